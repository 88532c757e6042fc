"""kda_lib.lab.train: model shapes and caches, the conv-only ablation's blindness, the optimiser's
weight-decay mask, and a few training steps that lower the loss."""

import dataclasses
import functools
import json
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from kda_lib import KDAConfig, KimiDeltaAttention
from kda_lib.lab.tasks import delayed_copy, stack_answer_positions
from kda_lib.lab.train import (
    SPLITS,
    TEST_STREAM,
    TRAIN_STREAM,
    VALIDATION_STREAM,
    _batch_drawer,
    _stream,
    default_result_path,
    evaluate,
    make_optimizer,
    make_task,
    masked_metrics,
    record_scores,
    run_experiment,
    run_sweep,
    save_record,
    summary_line,
    train,
)
from kda_lib.lab.train_cli import main as train_main
from kda_lib.layers.attention import CausalSelfAttention
from kda_lib.layers.mamba2 import Mamba2Mixer
from kda_lib.layers.params import weight_decay_mask
from kda_lib.models.tiny_lm import (
    MIXERS,
    ConvMixer,
    ModelConfig,
    TinyLM,
)


def parameter_path_names(path) -> tuple[str, ...]:
    """('blocks', '0', 'mixer', 'A_log') from a pytree path over nnx.state (no '.value')."""
    keys = (getattr(e, "key", getattr(e, "idx", getattr(e, "name", e))) for e in path)
    return tuple(str(k) for k in keys if str(k) != "value")


def decay_mask(model) -> dict[tuple[str, ...], bool]:
    """Parameter path -> whether AdamW decays it (weight_decay_mask, by name)."""
    leaves = jax.tree_util.tree_leaves_with_path(weight_decay_mask(model))
    return {parameter_path_names(path): bool(decay) for path, decay in leaves}


# tiny and quick to compile; the recurrent kernel compiles fastest on CPU
CFG = ModelConfig(
    vocab_size=8,
    num_layers=2,
    mixer_config=KDAConfig(hidden_size=16, num_heads=2, head_dim=8, implementation="recurrent"),
)
_MIXER_FIELDS = {field.name for field in dataclasses.fields(KDAConfig)}


def _model(**changes):
    """TinyLM(CFG) with ``changes`` to it or, for KDAConfig's fields, to its mixer_config."""
    mixer = {name: changes.pop(name) for name in list(changes) if name in _MIXER_FIELDS}
    mixer_config = dataclasses.replace(CFG.mixer_config, **mixer)
    config = dataclasses.replace(CFG, mixer_config=mixer_config, **changes)
    return TinyLM(config, rngs=nnx.Rngs(0))


def test_shapes_and_cache_decoding():
    """Every mixer of the model at once (one layer each, so one compilation per call shape)."""
    mixers = ("kda", "gdn", "mamba2", "attention", "conv")
    model = _model(num_layers=len(mixers), layers=mixers)
    tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, 8)
    apply = nnx.jit(lambda model, tokens, cache=None: model(tokens, cache=cache))
    logits = apply(model, tokens)
    assert logits.shape == (2, 9, 8) and logits.dtype == jnp.float32
    kinds = (KimiDeltaAttention, KimiDeltaAttention, Mamba2Mixer, CausalSelfAttention, ConvMixer)
    assert [type(b.mixer) for b in model.blocks] == list(kinds)
    # prefill 5 tokens, then decode one at a time: same logits as the full forward. A fixed
    # capacity: one program for the four steps (the growing attention cache, a new program
    # per step: tests/models/test_models.py's hybrid prefill-then-decode test)
    out, cache = apply(model, tokens[:, :5], model.init_cache(2, max_len=9))
    steps = [out]
    for t in range(5, 9):
        out, cache = apply(model, tokens[:, t : t + 1], cache)
        steps.append(out)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), logits, atol=2e-5, rtol=2e-5)
    for layer, mixer in enumerate(mixers[:2]):  # kda, gdn
        assert cache[layer].state.shape == (2, 2, 8, 8)
        assert model.blocks[layer].mixer.config.per_head_decay == (mixer == "gdn")
    assert cache[3].keys.shape == (2, 9, 2, 8)  # attention: every token's key is kept
    assert int(cache[3].seen) == 9


def test_conv_mixer_sees_only_its_taps():
    cfg = CFG.mixer_config
    mixer = ConvMixer(cfg, rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(0), (1, 12, cfg.hidden_size))
    t = 10
    # d y[t] / d x[s] for every s: zero for s < t - (W - 1), non-zero on the W taps
    jac = jax.jit(jax.jacobian(lambda x: mixer(x)[0, t]))(x)[:, 0]  # [hidden, T, hidden]
    reach = np.abs(np.asarray(jac)).sum(axis=(0, 2))
    w = cfg.conv_size
    assert (reach[: t - w + 1] == 0).all()
    assert (reach[t - w + 1 : t + 1] > 0).all()
    assert (reach[t + 1 :] == 0).all()  # causal


