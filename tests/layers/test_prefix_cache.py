"""The KDA layer's cache entry points: prefill keeps the cache at every chunk boundary
(prefix caching), draft keeps it after every token (speculative decoding); resuming from a
kept cache equals the run that never stopped. A cache a caller keeps in bfloat16 is read as its
float32 values; a bfloat16 layer's boundaries against the float64 oracle (issue 75.7)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kda_lib import KDAConfig, KimiDeltaAttention
from kda_lib.layers import cache_at
from kda_lib.testing import assert_close, float32_tolerance, relative_l2

# grouped value heads (HV = 2 H), conv width 4, chunks of 16
CONFIG = KDAConfig(hidden_size=32, num_heads=2, head_dim=16, value_head_dim=8, num_v_heads=4,
                   chunk_size=16)  # fmt: skip
T = 40


def _layer(**changes):
    return KimiDeltaAttention(dataclasses.replace(CONFIG, **changes), rngs=nnx.Rngs(0))


def _x(seq_len=T, seed=1):
    return jax.random.normal(jax.random.key(seed), (2, seq_len, 32))


# the tests share the layer's compiled programs (the full run and prefill at T, the draft of
# 5 tokens): one worker compiles each once
pytestmark = pytest.mark.xdist_group("prefix_cache_programs")

_apply = nnx.jit(lambda m, x, cache: m(x, cache=cache))
_prefill = nnx.jit(lambda m, x, cache=None: m.prefill(x, cache=cache))
_draft = nnx.jit(lambda m, x, cache: m.draft(x, cache=cache))


def _assert_caches_close(got, want, name):
    for field, a, b in zip(got._fields, got, want, strict=True):
        assert (a is None) == (b is None), field
        if a is not None:
            assert_close(a, b, **float32_tolerance(1e-5, 1e-5), name=f"{name}.{field}")


@pytest.mark.parametrize(
    "fused,resumed", [(False, 0), (True, 1)], ids=["three-convs", "fused-qkv-conv"]
)
@pytest.mark.tpu
def test_prefill_boundary_cache_then_continue_equals_the_full_run(fused, resumed):
    """A prompt prefilled once: resuming from a boundary (the first 16 tokens, a shared prefix;
    the first 32 with the fused conv) gives the full run's outputs and final cache without
    recomputing the prefix; every boundary's cache has the stacked shapes."""
    layer = _layer(fused_qkv_conv=fused)
    x = _x()
    y_full, cache_full = _apply(layer, x, layer.init_cache(2))
    y, cache, boundaries = _prefill(layer, x)
    assert boundaries.state.shape == (2, T // 16, 4, 16, 8)
    assert boundaries.q_conv.shape == (2, T // 16, 3, 32)
    assert_close(y, y_full, **float32_tolerance(1e-5, 1e-5), name="prefill y")
    _assert_caches_close(cache, cache_full, "prefill cache")
    start = (resumed + 1) * 16  # (each resumed length is a program of its own)
    y_rest, cache_rest = _apply(layer, x[:, start:], cache_at(boundaries, resumed))
    tol = float32_tolerance(1e-5, 1e-5)
    assert_close(y_rest, y_full[:, start:], **tol, name=f"resumed at {start}")
    _assert_caches_close(cache_rest, cache_full, f"final cache resumed at {start}")


def test_prefill_from_a_cache_keeps_boundaries_of_the_continuation():
    """Prefill continuing a cache (the conv history before its first token comes from it):
    its boundary 0 is the cache after 8 + 16 tokens of one run; with T = 32 a multiple of the
    chunk, the last boundary is the cache after all of it."""
    layer = _layer()
    x = _x()
    _, cache8 = _apply(layer, x[:, :8], layer.init_cache(2))
    _, cache_end, boundaries = _prefill(layer, x[:, 8:], cache8)
    _, cache24 = _apply(layer, x[:, :24], layer.init_cache(2))
    _assert_caches_close(cache_at(boundaries, 0), cache24, "boundary after 24")
    _, cache40 = _apply(layer, x, layer.init_cache(2))
    _assert_caches_close(cache_end, cache40, "prefill's cache after 8 + 32")
    _assert_caches_close(cache_at(boundaries, 1), cache40, "boundary after 8 + 32")
    traced = jax.jit(cache_at)(boundaries, jnp.int32(1))  # a 0-d index, traced under jit
    _assert_caches_close(traced, cache40, "boundary 1 picked by a traced 0-d index")


def _row(cache, row):
    return type(cache)(*(None if a is None else a[row] for a in cache))


@pytest.mark.tpu
def test_draft_then_accept_a_prefix_equals_decoding_only_it():
    """A 5-token draft from a decoded cache; rows accept 0, 1 or all 5 tokens: the cache after
    the accepted tokens equals the cache from feeding only those (0: the cache itself)."""
    layer = _layer()
    x = _x(seq_len=14)
    _, cache = _apply(layer, x[:, :9], layer.init_cache(2))
    y, _, token_caches = _draft(layer, x[:, 9:], cache)
    y_ref, after5 = _apply(layer, x[:, 9:], cache)
    assert_close(y, y_ref, **float32_tolerance(1e-5, 1e-5), name="draft y")
    want = {0: cache, 1: _apply(layer, x[:, 9:10], cache)[1], 5: after5}
    for counts in ((0, 5), (1, 0), (5, 1)):
        kept = layer.accept_draft(cache, token_caches, jnp.asarray(counts))
        for row, accepted in enumerate(counts):
            _assert_caches_close(_row(kept, row), _row(want[accepted], row), f"{row} {accepted}")
    _assert_caches_close(layer.accept_draft(cache, token_caches, 1), want[1], "int count")


def test_out_of_range_entries_under_jit_are_nan_never_another_entry():
    """Under jit the counts and indices are not checked: a row outside [0, T] (accept_draft)
    or [0, N) (cache_at) gets NaN in every field; the other row its entry."""
    layer = _layer()
    x = _x(seq_len=14)
    cache = layer.init_cache(2)
    _, _, token_caches = _draft(layer, x[:, 9:], cache)
    cases = [
        (layer.accept_draft, (cache, token_caches), ((-1, 3), (2, 6))),
        (cache_at, (token_caches,), ((-1, 4), (2, 5))),
    ]
    for eager, args, pairs in cases:
        for bad_row, pair in enumerate(pairs):
            good = 1 - bad_row
            got = jax.jit(eager)(*args, jnp.asarray(pair))
            want = eager(*args, pair[good])
            for a, b in zip(got, want, strict=True):
                assert np.isnan(np.asarray(a[bad_row])).all()
                np.testing.assert_array_equal(a[good], b[good])


def test_cache_entry_points_refuse_what_they_cannot_serve():
    layer = _layer()
    x = _x()
    _, _, boundaries = _prefill(layer, x)
    with pytest.raises(ValueError, match=r"index must be in \[0, 1\], got \[2 2\]"):
        cache_at(boundaries, 2)
    with pytest.raises(ValueError, match=r"index must be in \[0, 1\], got \[ 0 -1\]"):
        cache_at(boundaries, jnp.asarray([0, -1]))
    for bad in (True, np.bool_(False), jnp.asarray([True, False]), [0, 1], 1.0):
        with pytest.raises(ValueError, match=r"index must be an int or \[B\]=2 ints"):
            cache_at(boundaries, bad)
    with pytest.raises(ValueError, match="caches must be a KDACache of stacked states"):
        cache_at(layer.init_cache(2), 0)
    cache = layer.init_cache(2)
    with pytest.raises(ValueError, match=r"num_accepted_tokens must be in \[0, 2\]"):
        layer.accept_draft(cache, boundaries, jnp.asarray([0, 3]))
    with pytest.raises(ValueError, match="token_caches must be the KDACache layer.draft"):
        layer.accept_draft(cache, cache, 0)
    with pytest.raises(ValueError, match=r"cache.state has shape .* for batch size 2"):
        layer.accept_draft(layer.init_cache(3), boundaries, 0)
    with pytest.raises(ValueError, match=r"token_caches.q_conv must be \[B, T, 3, 32\]"):
        layer.accept_draft(cache, boundaries._replace(q_conv=boundaries.q_conv[..., :8]), 0)
    with pytest.raises(ValueError, match="draft continues a cache"):
        layer.draft(x, cache=None)
    tokamax = _layer(implementation="tokamax_xla")
    with pytest.raises(ValueError, match="tokamax_xla returns no interior states"):
        tokamax.prefill(x)


def _cast(cache, dtype):
    return type(cache)(*(None if a is None else a.astype(dtype) for a in cache))


def test_a_bfloat16_cache_is_read_as_its_float32_values():
    """A cache a caller keeps in bfloat16 (the state and the conv histories): the layer's call
    over one token, prefill over two chunks (its outputs, final cache and two boundaries) and a
    draft with accept_draft continue from it as from the same values in float32, and return
    float32 caches."""
    layer = _layer()
    x = _x()
    _, cache = _apply(layer, x[:, :8], layer.init_cache(2))
    half = _cast(cache, jnp.bfloat16)
    runs = {}
    for name, start in (("bfloat16", half), ("float32", _cast(half, jnp.float32))):
        y1, after1 = _apply(layer, x[:, 8:9], start)
        y_pre, cache_pre, boundaries = _prefill(layer, x[:, 8:], start)
        y_draft, _, token_caches = _draft(layer, x[:, 8:13], start)
        kept = layer.accept_draft(start, token_caches, jnp.asarray([0, 3]))
        runs[name] = (y1, after1, y_pre, cache_pre, boundaries, y_draft, kept)
    for got, want in zip(runs["bfloat16"], runs["float32"], strict=True):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert a.dtype == b.dtype == jnp.float32
            assert_close(a, b, **float32_tolerance(1e-5, 1e-5), name=type(got).__name__)
    # the count-0 row keeps the bfloat16 cache's values
    np.testing.assert_array_equal(runs["bfloat16"][-1].state[0], half.state[0].astype(jnp.float32))


def test_a_bfloat16_layer_resumes_from_a_boundary_as_the_float64_oracle():
    """A bfloat16 layer (bfloat16 conv histories, a float32 state) over T = 3C: its prefill's
    outputs and boundary states against the same layer in float64 on the recurrence (the
    bfloat16 layer's table: relative L2 3e-2); resumed from each boundary before the last, the
    rest of the outputs as the prefill's."""
    layer = _layer(dtype=jnp.bfloat16)
    x = _x(seq_len=48)
    y, final, boundaries = _prefill(layer, x)
    assert y.dtype == boundaries.q_conv.dtype == jnp.bfloat16
    assert boundaries.state.dtype == jnp.float32 and boundaries.state.shape[1] == 3
    with jax.enable_x64(True):
        config = dataclasses.replace(layer.config, dtype=jnp.float64, param_dtype=jnp.float64,
                                     implementation="recurrent")  # fmt: skip
        oracle = nnx.eval_shape(lambda: KimiDeltaAttention(config, rngs=nnx.Rngs(0)))
        nnx.update(oracle, jax.tree.map(lambda a: jnp.asarray(a, jnp.float64),
                                        nnx.state(layer, nnx.Param)))  # fmt: skip
        y64, _, boundaries64 = _prefill(oracle, jnp.asarray(x, jnp.float64))
        y64, states64 = np.asarray(y64), np.asarray(boundaries64.state)
    assert relative_l2(y, y64) < 3e-2, relative_l2(y, y64)
    for i in range(3):
        error = relative_l2(boundaries.state[:, i], states64[:, i])
        assert error < 3e-2, (i, error)
    for i in range(2):
        start = (i + 1) * 16
        y_rest, _ = _apply(layer, x[:, start:], cache_at(boundaries, i))
        assert_close(y_rest, y[:, start:], name=f"resumed at {start}")  # bfloat16's table
