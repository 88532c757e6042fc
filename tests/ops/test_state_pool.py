"""kda_pool_step: a decode step over slots of a state pool. The intent of fla's
``test_fused_recurrent_vllm_decode`` in kda_lib's terms: 3B slots, B rows in a random
permutation of them, every untouched slot holding 1e30 (any stray read or write shows);
outputs and touched slots within fla's 0.005 relative error ratio of the recurrence run row by
row from each row's slot; untouched slots exactly as they were."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib import kda_pool_step, kda_recurrent
from kda_lib.testing import relative_l2

B, H, HV, K, V = 5, 2, 4, 16, 16  # an odd batch, grouped value heads
HUGE = 1e30


def _case(seed=42):
    rng = np.random.default_rng(seed)
    slots = 3 * B
    indices = rng.permutation(slots)[:B].astype(np.int32)
    pool = np.full((slots, HV, K, V), HUGE, np.float32)
    pool[indices] = rng.normal(size=(B, HV, K, V))
    qk = rng.uniform(size=(2, B, H, K))
    qk /= np.linalg.norm(qk, axis=-1, keepdims=True)
    step = dict(
        q_t=qk[0], k_t=qk[1], v_t=rng.uniform(size=(B, HV, V)),
        g_t=-np.log1p(np.exp(-rng.normal(size=(B, HV, K)))),  # logsigmoid
        beta_t=1 / (1 + np.exp(-rng.uniform(size=(B, HV)))),
    )  # fmt: skip
    return pool, indices, {n: x.astype(np.float32) for n, x in step.items()}


def test_pool_step_matches_the_recurrence_and_leaves_untouched_slots():
    pool, indices, step = _case()
    untouched = np.ones(len(pool), bool)
    untouched[indices] = False
    new_pool, o = kda_pool_step(jnp.asarray(pool), jnp.asarray(indices), **step, scale=0.5)
    new_pool, o = np.asarray(new_pool), np.asarray(o)
    with jax.enable_x64(True):  # the oracle: each row on its own, from its slot, float64
        ref_o, ref_states = [], []
        for b in range(B):
            row = {n[:-2]: np.asarray(x[b : b + 1, None], np.float64) for n, x in step.items()}
            slot = pool[indices[b] : indices[b] + 1].astype(np.float64)
            o_b, s_b = kda_recurrent(**row, scale=0.5, output_final_state=True, initial_state=slot)
            ref_o.append(o_b[0, 0])
            ref_states.append(s_b[0])
    assert relative_l2(o, np.stack(ref_o)) < 0.005
    assert relative_l2(new_pool[indices], np.stack(ref_states)) < 0.005
    np.testing.assert_array_equal(new_pool[untouched], pool[untouched])  # still 1e30


def test_pool_is_updated_in_place():
    """The pool is donated: the array passed in is consumed (its buffer is the result's);
    inside an outer jit that donates it, the step compiles to an in-place update."""
    pool, indices, step = _case(1)
    before = jnp.asarray(pool)
    after, _ = kda_pool_step(before, jnp.asarray(indices), **step)
    assert before.is_deleted() and not after.is_deleted()
    decode = jax.jit(lambda p, i, s: kda_pool_step(p, i, **s), donate_argnums=0)
    text = decode.lower(after, jnp.asarray(indices), step).compile().as_text()
    assert "input_output_alias" in text or "must-alias" in text


def test_pool_step_refuses_bad_slots_by_name():
    pool, indices, step = _case(2)
    bad = indices.copy()
    bad[1] = bad[0]
    with pytest.raises(ValueError, match="state_indices must be distinct slots in"):
        kda_pool_step(jnp.asarray(pool), jnp.asarray(bad), **step)
    with pytest.raises(ValueError, match=r"state_indices must be distinct slots in \[0, 15\)"):
        kda_pool_step(jnp.asarray(pool), jnp.asarray(indices + 15), **step)
    with pytest.raises(ValueError, match=r"pool must have shape \[N, HV, K, V\]"):
        kda_pool_step(jnp.asarray(pool[:, :2]), jnp.asarray(indices), **step)
    with pytest.raises(ValueError, match=r"state_indices must be \[B\]=5 ints"):
        kda_pool_step(jnp.asarray(pool), jnp.asarray(indices[:3]), **step)
