"""One eager ``kda()`` call checks its inputs once (issue 26): the segment ids are
canonicalised once, padding is zeroed once, T is padded to a chunk multiple once, and the checks
read on the host the segment ids and beta's (min, max), reduced on the device (the raw gate's
sign is not checked; a log-space g's (min, max) is read the same way).

Before one check per call (the step-0 code of issue 26): 5 host reads for kda_lib's forms (the ids,
beta, and again ids, beta and the activated gate inside the form) and 3 for tokamax's (ids,
beta, the segment count); the ids canonicalised twice on the scan's path; padding zeroed twice.
"""

import collections
import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kda_lib.checks
import kda_lib.ops.api
import kda_lib.ops.chunked
import kda_lib.ops.contract
import kda_lib.ops.segments
import kda_lib.ops.tokamax.adapter
from kda_lib import kda
from kda_lib.testing import random_kda_inputs

COUNTED = {  # function name -> modules that call it by that name
    "canonical_segment_ids": (kda_lib.ops.api,),
    "zero_padding": (kda_lib.ops.api,),
    "pad_time": (kda_lib.ops.chunked, kda_lib.ops.tokamax.adapter),
    "host_values": (kda_lib.checks,),
}


@pytest.fixture
def calls(monkeypatch):
    counts = collections.Counter()
    for name, modules in COUNTED.items():
        for module in modules:
            original = getattr(module, name)

            def counting(*args, _name=name, _original=original, **kwargs):
                counts[_name] += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(module, name, counting)
    # the forms are traced once per options and shapes: an earlier test's trace would hide
    # this call's work from the counters
    kda_lib.ops.api.clear_compiled_forms()
    yield counts
    kda_lib.ops.api.clear_compiled_forms()  # no trace of the counting functions stays


@pytest.mark.parametrize(
    "implementation,pads",
    # auto at T = 40, not differentiated, on CPU: the scan (no padding; docs/DESIGN.md section 4)
    [("recurrent", 0), ("chunked", 1), ("auto", 0), ("tokamax_xla", 1), ("tokamax_xla_chunked", 1)],
)
def test_one_eager_call_checks_once(calls, implementation, pads):
    x = random_kda_inputs(jax.random.key(0), 1, 40, 2, 8, 8, gate="raw", with_state=True)
    ids = np.ones((1, 40), np.int32)
    ids[0, 20:25], ids[0, 25:] = 0, 2
    o, _ = kda(
        *(x[n] for n in ("q", "k", "v", "g", "beta")),
        a_log=x["a_log"],
        dt_bias=x["dt_bias"],
        lower_bound=-5.0,
        use_gate_in_kernel=True,
        initial_state=x["initial_state"],
        segment_ids=jnp.asarray(ids),
        max_num_segments=2,
        chunk_size=16 if implementation == "chunked" else 64,
        implementation=implementation,
    )
    assert np.isfinite(np.asarray(o)).all()
    assert calls["canonical_segment_ids"] == 1, calls
    assert calls["zero_padding"] == 1, calls
    assert calls["pad_time"] == pads, calls  # tokamax_xla: called with multiple 1, pads nothing
    assert calls["host_values"] == 2, calls  # beta's (min, max) and the segment ids


@pytest.mark.parametrize("implementation", ["recurrent", "chunked", "tokamax_xla"])
def test_one_eager_call_compiles_one_program(implementation, caplog):
    """The form runs as one compiled program (kda_lib.ops.api.run), not op by op: before,
    the first eager chunked call compiled 180 small programs. Shapes no other test uses, so
    nothing is cached."""
    x = random_kda_inputs(jax.random.key(0), 1, 37, 3, 8, 8, gate="raw")
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    jax.block_until_ready(args)
    kda_lib.ops.api.clear_compiled_forms()
    with jax.log_compiles(True), caplog.at_level("WARNING"):
        o, _ = kda(*args, a_log=x["a_log"], dt_bias=x["dt_bias"], use_gate_in_kernel=True,
                   implementation=implementation)  # fmt: skip
        jax.block_until_ready(o)
    compiled = [r.getMessage() for r in caplog.records if "Finished XLA compilation" in r.message]
    assert len(compiled) <= 2, compiled


