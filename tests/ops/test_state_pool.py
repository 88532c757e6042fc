"""kda_pool_step: a decode step over slots of a state pool; kda_pool_verify: a draft of T
tokens over the slots, keeping the state after each row's accepted prefix. The intent of fla's
``test_fused_recurrent_vllm_decode`` in kda_lib's terms: 3B slots, B rows in a random
permutation of them, every untouched slot holding 1e30 (any stray read or write shows);
outputs and touched slots within fla's 0.005 relative error ratio of the recurrence run row by
row from each row's slot; untouched slots exactly as they were."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib import kda_pool_step, kda_pool_verify, kda_recurrent
from kda_lib.testing import assert_close, relative_l2

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
    # the token arguments by their own names and shapes (not q, g with a T axis)
    cases = [
        (dict(q_t=step["q_t"][:, None]), r"q_t must have shape \[B, H, K\] .*\(5, 1, 2, 16\)"),
        (dict(g_t=step["g_t"][..., :8]), r"g_t must have shape \[B, HV, K\]=\(5, 4, 16\), got "
         r"shape \(5, 4, 8\)"),
        (dict(v_t=step["v_t"][:, :3]), r"v_t must have shape \[B, HV, V\] with B=5 and HV a "),
        (dict(beta_t=step["beta_t"][:, None]), r"beta_t must have shape \[B, HV\]=\(5, 4\)"),
        (dict(k_t=step["k_t"].astype(np.int32)), "k_t must be a floating-point array"),
    ]  # fmt: skip
    for changes, message in cases:
        with pytest.raises(ValueError, match=message):
            kda_pool_step(jnp.asarray(pool), jnp.asarray(indices), **dict(step, **changes))


@pytest.mark.parametrize("kind", ["step", "verify"])
def test_bad_slots_under_jit_give_nan_rows_and_write_nothing(kind):
    """Under jit the slots are not checked: a row whose slot is out of range (N + 3), negative
    (-1) or shared with another row (both rows) outputs NaN and writes nothing; the other rows'
    outputs and every other slot are as with good slots."""
    pool, indices, draft = _draft_case(10)
    if kind == "step":
        tokens = lambda d: {f"{n}_t": x[:, 0] for n, x in d.items()}  # noqa: E731
        run = jax.jit(lambda p, i, d: kda_pool_step(p, i, **tokens(d)))
    else:
        run = jax.jit(lambda p, i, d: kda_pool_verify(p, i, **d, num_accepted_tokens=ACCEPTED))
    good_pool, good_o = (np.asarray(a) for a in run(jnp.asarray(pool), jnp.asarray(indices), draft))
    for slot, bad_rows in ((len(pool) + 3, [1]), (-1, [1]), (indices[0], [0, 1])):
        bad = indices.copy()
        bad[1] = slot
        new_pool, o = (np.asarray(a) for a in run(jnp.asarray(pool), jnp.asarray(bad), draft))
        assert np.isnan(o[bad_rows]).all(), slot
        np.testing.assert_array_equal(np.delete(o, bad_rows, 0), np.delete(good_o, bad_rows, 0))
        want, written = pool.copy(), np.delete(indices, bad_rows)
        want[written] = good_pool[written]
        np.testing.assert_array_equal(new_pool, want)


def test_a_float64_pool_is_computed_in_float64(x64):
    """float32 inputs over a float64 pool (under x64): the slots stay float64 and hold the
    float64 recurrence's state (float32 arithmetic would be ~1e-7 off)."""
    pool, indices, step = _case(3)
    new_pool, o = kda_pool_step(jnp.asarray(pool, jnp.float64), jnp.asarray(indices), **step)
    assert new_pool.dtype == jnp.float64 and o.dtype == jnp.float32
    row = {n[:-2]: np.asarray(x[:, None], np.float64) for n, x in step.items()}
    _, want = kda_recurrent(**row, initial_state=pool[indices].astype(np.float64),
                            output_final_state=True)  # fmt: skip
    assert_close(new_pool[indices], want, atol=1e-13, rtol=1e-13)


def test_pool_verify_keeps_no_state_per_token():
    """The verify carries each row's kept state through the draft, never the T token states
    (RESOURCE_EXHAUSTED for long drafts): its compiled temporaries are far below their size."""
    b, t, hv, k, v = 2, 64, 4, 64, 64
    shapes = [(2 * b, hv, k, v), (b,), (b, t, 2, k), (b, t, 2, k), (b, t, hv, v), (b, t, hv, k),
              (b, t, hv), (b,)]  # fmt: skip
    args = [jax.ShapeDtypeStruct(s, jnp.int32 if len(s) == 1 else jnp.float32) for s in shapes]
    compiled = jax.jit(kda_pool_verify).lower(*args).compile()
    token_states = b * t * hv * k * v * 4
    assert compiled.memory_analysis().temp_size_in_bytes < token_states // 4


T = 4  # draft length
ACCEPTED = np.array([1, 4, 2, 0, 3], np.int32)  # every count from none to the whole draft


def _draft_case(seed=7):
    """The pool of :func:`_case` and a T-token draft per row ``[B, T, ...]``."""
    pool, indices, _ = _case(seed)
    rng = np.random.default_rng(seed)
    qk = rng.uniform(size=(2, B, T, H, K))
    qk /= np.linalg.norm(qk, axis=-1, keepdims=True)
    draft = dict(
        q=qk[0], k=qk[1], v=rng.uniform(size=(B, T, HV, V)),
        g=-np.log1p(np.exp(-rng.normal(size=(B, T, HV, K)))),  # logsigmoid
        beta=1 / (1 + np.exp(-rng.uniform(size=(B, T, HV)))),
    )  # fmt: skip
    return pool, indices, {n: x.astype(np.float32) for n, x in draft.items()}


