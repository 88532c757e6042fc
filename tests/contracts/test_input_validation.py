"""Bad input to the layer fails at the boundary, naming the argument, before any work.

KDAConfig at construction, ``init_cache``, the cache, ``x`` (type, dtype, empty; a NaN is not
read: NaN outputs), segment ids on the context-parallel layer exactly as on one device, and the
all-or-nothing fla loader.
Tiny shapes and the recurrent kernel: nothing here compiles more than a few small programs.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kda_lib import KDAConfig, KimiDeltaAttention
from kda_lib.layers.checkpoints import export_state_dict, load_state_dict

CFG = KDAConfig(hidden_size=8, num_heads=2, head_dim=4, implementation="recurrent")


def _layer(mesh=None, **changes):
    return KimiDeltaAttention(dataclasses.replace(CFG, **changes), rngs=nnx.Rngs(0), mesh=mesh)


def _x(batch=1, seq_len=4):
    return jax.random.normal(jax.random.key(1), (batch, seq_len, CFG.hidden_size))


# ------------------------------------------------------------------------------ KDAConfig
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dtype", "bogus", "KDAConfig.dtype must be a floating-point dtype"),
        ("dtype", jnp.int32, "KDAConfig.dtype must be a floating-point dtype"),
        ("param_dtype", jnp.int32, "KDAConfig.param_dtype must be a floating-point dtype"),
        ("param_dtype", None, "KDAConfig.param_dtype must be a floating-point dtype"),
        ("chunk_size", 48, "KDAConfig.chunk_size must be a power of two in [1, 4096], got 48"),
        ("chunk_size", 0, "KDAConfig.chunk_size must be a power of two in [1, 4096], got 0"),
        ("chunk_size", 64.0, "KDAConfig.chunk_size must be a power of two in [1, 4096], got 64.0"),
        ("hidden_size", True, "KDAConfig.hidden_size must be an int >= 1, got True"),
        ("num_heads", 2.0, "KDAConfig.num_heads must be an int >= 1, got 2.0"),
        ("value_head_dim", 0, "KDAConfig.value_head_dim must be None or a positive int"),
        ("conv_size", -1, "KDAConfig.conv_size must be an int >= 0"),
        ("forget_gate_rank", "4", "KDAConfig.forget_gate_rank must be None or a positive int"),
        ("output_gate_rank", 0, "KDAConfig.output_gate_rank must be None or a positive int"),
        ("gate_form", "sigmoid", "KDAConfig.gate_form must be one of ('softplus', "),
        ("gate_form", "safe_sigmoid", "KDAConfig.gate_form='safe_sigmoid' does not fit"),
        ("fused_qkv_conv", 1, "KDAConfig.fused_qkv_conv must be a bool"),
        ("norm_eps", "1e-5", "KDAConfig.norm_eps must be a finite number > 0"),
        ("norm_eps", float("nan"), "KDAConfig.norm_eps must be a finite number > 0"),
        ("allow_neg_eigval", "no", "KDAConfig.allow_neg_eigval must be a bool"),
        ("per_head_decay", 1, "KDAConfig.per_head_decay must be a bool"),
        ("implementation", "cuda", "KDAConfig.implementation must be 'auto' or one of"),
        ("implementation", None, "KDAConfig.implementation must be 'auto' or one of"),
        ("lower_bound", np.float32(-6.0), "lower_bound must be a float in"),
    ],
)
def test_config_rejects_bad_fields_at_construction(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        dataclasses.replace(CFG, **{field: value})


def test_config_accepts_numpy_scalars_and_dtype_names():
    cfg = KDAConfig(
        hidden_size=np.int64(8),
        num_heads=np.int32(2),
        head_dim=4,
        conv_size=np.int64(3),
        lower_bound=np.float32(-5.0),
        norm_eps=np.float32(1e-5),
        chunk_size=np.int64(32),
        allow_neg_eigval=np.bool_(True),
        dtype="bfloat16",
        param_dtype=np.float32,
    )
    # stored as Python numbers: equal configs hash alike whichever scalars built them
    assert type(cfg.hidden_size) is int and type(cfg.chunk_size) is int
    assert type(cfg.lower_bound) is float and cfg.lower_bound == -5.0
    assert type(cfg.allow_neg_eigval) is bool
    assert cfg == dataclasses.replace(cfg, hidden_size=8, num_heads=2, lower_bound=-5.0)


# ------------------------------------------------------------------------------ the cache
@pytest.mark.parametrize("batch_size", [-1, 0, 2.0, True, "2", None])
def test_init_cache_rejects_bad_batch_sizes(batch_size):
    with pytest.raises(ValueError, match=r"init_cache: batch_size must be a positive int, got"):
        _layer().init_cache(batch_size)


def test_init_cache_shapes_and_a_numpy_batch_size():
    cache = _layer().init_cache(np.int64(2))
    assert cache.state.shape == (2, 2, 4, 4) and cache.state.dtype == jnp.float32
    assert cache.q_conv.shape == (2, 3, 8) and cache.v_conv.shape == (2, 3, 8)
    assert _layer(conv_size=0).init_cache(1).q_conv is None


def test_a_cache_that_is_not_a_kdacache_is_rejected():
    layer = _layer()
    plain = tuple(layer.init_cache(1))
    with pytest.raises(ValueError, match=r"cache must be a KDACache, got tuple; .*init_cache\(1\)"):
        layer(_x(), cache=plain)
    broken = layer.init_cache(1)._replace(state=np.zeros((1, 2, 4, 4)).tolist())
    with pytest.raises(ValueError, match=r"cache.state must be a jax or numpy array, got list"):
        layer(_x(), cache=broken)
    ints = layer.init_cache(1)._replace(state=jnp.zeros((1, 2, 4, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"cache.state must be a floating-point array"):
        layer(_x(), cache=ints)


# ------------------------------------------------------------------------------ x
def test_x_must_be_a_floating_array():
    layer = _layer()
    with pytest.raises(ValueError, match=r"x must be a jax or numpy array, got list"):
        layer(np.asarray(_x()).tolist())
    with pytest.raises(ValueError, match=r"x must be a floating-point array, got dtype int32"):
        layer(jnp.ones((1, 4, 8), jnp.int32))
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, hidden_size=8\]"):
        layer(jnp.ones((4, 8)))
    with pytest.raises(ValueError, match=r"segment_ids must be a jax or numpy array, got list"):
        layer(_x(), segment_ids=[[1, 1, 2, 2]])


@pytest.mark.parametrize(
    ("shape", "empty"), [((1, 0, 8), "T = 0"), ((0, 4, 8), "B = 0"), ((0, 0, 8), "B and T = 0")]
)
def test_empty_x_raises_saying_what_is_empty(shape, empty):
    layer = _layer()
    with pytest.raises(ValueError, match=rf"x \[B, T, hidden\] is empty: {empty} \(shape"):
        layer(jnp.ones(shape))


def test_empty_prefill_raises_before_touching_the_cache():
    layer = _layer()
    with pytest.raises(ValueError, match=r"x \[B, T, hidden\] is empty: T = 0"):
        layer(jnp.ones((1, 0, 8)), cache=layer.init_cache(1))


def test_nan_in_x_is_not_read_on_the_host_and_gives_nan_outputs_from_its_token():
    """Issue 75.9: x is an activation, never read on the host (the eager call used to copy all
    of it to raise "x contains NaN/inf at [..]"). A NaN or inf in x gives NaN outputs from its
    token on, eager as under jit: never a silent finite result, and no error blames beta."""
    layer = _layer()
    for x, first in [(_x().at[0, 2, 5].set(jnp.nan), 2),
                     (_x().at[0, 3, 0].set(jnp.inf).at[0, 3, 1].set(-jnp.inf), 3)]:  # fmt: skip
        for y in (layer(x), jax.jit(lambda x: layer(x))(x)):
            bad = np.isnan(np.asarray(y)).any(axis=-1)[0]
            np.testing.assert_array_equal(bad, np.arange(4) >= first)
    # a numpy x is fine and gives what the jax array gives
    np.testing.assert_array_equal(layer(np.asarray(_x())), layer(_x()))


# ------------------------------------------------------------------------------ CP layer
def _mesh(ranks=2):
    return jax.make_mesh(
        (ranks,),
        ("context",),
        axis_types=(jax.sharding.AxisType.Auto,),
        devices=jax.devices()[:ranks],
    )


@pytest.mark.parametrize("with_mesh", [False, True], ids=["one_device", "context_parallel"])
@pytest.mark.parametrize(
    ("x", "ids", "message"),
    [
        (_x(), [[1, 2, 1, 1]], "segment_ids row 0 uses id 1 for two separate runs"),
        (_x(), [[1, -1, 2, 2]], r"segment_ids must be >= 0 \(0 = padding\), got min -1"),
        (_x(), [[1.0, 1.0, 2.0, 2.0]], "segment_ids must be an integer array"),
        (jnp.ones((1, 0, 8)), None, r"x \[B, T, hidden\] is empty: T = 0"),
        (jnp.ones((0, 4, 8)), None, r"x \[B, T, hidden\] is empty: B = 0"),
    ],
    ids=["reused_ids", "negative_ids", "float_ids", "empty_T", "empty_B"],
)
def test_context_parallel_layer_runs_the_one_device_checks(with_mesh, x, ids, message, monkeypatch):
    layer = _layer(mesh=_mesh() if with_mesh else None)
    # the checks come before any compilation: the CP forward (jitted inside) is never reached
    monkeypatch.setattr(layer, "_forward_context_parallel", None)
    monkeypatch.setattr(layer, "_forward", None)
    segment_ids = None if ids is None else jnp.asarray(ids)
    with pytest.raises(ValueError, match=message):
        layer(x, segment_ids=segment_ids)


# ------------------------------------------------------------------------------ fla loader
def _fla_state_dict(layer, offset=0.0):
    """An fla-layout state_dict holding ``layer``'s own weights (plus ``offset``)."""
    return {name: value + offset for name, value in export_state_dict(layer).items()}


