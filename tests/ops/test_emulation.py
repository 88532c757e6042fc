"""tokamax's Mosaic (TPU) KDA kernel and its context parallelism, run on CPU under
kda_lib.emulate_tpu (Pallas interpret mode), against kda_lib's own implementations.

Interpret mode is slow to compile (seconds per kernel), so shapes are small, every jit uses
FAST_COMPILE_OPTIONS, and the kernel tests are marked slow (they still run in `make test`).
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from kda_lib import KDAConfig, KimiDeltaAttention, emulate_tpu, kda
from kda_lib.lab import emulation
from kda_lib.ops.api import refusals, select_implementation
from kda_lib.ops.tokamax import adapter as tokamax_adapter
from kda_lib.parallel.context_parallel import kda_context_parallel, shard_as
from kda_lib.testing import relative_l2

FAST = emulation.FAST_COMPILE_OPTIONS
CFG = KDAConfig(
    hidden_size=32, num_heads=1, head_dim=128, lower_bound=-5.0, implementation="tokamax_mosaic"
)


def _mesh(ranks):
    return jax.make_mesh(
        (ranks,),
        ("context",),
        axis_types=(jax.sharding.AxisType.Explicit,),
        devices=jax.devices()[:ranks],
    )


def _loss_and_grads(layer, x):
    """(outputs, parameter gradients) of a fixed weighted sum, in one fast-compiled jit."""
    graphdef, state = nnx.split(layer)
    weights = jnp.cos(jnp.arange(np.prod(x.shape)).reshape(x.shape))

    def loss(state):
        y = nnx.merge(graphdef, state)(x)
        return jnp.sum(y * weights), y

    (_, y), grads = jax.jit(jax.value_and_grad(loss, has_aux=True), compiler_options=FAST)(state)
    return y, grads


def _worst(a, b):
    """Largest relative L2 error over the outputs and every parameter gradient."""
    (ya, ga), (yb, gb) = a, b
    errors = [relative_l2(ya, yb)]
    errors += [
        relative_l2(p, q) for p, q in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True)
    ]
    assert all(np.isfinite(errors)), errors
    return max(errors)


# ------------------------------------------------------------------ the switch itself


def test_context_manager_sets_and_restores_the_environment(monkeypatch):
    from jax._src import tpu_info
    from jax._src.pallas import primitives

    monkeypatch.setenv("PALLAS_INTERPRET", "0")
    fill = primitives.uninitialized_value
    kind = jax.devices()[0].device_kind
    assert kind not in tpu_info.registry and emulation.emulated_chip() is None
    with emulate_tpu() as chip:
        assert chip == "v6e" and os.environ["PALLAS_INTERPRET"] == "1"
        assert tpu_info.get_tpu_info().generation == 6
        assert primitives.uninitialized_value is not fill
        with emulate_tpu("7x", uninitialized_memory="nan"):
            assert tpu_info.get_tpu_info().generation == 7
            assert primitives.uninitialized_value is fill
            assert emulation.emulated_tpu_generation() == 7
        assert tpu_info.get_tpu_info().generation == 6
    assert os.environ["PALLAS_INTERPRET"] == "0"
    assert kind not in tpu_info.registry and primitives.uninitialized_value is fill
    with pytest.raises(ValueError, match="Unsupported TPU device kind"):
        tpu_info.get_tpu_info()  # no cached emulated answer left behind
    monkeypatch.delenv("PALLAS_INTERPRET")
    with emulate_tpu():
        pass
    assert "PALLAS_INTERPRET" not in os.environ
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'"):
        with emulate_tpu("v9"):
            pass


def test_environment_variable_turns_it_on_process_wide(monkeypatch):
    monkeypatch.delenv("PALLAS_INTERPRET", raising=False)
    monkeypatch.setenv("KDA_EMULATE_TPU", "v6e")
    emulation.reset_environment_activation()
    try:
        assert emulation.emulated_chip() == "v6e" and os.environ["PALLAS_INTERPRET"] == "1"
        assert not refusals(
            "tokamax_mosaic", key_dim=128, dtype=jnp.float32, lower_bound=-5.0, fused_gate=True
        )
    finally:
        monkeypatch.delenv("KDA_EMULATE_TPU")
        emulation.reset_environment_activation()
    assert emulation.emulated_chip() is None and "PALLAS_INTERPRET" not in os.environ
    monkeypatch.setenv("KDA_EMULATE_TPU", "tpu9")
    emulation.reset_environment_activation()
    try:
        with pytest.raises(ValueError, match="KDA_EMULATE_TPU='tpu9': .*unknown TPU generation"):
            emulation.emulated_chip()
    finally:
        monkeypatch.delenv("KDA_EMULATE_TPU")
        emulation.reset_environment_activation()


def test_missing_hook_names_the_tested_versions(monkeypatch):
    from jax._src import tpu_info

    monkeypatch.delattr(tpu_info, "registry")
    with pytest.raises(
        emulation.EmulationUnavailableError, match="jax 0.12.0.1 and tokamax 0.0.17"
    ):
        with emulate_tpu():
            pass


def test_a_missing_tokamax_hook_stops_emulation_at_entry(monkeypatch):
    """tokamax's hooks are checked by the check tokamax_backend registers, before anything is
    switched on: the environment is left as it was."""
    import importlib

    utils = importlib.import_module("tokamax._src.ops.kda.utils")
    monkeypatch.delattr(utils, "get_interpret")
    monkeypatch.delenv("PALLAS_INTERPRET", raising=False)
    with pytest.raises(emulation.EmulationUnavailableError, match="PALLAS_INTERPRET switch"):
        with emulate_tpu():
            pass
    assert "PALLAS_INTERPRET" not in os.environ and not emulation.is_emulating()


def test_emulated_tpu_counts_for_explicit_requests_but_never_for_auto(monkeypatch):
    args = dict(key_dim=128, dtype=jnp.bfloat16, lower_bound=-5.0, fused_gate=True)
    assert "needs a TPU v6 or newer" in refusals("tokamax_mosaic", **args)[0]
    with emulate_tpu():
        assert refusals("tokamax_mosaic", **args) == []
        assert select_implementation(seq_len=4096, **args) == "chunked"

        def no_tokamax(*args, **kwargs):
            raise AssertionError("auto picked a tokamax kernel")

        monkeypatch.setattr(tokamax_adapter, "call_tokamax", no_tokamax)
        x = jnp.ones((1, 32, 1, 128), jnp.bfloat16)
        beta = jnp.full((1, 32, 1), 0.5)
        a_log = jnp.zeros((1,))
        gate = dict(a_log=a_log, lower_bound=-5.0, use_gate_in_kernel=True)
        jax.jit(lambda *a: kda(*a, **gate)).trace(x, x, x, x, beta)
    with emulate_tpu("v5e"):
        assert refusals("tokamax_mosaic", **args) == [
            "tokamax_mosaic needs a TPU v6 or newer; this is TPU v5 (emulated)"
        ]


def test_the_emulated_mosaic_op_is_looked_up_only_for_mosaic_on_this_machine(monkeypatch):
    """While emulating, refusals of the XLA variants and of Mosaic elsewhere (here=False) do
    not build the Mosaic op (the seam returns it with the generation)."""
    asked = []
    seam = tokamax_adapter.emulated_tpu
    monkeypatch.setattr(tokamax_adapter, "emulated_tpu", lambda: asked.append(1) or seam())
    args = dict(key_dim=128, dtype=jnp.bfloat16, lower_bound=-5.0, fused_gate=True)
    with emulate_tpu():
        refusals("tokamax_xla", **args), refusals("tokamax_xla_chunked", **args)
        refusals("tokamax_mosaic", here=False, **args)
        assert asked == []
        assert refusals("tokamax_mosaic", **args) == [] and asked == [1]


# ------------------------------------------------------------------ kernel


@pytest.mark.slow
def test_adapter_mosaic_equals_chunked_with_padding_segments_and_state():
    """kda(..., "tokamax_mosaic") with the fused safe gate without a rate (a_log=None), grouped
    value heads (HV = 2 on one q/k head), T not a multiple of 64, segments with padding inside
    rows, and an initial and a final state."""
    ks = jax.random.split(jax.random.key(3), 7)
    b, t, h, hv, d = 2, 100, 1, 2, 128
    q, k = (jax.random.normal(kk, (b, t, h, d)) for kk in ks[:2])
    f, v = (jax.random.normal(kk, (b, t, hv, d)) for kk in ks[2:4])
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], (b, t, hv)))
    ids = np.ones((b, t), np.int32)
    ids[0, 30:38], ids[0, 38:] = 0, 2
    ids[1, :10], ids[1, 60:] = 0, 3
    kw = dict(
        a_log=None,
        dt_bias=0.5 * jax.random.normal(ks[5], (hv * d,)),
        lower_bound=-5.0,
        use_gate_in_kernel=True,
        use_qk_l2norm=True,
        segment_ids=jnp.asarray(ids),
        max_num_segments=2,
        initial_state=0.1 * jax.random.normal(ks[6], (b, hv, d, d)),
        output_final_state=True,
    )

    def run(impl):
        fn = lambda *a: kda(*a, **kw, implementation=impl)  # noqa: E731
        return jax.jit(fn, compiler_options=FAST)(q, k, v, f, beta)

    with emulate_tpu():
        got = run("tokamax_mosaic")
    want = run("chunked")
    for a, b_ in zip(got, want, strict=True):
        assert relative_l2(a, b_) < 1e-5


# ------------------------------------------------------------------ layer, one device and CP


@pytest.mark.slow
def test_layer_and_cp_layer_through_mosaic_equal_chunked_layer():
    """Outputs and parameter gradients of the layer on the Mosaic kernel, and of the CP layer on
    tokamax's own CP, equal the one-device chunked layer's. One test, so that the reference is
    computed once. Four ranks: tokamax's state chain runs through several ranks, and each rank
    holds 32 tokens, less than one 64-token chunk. (kda_lib's own CP layer against the
    one-device layer: tests/parallel/test_context_parallel.py::test_layer_cp_equals_one_device.)"""
    layer_input = jax.random.normal(jax.random.key(1), (1, 128, 32))
    chunked_cfg = dataclasses.replace(CFG, implementation="chunked")
    single_chunked = _loss_and_grads(KimiDeltaAttention(chunked_cfg, rngs=nnx.Rngs(0)), layer_input)
    with emulate_tpu():
        mosaic = _loss_and_grads(KimiDeltaAttention(CFG, rngs=nnx.Rngs(0)), layer_input)
    assert _worst(mosaic, single_chunked) < 1e-5

    mesh = _mesh(4)
    with emulate_tpu():
        layer = KimiDeltaAttention(CFG, rngs=nnx.Rngs(0), mesh=mesh)
        mosaic_cp = _loss_and_grads(layer, layer_input)
    assert _worst(mosaic_cp, single_chunked) < 1e-5


# ------------------------------------------------------------------ context parallelism


@pytest.mark.slow
def test_cp_mosaic_segments_across_ranks_and_padding():
    """Log-space gates, grouped value heads (HV = 2 on one q/k head); a document spanning ranks,
    a boundary at a rank split, padding inside a row (NaN keys and values), an all-padding rank:
    tokamax's chain (from rank-local ids) equals one device."""
    ranks, b, t, h, hv, d = 4, 2, 128, 1, 2, 128
    ks = jax.random.split(jax.random.key(5), 5)
    q, k = (jax.random.normal(kk, (b, t, h, d)) for kk in ks[:2])
    f, v = (jax.random.normal(kk, (b, t, hv, d)) for kk in ks[2:4])
    g = -0.3 * jax.nn.softplus(f)
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], (b, t, hv)))
    ids = np.zeros((b, t), np.int32)
    ids[0, :70], ids[0, 70:75], ids[0, 75:] = 1, 0, 2  # doc 1 spans ranks 0-2
    ids[1, 5:32], ids[1, 64:100], ids[1, 100:] = 4, 5, 6  # boundary at a split; rank 1 padding
    ids = jnp.asarray(ids)
    padding = (ids == 0)[..., None, None]  # NaN keys and values there change nothing
    k, v = jnp.where(padding, jnp.nan, k), jnp.where(padding, jnp.nan, v)
    mesh = _mesh(ranks)

    def local(q, k, v, g, beta, ids):
        return kda_context_parallel(
            q,
            k,
            v,
            g,
            beta,
            segment_ids=ids,
            use_qk_l2norm=True,
            max_num_segments=3,
            implementation="tokamax_mosaic",
            mesh=mesh,
        )[0]

    spec = P(None, "context")
    fn = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 6, out_specs=spec, check_vma=False)
    with emulate_tpu():
        got = jax.jit(lambda *a: fn(*(shard_as(z, mesh, spec) for z in a)), compiler_options=FAST)(
            q, k, v, g, beta, ids
        )
    want = jax.jit(
        lambda *a: kda(*a, segment_ids=ids, use_qk_l2norm=True, implementation="chunked")[0]
    )(q, k, v, g, beta)
    assert relative_l2(got, want) < 1e-5
    assert float(np.abs(np.asarray(got)[0, 70:75]).max()) == 0.0  # padding outputs 0