@pytest.mark.parametrize("implementation", ["recurrent", "chunked"])
def test_a_new_segment_count_compiles_nothing_new_for_kda_libs_forms(implementation, caplog):
    """The most segments in a row (read from concrete ids for tokamax's slot count) is no part
    of kda_lib's forms' compiled program: packed batches of 1, 2 and 3 documents per row reuse
    one program."""
    x = random_kda_inputs(jax.random.key(1), 1, 29, 2, 8, 8)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    ids = [jnp.asarray([[1] * 29]), jnp.asarray([[1] * 10 + [2] * 19]),
           jnp.asarray([[1] * 5 + [2] * 12 + [3] * 12])]  # fmt: skip
    jax.block_until_ready(args)
    kda_lib.ops.api.clear_compiled_forms()
    jax.block_until_ready(kda(*args, segment_ids=ids[0], implementation=implementation)[0])
    with jax.log_compiles(True), caplog.at_level("WARNING"):
        for segment_ids in ids[1:]:
            o, _ = kda(*args, segment_ids=segment_ids, implementation=implementation)
            jax.block_until_ready(o)
    compiled = [r.getMessage() for r in caplog.records if "Finished XLA compilation" in r.message]
    assert not [m for m in compiled if "_compiled" in m], compiled


def test_one_eager_layer_call_reads_the_segment_ids_once_and_x_never(monkeypatch):
    """Issue 53: the layer, its three convs and kda() each read the ids (five reads), then the
    layer read them once and kda() ran the segment rule on that copy again and read beta; then
    the layer read and checked the ids once, at its entry, and x once (finite). Issue 75.9: x
    is an activation, never read on the host (a NaN in x gives NaN outputs); kda() reads
    nothing. Every check's host read goes through checks.host_values, counted here."""
    from flax import nnx

    from kda_lib import KDAConfig, KimiDeltaAttention

    reads = []

    def counting(original, seen):
        def host_values(x, *args):
            kind = "ids" if jnp.issubdtype(x.dtype, jnp.integer) else "floats"
            seen.append((kind, "device" if isinstance(x, jax.Array) else "host", x.shape))
            return original(x, *args)

        return host_values

    checks = kda_lib.checks
    monkeypatch.setattr(checks, "host_values", counting(checks.host_values, reads))
    ids = jnp.asarray([[1] * 8 + [2] * 10 + [0] * 2, [3] * 20], jnp.int32)
    x = jax.random.normal(jax.random.key(0), (2, 20, 32))
    config = KDAConfig(hidden_size=32, num_heads=2, head_dim=16, value_head_dim=8,
                       lower_bound=-5.0, implementation="tokamax_xla")  # fmt: skip
    layer = KimiDeltaAttention(config, rngs=nnx.Rngs(0))
    y = layer(x, segment_ids=ids)
    assert reads == [("ids", "device", (2, 20))], reads
    oracle = dataclasses.replace(config, implementation="recurrent")
    nnx.update(want_layer := KimiDeltaAttention(oracle, rngs=nnx.Rngs(1)), nnx.state(layer))
    want = nnx.jit(lambda m, x, ids: m(x, segment_ids=ids))(want_layer, x, ids)
    np.testing.assert_allclose(np.asarray(y), np.asarray(want), atol=2e-6, rtol=1e-5)