def _params(layer):
    return export_state_dict(layer)


def test_fla_loader_round_trips_and_takes_lists():
    source, target = _layer(), KimiDeltaAttention(CFG, rngs=nnx.Rngs(7))
    state_dict = _fla_state_dict(source)
    state_dict["A_log"] = state_dict["A_log"].tolist()  # nested lists of numbers convert
    load_state_dict(target, state_dict)
    want, got = _params(source), _params(target)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("o_norm.weight", np.ones(7, np.float32), r"fla o_norm.weight: shape \(7,\) converts"),
        ("A_log", [None, None], "fla A_log: expected an array of real numbers, got dtype object"),
        ("A_log", np.array(["a", "b"]), "fla A_log: expected an array of real numbers"),
        ("dt_bias", np.ones(8, bool), "fla dt_bias: expected an array of real numbers"),
        ("dt_bias", np.full(8, np.nan), "fla dt_bias: contains NaN or inf"),
        ("q_proj.weight", [[1.0, 2.0], [3.0]], "fla q_proj.weight: not convertible"),
        ("k_conv1d.weight", np.ones((8, 4)), r"fla k_conv1d.weight: expected a depthwise Conv1d"),
    ],
)
def test_fla_loader_is_all_or_nothing(name, value, message):
    layer = _layer()
    before = _params(layer)
    state_dict = _fla_state_dict(layer, offset=1.0)  # every other entry valid and different
    state_dict[name] = value
    with pytest.raises(ValueError, match=message):
        load_state_dict(layer, state_dict)
    after = _params(layer)
    for param in before:
        np.testing.assert_array_equal(after[param], before[param], err_msg=param)


