"""``implementation="auto"`` off TPU: ``"recurrent"`` for T <= 16, ``"chunked"`` above, for
calls that are differentiated and calls that are not (the measured reasons are beside the
policy in ``kda_lib/ops/registry.py``). Each case compares ``auto`` with the form it stands for
bit for bit: the same program, so the same bits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib import kda, kda_chunked, kda_recurrent
from kda_lib.ops.api import RECURRENT_MAX_AUTO_T, select_implementation
from kda_lib.testing import random_kda_inputs

B, H, K, V = 1, 2, 16, 8
T = 80  # over RECURRENT_MAX_AUTO_T: one full 64-token chunk and a partial one
ARGNUMS = tuple(range(6))  # q, k, v, g, beta, initial_state


def _case(seq_len: int):
    inputs = random_kda_inputs(jax.random.key(seq_len), B, seq_len, H, K, V)
    args = tuple(inputs[n] for n in ("q", "k", "v", "g", "beta"))
    half = seq_len // 2  # two segments, then two padding tokens
    segment_ids = jnp.concatenate(
        [jnp.ones((B, half), jnp.int32), jnp.full((B, seq_len - half - 2), 2, jnp.int32),
         jnp.zeros((B, 2), jnp.int32)], axis=1)
    initial_state = jax.random.normal(jax.random.key(1), (B, H, K, V))
    options = dict(segment_ids=segment_ids, output_final_state=True)
    return (*args, initial_state), options


def _loss(fn, options):
    def loss(q, k, v, g, beta, initial_state):
        o, final = fn(q, k, v, g, beta, initial_state=initial_state, **options)
        return jnp.sum(jnp.sin(o)) + jnp.sum(final**2), (o, final)

    return loss


def _assert_identical(got, want, names):
    for name, x, y in zip(names, got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


def test_the_suite_runs_off_tpu():
    assert jax.default_backend() != "tpu"  # the tests below rely on auto never picking Mosaic
    picks = {t: select_implementation(seq_len=t, key_dim=K, dtype=jnp.float32,
                                      lower_bound=None, fused_gate=False)
             for t in (RECURRENT_MAX_AUTO_T, RECURRENT_MAX_AUTO_T + 1)}
    assert picks == {16: "recurrent", 17: "chunked"}, picks


def test_auto_forward_above_16_tokens_is_the_chunked_form_with_or_without_a_precision():
    """A call that is not differentiated: no scan in between, whatever the precision."""
    args, options = _case(T)

    @jax.jit  # one program for the four calls: a compilation is most of this test's time
    def forwards(q, k, v, g, beta, initial_state):
        return [fn(q, k, v, g, beta, initial_state=initial_state, **options, **precision)
                for precision in ({}, {"precision": "highest"}) for fn in (kda, kda_chunked)]

    auto, chunked, auto_highest, chunked_highest = forwards(*args)
    _assert_identical(auto, chunked, ("o", "final_state"))
    _assert_identical(auto_highest, chunked_highest, ("o (highest)", "final_state (highest)"))


def test_auto_gradient_above_16_tokens_is_the_chunked_forms():
    args, options = _case(T)
    auto, chunked = (
        jax.jit(jax.value_and_grad(_loss(fn, options), argnums=ARGNUMS, has_aux=True))(*args)
        for fn in (kda, kda_chunked))
    (auto_loss, auto_forward), auto_grads = auto
    (chunked_loss, chunked_forward), chunked_grads = chunked
    _assert_identical((auto_loss, *auto_forward, *auto_grads),
                      (chunked_loss, *chunked_forward, *chunked_grads),
                      ("loss", "o", "final_state", "dq", "dk", "dv", "dg", "dbeta",
                       "dinitial_state"))
    assert all(float(jnp.abs(x).max()) > 0 for x in auto_grads)  # gradients reach every input


def test_auto_up_to_16_tokens_is_the_recurrence():
    args, options = _case(RECURRENT_MAX_AUTO_T)

    @jax.jit
    def forwards(q, k, v, g, beta, initial_state):
        return [fn(q, k, v, g, beta, initial_state=initial_state, **options)
                for fn in (kda, kda_recurrent)]

    auto, recurrent = forwards(*args)
    _assert_identical(auto, recurrent, ("o", "final_state"))