def test_an_eager_call_with_a_log_space_gate_reads_two_numbers_per_checked_array(monkeypatch):
    """Issue 75.9 (an engineer's review, 2026-12-06): with a log-space g, kda() checks g in
    [lower_bound, 0] and beta in [0, 1]; before, each was read whole on the host ([B, T, HV, K]
    for g); now each is reduced where it lives and its (min, max) read back. The refusals
    still name the argument and the extreme value."""
    seen = []
    original = kda_lib.checks.host_values

    def host_values(x, *args):
        seen.append(tuple(np.shape(x)))
        return original(x, *args)

    monkeypatch.setattr(kda_lib.checks, "host_values", host_values)
    x = random_kda_inputs(jax.random.key(3), 1, 40, 2, 8, 8)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    args[3] = jnp.maximum(args[3], -4.0)  # inside lower_bound's range [-5, 0)
    kda(*args, lower_bound=-5.0, implementation="chunked")
    assert seen == [(2,), (2,)], seen  # beta's range, g's range
    with pytest.raises(ValueError, match=r"g is a log-space decay and must be <= 0, got max 0\.5"):
        kda(*args[:3], args[3].at[0, 3, 1, 2].set(0.5), args[4])
    with pytest.raises(ValueError, match=r"g must be >= lower_bound=-5 .*got min -6;"):
        kda(*args[:3], args[3].at[0, 5, 0, 0].set(-6.0), args[4], lower_bound=-5.0)
    beta_message = r"beta must lie in \[0, 1\].*got values in \[0\.\d+, 1\.5\]"  # NaN left out
    with pytest.raises(ValueError, match=beta_message):
        kda(*args[:4], args[4].at[0, 7, 1].set(1.5).at[0, 8, 0].set(jnp.nan))


def test_the_prechecked_entry_reads_nothing_and_matches_kda(calls):
    """``kda_prechecked`` (the KDA layer's entry: it checked x and the ids itself) checks shapes
    and options only; its result is kda()'s."""
    x = random_kda_inputs(jax.random.key(2), 1, 24, 2, 8, 8)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    ids = jnp.asarray([[1] * 10 + [0] * 4 + [2] * 10])
    want, _ = kda(*args, segment_ids=ids, implementation="chunked", chunk_size=8)
    canonical = kda_lib.ops.segments.canonical_segment_ids(ids)
    calls.clear()
    got, _ = kda_lib.ops.api.kda_prechecked(*args, segment_ids=canonical, segments_per_row=2,
                                            implementation="chunked", chunk_size=8)  # fmt: skip
    assert calls["host_values"] == 0 and calls["canonical_segment_ids"] == 0, calls
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(ValueError, match="chunk_size must be a power of two"):
        kda_lib.ops.api.kda_prechecked(*args, chunk_size=3)


# ------------------------------------------------------------ issue 75.9: check once, then compute
def _small_layer(**overrides):
    from flax import nnx

    from kda_lib import KDAConfig, KimiDeltaAttention

    config = KDAConfig(hidden_size=32, num_heads=2, head_dim=16, lower_bound=-5.0, **overrides)
    return KimiDeltaAttention(config, rngs=nnx.Rngs(0))


@contextlib.contextmanager
def no_host_reads():
    """Any read of a jax array's values on the host raises. On CPU a transfer guard lets
    ``np.asarray`` through (the host's buffer is shared), so the array's own doors are shut too:
    the buffer protocol, ``__array__`` and ``_value`` (float(), bool(), tolist(), device_get)."""
    from jax._src.array import ArrayImpl

    def refuse(self, *args, **kwargs):
        raise RuntimeError(f"host read of a jax array {self.shape} {self.dtype}")

    with pytest.MonkeyPatch.context() as patch, jax.transfer_guard_device_to_host("disallow"):
        patch.setattr(ArrayImpl, "__buffer__", refuse)
        patch.setattr(ArrayImpl, "__array__", refuse)
        patch.setattr(ArrayImpl, "_value", property(refuse))
        yield