def test_fla_loader_rejects_a_non_mapping_and_wrong_names():
    layer = _layer()
    with pytest.raises(ValueError, match="state_dict must be a mapping of fla names to arrays"):
        load_state_dict(layer, list(_fla_state_dict(layer).items()))
    state_dict = _fla_state_dict(layer)
    state_dict["q_conv1d.bias"] = state_dict.pop("A_log")
    with pytest.raises(ValueError, match=r"missing \['A_log'\]; unexpected \['q_conv1d.bias'\]"):
        load_state_dict(layer, state_dict)


# ------------------------------------------------------- models, generation, training (issue 30)
def _tiny_lm(mixer="attention", **changes):
    from kda_lib.models.tiny_lm import ModelConfig, TinyLM

    config = dict(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2, head_dim=4)
    config.update(implementation="recurrent", mixer=mixer, **changes)
    return TinyLM(ModelConfig.from_flat(**config), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("mixer", ["attention", "conv", "kda"])
@pytest.mark.parametrize("bad_id", [8, 100, -1])
def test_token_ids_outside_the_vocabulary_are_named(mixer, bad_id):
    # an id >= vocab_size gave all-NaN logits (attention, conv) or blamed the layer input (KDA);
    # -1 silently became token vocab_size - 1
    model = _tiny_lm(mixer)
    tokens = jnp.asarray([[1, 2, bad_id]], jnp.int32)
    with pytest.raises(ValueError, match=r"tokens token ids must lie in \[0, 8\) \(vocab_size\)"):
        model(tokens)
    with pytest.raises(ValueError, match="tokens must hold integer token ids"):
        model(jnp.zeros((1, 3)))
    assert model(jnp.asarray([[0, 7]], jnp.int32)).shape == (1, 2, 8)


def test_score_text_checks_ids_and_windows():
    from kda_lib.lab.corpus import TextBatch
    from kda_lib.lab.generate import score_text

    model = _tiny_lm()
    good = np.ones((2, 4), np.int32)
    for field in ("inputs", "targets"):
        windows = dict(inputs=good, targets=good)
        windows[field] = np.full((2, 4), 9, np.int32)
        with pytest.raises(ValueError, match=rf"windows.{field} token ids must lie in \[0, 8\)"):
            score_text(model, TextBatch(**windows, mask=good > 0))
    empty = np.zeros((0, 4), np.int32)
    with pytest.raises(ValueError, match="windows must hold at least one window"):
        score_text(model, TextBatch(empty, empty, empty > 0))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # the mixer's fields live in its KDAConfig, which names them
        (dict(norm_eps=-1.0), "KDAConfig.norm_eps must be a finite number > 0, got -1.0"),
        (dict(norm_eps=float("nan")), "KDAConfig.norm_eps must be a finite number > 0"),
        (dict(norm_eps=True), "KDAConfig.norm_eps must be a finite number > 0, got True"),
        (dict(vocab_size=True), "ModelConfig.vocab_size must be an int >= 1, got True"),
        (dict(num_layers=True), "ModelConfig.num_layers must be an int >= 1, got True"),
        (dict(hidden_size=8.0), "KDAConfig.hidden_size must be an int >= 1, got 8.0"),
        (dict(mixer=["kda"]), "ModelConfig.mixer must be one of"),
        (dict(layers=("kda", ["attention"])), "ModelConfig.layers names unknown mixers"),
    ],
)
def test_model_config_rejects_bad_fields(changes, message):
    from kda_lib.models.tiny_lm import ModelConfig

    fields = {"vocab_size": 8, "num_layers": 2, "hidden_size": 8, **changes}
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig.from_flat(**fields)


