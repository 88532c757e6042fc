"""``implementation="auto"`` off TPU: ``"recurrent"`` for T <= 16; above, on CPU, the scan for
a call that is not differentiated (a state under 65536 numbers per token; the chunked form from
there) and the chunked form's forward and backward for one that is (``api._route``, a
``custom_jvp`` whose JVP is the transposed chunked VJP, so that reverse mode transposes it
back); the rules come from the recorded grid (``test_policy_grid.py`` checks them against it).
Each forward is compared with the form it stands for bit for bit (the same program); gradients
to float32 rounding (the chunked backward, transposed twice). Segment ids, initial and final
states and grouped value heads go through the route."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib import kda, kda_chunked, kda_recurrent
from kda_lib.ops.api import (
    CPU_CHUNKED_FORWARD_MIN_STATE,
    RECURRENT_MAX_AUTO_T,
    select_implementation,
)
from kda_lib.testing import assert_close, random_kda_inputs

B, H, HV, K, V = 1, 2, 4, 16, 8  # grouped value heads: two per q/k head
T = 80  # over RECURRENT_MAX_AUTO_T: one full 64-token chunk and a partial one
ARGNUMS = tuple(range(6))  # q, k, v, g, beta, initial_state


def _case(seq_len: int):
    inputs = random_kda_inputs(jax.random.key(seq_len), B, seq_len, HV, K, V)
    q, k = (inputs[n][:, :, :H] for n in ("q", "k"))
    args = (q, k, *(inputs[n] for n in ("v", "g", "beta")))
    half = seq_len // 2  # two segments, then two padding tokens
    segment_ids = jnp.concatenate(
        [
            jnp.ones((B, half), jnp.int32),
            jnp.full((B, seq_len - half - 2), 2, jnp.int32),
            jnp.zeros((B, 2), jnp.int32),
        ],
        axis=1,
    )
    initial_state = jax.random.normal(jax.random.key(1), (B, HV, K, V))
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
    assert jax.default_backend() == "cpu"  # the tests below rely on the CPU policy

    def picks(differentiated):
        return {
            t: select_implementation(
                seq_len=t,
                key_dim=K,
                dtype=jnp.float32,
                lower_bound=None,
                fused_gate=False,
                differentiated=differentiated,
            )
            for t in (RECURRENT_MAX_AUTO_T, RECURRENT_MAX_AUTO_T + 1)
        }

    assert picks(True) == {16: "recurrent", 17: "chunked"}, picks(True)
    assert picks(False) == {16: "recurrent", 17: "recurrent"}, picks(False)


def test_auto_forward_of_a_large_state_is_the_chunked_form():
    """From B * HV * K * V = 65536 state numbers per token the chunked form's forward beats the
    scan's on CPU (the recorded grid, DESIGN section 4): an undifferentiated call runs it, bit
    for bit; smaller states keep the scan."""
    assert CPU_CHUNKED_FORWARD_MIN_STATE == 65536
    cases = {(1, 4, 64, None): "recurrent", (2, 4, 64, 64): "recurrent",
             (1, 16, 64, None): "chunked", (1, 4, 128, None): "chunked", (4, 16, 64, 32): "chunked"}
    for (batch, heads, key_dim, value_dim), form in cases.items():
        picked = select_implementation(seq_len=T, key_dim=key_dim, dtype=jnp.float32,
                                       lower_bound=None, fused_gate=False, differentiated=False,
                                       batch=batch, num_heads=heads, value_dim=value_dim)
        assert picked == form, (batch, heads, key_dim, value_dim, picked)
    x = random_kda_inputs(jax.random.key(7), 1, 20, 4, 128, 128)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    _assert_identical(kda(*args), kda_chunked(*args), ("o", "final_state"))


def test_auto_forward_above_16_tokens_is_the_scan():
    """A call that is not differentiated runs the scan (precision "highest" too: the scan is
    float32 throughout); precision "input" keeps it on the chunked form."""
    args, options = _case(T)

    @jax.jit  # one program for the calls: a compilation is most of this test's time
    def forwards(q, k, v, g, beta, initial_state):
        common = dict(initial_state=initial_state, **options)
        return [
            kda(q, k, v, g, beta, **common),
            kda_recurrent(q, k, v, g, beta, **common),
            kda(q, k, v, g, beta, **common, precision="highest"),
            kda(q, k, v, g, beta, **common, precision="input"),
            kda_chunked(q, k, v, g, beta, **common, precision="input"),
        ]

    auto, recurrent, auto_highest, auto_input, chunked_input = forwards(*args)
    _assert_identical(auto, recurrent, ("o", "final_state"))
    _assert_identical(auto_highest, recurrent, ("o (highest)", "final_state (highest)"))
    _assert_identical(auto_input, chunked_input, ("o (input)", "final_state (input)"))


def test_auto_forward_eagerly_is_the_scan():
    args, options = _case(T)
    q, k, v, g, beta, initial_state = args
    got = kda(q, k, v, g, beta, initial_state=initial_state, **options)
    want = kda_recurrent(q, k, v, g, beta, initial_state=initial_state, **options)
    _assert_identical(got, want, ("o", "final_state"))


@functools.cache
def _compiled_value_and_grad(fn):
    """``fn``'s loss, forward outputs and gradients at ``_case(T)``, compiled once per worker for
    the two tests below: ``(args, compiled)``."""
    args, options = _case(T)
    program = jax.jit(jax.value_and_grad(_loss(fn, options), argnums=ARGNUMS, has_aux=True))
    return args, program.lower(*args).compile()


def test_auto_gradient_above_16_tokens_is_the_chunked_forms():
    auto, chunked = (
        compiled(*args) for args, compiled in map(_compiled_value_and_grad, (kda, kda_chunked))
    )
    (auto_loss, auto_forward), auto_grads = auto
    (chunked_loss, chunked_forward), chunked_grads = chunked
    _assert_identical(
        (auto_loss, *auto_forward), (chunked_loss, *chunked_forward), ("loss", "o", "final_state")
    )
    for name, got, want in zip(("q", "k", "v", "g", "beta", "initial_state"), auto_grads,
                               chunked_grads, strict=True):  # fmt: skip
        assert_close(got, want, name=f"d{name}")
    assert all(float(jnp.abs(x).max()) > 0 for x in auto_grads)  # gradients reach every input


def test_auto_up_to_16_tokens_is_the_recurrence():
    args, options = _case(RECURRENT_MAX_AUTO_T)

    @jax.jit
    def forwards(q, k, v, g, beta, initial_state):
        return [
            fn(q, k, v, g, beta, initial_state=initial_state, **options)
            for fn in (kda, kda_recurrent)
        ]

    auto, recurrent = forwards(*args)
    _assert_identical(auto, recurrent, ("o", "final_state"))


def _scan_lengths(jaxpr) -> list[int]:
    """Trip counts of every scan in a jaxpr and the jaxprs inside it."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.append(eqn.params["length"])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                if hasattr(sub, "eqns"):
                    found += _scan_lengths(sub)
    return found


def _trip_counts(hlo_text: str) -> list[int]:
    """Known trip counts of the while loops in compiled HLO text."""
    return [int(n) for n in re.findall(r'"known_trip_count":\{"n":"(\d+)"', hlo_text)]


def test_auto_under_grad_runs_no_scan_over_time():
    """The differentiated program (the one the test above runs) holds the chunked form's loops
    (over T / 64 chunks) and nothing of length T; the same inspection finds the scan in the
    forward-only program."""
    args, options = _case(T)
    loss = _loss(kda, options)
    grad = jax.value_and_grad(loss, argnums=ARGNUMS, has_aux=True)
    forward = jax.jit(lambda *a: loss(*a)[0])
    assert T in _scan_lengths(jax.make_jaxpr(forward)(*args).jaxpr)  # the inspection works
    assert T in _trip_counts(forward.lower(*args).compile().as_text())
    lengths = _scan_lengths(jax.make_jaxpr(grad)(*args).jaxpr)
    assert lengths and max(lengths) < T // 8, lengths
    trips = _trip_counts(_compiled_value_and_grad(kda)[1].as_text())
    assert not trips or max(trips) < T // 8, trips