def test_conv_only_model_is_blind_beyond_its_reach_and_kda_is_not():
    for mixer, blind in (("conv", True), ("kda", False)):
        model = _model(mixer=mixer)
        reach = model.config.conv_reach
        assert reach == 2 * (CFG.mixer_config.conv_size - 1)
        tokens = jax.random.randint(jax.random.key(1), (1, 12), 0, 8)
        emb = model.embed(tokens)

        def logits_at_end(emb, model=model):
            x = emb
            for block in model.blocks:
                x = block(x)
            return model.head(model.final_norm(x))[0, -1]

        jac = jax.jit(jax.jacobian(logits_at_end))(emb)[:, 0]  # [vocab, T, hidden]
        influence = np.abs(np.asarray(jac)).sum(axis=(0, 2))
        last = tokens.shape[1] - 1
        assert (influence[last - reach :] > 0).all()
        if blind:
            assert (influence[: last - reach] == 0).all(), influence
        else:
            assert (influence[: last - reach] > 0).all(), influence


def test_decay_mask():
    model = _model()
    mask = decay_mask(model)
    kda_layer = model.blocks[0].mixer
    for name in ("A_log", "dt_bias", "o_norm"):
        assert mask[("blocks", "0", "mixer", name)] is False
    assert mask[("blocks", "1", "mixer", "g_proj", "bias")] is False
    assert mask[("blocks", "0", "mixer", "q_proj", "kernel")] is True
    assert mask[("blocks", "0", "mixer", "q_conv1d", "kernel")] is True
    assert mask[("embed", "embedding")] is False
    assert mask[("blocks", "0", "mixer_norm", "scale")] is False
    assert mask[("blocks", "0", "mlp", "up", "bias")] is False
    assert mask[("blocks", "0", "mlp", "up", "kernel")] is True
    assert mask[("head", "kernel")] is True
    assert len(mask) == len(jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert kda_layer.A_log[...].dtype == jnp.float32


def test_optimizer_decays_only_the_masked_params():
    model = _model()
    before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    optimizer = make_optimizer(
        model, steps=10, learning_rate=1e-2, weight_decay=0.5, warmup_steps=0
    )
    zeros = jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))
    # Adam's step is 0 for zero gradients: only the weight decay moves parameters
    nnx.jit(lambda optimizer, model, grads: optimizer.update(model, grads))(optimizer, model, zeros)
    mask = decay_mask(model)
    after = nnx.state(model, nnx.Param)
    flat_before = dict(jax.tree_util.tree_leaves_with_path(before))
    for path, value in jax.tree_util.tree_leaves_with_path(after):
        changed = not np.array_equal(np.asarray(value), flat_before[path])
        assert changed == mask[parameter_path_names(path)], (parameter_path_names(path), changed)


def test_masked_metrics():
    logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))
    batch = jax.jit(lambda key: delayed_copy(key, 1, 2, vocab_size=3, delay=1))(jax.random.key(0))
    batch = batch._replace(targets=jnp.array([[0, 2]]), mask=jnp.array([[False, True]]))
    loss, acc = jax.jit(masked_metrics)(logits, batch)  # one program, not op by op
    assert float(loss) == pytest.approx(-np.log(0.8), rel=1e-5) and float(acc) == 1.0


# the conv model's training runs share one task object, one batch shape and one schedule (steps,
# learning rate): one compiled batch drawer and training step for all of them (one worker)
TASK = functools.partial(delayed_copy, vocab_size=8, delay=2)
CONV_TRAINING = dict(steps=30, batch_size=8, seq_len=12, learning_rate=1e-2)
SHARED_CONV_STEP = pytest.mark.xdist_group("train_conv_step")


@SHARED_CONV_STEP
def test_training_lowers_the_loss_and_is_deterministic():
    task = TASK
    runs = []
    for _ in range(2):
        model = _model(mixer="conv", num_layers=1)
        runs.append(train(model, task, **CONV_TRAINING, seed=0, log_every=10))
    history = runs[0]
    assert history["step"] == [10, 20, 30]
    assert set(history) == {"step", "loss", "accuracy", "seconds"}
    assert history["loss"] == runs[1]["loss"]  # same seed, same run
    # delay 2 is within the conv's reach (W - 1 = 3): 30 steps already beat chance by far
    assert history["loss"][-1] < 0.5 * np.log(8)
    metrics = evaluate(model, task, batch_size=8, seq_len=12, num_batches=2)
    assert metrics["loss"] < 0.5 * np.log(8) and metrics["accuracy"] > 0.5


