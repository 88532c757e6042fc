"""The one segment rule (kda_lib.ops.segments) at every entry point and in every mixer.

* Ids are compared in their own dtype: int64/uint64 ids near and beyond 2**31 and 2**32 give
  the same outputs as the small ids that number the same segments, at every entry point that
  takes ids (with ``jax_enable_x64`` off, a conversion before the comparison would wrap them:
  ``2**32`` became padding, ``1`` and ``2**32 + 1`` one document).
* Every registered mixer applies the rule: a real token depends exactly on the earlier real
  tokens of its segment (within the conv's reach for the conv mixer), where a segment starts
  wherever a real token's id differs from the previous real token's and padding (0) is not a
  token; padding outputs 0. Checked on the Jacobian under jit (reused ids and padding inside a
  document included, which the eager check refuses), hypothesis over segmentations.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kda_lib import KDAConfig, kda, kda_chunked, kda_recurrent
from kda_lib.layers.conv import ShortConvolution
from kda_lib.models.tiny_lm import MIXERS, ModelConfig

B, T, HIDDEN = 2, 8, 8
# every row builds every entry point (one cache) and the mixers' ops at these shapes: one worker
# compiles them once
pytestmark = pytest.mark.xdist_group("segment_rule_programs")
# ids that wrap onto each other or onto 0 when cut to 32 bits, and their neighbours
BIG_IDS = (1, 2, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**32 + 2, 2**33, 2**63 - 1)
ID_DTYPES = (np.int64, np.uint64, np.uint32, np.int32)


def rule_segments(ids) -> np.ndarray:
    """The rule, written out token by token: ``[B, T]`` segment numbers 1, 2, ... per row,
    0 at padding (an independent oracle for kda_lib's canonical ids)."""
    out = np.zeros(np.shape(ids), np.int32)
    for b, row in enumerate(np.asarray(ids).tolist()):
        number, previous = 0, None
        for t, value in enumerate(row):
            if value == 0:
                continue
            if value != previous:
                number, previous = number + 1, value
            out[b, t] = number
    return out


@st.composite
def packed_ids(draw, dtype):
    """``[B, T]`` ids of ``dtype`` that the eager check accepts (one run per id in a row,
    padding only between different ids or at the ends), labels from :data:`BIG_IDS`. Three
    runs per row: the same segment count every example, so each entry point compiles once."""
    labels = [x for x in BIG_IDS if x <= np.iinfo(dtype).max]
    rows = []
    for _ in range(B):
        runs = draw(st.lists(st.sampled_from(labels), min_size=3, max_size=3, unique=True))
        lengths = draw(st.sampled_from([(1, 2, 3), (3, 3, 1), (2, 1, 2), (1, 1, 1)]))
        row = []
        for label, length in zip(runs, lengths, strict=True):
            row += [label] * length
        lead = draw(st.integers(0, T - len(row)))
        rows.append([0] * lead + row + [0] * (T - lead - len(row)))
    return np.array(rows, dtype=dtype)


def _kernel_inputs():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, T, 2, 4)).astype(np.float32)
    k = rng.standard_normal((B, T, 2, 4)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, 2, 4)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, (B, T, 2, 4)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (B, T, 2)).astype(np.float32)
    return q, k, v, g, beta


@functools.cache
def _entry_points():
    """name -> ``f(segment_ids) -> outputs``: every public function that takes segment ids."""
    q, k, v, g, beta = _kernel_inputs()
    x = np.random.default_rng(1).standard_normal((B, T, HIDDEN)).astype(np.float32)
    conv = ShortConvolution(HIDDEN, conv_size=4, rngs=nnx.Rngs(0))

    def kda_with(implementation, **kw):
        return lambda ids: kda(
            q, k, v, g, beta, segment_ids=ids, implementation=implementation, **kw
        )[0]

    points = {  # kda_recurrent is kda(implementation="recurrent"); kda_chunked runs kda's checks
        "kda_recurrent": lambda ids: kda_recurrent(q, k, v, g, beta, segment_ids=ids)[0],
        "kda_chunked": lambda ids: kda_chunked(q, k, v, g, beta, segment_ids=ids, chunk_size=4)[0],
        "kda/tokamax_xla": kda_with("tokamax_xla", max_num_segments=T),
        "ShortConvolution": lambda ids: conv(x, segment_ids=ids)[0],
    }
    for name in sorted(MIXERS):  # the KDA layer (kda, gdn), MLA, attention, conv
        mixer = MIXERS[name](_mixer_config(name), nnx.Rngs(2))
        points[f"mixer {name}"] = functools.partial(lambda m, ids: m(x, segment_ids=ids), mixer)
    return points