def test_pool_verify_keeps_the_state_after_the_accepted_prefix():
    """Each touched slot holds the state of running only the accepted tokens from it (the
    float64 recurrence; 0 accepted: the slot bit for bit as it was); the outputs of all T
    tokens are the recurrence's; untouched slots still hold 1e30 bit for bit."""
    pool, indices, draft = _draft_case()
    untouched = np.ones(len(pool), bool)
    untouched[indices] = False
    new_pool, o = kda_pool_verify(jnp.asarray(pool), jnp.asarray(indices), **draft,
                                  num_accepted_tokens=jnp.asarray(ACCEPTED), scale=0.5)  # fmt: skip
    new_pool, o = np.asarray(new_pool), np.asarray(o)
    assert o.shape == (B, T, HV, V)
    with jax.enable_x64(True):
        ref_o, ref_states = [], []
        for b, accepted in enumerate(ACCEPTED):
            slot = pool[indices[b] : indices[b] + 1].astype(np.float64)
            row = {n: np.asarray(x[b : b + 1], np.float64) for n, x in draft.items()}
            ref_o.append(kda_recurrent(**row, scale=0.5, initial_state=slot)[0][0])
            if accepted == 0:
                ref_states.append(slot[0])
                continue
            prefix = {n: x[:, :accepted] for n, x in row.items()}
            _, s_b = kda_recurrent(**prefix, scale=0.5, initial_state=slot, output_final_state=True)
            ref_states.append(s_b[0])
        ref_o, ref_states = np.stack(ref_o), np.stack(ref_states)
    for got, want in ((o, ref_o), (new_pool[indices], ref_states)):
        error = relative_l2(got, want)
        assert error < 0.005 and error < 1e-6, error  # fla's ratio; in fact float32 rounding
    np.testing.assert_array_equal(new_pool[indices[ACCEPTED == 0]], pool[indices[ACCEPTED == 0]])
    np.testing.assert_array_equal(new_pool[untouched], pool[untouched])  # still 1e30


def test_pool_verify_donates_the_pool_and_marks_bad_counts_under_jit():
    """The pool is consumed (in place); under an outer jit that donates it the update is
    aliased, and a count outside [0, T] (unchecked there) writes NaN to its row's slot only."""
    pool, indices, draft = _draft_case(8)
    before = jnp.asarray(pool)
    after, _ = kda_pool_verify(before, jnp.asarray(indices), **draft,
                               num_accepted_tokens=jnp.asarray(ACCEPTED))  # fmt: skip
    assert before.is_deleted() and not after.is_deleted()
    verify = jax.jit(lambda p, i, d, a: kda_pool_verify(p, i, **d, num_accepted_tokens=a),
                     donate_argnums=0)  # fmt: skip
    bad = ACCEPTED.copy()
    bad[2] = T + 1
    args = (after, jnp.asarray(indices), draft, jnp.asarray(bad))
    text = verify.lower(*args).compile().as_text()
    assert "input_output_alias" in text or "must-alias" in text
    kept = np.asarray(after)
    new_pool = np.asarray(verify(*args)[0])
    assert np.isnan(new_pool[indices[2]]).all()
    assert not np.isnan(np.delete(new_pool, indices[2], axis=0)).any()
    untouched = np.setdiff1d(np.arange(len(pool)), indices)
    np.testing.assert_array_equal(new_pool[untouched], kept[untouched])


def test_pool_verify_refuses_bad_inputs_by_name_before_any_work():
    pool, indices, draft = _draft_case(9)
    pool = jnp.asarray(pool)
    accepted = jnp.asarray(ACCEPTED)

    def call(idx=indices, counts=accepted, **changes):
        kda_pool_verify(pool, jnp.asarray(idx), **dict(draft, **changes),
                        num_accepted_tokens=counts)  # fmt: skip

    duplicate = indices.copy()
    duplicate[1] = duplicate[0]
    cases = [
        (dict(idx=duplicate), r"state_indices must be distinct slots in \[0, 15\)"),
        (dict(idx=indices + 15), r"state_indices must be distinct slots in \[0, 15\)"),
        (dict(idx=indices[:3]), r"state_indices must be \[B\]=5 ints"),
        (dict(counts=accepted.at[0].set(T + 1)), r"num_accepted_tokens must be in \[0, T=4\]"),
        (dict(counts=accepted.at[0].set(-1)), r"num_accepted_tokens must be in \[0, T=4\]"),
        (dict(counts=accepted[:4]), r"num_accepted_tokens must be \[B\]=5 ints"),
        (dict(counts=accepted.astype(jnp.float32)), r"num_accepted_tokens must be \[B\]=5 ints"),
        (dict(counts=list(ACCEPTED)), "num_accepted_tokens must be a jax or numpy array"),
        (dict(g=draft["g"][:, :2]), r"g must have shape \[B, T, HV, K\]"),
        (dict(k=draft["k"][:, :2]), r"k must have shape \[B, T, H, K\]"),
        (dict(beta=draft["beta"][..., :2]), "beta must have shape"),
        (dict(g=draft["g"].astype(np.int32)), "g must be a floating-point array"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            call(**kwargs)
    with pytest.raises(ValueError, match=r"pool must have shape \[N, HV, K, V\]"):
        kda_pool_verify(pool[:, :2], jnp.asarray(indices), **draft, num_accepted_tokens=accepted)
    assert not pool.is_deleted()  # refused before the donated call
