"""Sizes are estimated before anything is allocated (issue 37, finding 5).

A size whose estimate exceeds this machine's memory is refused with a ValueError (argparse's
exit status 2 on the command lines) naming the argument and the estimate: ``KDAConfig``'s
widths (where the layer is built: a config may describe a larger machine's layer),
``max_num_segments`` (tokamax's per-segment states, capped at
T), ``kda-train``'s counts and sizes and ``kda-bench``'s shapes. The refusals are fast: no
array of the refused size exists, nothing compiles (``jax.eval_shape`` gives a kernel call
its shapes). Reasonable sizes still pass. Also the regressions of this round's hostile pass
over the config vocabulary (``gate_form``, ``lower_bound``, the gate ranks).
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from kda_lib import KDAConfig, KimiDeltaAttention, kda
from kda_lib.checks import (
    allocation_problem,
    check_allocation,
    format_bytes,
    memory_limit,
)
from kda_lib.layers.params import parameter_count
from kda_lib.models.presets import KIMI_LINEAR_48B
from kda_lib.ops.contract import Dims
from kda_lib.ops.tokamax.adapter import TOKAMAX_VARIANTS, segment_slot_count, segment_slots_problem

SMALL = dict(hidden_size=16, num_heads=2, head_dim=4)
# an estimate with a unit from TiB up: more than any machine these tests run on
HUGE = r"~[\d.]+ (TiB|PiB|EiB|ZiB|YiB) \(more than this machine's memory, [\d.]+ \w+\)"


# ------------------------------------------------------------------ the helper
def test_check_allocation_names_the_argument_and_the_estimate():
    gib = 2**30
    check_allocation("x", 3, "three things", 2 * gib, limit=4 * gib)  # fits: nothing
    with pytest.raises(ValueError) as error:
        check_allocation("KDAConfig.num_v_heads", 2**40, "the layer's parameters", 4 * 2**40,
                         limit=23 * gib)  # fmt: skip
    assert str(error.value) == (
        "KDAConfig.num_v_heads=1099511627776: the layer's parameters would take ~4.0 TiB "
        "(more than this machine's memory, 23.0 GiB)"
    )
    assert allocation_problem("y", 10, limit=10) is None  # the limit itself fits
    assert [format_bytes(n) for n in (512, 1536, 5 * 2**20, 300 * 2**30)] == [
        "512 B",
        "1.5 KiB",
        "5.0 MiB",
        "300 GiB",
    ]


def test_memory_limit_is_this_machines_physical_memory():
    limit = memory_limit()
    assert isinstance(limit, int) and 2**28 < limit < 2**60


# ------------------------------------------------------------------ KDAConfig's widths
def _build(config):
    return KimiDeltaAttention(config, rngs=nnx.Rngs(0))


def test_layer_refuses_2_pow_40_value_heads_naming_the_field_and_the_estimate():
    """Issue 55, finding 5: the config describes the layer (it may be for a larger machine);
    building it here is refused before any parameter exists, and eval_shape gives its shapes."""
    config = KDAConfig(hidden_size=64, num_heads=1, head_dim=16, num_v_heads=2**40)
    says = r"^KDAConfig\.num_v_heads=1099511627776: the parameters of KimiDeltaAttention would "
    with pytest.raises(ValueError, match=says + r"take " + HUGE):
        _build(config)
    assert parameter_count(nnx.eval_shape(lambda: _build(config))) > 2**40


WIDTHS = ("hidden_size", "num_heads", "head_dim", "value_head_dim", "forget_gate_rank",
          "output_gate_rank")  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(WIDTHS), power=st.integers(40, 80))
def test_any_width_too_large_for_memory_is_refused_by_name_where_it_is_built(name, power):
    config = KDAConfig(**{**SMALL, name: 2**power})  # the config constructs
    with pytest.raises(ValueError, match=rf"^KDAConfig\.{name}={2**power}: .*" + HUGE):
        _build(config)


def test_reasonable_and_published_widths_pass():
    _build(KDAConfig(**SMALL))
    KDAConfig(hidden_size=4096, num_heads=32, head_dim=128, num_v_heads=64)  # ~1.5 GiB
    published = nnx.eval_shape(lambda: _build(KIMI_LINEAR_48B.kda_config()))
    assert parameter_count(published) == KIMI_LINEAR_48B.kda_parameter_count()


# ------------------------------------------------------------------ max_num_segments
def _abstract_kernel_inputs(batch, seq_len, heads, key_dim, value_dim):
    shape = jax.ShapeDtypeStruct
    return (
        shape((batch, seq_len, heads, key_dim), jnp.bfloat16),
        shape((batch, seq_len, heads, key_dim), jnp.bfloat16),
        shape((batch, seq_len, heads, value_dim), jnp.bfloat16),
        shape((batch, seq_len, heads, key_dim), jnp.float32),
        shape((batch, seq_len, heads), jnp.float32),
        shape((batch, seq_len), jnp.int32),
    )


@pytest.mark.parametrize("implementation", ["tokamax_xla", "tokamax_xla_chunked"])
def test_kda_refuses_segment_slots_that_cannot_fit_before_tracing_the_kernel(implementation):
    """``max_num_segments=10**9`` at a T whose slots (capped at T) still cannot fit: refused
    by name with the slots' shape and estimate, from the shapes alone (eval_shape: nothing is
    allocated or compiled)."""
    gate = dict(a_log=jnp.zeros(256), dt_bias=jnp.zeros(256 * 128), lower_bound=-5.0,
                use_gate_in_kernel=True)  # fmt: skip

    def call(q, k, v, g, beta, ids):
        return kda(q, k, v, g, beta, segment_ids=ids, max_num_segments=10**9,
                   implementation=implementation, **gate)  # fmt: skip

    expected = (
        rf"max_num_segments=1000000000: {implementation}'s per-segment states "
        r"\[B, slots, HV, K, V\] = \[1, 16777216, 256, 128, 128\] \(float32.*\) would take "
        r"~256 TiB"
    )
    with pytest.raises(ValueError, match=expected):
        jax.eval_shape(call, *_abstract_kernel_inputs(1, 2**24, 256, 128, 128))


def test_layer_refuses_its_configs_segment_bound_before_any_work():
    config = KDAConfig(hidden_size=16, num_heads=4, head_dim=32, implementation="tokamax_xla",
                       max_num_segments=10**9)  # fmt: skip
    layer = KimiDeltaAttention(config, rngs=nnx.Rngs(0))
    x = jax.ShapeDtypeStruct((1, 2**30, 16), jnp.float32)
    ids = jax.ShapeDtypeStruct((1, 2**30), jnp.int32)
    with pytest.raises(ValueError, match=r"^KDAConfig\.max_num_segments=1000000000: .*" + HUGE):
        jax.eval_shape(lambda x, ids: layer(x, segment_ids=ids), x, ids)


def test_a_bound_above_t_gives_t_slots_and_the_same_result():
    """One real segment and ``max_num_segments=10**9`` used to ask tokamax's XLA forms for 10**9
    state slots (~256 GB here); the slots are capped at T and the result is unchanged."""
    for name, variant in TOKAMAX_VARIANTS.items():
        cap = 64 if variant.mosaic else 8  # Mosaic: T rounded up to its 64-token chunk
        assert segment_slot_count(variant, 10**9, 8) == cap, name
        assert segment_slot_count(variant, 3, 8) == 3, name
    assert segment_slot_count(TOKAMAX_VARIANTS["tokamax_mosaic"], 10**9, 8, segments_per_row=1) == 1
    assert segment_slots_problem("tokamax_xla", Dims(1, 8, 1, 4, 4, 1), 10**9) is None
    assert segment_slots_problem("chunked", Dims(1, 2**40, 64, 128, 128, 1), 10**9) is None
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(1, 8, 1, 4)), jnp.float32)
    g = -jnp.abs(jnp.asarray(rng.normal(size=(1, 8, 1, 4)), jnp.float32))
    beta, ids = jnp.full((1, 8, 1), 0.5), jnp.ones((1, 8), jnp.int32)
    capped, _ = kda(q, q, q, g, beta, segment_ids=ids, max_num_segments=10**9,
                    implementation="tokamax_xla")  # fmt: skip
    reference, _ = kda(q, q, q, g, beta, segment_ids=ids, implementation="recurrent")
    np.testing.assert_allclose(capped, reference, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ kda-train
def _train_error(capsys, tmp_path, *options) -> str:
    from kda_lib.lab.train_cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["mqar", *options, "--output", str(tmp_path / "run.json"), "--progress", "none"])
    assert exit_info.value.code == 2
    assert not (tmp_path / "run.json").exists()  # nothing written
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "steps, says",
    [
        ("1e20", "argument --steps: invalid int value: '1e20'"),
        ("2.5", "argument --steps: invalid int value: '2.5'"),
        (str(10**20), f"--steps must be <= 1,000,000,000, got {10**20}"),
        ("0", "--steps must be >= 1, got 0"),
    ],
)
def test_train_cli_refuses_steps_that_are_not_a_sane_int(capsys, tmp_path, steps, says):
    assert _train_error(capsys, tmp_path, "--steps", steps).endswith(says)


@pytest.mark.parametrize("option", ["--eval-batches", "--log-every"])
def test_train_cli_bounds_its_other_counts(capsys, tmp_path, option):
    said = _train_error(capsys, tmp_path, option, str(10**10))
    assert said.endswith(f"{option} must be <= 1,000,000,000, got {10**10}")


@pytest.mark.parametrize(
    "option, value",
    [("--hidden-size", 2**40), ("--vocab-size", 2**40), ("--seq-len", 2**36),
     ("--batch-size", 2**36)],
)  # fmt: skip
def test_train_cli_refuses_sizes_that_cannot_fit_naming_the_option(capsys, tmp_path, option, value):
    """Past memory, naming the largest size (--num-layers: refused past 1,024 by ModelConfig's
    bound, tests/contracts/test_misuse_cli.py)."""
    said = _train_error(capsys, tmp_path, option, str(value))
    assert re.search(rf"error: {option} {value} \(with --.*\): training \(at least: .*\) would "
                     r"take " + HUGE, said), said  # fmt: skip


def test_train_cli_estimate_passes_the_defaults_and_a_long_run():
    from kda_lib.lab.train_cli import _memory_problem, _parser

    for argv in (["mqar"], ["mqar", "--steps", str(10**9), "--seq-len", "4096"]):
        assert _memory_problem(_parser().parse_args(argv)) is None


# ------------------------------------------------------------------ kda-bench
@pytest.mark.parametrize(
    "options, named",
    [
        (["--key-dim", str(2**40)], f"--key-dim {2**40}"),
        (["--value-dim", str(2**40)], f"--value-dim {2**40}"),
        (["--seq-lens", "1024", str(2**40)], f"--seq-lens 1024 {2**40}"),
        (["--heads", str(2**40), "--impls", "softmax"], f"--heads {2**40}"),
        (["--train", "--train-batch", str(2**40)], f"--train-batch {2**40}"),
    ],
)
def test_bench_refuses_shapes_that_cannot_fit_naming_the_option(capsys, options, named):
    from kda_lib.lab import bench

    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args([*options, "--out", "-"])
    assert exit_info.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(rf"error: {re.escape(named)} \(with --.*\): the rows' inputs \(all built "
                     r"before timing\) would take " + HUGE, said), said  # fmt: skip


def test_bench_passes_its_defaults_and_the_accelerator_preset():
    from kda_lib.lab import bench

    for argv in ([], ["--preset", "accelerator"], ["--impls", "layer", "softmax", "chunked"]):
        args = bench.parse_args([*argv, "--out", "-"])
        assert bench.input_bytes(args) < 2**33


# ------------------------------------------------------------------ hostile pass: vocabulary
def test_config_lower_bound_errors_name_the_config_field():
    for bound in (0.0, 1.0, -6.0, True, float("nan"), "-5"):
        with pytest.raises(ValueError, match=r"^KDAConfig\.lower_bound must be a float in"):
            KDAConfig(**SMALL, lower_bound=bound)


def test_preset_refuses_a_non_negative_lower_bound_at_construction():
    for bound in (0.0, 1.0, np.float32(0.5)):
        with pytest.raises(ValueError, match=r"^ModelPreset\.lower_bound must be a negative"):
            dataclasses.replace(KIMI_LINEAR_48B, gate_form="safe_sigmoid", lower_bound=bound)


def test_preset_bound_below_the_layers_range_is_named_as_unsupported():
    preset = dataclasses.replace(KIMI_LINEAR_48B, gate_form="clamped_softplus", lower_bound=-10.0)
    assert preset.kda_parameter_count() == KIMI_LINEAR_48B.kda_parameter_count()
    with pytest.raises(NotImplementedError, match=r"lower_bound=-10, below the layer's range"):
        preset.kda_config()


def test_preset_stores_numpy_numbers_as_python_numbers():
    preset = dataclasses.replace(
        KIMI_LINEAR_48B,
        hidden_size=np.int64(2304),
        forget_gate_rank=np.int32(64),
        output_gate_rank=np.int64(64),
        gate_form="safe_sigmoid",
        lower_bound=np.float32(-5.0),
        norm_eps=np.float64(1e-6),
    )
    for name in ("hidden_size", "forget_gate_rank", "output_gate_rank"):
        assert type(getattr(preset, name)) is int, name
    assert type(preset.lower_bound) is float and type(preset.norm_eps) is float
    assert (
        preset.kda_config()
        == dataclasses.replace(preset, forget_gate_rank=64, output_gate_rank=64).kda_config()
    )


# ------------------------------------------------------------------ the other layers' widths
def _mla(hidden):
    from kda_lib.layers.mla import MLAConfig, MultiHeadLatentAttention

    config = MLAConfig(hidden_size=hidden, num_heads=1, head_dim=4, value_head_dim=4,
                       kv_lora_rank=4, shared_key_dim=0)  # fmt: skip
    return lambda: MultiHeadLatentAttention(config, rngs=nnx.Rngs(0))


def _attention(hidden):
    from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention

    return lambda: CausalSelfAttention(AttentionConfig(hidden, 1, 4), rngs=nnx.Rngs(0))


def _mamba2(hidden):
    from kda_lib.layers.mamba2 import Mamba2Config, Mamba2Mixer

    config = Mamba2Config(hidden_size=hidden, num_heads=1, head_dim=4)
    return lambda: Mamba2Mixer(config, rngs=nnx.Rngs(0))


def _conv_mixer(hidden):
    from kda_lib.layers.mamba2 import ConvMixer

    config = KDAConfig(hidden_size=hidden, num_heads=1, head_dim=4)
    return lambda: ConvMixer(config, rngs=nnx.Rngs(0))


def _tiny_lm(vocab):
    from kda_lib.models.tiny_lm import ModelConfig, TinyLM

    return lambda: TinyLM(ModelConfig(vocab_size=vocab), rngs=nnx.Rngs(0))


@pytest.mark.parametrize(
    "layer, size, field",
    [(_mla, 2**34, "MLAConfig.hidden_size"), (_attention, 2**34, "AttentionConfig.hidden_size"),
     (_mamba2, 2**34, "Mamba2Config.hidden_size"), (_conv_mixer, 2**34, "KDAConfig.hidden_size"),
     (_tiny_lm, 2**40, "ModelConfig.vocab_size")],
)  # fmt: skip
def test_a_layer_too_large_for_memory_is_refused_where_it_is_built(layer, size, field):
    """Issue 55, finding 5: the config describes it (it may be for a larger machine), building
    it here is refused naming the field, before any parameter exists; nnx.eval_shape still
    gives its shapes; a small one still builds."""
    build = layer(size)  # the config constructs
    says = rf"^{re.escape(field)}={size}: the parameters of .* would take ~[\d.]+ \w+ \(more than"
    with pytest.raises(ValueError, match=says):
        build()
    shapes = nnx.eval_shape(build)
    assert parameter_count(shapes) > size
    assert parameter_count(layer(16)()) > 0


@pytest.mark.parametrize(
    "fields, named",
    [(dict(vocab_size=2**40), "ModelConfig.vocab_size=1099511627776"),
     (dict(vocab_size=256, hidden_size=65536, num_heads=64, head_dim=1024),
      "KDAConfig.hidden_size=65536")],
)  # fmt: skip
def test_a_tiny_lm_too_large_names_the_field_that_drives_its_size(fields, named):
    """A huge vocabulary names vocab_size; a huge mixer at a small vocabulary names the mixer's
    width, as the layer alone does, not the largest int of ModelConfig."""
    from kda_lib.models.tiny_lm import ModelConfig, TinyLM

    config = ModelConfig.from_flat(**fields)
    with pytest.raises(ValueError, match=rf"^{re.escape(named)}: the parameters of .* would take"):
        TinyLM(config, rngs=nnx.Rngs(0))


def test_interior_states_asked_for_together_are_sized_together(monkeypatch):
    """Issue 75.9, one memory-size check: token and chunk states that each fit but not together
    are refused by one check naming both flags (before, each was checked alone)."""
    import kda_lib.checks
    from kda_lib.testing import random_kda_inputs

    x = random_kda_inputs(jax.random.key(0), 1, 64, 1, 8, 8)
    token_bytes, chunk_bytes = 64 * 8 * 8 * 4, 64 // 16 * 8 * 8 * 4  # float32 [HV, K, V] each
    monkeypatch.setattr(kda_lib.checks, "memory_limit", lambda: token_bytes + chunk_bytes - 1)
    for flag in ("output_token_states", "output_chunk_states"):
        kda(**x, chunk_size=16, implementation="recurrent", **{flag: True})
    both = (r"output_token_states and output_chunk_states=True: token_states .* plus at "
            r"chunk_size=16, chunk_states .* = \[1, 68, 1, 8, 8\]")  # 64 + 4 states, one check
    with pytest.raises(ValueError, match=both):
        kda(**x, chunk_size=16, implementation="recurrent", output_token_states=True,
                    output_chunk_states=True)  # fmt: skip
