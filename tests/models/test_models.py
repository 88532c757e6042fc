"""kda_lib.models.tiny_lm: per-layer mixer patterns (Kimi Linear's hybrid), decoding across mixed
layers, NoPE attention, attention with short convolutions, fixed-capacity attention caches and
equal-parameter configs; the training command line's --layers."""

import dataclasses
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jitted_call
from flax import nnx

from kda_lib.lab.train_cli import main as train_main
from kda_lib.layers.attention import AttentionCache, AttentionConfig, CausalSelfAttention
from kda_lib.layers.kda_layer import KDACache, KDAConfig
from kda_lib.layers.params import parameter_count
from kda_lib.models.tiny_lm import (
    ModelConfig,
    TinyLM,
    config_param_count,
    match_parameter_count,
)

HYBRID = ModelConfig(
    vocab_size=11,
    num_layers=4,
    layers=("kda", "kda", "kda", "attention"),
    rope=False,
    mixer_config=KDAConfig(hidden_size=16, num_heads=2, head_dim=8, implementation="recurrent"),
)


def _with_mixer(config: ModelConfig, **changes) -> ModelConfig:
    """``config`` with ``changes`` to its mixer's KDAConfig."""
    return dataclasses.replace(
        config, mixer_config=dataclasses.replace(config.mixer_config, **changes)
    )


def _apply(model, tokens, cache=None):
    return model(tokens, cache=cache)


_jitted = nnx.jit(_apply)


def test_hybrid_prefill_then_decode_equals_full_forward():
    """A growing attention cache (a new shape, so a new program, each step) beside a fixed KDA
    state (one layer of each: the hybrid's 3:1 pattern tiles the same two kinds of layer,
    test_pattern_is_tiled_and_validated). A fixed-capacity attention cache beside KDA, GDN,
    Mamba2 and conv layers: tests/lab/test_train.py::test_shapes_and_cache_decoding."""
    model = TinyLM(dataclasses.replace(HYBRID, num_layers=2, layers=("kda", "attention")),
                   rngs=nnx.Rngs(3))  # fmt: skip
    kinds = [type(b.mixer).__name__ for b in model.blocks]
    assert kinds == ["KimiDeltaAttention", "CausalSelfAttention"]
    tokens = jax.random.randint(jax.random.key(0), (2, 11), 0, 11)
    full = _jitted(model, tokens)
    out, cache = _jitted(model, tokens[:, :9], model.init_cache(2))
    pieces = [out]
    for t in range(9, 11):
        out, cache = _jitted(model, tokens[:, t : t + 1], cache)
        pieces.append(out)
    np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, atol=3e-5, rtol=3e-5)
    # one cache per layer, of its own kind: a fixed KDA state, a growing KV buffer
    assert [type(c) for c in cache] == [KDACache, AttentionCache]
    assert cache[0].state.shape == (2, 2, 8, 8)
    assert cache[1].keys.shape == (2, 11, 2, 8)
    assert int(cache[1].seen) == 11


def test_pattern_is_tiled_and_validated():
    cfg = ModelConfig(vocab_size=5, num_layers=8, layers=["kda", "kda", "kda", "attention"])
    assert cfg.layers == ("kda", "kda", "kda", "attention")  # a list is stored as a tuple
    assert cfg.layer_mixers == ("kda", "kda", "kda", "attention") * 2
    assert cfg.label == "kda3-attention"
    assert ModelConfig(vocab_size=5, mixer="gdn", num_layers=3).layer_mixers == ("gdn",) * 3
    assert ModelConfig(vocab_size=5, mixer="gdn").label == "gdn"
    assert ModelConfig(vocab_size=5, num_layers=2, layers=("conv",)).label == "conv"
    hash(cfg)  # static config of a jitted model: must hash
    bad = [
        (dict(layers=("kda", "nope")), r"layers names unknown mixers \['nope'\]"),
        (dict(layers="kda"), "layers must be a tuple of mixer names"),
        (dict(num_layers=3, layers=("kda", "attention")), "num_layers=3 is not a multiple"),
        (dict(rope=1), "rope must be a bool"),
        (dict(mlp_width=0), "mlp_width must be None or a positive int"),
    ]
    for changes, message in bad:
        with pytest.raises(ValueError, match=message):
            ModelConfig(vocab_size=5, **changes)