def test_caches_from_another_model_are_named():
    model = _tiny_lm(layers=("kda", "attention"), num_layers=2)
    tokens = jnp.ones((2, 3), jnp.int32)
    other_order = _tiny_lm(layers=("attention", "kda"), num_layers=2).init_cache(2)
    with pytest.raises(ValueError, match="must be an AttentionCache, got KDACache"):
        model(tokens, cache=(other_order[1], other_order[1]))  # a KDA cache for attention
    with pytest.raises(ValueError, match="cache must be a KDACache"):
        model(tokens, cache=other_order)
    wrong_batch = model.init_cache(3)
    with pytest.raises(ValueError, match=r"cache\.\w+ has shape"):
        model(tokens, cache=wrong_batch)
    wrong_heads = _tiny_lm(layers=("kda", "attention"), num_layers=2, num_heads=1)
    cache = (model.init_cache(2)[0], wrong_heads.init_cache(2)[1])
    with pytest.raises(ValueError, match=r"cache\.keys has shape \(2, 0, 1, 4\), expected"):
        model(tokens, cache=cache)
    conv = _tiny_lm("conv")
    with pytest.raises(ValueError, match=r"cache for a conv layer must be an array of shape"):
        conv(tokens, cache=(jnp.zeros((3, 3, 8)),))
    logits, _ = model(tokens, cache=model.init_cache(2))
    assert logits.shape == (2, 3, 8)