def _mixer_config(name: str) -> ModelConfig:
    # the recurrent form is the cheapest to compile; the forms agree (tests/ops)
    mixer_config = KDAConfig(
        hidden_size=HIDDEN, num_heads=2, head_dim=4, implementation="recurrent"
    )
    return ModelConfig(vocab_size=16, mixer=name, mixer_config=mixer_config)


ENTRY_POINTS = (
    "kda_recurrent",
    "kda_chunked",
    "kda/tokamax_xla",
    "ShortConvolution",
    *(f"mixer {name}" for name in sorted(MIXERS)),
)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_int64_segment_ids_are_not_cut_to_32_bits(entry, data):
    """Ids near and beyond 2**31 and 2**32, in every integer dtype that holds them, give the
    outputs of the small ids numbering the same segments (x64 off: no wrapping conversion)."""
    assert not jax.config.jax_enable_x64
    dtype = data.draw(st.sampled_from(ID_DTYPES))
    ids = data.draw(packed_ids(dtype))
    f = _entry_points()[entry]
    got = np.asarray(f(ids))
    want = np.asarray(f(rule_segments(ids)))
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------- the rule in every mixer


@st.composite
def any_ids(draw):
    """``[B, T]`` int32 ids of any pattern jit accepts: reused ids, padding inside a document,
    leading and trailing padding, all-padding rows."""
    return np.array(
        [[draw(st.sampled_from([0, 0, 1, 2, 3, 7])) for _ in range(T)] for _ in range(B)],
        np.int32,
    )


def _reach(name: str) -> int | None:
    """How many positions back a mixer's token can see inside its segment (None: all)."""
    return _mixer_config(name).mixer_config.conv_size if name == "conv" else None


@functools.cache
def _jacobian_fn(name: str):
    """``ids -> dependency [B, T, B, T]`` of the mixer's outputs on its inputs, under jit."""
    mixer = MIXERS[name](_mixer_config(name), nnx.Rngs(3))
    graphdef, state = nnx.split(mixer)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((B, T, HIDDEN)), jnp.float32)

    @jax.jit
    def dependency(ids):
        def f(x):
            return nnx.merge(graphdef, state)(x, segment_ids=ids)

        jac = jax.jacrev(f)(x)  # [B, T, HIDDEN, B, T, HIDDEN]
        return jnp.abs(jac).max(axis=(2, 5)), f(x)

    return dependency


@pytest.mark.parametrize("name", sorted(MIXERS))
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(ids=any_ids())
def test_every_mixer_follows_the_one_segment_rule(name, ids):
    """A real token depends on exactly the earlier real tokens of its own segment (padding is
    not a token; a reused id starts a new segment), within the conv's reach for the conv
    mixer; padding outputs 0. Outputs and gradients: the Jacobian's pattern."""
    dependency, y = (np.asarray(a) for a in _jacobian_fn(name)(ids))
    segments = rule_segments(ids)
    reach = _reach(name)
    for b in range(B):
        for t in range(T):
            if segments[b, t] == 0:
                assert not np.any(y[b, t]), (name, b, t, "padding must output 0")
                continue
            for c in range(B):
                for s in range(T):
                    may = c == b and s <= t and segments[c, s] == segments[b, t]
                    must = may and (reach is None or t - s < reach)
                    seen = dependency[b, t, c, s] > 0
                    assert seen == must, (name, ids.tolist(), (b, t), (c, s), seen, must)
