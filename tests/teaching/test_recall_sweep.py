"""kda_lib.teaching.recall_sweep: notebook 08's figure and the limits it reads from a record,
on records built by hand (the recorded sweep itself: tests/teaching/test_notebook_claims.py)."""

import matplotlib
import numpy as np
import pytest

from kda_lib.teaching import recall_sweep as rs

matplotlib.use("Agg")


def _run(task, mixer, t, seed, acc, stop="flat", steps=(100, 200), curve=(0.5, 1.0), **extra):
    test = dict(accuracy=acc) | extra
    return dict(task=task, mixer=mixer, stop=stop, phase="seeds", test=test,
                validation=dict(accuracy=acc), curve=dict(step=list(steps), accuracy=list(curve)),
                training=dict(seed=seed, seq_len=t, learning_rate=0.01))  # fmt: skip


def _sweep():
    runs = []
    for m in ("kda", "gdn", "mamba2"):
        for t in (64, 128):
            for s in (0, 1):
                runs += [_run("palindrome", m, t, s, 0.2 + 0.1 * s, stop=("rising", "flat")[s])]
                runs += [_run("stack", m, t, s, 0.9, beyond_reach_accuracy=0.5 + 0.1 * s)]
            runs += [_run("mqar", m, t, s, 0.99, curve=(0.5, 0.995 if m == "gdn" or s else 0.9))
                     for s in (0, 1)]  # fmt: skip
    for lr, acc in ((0.001, 0.80), (0.003, 0.92), (0.01, 0.90)):
        runs += [dict(_run("stack", "gdn", 64, 9, acc), phase="tune")]
        runs[-1]["training"]["learning_rate"] = lr
    grids = {f"{k}/{m}": dict(best=0.01, inside=True) for k in ("palindrome", "stack", "mqar")
             for m in ("kda", "gdn", "mamba2")}  # fmt: skip
    grids["stack/gdn"]["best"] = 0.003
    setting = dict(solved=0.99, max_steps=2000, eval_every=100, tune_seed=9, protocol_version=2,
                   flat_tol=0.01)
    return dict(setting=setting, grids=grids, runs=runs)


def test_recorded_limits_read_chance_multiples_rising_runs_rate_margin_and_steps():
    sweep = _sweep()
    sweep["grids"]["stack/gdn"]["best"] = 0.01  # every cell at 0.01 ...
    cells, _, _ = rs.sweep_cells(sweep, min_seeds=2)
    sweep["grids"]["stack/gdn"]["best"] = 0.003  # ... the tuning grid's winner: 0.003
    lim = rs.recorded_limits(sweep, cells, chance=0.1)
    np.testing.assert_allclose(lim["palindrome"][("kda", 64)], [2.0, 3.0])
    assert set(lim["palindrome"]) == {(m, t) for m in ("kda", "gdn", "mamba2") for t in (64, 128)}
    assert lim["rising"] == 6 and lim["tune"] == {0.001: 0.80, 0.003: 0.92, 0.01: 0.90}
    assert round(lim["margin"], 6) == 0.02  # 0.92 - 0.90
    assert lim["solve"] == {"kda": [2000, 200], "gdn": [200, 200]}  # unsolved: the budget


def test_the_recorded_figure_has_a_beyond_reach_panel_and_mamba2_style_labels():
    sweep = _sweep()
    sweep["grids"]["stack/gdn"]["best"] = 0.01
    cells, complete, acc = rs.sweep_cells(sweep, min_seeds=2)
    chance = {"palindrome": 0.1, "stack": 0.1, "mqar": 0.1}
    fig = rs.plot_recorded(cells, complete, acc, sweep["setting"], chance)
    titles = [ax.get_title() for ax in fig.axes]
    assert "stack, pops beyond the conv reach" in titles and len(fig.axes) == 8
    beyond = fig.axes[titles.index("stack, pops beyond the conv reach")]
    means = [round(float(c.lines[0].get_ydata()[0]), 3) for c in beyond.containers]
    assert means == [0.55] * 3  # (0.5 + 0.6) / 2 per mixer at the first length
    assert {c.lines[0].get_linestyle() for c in beyond.containers} == {"None"}  # not joined
    labels = fig.axes[-1].get_legend_handles_labels()[1] or [
        t.get_text() for t in fig.axes[-1].get_legend().get_texts()
    ]
    assert labels == ["kda", "gdn", "mamba2-style", "chance (every panel)"]  # dotted (teacher C)
    assert rs.label("mamba2 beyond") == "mamba2-style beyond" and rs.label("gdn") == "gdn"