def test_generate_takes_numpy_temperatures_and_names_bad_seeds_and_ragged_prompts():
    from kda_lib.lab.generate import generate

    model = _tiny_lm()
    out = generate(model, np.array([1, 2]), 2, temperature=np.float32(0.7), seed=np.int64(3))
    assert out.shape == (4,)
    for seed in (2**64, 2**63, -1, 1.0, True):
        with pytest.raises(ValueError, match="seed must be an int"):
            generate(model, np.array([1, 2]), 2, seed=seed)
    with pytest.raises(ValueError, match=r"every row the same length"):
        generate(model, [[1, 2], [3]], 2)


def test_train_and_evaluate_name_bad_counts_and_rates():
    from kda_lib.lab.tasks import delayed_copy
    from kda_lib.lab.train import evaluate, train

    model = _tiny_lm("conv")

    def task(key, batch, seq_len):
        return delayed_copy(key, batch, seq_len, vocab_size=8, delay=1)

    shape = dict(batch_size=1, seq_len=4)
    for kwargs, message in [
        (dict(steps=2.5), "steps must be an int >= 1, got 2.5"),
        (dict(steps=True), "steps must be an int >= 1, got True"),
        (dict(steps=2, learning_rate=-0.05), "learning_rate must be a number >= 0, got -0.05"),
        (dict(steps=2, seed=2**64), "seed must be an int in [0, 2**63 - 1]"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            train(model, task, **shape, **kwargs)
    with pytest.raises(ValueError, match=re.escape("num_batches must be an int >= 1, got 2.5")):
        evaluate(model, task, **shape, num_batches=2.5)


def test_train_cli_names_a_seed_out_of_range(capsys):
    from kda_lib.lab.train_cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["stack", "--seed", str(2**64)])
    assert exit_info.value.code == 2
    assert "--seed must lie in [0, 2**63 - 1]" in capsys.readouterr().err


# ------------------------------------------------------------- files (issue 30)
def test_recorded_and_benchmark_files_that_cannot_be_read_are_named(tmp_path, monkeypatch):
    from kda_lib.lab import records

    monkeypatch.setattr(records, "recorded_dir", lambda kind: tmp_path)
    (tmp_path / "latin1.json").write_bytes(b'{"name": "caf\xe9"}')
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"latin1\.json is not UTF-8 text"):
        records.load_recorded("results", "latin1.json")
    with pytest.raises(ValueError, match=r"deep\.json is nested too deeply to parse"):
        records.load_recorded("results", "deep.json")
    runs, notes = records.load_benchmark_runs(tmp_path)
    assert runs == []
    assert any(n.startswith("deep.json: unreadable (nested too deeply") for n in notes), notes
    assert any(n.startswith("latin1.json: unreadable") for n in notes), notes


def test_stdlib_corpus_reads_file_names_that_are_not_utf8(tmp_path):
    import os

    from kda_lib.lab.corpus import load_stdlib_corpus

    for i in range(20):
        (tmp_path / f"m{i}.py").write_text(f"x = {i}\n")
    try:
        with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.py"), "wb") as file:
            file.write(b"y = 1\n")
    except OSError:
        pytest.skip("this filesystem refuses file names that are not UTF-8")
    corpus = load_stdlib_corpus(tmp_path, validation_fraction=0.3)
    names = corpus.train_files + corpus.validation_files
    assert len(names) == 21 and os.fsdecode(b"caf\xe9.py") in names