def test_an_eager_layer_call_reads_no_activation_on_the_host():
    """Issue 75.9: before, the eager call read all of x on the host (a finiteness check: a
    device-to-host copy of the layer's input every call). Shapes and dtypes are metadata."""
    layer = _small_layer()
    x = jax.random.normal(jax.random.key(0), (2, 20, 32))
    want = jax.block_until_ready(layer(x))  # compiled outside: the hot path is checked
    with no_host_reads():
        y = jax.block_until_ready(layer(x))
        y_cache, _ = layer(x, cache=layer.init_cache(2))
        with pytest.raises(ValueError, match=r"x must have shape \[B, T, hidden_size=32\]"):
            layer(x[..., :8])  # misuse is still refused by name, from the shape alone
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))  # the doors open again
    np.testing.assert_allclose(np.asarray(y_cache), np.asarray(want), atol=1e-5, rtol=1e-5)


def _stays_before_the_first_projection(layer, x, **kwargs) -> list[str]:
    """The kda_lib modules the call enters, in order, until the layer's first projection: each
    entry is a stay (one or more functions entered in a row in one module)."""
    import sys

    stays, root = [], kda_lib.checks.__file__.rsplit("/", 1)[0] + "/"

    class Projection(BaseException):  # no `except Exception` on the way can swallow it
        pass

    def profile(frame, event, arg):
        if event != "call":
            return
        if frame.f_locals.get("self") is layer.q_proj and frame.f_code.co_name == "__call__":
            raise Projection
        module = frame.f_code.co_filename
        if module.startswith(root) and (not stays or stays[-1] != module):
            stays.append(module)

    sys.setprofile(profile)
    try:
        layer(x, **kwargs)
    except Projection:
        pass
    finally:
        sys.setprofile(None)
    return [m.removeprefix(root) for m in stays]


def test_the_layer_reaches_its_first_projection_in_three_stays():
    """Issue 75.9: a plain call's ``x`` stays in at most three kda_lib modules before it meets
    ``q_proj`` (before: five, the mixers' shared checks and the config's properties between).
    With segment ids, their check and canonical form add what they need (nine stays)."""
    layer = _small_layer()
    x = jax.random.normal(jax.random.key(0), (1, 8, 32))
    stays = _stays_before_the_first_projection(layer, x)
    assert len(stays) <= 3 and stays[0] == "layers/kda_layer.py", stays
    ids = jnp.ones((1, 8), jnp.int32)
    assert len(_stays_before_the_first_projection(layer, x, segment_ids=ids)) <= 9


CASES = [("plain", 0), ("ids", 0), ("tokamax_count", 1), ("prefill", 1), ("draft", 1),
         ("decode", 0), ("tokamax_bound", 1)]  # fmt: skip


@pytest.mark.parametrize("case, checks", CASES)
def test_one_memory_size_check_per_layer_call(monkeypatch, case, checks):
    """Issue 75.9: every size check asks checks.memory_limit (counted here); a call makes at
    most one. Before: prefill checked its chunk states and an empty cache it built for zeros."""
    tokamax = case.startswith("tokamax")
    bound = 4 if case == "tokamax_bound" else None
    layer = _small_layer(implementation="tokamax_xla" if tokamax else "auto",
                         max_num_segments=bound)  # fmt: skip
    x = jax.random.normal(jax.random.key(0), (2, 16, 32))
    ids = jnp.asarray([[1] * 8 + [2] * 8, [3] * 16], jnp.int32)
    cache = layer.init_cache(2)
    calls = []
    original = kda_lib.checks.memory_limit
    monkeypatch.setattr(kda_lib.checks, "memory_limit", lambda: calls.append(1) or original())
    if case in ("plain", "decode"):
        layer(x, cache=cache if case == "decode" else None)
    elif case == "prefill":
        layer.prefill(x)
    elif case == "draft":
        layer.draft(x, cache=cache)
    else:
        layer(x, segment_ids=ids)
    assert len(calls) == checks, (case, len(calls))