def test_nope_attention_sees_a_set_and_rope_an_order():
    """Without positions, causal attention at the last token is blind to the order of the
    earlier tokens; with RoPE it is not."""
    cfg = dataclasses.replace(HYBRID, num_layers=1, layers=("attention",))
    x = jax.random.normal(jax.random.key(1), (1, 6, 16))
    swapped = x[:, jnp.array([1, 0, 3, 2, 4, 5])]
    for rope in (False, True):
        layer = CausalSelfAttention(
            AttentionConfig(hidden_size=16, num_heads=2, head_dim=8, rope=rope), rngs=nnx.Rngs(0)
        )
        y, y_swapped = (_jitted(layer, a)[0, -1] for a in (x, swapped))  # one program
        if rope:
            assert float(jnp.abs(y - y_swapped).max()) > 1e-4
        else:
            np.testing.assert_allclose(y, y_swapped, atol=1e-5)
    model = TinyLM(dataclasses.replace(cfg, rope=False), rngs=nnx.Rngs(0))
    assert model.blocks[0].mixer.config.rope is False


def test_attention_with_short_conv_decodes_and_sees_its_predecessor():
    cfg = dataclasses.replace(HYBRID, num_layers=2, layers=("attention_conv", "attention"))
    model = TinyLM(cfg, rngs=nnx.Rngs(0))
    mixer = model.blocks[0].mixer
    assert mixer.config.short_conv and mixer.q_conv1d.kernel.shape == (4, 16)
    tokens = jax.random.randint(jax.random.key(2), (1, 9), 0, 11)
    full = _jitted(model, tokens)
    out, cache = _jitted(model, tokens[:, :4], model.init_cache(1, max_len=9))
    pieces = [out]
    for t in range(4, 9):
        out, cache = _jitted(model, tokens[:, t : t + 1], cache)
        pieces.append(out)
    np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, atol=3e-5, rtol=3e-5)
    assert cache[0].k_conv.shape == (1, 3, 16) and cache[1].k_conv is None
    # the key at position t mixes the inputs t-3..t: d k_t / d x_s != 0 exactly there
    x = jax.random.normal(jax.random.key(3), (1, 8, 16))
    jac = jax.jit(jax.jacobian(lambda x: mixer.k_conv1d(mixer.k_proj(x))[0][0, 6]))(x)[:, 0]
    reach = np.abs(np.asarray(jac)).sum(axis=(0, 2))
    assert (reach[3:7] > 0).all() and (reach[:3] == 0).all() and (reach[7:] == 0).all()