def _param_vector(model):
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))])


@SHARED_CONV_STEP
def test_training_updates_the_model_for_callbacks_and_when_interrupted(monkeypatch):
    """train() trains in place: each progress callback sees the parameters after its window,
    and the model holds the last completed step also when the loop is interrupted between
    callbacks (here: drawing the fifth batch raises)."""
    from kda_lib.lab import train as train_module

    task = TASK
    options = dict(CONV_TRAINING, log_every=2)
    seen = []
    full = _model(mixer="conv", num_layers=1)
    start = _param_vector(full)
    train(full, task, **options, progress=lambda record: seen.append(_param_vector(full)))
    assert len(seen) == 15 and not np.array_equal(seen[0], start)
    assert not np.array_equal(seen[1], seen[2])
    np.testing.assert_array_equal(seen[-1], _param_vector(full))

    drawer, calls = train_module._batch_drawer, []

    def interrupted_before_the_fifth_step(*args):
        draw = drawer(*args)

        def interrupted(key):
            calls.append(1)
            if len(calls) == 5:
                raise KeyboardInterrupt
            return draw(key)

        return interrupted

    monkeypatch.setattr(train_module, "_batch_drawer", interrupted_before_the_fifth_step)
    model = _model(mixer="conv", num_layers=1)
    with pytest.raises(KeyboardInterrupt):
        train(model, task, **options)
    np.testing.assert_array_equal(_param_vector(model), seen[1])  # after 4 of 30 steps


def test_kda_training_steps_reduce_loss_with_progress_lines(capsys):
    task = TASK
    model = _model(num_layers=1)  # one KDA layer: half the training step to compile
    before = evaluate(model, task, batch_size=8, seq_len=12, num_batches=1)
    history = train(
        model,
        task,
        steps=20,
        batch_size=8,
        seq_len=12,
        learning_rate=1e-2,
        log_every=7,
        progress=True,
    )
    assert history["step"] == [7, 14, 20]
    assert capsys.readouterr().out.count("loss") == 3
    after = evaluate(model, task, batch_size=8, seq_len=12, num_batches=1)
    assert after["loss"] < before["loss"] - 0.3


@SHARED_CONV_STEP
def test_silent_by_default_and_callback(capsys):
    records = []
    model = _model(mixer="conv", num_layers=1)
    train(model, TASK, **CONV_TRAINING, log_every=20, progress=records.append)
    assert capsys.readouterr().out == ""
    assert [r["step"] for r in records] == [20, 30]  # and the last step, off the grid


def test_mixer_registry_and_errors():
    assert {"kda", "conv"} <= set(MIXERS)
    with pytest.raises(ValueError, match="mixer must be one of"):
        ModelConfig(vocab_size=4, mixer="nope")

    def _identity(config, rngs):  # a mixer is registered by adding its factory to MIXERS
        class Identity(nnx.Module):
            def __call__(self, x, *, cache=None):
                return x if cache is None else (x, cache)

            def init_cache(self, batch_size):
                return jnp.zeros(())

        return Identity()

    MIXERS["identity_for_test"] = _identity
    try:
        model = _model(mixer="identity_for_test")
        logits = nnx.jit(lambda m, t: m(t))(model, jnp.zeros((1, 3), jnp.int32))  # one program
        assert logits.shape == (1, 3, 8)
    finally:
        del MIXERS["identity_for_test"]
    with pytest.raises(ValueError, match="steps must be an int >= 1, got 0"):
        train(_model(), lambda *a: None, steps=0, batch_size=1, seq_len=1)
    with pytest.raises(ValueError, match="conv_size >= 1"):
        _model(mixer="conv", conv_size=0)
    assert optax is not None


# ----------------------------------------------------------------------------- experiments
def test_make_task_binds_defaults_and_rejects_unknown_options():
    task = make_task("mqar", num_pairs=3)
    assert task.keywords == dict(vocab_size=64, num_pairs=3)
    assert task(jax.random.key(0), 2, 12).inputs.shape == (2, 12)
    with pytest.raises(ValueError, match=r"task 'mqar' takes the options \['vocab_size', "):
        make_task("mqar", delay=3)
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        make_task("nope")


# run_experiment_record's run and the command line's runs below: one model, task, batch shape
# and schedule, so one compiled training step and batch drawer for all of them (one worker); the
# sweep's runs at T = 12 and evaluate's splits below run the same programs
SHARED_RUN_STEP = pytest.mark.xdist_group("train_run_step")