def test_one_memory_size_check_per_context_parallel_layer_call(monkeypatch):
    """Issue 75.9 under context parallelism: the tokamax Mosaic CP layer with segment ids checks
    its per-segment states once, at the layer's entry (before: there and in
    kda_context_parallel). Traced only (jax.eval_shape): the checks run while the program is
    built."""
    from flax import nnx

    from kda_lib import KDAConfig, KimiDeltaAttention, emulate_tpu

    mesh = jax.make_mesh((2,), ("context",), axis_types=(jax.sharding.AxisType.Explicit,),
                         devices=jax.devices()[:2])  # fmt: skip
    config = KDAConfig(hidden_size=32, num_heads=1, head_dim=128, lower_bound=-5.0,
                       implementation="tokamax_mosaic", max_num_segments=4)  # fmt: skip
    ids = jnp.asarray([[1] * 64 + [2] * 64], jnp.int32)
    layer = KimiDeltaAttention(config, rngs=nnx.Rngs(0), mesh=mesh)  # its parameters' checks
    calls = []
    original = kda_lib.checks.memory_limit
    monkeypatch.setattr(kda_lib.checks, "memory_limit", lambda: calls.append(1) or original())
    with emulate_tpu():
        jax.eval_shape(lambda x: layer(x, segment_ids=ids), jnp.zeros((1, 128, 32)))
    assert len(calls) == 1, len(calls)


@pytest.mark.parametrize("bound", [None, 4])
def test_a_context_parallel_refusal_names_what_set_tokamax_s_segment_bound(monkeypatch, bound):
    """Per-segment states past memory under context parallelism (the limit lowered to 1 KiB):
    the layer names what set the bound, KDAConfig.max_num_segments or the ids' segment count
    + 1 (before: 'max_num_segments=3', which the caller never set); kda_context_parallel
    called without max_num_segments says it assumed a slot per token of the slice."""
    from flax import nnx
    from jax.sharding import PartitionSpec as P

    from kda_lib import KDAConfig, KimiDeltaAttention, emulate_tpu
    from kda_lib.parallel import kda_context_parallel

    mesh = jax.make_mesh((2,), ("context",), axis_types=(jax.sharding.AxisType.Explicit,),
                         devices=jax.devices()[:2])  # fmt: skip
    config = KDAConfig(hidden_size=32, num_heads=1, head_dim=128, lower_bound=-5.0,
                       implementation="tokamax_mosaic", max_num_segments=bound)  # fmt: skip
    ids = jnp.asarray([[1] * 64 + [2] * 64], jnp.int32)
    layer = KimiDeltaAttention(config, rngs=nnx.Rngs(0), mesh=mesh)
    monkeypatch.setattr(kda_lib.checks, "memory_limit", lambda: 1024)
    named = ("KDAConfig.max_num_segments=4" if bound else
             r"the segment count of segment_ids \+ 1 \(a rank's slice .*\)=3")  # fmt: skip
    with emulate_tpu(), pytest.raises(ValueError, match=f"^{named}: tokamax_mosaic's per-segment"):
        jax.eval_shape(lambda x: layer(x, segment_ids=ids), jnp.zeros((1, 128, 32)))
    if bound:
        return
    x = random_kda_inputs(jax.random.key(0), 1, 128, 1, 128, 128)
    mesh = jax.make_mesh((2,), ("context",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:2])  # fmt: skip
    run = jax.shard_map(
        lambda q, k, v, g, beta, ids: kda_context_parallel(
            q, k, v, g, beta, segment_ids=ids, implementation="tokamax_mosaic", mesh=mesh,
            a_log=jnp.zeros(1), dt_bias=jnp.zeros(128), lower_bound=-5.0,
            use_gate_in_kernel=True)[0],
        mesh=mesh, in_specs=(P(None, "context"),) * 6, out_specs=P(None, "context"),
        check_vma=False)  # fmt: skip
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    with emulate_tpu(), pytest.raises(ValueError, match="max_num_segments not given, so a state "
                                      r"slot per token of this slice \(T_local=64\)"):
        jax.eval_shape(run, *args, ids)