@pytest.mark.parametrize("mixer", ["attention_conv", "mamba2", "conv"])
def test_the_short_convs_run_on_inputs_checked_once_at_the_entry(mixer, monkeypatch):
    """x, the cache and the segment ids are checked once, where they enter the layer; its
    short convs run unchecked (ShortConvolution's checked entry is never called). Under jit:
    the checks run while tracing (a new closure traces again; its program is the compiled one
    of the first, from the compile cache), and eager calls would compile every small op."""
    import kda_lib.layers.attention as attention
    from kda_lib.layers.conv import ShortConvolution

    cfg = dataclasses.replace(HYBRID, layers=(), mixer=mixer, num_layers=1)
    layer = TinyLM(cfg, rngs=nnx.Rngs(0)).blocks[0].mixer
    x = jax.random.normal(jax.random.key(4), (2, 7, 16))
    ids = jnp.asarray([[1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    want = [jitted_call(layer, x, segment_ids=ids),
            jitted_call(layer, x[:, :3], cache=layer.init_cache(2))[0]]  # fmt: skip
    checks = []
    original = attention.check_segment_ids
    monkeypatch.setattr(attention, "check_segment_ids", lambda *a: checks.append(a) or original(*a))
    monkeypatch.setattr(ShortConvolution, "__call__", lambda *a, **k: pytest.fail("checked again"))
    traced_again = nnx.jit(lambda module, x, **kwargs: module(x, **kwargs))
    got = [traced_again(layer, x, segment_ids=ids),
           traced_again(layer, x[:, :3], cache=layer.init_cache(2))[0]]  # fmt: skip
    assert len(checks) == 1
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_fixed_capacity_cache_overflow_is_loud():
    model = TinyLM(
        dataclasses.replace(HYBRID, num_layers=1, layers=("attention",)), rngs=nnx.Rngs(0)
    )
    tokens = jnp.zeros((1, 5), jnp.int32)
    with pytest.raises(ValueError, match="holds 4 tokens; 0 are filled, 5 more do not fit"):
        model(tokens, cache=model.init_cache(1, max_len=4))
    # under jit the fill level is not known while tracing: the outputs become NaN instead
    # (two programs: 2 and 3 new tokens)
    logits, cache = _jitted(model, tokens[:, :2], model.init_cache(1, max_len=4))
    assert bool(jnp.isfinite(logits).all())
    logits, _ = _jitted(model, tokens[:, :3], cache)
    assert bool(jnp.isnan(logits).all())
    logits, _ = _jitted(model, tokens[:, :2], cache)  # fills it exactly
    assert bool(jnp.isfinite(logits).all())
    with pytest.raises(ValueError, match="max_len must be None or a positive int"):
        model.init_cache(1, max_len=0)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        model.init_cache(0)
    with pytest.raises(ValueError, match="one entry per block"):
        model(tokens, cache=())


# a config's parameter count (an abstract model built, ~0.1 s), the same one-unit configs for
# both targets: counted once per config
_param_count = functools.cache(config_param_count)


@pytest.mark.parametrize("target", [9_000, 20_000])
def test_equal_parameter_counts_across_mixers(target, monkeypatch):
    from kda_lib.models import tiny_lm

    monkeypatch.setattr(tiny_lm, "config_param_count", _param_count)  # match_parameter_count's
    config_param_count = _param_count
    base = dataclasses.replace(HYBRID, layers=())
    sizes = {}
    for layers in [("attention",), ("kda",), ("gdn",), HYBRID.layers]:
        cfg = match_parameter_count(dataclasses.replace(base, layers=layers), target)
        sizes[cfg.label] = config_param_count(cfg)
        # one MLP unit more or less moves the count by 4 * (2 * 16 + 1) = 132
        assert abs(sizes[cfg.label] - target) <= 66, (cfg.label, sizes[cfg.label])
    assert parameter_count(TinyLM(cfg, rngs=nnx.Rngs(0))) == sizes[cfg.label]
    with pytest.raises(ValueError, match="below what kda needs"):
        match_parameter_count(dataclasses.replace(base, mixer="kda"), 100)


def test_train_command_line_takes_a_layer_pattern(tmp_path, capsys):
    """A conv layer beside attention: the pattern is the point, and its training step compiles
    faster than KDA's (KDA in TinyLM training: tests/lab/test_train.py)."""
    out = tmp_path / "hybrid.json"
    args = [
        "mqar",
        "--layers",
        "conv,attention",
        "--no-rope",
        "--steps",
        "2",
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--vocab-size",
        "16",
        "--num-pairs",
        "2",
        "--hidden-size",
        "16",
        "--num-heads",
        "2",
        "--head-dim",
        "8",
        "--eval-batches",
        "1",
        "--log-every",
        "1",
        "--implementation",
        "recurrent",
        "--progress",
        "none",
        "--output",
        str(out),
    ]
    record = train_main(args)
    saved = json.loads(out.read_text())
    assert record["mixer"] == saved["mixer"] == "conv-attention"
    assert saved["model"]["layers"] == ["conv", "attention"] and saved["model"]["num_layers"] == 2
    assert saved["model"]["rope"] is False and saved["model"]["implementation"] == "recurrent"
    assert "mqar / conv-attention, T=16" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        train_main(["mqar", "--layers", "kda,transformer", "--output", str(out)])
    assert "unknown mixers ['transformer']" in capsys.readouterr().err


def _norm_epsilons(module) -> list[float]:
    """The epsilon of every norm inside ``module``: nnx.RMSNorm's ``epsilon`` and the
    ``norm_eps`` a mixer hands its gated output norm (on the mixer or in its config)."""
    found = []
    for _, node in nnx.iter_graph(module):
        if isinstance(node, nnx.RMSNorm):
            found.append(node.epsilon)
        elif isinstance(node, nnx.Module):
            owner = getattr(node, "config", node)
            if hasattr(owner, "norm_eps") and not isinstance(owner, ModelConfig):
                found.append(owner.norm_eps)
    return found


@pytest.mark.parametrize(
    "mixer", ["kda", "gdn", "mamba2", "attention", "attention_conv", "conv", "mla"]
)
def test_norm_eps_reaches_every_norm_of_every_mixer(mixer):
    cfg = dataclasses.replace(
        _with_mixer(HYBRID, norm_eps=0.25), layers=(), mixer=mixer, num_layers=1
    )
    model = nnx.eval_shape(lambda: TinyLM(cfg, rngs=nnx.Rngs(0)))
    epsilons = _norm_epsilons(model)
    # the block's two norms and the final norm, plus the mixer's own (none in attention;
    # MLA: its config and its latent RMSNorm)
    own = {"attention": 0, "attention_conv": 0, "mla": 2}.get(mixer, 1)
    assert len(epsilons) == 3 + own, epsilons
    assert set(epsilons) == {0.25}, epsilons


def test_norm_eps_changes_the_kda_mixer_output():
    x = jax.random.normal(jax.random.key(3), (1, 5, 16)) * 1e-2  # small: eps matters
    outs = []
    for eps in (1e-5, 0.25):
        cfg = dataclasses.replace(_with_mixer(HYBRID, norm_eps=eps), layers=(), num_layers=1)
        outs.append(_jitted(TinyLM(cfg, rngs=nnx.Rngs(0)).blocks[0].mixer, x))
    assert float(jnp.abs(outs[0] - outs[1]).max()) > 1e-3


@pytest.mark.parametrize(
    "field, value",
    [
        ("vocab_size", True),
        ("num_layers", True),
        ("mlp_ratio", True),
        ("mlp_width", True),
        ("kv_lora_rank", True),
        ("mlp_ratio", 2.0),
        ("kv_lora_rank", np.bool_(True)),
    ],
)
def test_model_config_refuses_a_bool_or_float_for_an_int_field(field, value):
    with pytest.raises(ValueError, match=f"ModelConfig.{field} must be"):
        dataclasses.replace(HYBRID, **{field: value})


@pytest.mark.parametrize(
    "field, value",
    [
        ("hidden_size", True),
        ("num_heads", True),
        ("head_dim", True),
        ("value_head_dim", True),
        ("conv_size", True),
        ("chunk_size", True),
        ("num_heads", 2.0),
        ("head_dim", np.bool_(True)),
    ],
)
def test_the_mixer_widths_are_checked_once_by_kda_config(field, value):
    """ModelConfig declares no mixer width: a bad one is refused by the KDAConfig it lives in,
    built directly or from flat names."""
    with pytest.raises(ValueError, match=f"KDAConfig.{field} must be"):
        ModelConfig.from_flat(vocab_size=5, **{field: value})
    with pytest.raises(ValueError, match=f"KDAConfig.{field} must be"):
        _with_mixer(HYBRID, **{field: value})


def test_mixer_config_is_the_one_place_of_the_mixer_fields():
    shared = {f.name for f in dataclasses.fields(ModelConfig)}
    assert not shared & {f.name for f in dataclasses.fields(KDAConfig)}
    cfg = HYBRID
    assert (cfg.hidden_size, cfg.norm_eps) == (16, cfg.mixer_config.norm_eps)
    with pytest.raises(ValueError, match="ModelConfig.mixer_config must be a KDAConfig"):
        ModelConfig(vocab_size=5, mixer_config=dict(hidden_size=16))
    with pytest.raises(ValueError, match=r"from_flat got fields \['heads'\]"):
        ModelConfig.from_flat(vocab_size=5, heads=2)


@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(gate_form=None, lower_bound=-5.0, num_v_heads=4, param_dtype=jnp.bfloat16),
        dict(gate_form="clamped_softplus", lower_bound=-3.0, forget_gate_rank=4),
    ],
)
def test_a_record_reads_back_as_the_same_config(changes):
    cfg = dataclasses.replace(_with_mixer(HYBRID, **changes), kv_lora_rank=6, mlp_width=5)
    record = json.loads(json.dumps(cfg.record()))  # JSON-ready: dtypes by name
    assert record["hidden_size"] == 16 and record["num_layers"] == 4
    back = ModelConfig.from_flat(**record)
    assert back == cfg and hash(back) == hash(cfg)


def test_the_recorded_model_dicts_still_read():
    """Every ``model`` dict in data/results (flat names, recorded before mixer_config
    existed) builds its config."""
    root = pathlib.Path(__file__).resolve().parents[2] / "data" / "results"
    records = []

    def collect(node):
        if isinstance(node, list):
            for item in node:
                collect(item)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key == "model" and isinstance(value, dict):
                    records.append(value)  # an experiment record's ModelConfig
                elif key == "models" and isinstance(value, dict):
                    records.extend(m["config"] for m in value.values() if "config" in m)
                else:
                    collect(value)

    for path in sorted(root.rglob("*.json")):
        collect(json.loads(path.read_text()))
    assert len(records) > 10
    for record in records:
        cfg = ModelConfig.from_flat(**record)
        assert (cfg.hidden_size, cfg.num_layers) == (record["hidden_size"], record["num_layers"])
        assert cfg.mixer_config.head_dim == record["head_dim"]


def test_a_deep_model_is_refused_from_its_layers_arithmetic_not_by_building_them(monkeypatch):
    """Issue 75.1: TinyLM's memory check builds (as shapes) at most two copies of the layer
    pattern, then counts; 1,000 wide layers are refused at once (it built all 1,000 first:
    ~0.05 s each), and ModelConfig refuses more layers than 8x any published model. Naming the
    size behind the bytes (checks.dominant_size) counts again with each size field at 1: 38
    small blocks for this config, whatever num_layers is."""
    from kda_lib.models import tiny_lm

    built, block = [], tiny_lm.Block

    def counted(*args, **kwargs):
        built.append(args[1])
        if len(built) > 64:
            pytest.fail("the memory check builds every layer")
        return block(*args, **kwargs)

    monkeypatch.setattr(tiny_lm, "Block", counted)
    wide = KDAConfig(hidden_size=1024, num_heads=8, head_dim=128)
    config = ModelConfig(vocab_size=8, num_layers=1_000, mixer_config=wide,
                         layers=("kda", "attention"))  # fmt: skip
    with pytest.raises(ValueError, match=r"hidden_size=1024: the parameters of TinyLM would take "
                       r"~35\.2 GiB"):
        TinyLM(config, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"ModelConfig\.num_layers must be <= 1,024"):
        ModelConfig(vocab_size=8, num_layers=10**7)


def test_the_parameter_bytes_arithmetic_matches_the_built_model():
    """What the memory check counts for N layers (two pattern copies built, then arithmetic)
    equals the whole model's bytes built as shapes."""
    from kda_lib.models.tiny_lm import _parameter_bytes

    config = dataclasses.replace(HYBRID, num_layers=12)
    assert _parameter_bytes(config) == 4 * config_param_count(config)