@SHARED_RUN_STEP
def test_run_experiment_record(tmp_path):
    record = run_experiment(
        "mqar",
        mixer="conv",
        seq_len=12,
        steps=3,
        batch_size=2,
        eval_batches=2,
        task_options=dict(vocab_size=9, num_pairs=2),
        model_options=dict(hidden_size=16, num_layers=1, num_heads=2, head_dim=8),
        log_every=2,
    )
    assert record["task"] == "mqar" and record["mixer"] == "conv"
    assert record["task_options"] == dict(vocab_size=9, num_pairs=2)
    assert record["model"]["vocab_size"] == 9 and record["model"]["num_layers"] == 1
    assert record["training"] == dict(steps=3, batch_size=2, seq_len=12, learning_rate=3e-3, seed=0)
    assert record["history"]["step"] == [2, 3]
    assert 0.0 <= record["eval"]["accuracy"] <= 1.0 and record["eval"]["batches"] == 2
    assert record["eval"] == record["validation"] and record["test"]["batches"] == 2
    assert record["validation"] != record["test"]  # scored on other batches
    assert record["chance_accuracy"] == 0.25  # 4 value tokens
    assert record["diverged"] is False
    assert record["params"] > 0 and record["versions"]["jax"] == jax.__version__
    path = save_record(record, default_result_path(record, tmp_path))
    assert path.name == "mqar-conv-T12-seed0.json"
    assert json.loads(path.read_text()) == json.loads(json.dumps(record))
    # a generator's own error surfaces before any compilation of the training step
    with pytest.raises(ValueError, match="seq_len must be >= 3 \\* num_pairs = 6"):
        run_experiment("mqar", mixer="conv", seq_len=5, steps=1, task_options=dict(num_pairs=2))


CLI_TINY = ["--mixer", "conv", "--steps", "3", "--seq-len", "12", "--batch-size", "2",
            "--eval-batches", "1", "--hidden-size", "16", "--num-layers", "1",
            "--num-heads", "2", "--head-dim", "8", "--log-every", "2"]  # fmt: skip
# the run of test_run_experiment_record, from the command line
CLI_RUN = ["mqar", *CLI_TINY, "--vocab-size", "9", "--num-pairs", "2"]


@SHARED_RUN_STEP
def test_command_line_lines_and_record(tmp_path, capsys):
    out = tmp_path / "run.json"
    record = train_main([*CLI_RUN, "--output", str(out)])
    captured = capsys.readouterr()
    printed = captured.out.splitlines()
    # not a terminal: plain lines, one per record, then the summary
    assert printed[0].startswith("step      2  loss") and printed[1].startswith("step      3")
    assert printed[-1].startswith("mqar / conv, T=12: held-out accuracy")
    assert str(out) in printed[-1]
    # the silent compile is announced; the summary's times say what they cover
    assert "compiling the first training step" in captured.err
    assert re.search(r"\d+ s training \(compilation included\), \d+ s in all", printed[-1])
    saved = json.loads(out.read_text())
    assert saved["task_options"] == {"vocab_size": 9, "num_pairs": 2}
    assert saved["eval"] == record["eval"]


def test_command_line_help_shows_values_and_every_mixer(capsys):
    with pytest.raises(SystemExit):
        train_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "DEFAULT_TASK_OPTIONS" not in text and "(default: ModelConfig)" not in text
    assert "[delayed_copy 16, mqar 64, palindrome 16, stack 16]" in text
    assert "model width (default: 64)" in text and "optimiser steps (default: 1000)" in text
    for mixer in MIXERS:
        assert f"{mixer} (" in text, f"--help does not explain the mixer {mixer}"