# ------------------------------------------------------------- notebook parameters (issue 30)
@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("seq_len", -5, "notebook parameter seq_len must be an int >= 1, got -5"),
        ("seq_len", "abc", "notebook parameter seq_len must be an int >= 1, got 'abc'"),
        ("num_heads", 0, "notebook parameter num_heads must be an int >= 1, got 0"),
        ("num_heads", True, "notebook parameter num_heads must be an int >= 1, got True"),
        ("seed", -1, "notebook parameter seed must be an int >= 0, got -1"),
        ("lower_bound", float("nan"), "notebook parameter lower_bound must be a finite number"),
        ("timing_backward", "yes", "notebook parameter timing_backward must be True or False"),
        ("lengths", [256, 0], "lengths must be a list whose entries are each an int >= 1"),
        ("lengths", 256, "notebook parameter lengths must be a list, got 256"),
        ("implementation", 3, "notebook parameter implementation must be a str, got 3"),
    ],
)
def test_notebook_parameters_are_checked_by_name(name, value, message):
    from kda_lib.teaching.notebook import check_parameters

    namespace = dict(
        seq_len=128, num_heads=2, seed=0, lower_bound=-5.0, timing_backward=False,
        lengths=[256], implementation="chunked", conv_size=0,
    )  # fmt: skip
    namespace["__annotations__"] = {
        "seq_len": int, "num_heads": int, "seed": int, "lower_bound": float,
        "timing_backward": bool, "lengths": list[int], "implementation": str, "conv_size": int,
    }  # fmt: skip
    check_parameters(namespace)  # the defaults pass (conv_size 0: no convolution)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_parameters({**namespace, name: value})


def test_every_notebook_checks_its_parameters_before_its_setup():
    import pathlib

    import jupytext

    sources = sorted(pathlib.Path(__file__).parents[2].glob("notebooks/[0-9][0-9]_*.py"))
    assert len(sources) >= 11
    for source in sources:
        cells = [c for c in jupytext.read(source).cells if c.cell_type == "code"]
        index = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
        install = next(i for i, c in enumerate(cells) if c.source.startswith("# Install"))
        assert install > index, source.name
        # the imports-and-setup cell: the check (options may follow) before setup() and any work
        code = cells[install + 1].source
        check = code.index("kda_lib.teaching.notebook.check_parameters(globals()")
        assert check < code.index("\nkda_lib.teaching.notebook.setup("), source.name


def test_conv_size_has_an_upper_bound():
    # issue 30: compiling a gradient took 38 s at conv_size 1024 and minutes at 4096
    from kda_lib.layers.kda_layer import MAX_CONV_SIZE

    assert dataclasses.replace(CFG, conv_size=MAX_CONV_SIZE).conv_size == MAX_CONV_SIZE
    with pytest.raises(ValueError, match=r"KDAConfig.conv_size must be <= 64 \(a short conv"):
        dataclasses.replace(CFG, conv_size=MAX_CONV_SIZE + 1)


# ------------------------------------------------------------- records (issue 37)
def test_write_json_keeps_the_mode_of_an_existing_file(tmp_path):
    import os
    import stat

    from kda_lib.lab.records import write_json

    path = tmp_path / "private.json"
    path.write_text("{}")
    os.chmod(path, 0o600)
    write_json({"a": 1}, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip().startswith("{")


def test_write_json_writes_through_a_symlink_and_keeps_the_link(tmp_path):
    import json

    from kda_lib.lab.records import write_json

    target = tmp_path / "store" / "run.json"
    target.parent.mkdir()
    target.write_text("{}")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    write_json({"b": 2}, link)
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert json.loads(target.read_text()) == {"b": 2}


def test_benchmark_runs_drop_non_finite_timings_and_non_int_t(tmp_path):
    import json

    from kda_lib.lab.records import load_benchmark_runs

    good = {"impl": "chunked", "T": 64, "mode": "fwd", "median_ms": 1.5}
    bad = [
        {**good, "median_ms": float("nan")},
        {**good, "median_ms": float("-inf")},
        {**good, "median_ms": float("inf")},
        {**good, "T": True},
        {**good, "T": 64.0},
    ]
    (tmp_path / "run.json").write_text(json.dumps({"platform": "cpu", "records": [good, *bad]}))
    runs, notes = load_benchmark_runs(tmp_path)
    assert [r["records"] for r in runs] == [[good]]
    assert any("5 records" in n for n in notes), notes