def test_stop_label_calls_rising_only_a_net_gain_over_the_last_fifth():
    """Review 2026-12-05: the recording rule called a run rising when validation moved by the
    tolerance either way; a run that fell, or came back, is "moving", not rising."""
    steps = (1000, 1500, 1600, 1800, 2000)  # the last fifth starts after step 1600
    rose = _run("mqar", "kda", 64, 0, 0.3, stop="rising", steps=steps, curve=(.1, .2, .2, .25, .22))
    fell = _run("mqar", "kda", 64, 0, 0.3, stop="rising", steps=steps, curve=(.1, .2, .2, .25, .19))
    back = _run("mqar", "kda", 64, 0, 0.3, stop="rising", steps=steps, curve=(.1, .2, .2, .23, .2))
    assert [rs.stop_label(r, 0.01) for r in (rose, fell, back)] == ["rising", "moving", "moving"]
    for stop in ("flat", "solved", "diverged"):
        assert rs.stop_label(_run("mqar", "kda", 64, 0, 0.3, stop=stop), 0.01) == stop


def test_vote_accuracy_is_the_expected_largest_multiplicity_over_n():
    """One value: always right; n values from a large set: nearly all distinct, 1/n; two from two:
    the larger count is 2 with probability 1/2 (equal draws), else 1: (1/2 * 2 + 1/2 * 1) / 2."""
    assert rs.vote_accuracy(1, 7) == 1.0
    assert abs(rs.vote_accuracy(3, 10**4) - 1 / 3) < 2e-4  # collisions: about 3 / 10^4
    assert abs(rs.vote_accuracy(2, 2) - 0.75) < 1e-12


def test_vote_accuracy_with_unequal_probabilities_is_the_enumerated_expectation():
    """Exercise 08.1's checker reads the vote level at unequal probabilities (teacher s13, 4):
    equal to every sequence enumerated, and to the uniform case at equal ones."""
    import itertools

    probs = np.array([0.6, 0.25, 0.1, 0.05])
    for n in (1, 2, 4):
        want = sum(np.prod(probs[list(seq)]) * max(seq.count(v) for v in set(seq))
                   for seq in itertools.product(range(4), repeat=n)) / n
        assert abs(rs.vote_accuracy(n, 4, probs=probs) - want) < 1e-12, n
    assert abs(rs.vote_accuracy(8, 32, probs=np.full(32, 1 / 32)) - rs.vote_accuracy(8, 32)) < 1e-12


def test_ordered_in_every_family_keeps_only_rows_ordered_in_each():
    """Notebook 08's larger families: a row ordered alone but level once ten noisy rows share
    its Holm correction is dropped; the row against a control (conv) is never kept."""
    rng = np.random.default_rng(0)
    strong = (np.array([0.9, 0.91, 0.92, 0.9, 0.93]), np.full(5, 0.5))
    weak = (np.array([0.52, 0.55, 0.51, 0.56, 0.53]), np.full(5, 0.5))  # p about 0.01
    noise = {("stack", 64, f"gdn {i}"): (rng.random(5), rng.random(5)) for i in range(10)}
    small = {("stack", 64, "gdn"): strong, ("stack", 128, "gdn"): weak,
             ("stack", 64, "conv"): strong}
    ordered, kept = rs.ordered_in_every_family(small, small | noise)
    assert set(ordered) == {3, 13} and ("stack", 128, "gdn") in ordered[3]
    assert kept == [("stack", 64, "gdn")], kept