@SHARED_RUN_STEP
def test_command_line_progress_bar_and_errors(tmp_path, capsys):
    # the run of test_command_line_lines_and_record (its compiled training step, reused)
    train_main([*CLI_RUN, "--progress", "bar", "--output", str(tmp_path / "s.json")])
    captured = capsys.readouterr()
    assert "mqar/conv" in captured.err and "3/3" in captured.err  # the tqdm bar
    assert "step      2" not in captured.out
    with pytest.raises(SystemExit):
        train_main(["mqar", *CLI_TINY, "--delay", "3"])
    assert "task 'mqar' takes the options" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_main(["mqar", *CLI_TINY, "--num-pairs", "5"])
    assert "seq_len must be >= 3 * num_pairs = 15" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_main(["copy"])
    assert "invalid choice: 'copy'" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    """``python -m kda_lib.lab.train_cli`` runs main (its runs: the tests above, in process)."""
    result = subprocess.run(
        [sys.executable, "-m", "kda_lib.lab.train_cli", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=pathlib.Path(__file__).parents[2],
    )
    assert result.returncode == 0, result.stderr
    assert "optimiser steps (default: 1000)" in " ".join(result.stdout.split())


@SHARED_RUN_STEP
def test_run_sweep_order_report_and_shared_compilation():
    # the command line's model and schedule (CLI_TINY): its runs' compiled step at T = 12
    tiny = dict(hidden_size=16, num_layers=1, num_heads=2, head_dim=8)
    lines = []
    before = _train_step_cache_size()
    records = run_sweep(
        {"palindrome": dict(vocab_size=9), "mqar": dict(vocab_size=9, num_pairs=2)},
        ["conv"],
        [12, 16],
        report=lambda r: lines.append(summary_line(r)),
        steps=3,
        batch_size=2,
        eval_batches=1,
        model_options=tiny,
        log_every=1,
    )
    order = [(r["task"], r["training"]["seq_len"], r["mixer"]) for r in records]
    assert order == [
        ("palindrome", 12, "conv"),
        ("palindrome", 16, "conv"),
        ("mqar", 12, "conv"),
        ("mqar", 16, "conv"),
    ]
    assert lines[0].startswith("palindrome   T=12    conv       accuracy ")
    assert "(chance 0.143)" in lines[0] and "(chance 0.250)" in lines[2]
    # one vocabulary: the two tasks reuse the training step compiled for each length
    assert _train_step_cache_size() - before <= 2


def _train_step_cache_size():
    from kda_lib.lab import train as train_module

    return train_module.train_step.jitted_fn._cache_size()


def test_attention_mixer_takes_a_value_dim_other_than_the_key_dim():
    model = _model(mixer="attention", value_head_dim=12)
    tokens = jax.random.randint(jax.random.key(2), (2, 7), 0, 8)
    apply = nnx.jit(lambda m, t: m(t))  # one compilation, not one per eager op
    logits = apply(model, tokens)
    assert logits.shape == (2, 7, 8) and model.blocks[0].mixer.v_proj.kernel.shape == (16, 24)
    # causal: changing the last token leaves every earlier position's logits alone
    changed = apply(model, tokens.at[:, -1].set((tokens[:, -1] + 1) % 8))
    np.testing.assert_array_equal(changed[:, :-1], logits[:, :-1])


# ----------------------------------------------------------------------------- CLI: bad input
def _no_training(monkeypatch):
    """Make any training or experiment fail loudly: the checks must come first."""
    from kda_lib.lab import train as train_module
    from kda_lib.lab import train_cli

    def forbidden(*args, **kwargs):
        raise AssertionError("training started before the arguments were checked")

    monkeypatch.setattr(train_cli, "run_experiment", forbidden)
    monkeypatch.setattr(train_module, "run_experiment", forbidden)
    monkeypatch.setattr(train_module, "train", forbidden)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--eval-batches", "0"], "--eval-batches must be >= 1, got 0"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--batch-size", "-1"], "--batch-size must be >= 1, got -1"),
        (["--seq-len", "0"], "--seq-len must be >= 1, got 0"),
        (["--log-every", "0"], "--log-every must be >= 1, got 0"),
        (["--hidden-size", "-8"], "--hidden-size must be >= 1, got -8"),
        (["--num-heads", "0"], "--num-heads must be >= 1, got 0"),
        (["--conv-size", "-1"], "--conv-size must be >= 0, got -1"),
        (["--delay", "-2"], "--delay must be >= 0, got -2"),
        (["--pop-probability", "1.5"], "--pop-probability must lie in [0, 1], got 1.5"),
        (["--learning-rate", "-0.1"], "--learning-rate must be >= 0, got -0.1"),
    ],
)
def test_command_line_rejects_bad_options_before_training(
    options, message, tmp_path, monkeypatch, capsys
):
    _no_training(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        train_main(["stack", *CLI_TINY, *options, "--output", str(tmp_path / "unused.json")])
    assert exit_info.value.code == 2
    assert f"kda-train: error: {message}" in capsys.readouterr().err


def test_command_line_checks_the_output_path_before_training(tmp_path, monkeypatch, capsys):
    _no_training(monkeypatch)
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "adir").mkdir()
    for output, message in [
        (tmp_path / "afile" / "x.json", f"'{tmp_path / 'afile'}' is a file, so"),
        (tmp_path / "afile" / "deeper" / "x.json", f"'{tmp_path / 'afile'}' is a file, so"),
        (tmp_path / "adir", f"'{tmp_path / 'adir'}' is a directory; give a file path"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            train_main(["stack", *CLI_TINY, "--output", str(output)])
        assert exit_info.value.code == 2
        assert f"error: --output: {message}" in capsys.readouterr().err
    # the default path is checked too: here build/runs/results would be made inside a file
    monkeypatch.chdir(tmp_path / "adir")
    pathlib.Path("build").write_text("a file where the runs folder should go")
    with pytest.raises(SystemExit):
        train_main(["stack", *CLI_TINY])
    assert "error: --output: 'build' is a file, so 'build/runs/results/stack-conv-T12" in (
        capsys.readouterr().err
    )
    # and so is the recorded one (--record), which is never the default
    pathlib.Path("data").write_text("a file where the recorded results should go")
    with pytest.raises(SystemExit):
        train_main(["stack", *CLI_TINY, "--record"])
    assert "error: --output: 'data' is a file, so 'data/results/stack-conv-T12" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        train_main(["stack", *CLI_TINY, "--record", "--output", "x.json"])
    assert "give --output or --record" in capsys.readouterr().err


def test_an_experiment_with_nothing_to_score_is_an_error(monkeypatch, capsys):
    from kda_lib.lab import train as train_module

    monkeypatch.setattr(train_module, "train", None)  # never reached
    with pytest.raises(ValueError, match="scores no position .* nothing to train or evaluate"):
        run_experiment("delayed_copy", mixer="conv", seq_len=4, steps=1, batch_size=2,
                       task_options=dict(delay=8))  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        train_main(["delayed_copy", *CLI_TINY, "--seq-len", "4", "--delay", "8"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: task 'delayed_copy' with seq_len=4 and options" in err and "'delay': 8" in err


def _strict_load(path):
    """json.load that refuses NaN and Infinity (which json.dumps writes unless told not to)."""

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(pathlib.Path(path).read_text(), parse_constant=refuse)


def test_a_diverged_run_is_recorded_as_diverged_in_strict_json_and_exits_1(tmp_path, capsys):
    out = tmp_path / "nan.json"
    with pytest.raises(SystemExit) as exit_info:
        argv = ["palindrome", *CLI_TINY, "--vocab-size", "6", "--learning-rate", "nan"]
        train_main([*argv, "--output", str(out)])
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert "diverged (the training loss at step 2 is not finite)" in captured.err
    assert "held-out accuracy" not in captured.out
    saved = _strict_load(out)
    assert saved["diverged"] is True
    assert saved["training"]["learning_rate"] is None and saved["eval"]["loss"] is None
    # step 1's loss comes before the first (NaN) update; training stops at the first NaN window
    assert saved["history"]["step"] == [2] and saved["history"]["loss"] == [None]


def test_save_record_is_strict_and_atomic(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "run.json"
    save_record({"loss": float("nan"), "history": [1.0, float("inf"), -float("inf")]}, path)
    assert _strict_load(path) == {"loss": None, "history": [1.0, None, None]}
    assert path.stat().st_mode & 0o644 == 0o644  # readable like any file, not mkstemp's 0600
    before = path.read_text()

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", crash)
    with pytest.raises(OSError, match="disk full"):
        save_record({"loss": 1.0}, path)
    assert path.read_text() == before  # the old record survives a failed write
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.json"]  # no temp file left


def test_a_one_step_schedule_is_valid():
    # warmup takes the one step; optax still needs a (zero-length-free) decay phase after it
    make_optimizer(_model(), steps=1, learning_rate=1e-3)


@SHARED_RUN_STEP
@pytest.mark.parametrize("fallback_works", [True, False])
def test_cli_keeps_a_finished_run_when_the_disk_is_full(
    tmp_path, monkeypatch, capsys, fallback_works
):
    # issue 30: the record's path was checked writable before training, but the disk filled
    # up meanwhile; the finished run must not be lost
    import errno
    import os

    from kda_lib.lab import train as train_module
    from kda_lib.lab import train_cli

    fallback_dir = tmp_path / "tmp"
    fallback_dir.mkdir()
    monkeypatch.setattr(train_cli.tempfile, "gettempdir", lambda: str(fallback_dir))
    out = tmp_path / "results" / "run.json"
    real_write = train_module.write_json

    def full_disk(document, path):
        if pathlib.Path(path) == out or not fallback_works:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_write(document, path)

    monkeypatch.setattr(train_module, "write_json", full_disk)
    with pytest.raises(SystemExit) as exit_info:
        train_main([*CLI_RUN, "--output", str(out)])
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert f"could not write the finished run's record to {out}" in captured.err
    assert "No space left on device" in captured.err
    if fallback_works:
        saved = fallback_dir / "run.json"
        assert f"the record was written to {saved} instead" in captured.err
        record = json.loads(saved.read_text())
    else:
        assert "the record was printed above on stdout" in captured.err
        record = json.loads(captured.out[captured.out.index("{") :])
    assert record["task"] == "mqar" and record["eval"]["accuracy"] is not None
    assert not out.exists()


# The parameters AdamW must not decay, for one block of each mixer (the set the path-name
# policy gave before the marks replaced it): gate parameters, norm weights, biases, embeddings.
_SHARED_NO_DECAY = {
    "blocks.0.mixer_norm.scale",
    "blocks.0.mlp.down.bias",
    "blocks.0.mlp.up.bias",
    "blocks.0.mlp_norm.scale",
    "embed.embedding",
    "final_norm.scale",
}
_KDA_NO_DECAY = {"A_log", "dt_bias", "g_proj.bias", "o_norm"}
NO_DECAY_BY_MIXER = {
    "kda": _SHARED_NO_DECAY | {f"blocks.0.mixer.{n}" for n in _KDA_NO_DECAY},
    "gdn": _SHARED_NO_DECAY | {f"blocks.0.mixer.{n}" for n in _KDA_NO_DECAY},
    "attention": _SHARED_NO_DECAY,
    "attention_conv": _SHARED_NO_DECAY,
    "mamba2": _SHARED_NO_DECAY | {f"blocks.0.mixer.{n}" for n in _KDA_NO_DECAY},
    "mamba2_dt": _SHARED_NO_DECAY | {f"blocks.0.mixer.{n}" for n in _KDA_NO_DECAY},
    "conv": _SHARED_NO_DECAY | {"blocks.0.mixer.g_proj.bias", "blocks.0.mixer.o_norm"},
    "mla": _SHARED_NO_DECAY | {"blocks.0.mixer.kv_a_layernorm.scale"},
}
PARAMS_BY_MIXER = dict(kda=23, gdn=23, mamba2=22, mamba2_dt=22, attention=13, attention_conv=16,
                       conv=15, mla=14)


@pytest.mark.parametrize("mixer", sorted(NO_DECAY_BY_MIXER))
def test_no_decay_set_of_every_mixer_is_unchanged(mixer):
    cfg = dataclasses.replace(CFG, mixer=mixer, num_layers=1)
    model = nnx.eval_shape(lambda: TinyLM(cfg, rngs=nnx.Rngs(0)))
    mask = decay_mask(model)
    assert {".".join(path) for path, decay in mask.items() if not decay} == (
        NO_DECAY_BY_MIXER[mixer]
    )
    assert len(mask) == PARAMS_BY_MIXER[mixer]


@pytest.mark.parametrize(
    "options, expected",
    [
        (
            dict(forget_gate_rank=4, output_gate_rank=4),
            {"A_log", "dt_bias", "g_proj.layers.1.bias", "o_norm"},
        ),
        (dict(output_gate_bias=False), {"A_log", "dt_bias", "o_norm"}),
        (dict(conv_size=0), {"A_log", "dt_bias", "g_proj.bias", "o_norm"}),
    ],
)
def test_no_decay_set_of_layer_variants_is_unchanged(options, expected):

    layer = nnx.eval_shape(
        lambda: KimiDeltaAttention(
            KDAConfig(hidden_size=16, num_heads=2, head_dim=8, **options), rngs=nnx.Rngs(0)
        )
    )
    mask = jax.tree_util.tree_leaves_with_path(weight_decay_mask(layer))
    assert {".".join(parameter_path_names(p)) for p, d in mask if not d} == expected


def test_no_decay_set_of_mla_with_low_rank_queries_is_unchanged():
    from kda_lib.layers.mla import MLAConfig, MultiHeadLatentAttention

    config = MLAConfig(
        hidden_size=16, num_heads=2, head_dim=8, kv_lora_rank=4, q_lora_rank=4, shared_key_dim=2
    )
    layer = nnx.eval_shape(lambda: MultiHeadLatentAttention(config, rngs=nnx.Rngs(0)))
    mask = jax.tree_util.tree_leaves_with_path(weight_decay_mask(layer))
    no_decay = {".".join(parameter_path_names(p)) for p, d in mask if not d}
    assert no_decay == {"kv_a_layernorm.scale", "q_a_layernorm.scale"}


def test_the_decay_policy_reads_the_mark_not_the_name():
    from kda_lib.layers.params import NO_DECAY

    class Probe(nnx.Module):
        def __init__(self):
            self.bias = nnx.Param(jnp.zeros(2))  # named like a bias, but not marked: decays
            self.kernel = nnx.Param(jnp.zeros(2), **NO_DECAY)  # marked: does not

    mask = weight_decay_mask(Probe())
    assert mask["bias"] is True and mask["kernel"] is False


def test_training_validation_and_test_streams_are_disjoint():
    """Three fold_in constants, and no batch shared among the first 64 of each stream (for
    seeds 0 and 1: a seed's validation or test batches are no other seed's training batches
    either)."""
    assert len({TRAIN_STREAM, VALIDATION_STREAM, TEST_STREAM}) == 3
    assert SPLITS == {"validation": VALIDATION_STREAM, "test": TEST_STREAM}
    draw = _batch_drawer(make_task("mqar", vocab_size=33, num_pairs=8), 2, 32)
    seen = {}
    for seed in (0, 1):
        for stream in (TRAIN_STREAM, VALIDATION_STREAM, TEST_STREAM):
            key = _stream(seed, stream)
            for i in range(64):
                inputs = np.asarray(draw(jax.random.fold_in(key, i)).inputs).tobytes()
                assert inputs not in seen, (seed, stream, i, seen.get(inputs))
                seen[inputs] = (seed, stream, i)


@SHARED_RUN_STEP
def test_evaluate_draws_validation_or_test_and_refuses_another_split():
    # the command line's model, task and batch shape (CLI_RUN): its compiled evaluation
    task = make_task("mqar", vocab_size=9, num_pairs=2)
    config = ModelConfig.from_flat(vocab_size=9, mixer="conv", hidden_size=16, num_layers=1,
                                   num_heads=2, head_dim=8)  # fmt: skip
    model = TinyLM(config, rngs=nnx.Rngs(0))
    shape = dict(batch_size=2, seq_len=12, num_batches=2)
    default = evaluate(model, task, **shape)
    assert default == evaluate(model, task, **shape, split="validation")
    assert default != evaluate(model, task, **shape, split="test")
    with pytest.raises(ValueError, match="split must be one of \\['test', 'validation'\\]"):
        evaluate(model, task, **shape, split="train")
    with pytest.raises(ValueError, match="reach must be an int >= 0"):
        evaluate(model, task, **shape, reach=-1)
    assert set(evaluate(model, task, **shape, reach=2)) == {"loss", "accuracy"}  # mqar: none


def test_stack_evaluation_reports_accuracy_beyond_the_conv_reach():
    """The accuracy over the scored pops whose answer lies beyond the reach, counted by hand
    from the same batches."""
    task = make_task("stack", vocab_size=6)
    mixer_config = KDAConfig(hidden_size=8, num_heads=1, head_dim=8)
    config = ModelConfig(vocab_size=6, mixer="conv", num_layers=1, mixer_config=mixer_config)
    model = TinyLM(config, rngs=nnx.Rngs(0))
    reach = config.conv_reach
    scores = evaluate(model, task, batch_size=4, seq_len=24, num_batches=2, split="test",
                      reach=reach)  # fmt: skip
    correct = scored = 0
    key = _stream(0, TEST_STREAM)
    apply = nnx.jit(lambda model, tokens: model(tokens))  # one program each, not op by op
    draw = jax.jit(lambda key: task(key, 4, 24))  # the generator itself (not evaluate's drawer)
    answer_positions = jax.jit(stack_answer_positions)
    for i in range(2):
        batch = draw(jax.random.fold_in(key, i))
        positions = np.asarray(answer_positions(batch.inputs))
        beyond = np.asarray(batch.mask) & (np.arange(24) - positions > reach)
        guess = np.asarray(jnp.argmax(apply(model, batch.inputs), -1))
        correct += int((guess == np.asarray(batch.targets))[beyond].sum())
        scored += int(beyond.sum())
    assert scored > 0 and scores["beyond_reach_scored"] == scored
    assert scores["beyond_reach_accuracy"] == pytest.approx(correct / scored)
    # batch 4: the evaluation above's compiled step and batch drawer (the same model config)
    record = run_experiment("stack", mixer="conv", seq_len=24, steps=1, batch_size=4,
                            eval_batches=1, task_options=dict(vocab_size=6),
                            model_options=dict(hidden_size=8, num_layers=1, num_heads=1,
                                               head_dim=8))  # fmt: skip
    assert {"beyond_reach_accuracy", "beyond_reach_scored"} <= set(record["test"])
    assert {"beyond_reach_accuracy", "beyond_reach_scored"} <= set(record["validation"])


def test_old_records_are_read_as_validation_without_test():
    old = dict(eval=dict(loss=1.0, accuracy=0.5, batches=4))
    assert record_scores(old) == dict(validation=old["eval"], test=None)
    new = dict(eval=dict(accuracy=0.5), validation=dict(accuracy=0.5), test=dict(accuracy=0.4))
    assert record_scores(new) == dict(validation=new["validation"], test=new["test"])


def test_equal_task_settings_share_one_binding_and_so_one_compiled_batch_drawer():
    """make_task returns the same object for equal settings (defaults filled in), so a sweep's
    runs draw batches through one compilation; other settings get their own."""
    from kda_lib.lab import train

    first = train.make_task("mqar", vocab_size=32, num_pairs=4)
    assert train.make_task("mqar", num_pairs=4, vocab_size=32) is first
    assert train.make_task("mqar", vocab_size=32, num_pairs=8) is not first
    assert train._batch_drawer(first, 2, 32) is train._batch_drawer(
        train.make_task("mqar", vocab_size=32, num_pairs=4), 2, 32
    )
    assert first.keywords == dict(vocab_size=32, num_pairs=4)