def test_cp_mosaic_errors_name_the_constraint():
    mesh = _mesh(2)
    spec = P(None, "context")

    def run(key_dim=128, check_vma=False, **kw):
        def local(q, beta):
            return kda_context_parallel(
                q, q, q, -jnp.abs(q), beta, implementation="tokamax_mosaic", mesh=mesh, **kw
            )[0]

        fn = jax.shard_map(
            local, mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=check_vma
        )
        q = jnp.zeros((1, 128, 1, key_dim))
        beta = jnp.zeros((1, 128, 1))
        return jax.jit(fn).trace(shard_as(q, mesh, spec), shard_as(beta, mesh, spec))

    with emulate_tpu():
        with pytest.raises(ValueError, match="needs K and V multiples of 128, got K=64, V=64"):
            run(key_dim=64)
        with pytest.raises(ValueError, match="does not support initial_state"):
            run(initial_state=jnp.zeros((1, 1, 128, 128)))
        with pytest.raises(ValueError, match="does not support output_final_state"):
            run(output_final_state=True)
        with pytest.raises(ValueError, match=r"needs jax.shard_map\(..., check_vma=False\)"):
            run(check_vma=True)
        with pytest.raises(ValueError, match="K and V multiples of 128, got K=64"):
            layer = KimiDeltaAttention(
                dataclasses.replace(CFG, head_dim=64), rngs=nnx.Rngs(0), mesh=mesh
            )
            layer(jnp.zeros((1, 128, 32)))
    with pytest.raises(
        ValueError, match="cannot run inside shard_map here: tokamax_mosaic needs a TPU"
    ):
        run()  # no TPU, no emulation


def test_environment_emulation_leaves_no_traceback_at_exit():
    """With KDA_EMULATE_TPU=1 a process that queries the emulation exits without an ignored
    AttributeError traceback (the activation's generator was closed during interpreter
    shutdown, after module globals were cleared)."""
    import subprocess
    import sys

    script = "from kda_lib.lab.emulation import is_emulating; print(is_emulating())"
    env = {**os.environ, "KDA_EMULATE_TPU": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr, (
        result.stderr
    )


@pytest.mark.parametrize("implementation", ["tokamax_xla", "tokamax_xla_chunked"])
def test_kda_config_refuses_neg_eigval_with_tokamax_at_construction(implementation):
    """allow_neg_eigval with a tokamax kernel (which has no beta in [0, 2]) is refused when
    the config is built, naming both options, not at the first call."""
    with pytest.raises(ValueError, match="allow_neg_eigval"):
        KDAConfig(hidden_size=16, num_heads=2, head_dim=8, allow_neg_eigval=True,
                  implementation=implementation)  # fmt: skip