def test_the_induction_step_reads_every_mqar_answer_and_is_drawn():
    """Matching a query's key among the predecessors and reading the token there gives every
    scored target of MQAR examples (odd and even vocabularies); the figure outlines the first."""
    import jax

    from kda_lib.lab.train import make_task

    for vocab, pairs, seed in ((32, 4, 0), (33, 6, 1), (64, 8, 2)):
        batch = make_task("mqar", vocab_size=vocab, num_pairs=pairs)(jax.random.key(seed), 1, 40)
        inputs, targets, mask = (np.asarray(a[0]) for a in batch)
        reads = rs.induction_reads(inputs, mask)
        assert sorted(reads) == np.flatnonzero(mask).tolist() and len(reads) == pairs
        assert all(inputs[s] == targets[t] and s < t for t, s in reads.items())
    fig = rs.plot_induction_steps(inputs, targets, mask, vocab)
    assert len(fig.axes[0].patches) == 3 and "predecessor" in fig.axes[0].get_title()
    try:  # a scored token with no earlier occurrence is no MQAR query: named, not an IndexError
        rs.induction_reads([3, 4, 5], [False, False, True])
    except ValueError as error:
        assert "inputs[2]" in str(error)
    else:
        raise AssertionError("induction_reads accepted a query with no earlier key")


def test_recall_errors_rank_not_orthogonality_decides_what_a_state_holds():
    """08 section 8 (teacher s15, 1): d_k linearly independent, overlapping unit keys are held
    exactly by the state that solves for them, not by one delta-rule sweep or a sum of outer
    products; orthonormal keys are held by one sweep; d_k + 1 keys by no state (float64)."""
    for d, seed in ((8, 0), (8, 3), (4, 1), (16, 2)):
        room = rs.exact_recall_errors(d, seed)
        assert room["solved"] == room["orthogonal, one sweep"] == 0, room
        assert min(room["one sweep"], room["sum"], room["one pair more"]) > 0.1, room
        assert 0.3 < room["overlap"] < 1, room


def test_capacity_reading_print_and_sizes_on_a_hand_made_record(capsys):
    """capacity_reading's numbers, print_capacity's lines, recorded_sizes' check and
    ordered_ahead's rows on values made by hand."""
    from types import SimpleNamespace

    from kda_lib.models.tiny_lm import ModelConfig, config_param_count

    a = np.array
    acc = {"kda": {2: a([0.99, 0.98, 0.97]), 4: a([0.9, 0.95, 0.97]), 8: a([0.5, 0.4, 0.6]),
                   16: a([0.1, 0.2, 0.15]), 32: a([0.03, 0.04, 0.05])},
           "gdn": {n: v + 0.01 for n, v in {2: a([0.9, 0.9, 0.9]), 4: a([0.88, 0.9, 0.9]),
                                            8: a([0.6, 0.5, 0.4]), 16: a([0.2, 0.1, 0.3]),
                                            32: a([0.05, 0.05, 0.05])}.items()},
           "mamba2": {n: np.minimum(v + 0.2, 1) for n, v in {2: a([0.8, 0.8, 0.8]), 4: a([
               0.8, 0.8, 0.8]), 8: a([0.6, 0.6, 0.6]), 16: a([0.3, 0.3, 0.3]),
               32: a([0.1, 0.1, 0.1])}.items()}}
    read = rs.capacity_reading(acc, 8, 32)
    assert round(read["low"], 6) == 0.89 and read["best"]["kda"] == [0.2, 0.05]
    assert read["kda below mamba2"] == {8: 3, 16: 3} and read["kda mean"] == [0.5, 0.15, 0.04]
    assert read["vote"] == {2: 0.516, 4: 0.295, 8: 0.208, 16: 0.15, 32: 0.11}  # 32 values
    assert read["means at 2d"] == {"kda": 0.15, "gdn": 0.21, "mamba2": 0.5}
    assert read["above vote"] == {"kda": [2, 0], "gdn": [2, 0], "mamba2": [3, 3]}
    assert read["sign-flip p"] == 0.25
    rs.print_capacity({"kda": acc["kda"]}, {"kda": {n: ["rising", "flat", "rising"] for n in acc[
        "kda"]}})
    assert "8: 0.50 [0.40, 0.60]rr" in capsys.readouterr().out
    model = dict(vocab_size=65, mixer="kda", hidden_size=64, num_layers=1, num_heads=2,
                 head_dim=8)
    count = config_param_count(ModelConfig.from_flat(**model))
    runs = [dict(mixer="kda", model=model, params=count)] * 2
    assert rs.recorded_sizes(runs) == {"kda": count}
    assert rs.size_line({"kda": 110, "gdn": 100}) == "parameters: kda 110, gdn 100 (KDA +10.0%)"
    try:
        rs.recorded_sizes([*runs, dict(mixer="kda", model=model, params=count + 1)])
    except ValueError as error:
        assert "recorded" in str(error)
    else:
        raise AssertionError("recorded_sizes accepted a run whose count is not its model's")
    row = SimpleNamespace(verdict=">", above=5, n=5)
    tests = {("stack", 64, "gdn"): row, ("stack", 128, "gdn"): SimpleNamespace(
        verdict="level", above=5, n=5), ("stack", 64, "mamba2"): SimpleNamespace(
        verdict=">", above=4, n=5), ("mqar", 64, "gdn"): row}
    assert rs.ordered_ahead(tests, "stack") == {(64, "gdn")}


def test_tuning_steps_reads_the_tuning_runs_only():
    """tuning_steps (08 section 8's rate caveat, teacher s15 re-read, 3): steps to the solved
    level per tuning rate; seed runs and other tasks are not read, a run never solved is None."""
    def run(mixer, lr, acc, phase="tune", task="mqar"):
        return dict(mixer=mixer, task=task, phase=phase, training=dict(learning_rate=lr),
                    curve=dict(step=[100, 200, 300], accuracy=acc))
    sweep = {"setting": {"solved": 0.99}, "runs": [
        run("kda", 0.003, [0.5, 0.99, 1]), run("kda", 0.01, [0.5, 0.9, 0.995]),
        run("gdn", 0.003, [0.99, 1, 1]), run("gdn", 0.01, [0.2, 0.3, 0.4]),
        run("kda", 0.003, [1, 1, 1], phase="seeds"), run("kda", 0.01, [1, 1, 1], task="stack")]}
    assert rs.tuning_steps(sweep, "mqar", ("kda", "gdn"), (0.003, 0.01)) == {
        "kda": [200, 300], "gdn": [100, None]}


def test_check_protocol_names_each_break():
    """check_protocol (08 section 6's protocol asserts, moved): the reported seeds of a sound
    record; a ValueError naming each break otherwise."""
    def run(seed, phase="seeds", test=True):
        return dict(phase=phase, training=dict(seed=seed), test={"accuracy": 1} if test else None)
    runs = [run(9, "tune"), run(0), run(1)]
    sweep = {"setting": {"protocol_version": 2, "tune_seed": 9}, "runs": runs}
    cells = {("mqar", "kda", 64): runs[1:], ("mqar", "gdn", 64): runs[1:2]}
    assert rs.check_protocol(sweep, cells, {("mqar", "kda", 64)}, 2) == {0, 1}
    for broken, why in (
            (dict(sweep, setting={"protocol_version": 1, "tune_seed": 9}), "not protocol 2"),
            (dict(sweep, runs=[*runs, run(2, test=False)]), "without a test score"),
            (dict(sweep, runs=[*runs, run(9)]), "tuning seed reported")):
        with pytest.raises(ValueError, match=why):
            rs.check_protocol(broken, cells, {("mqar", "kda", 64)}, 2)
    with pytest.raises(ValueError, match="2 reported seeds, not 5"):
        rs.check_protocol(sweep, cells, {("mqar", "kda", 64)}, 5)
    with pytest.raises(ValueError, match="complete cell"):
        rs.check_protocol(sweep, cells, set(cells), 2)
