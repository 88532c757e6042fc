"""Context parallelism's algorithm on one TPU: the sequence in R slices under ``jax.vmap`` with
the context axis named (the collectives of :func:`kda_context_parallel` run over the mapped
axis), each slice by the Pallas kernels, equal to one pass over the whole sequence: outputs,
final state, gradients. A TPU test (``make test-tpu``): on a CPU the interpreter under vmap
also runs the recurrence (the non-finite fallback's cond becomes a select) and CP is tested on
simulated devices (tests/parallel/test_context_parallel.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib import kda
from kda_lib.parallel import kda_context_parallel
from kda_lib.testing import random_kda_inputs

RANKS = 2


def _split(x):  # [B, T, ...] -> [R, B, T / R, ...]
    return jnp.moveaxis(x.reshape(x.shape[0], RANKS, -1, *x.shape[2:]), 1, 0)


def _merge(x):
    return jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1, *x.shape[3:])


@jax.jit
def _both(x, cotangent):
    """``(one pass, context parallel)``: each ``(o, final, grads)`` of ``<o, cot> + |final|^2``."""

    def whole(x):
        o, s = kda(**x, output_final_state=True, implementation="pallas_tpu")
        return o, s

    def parallel(x):
        per_rank = lambda x: kda_context_parallel(**x, output_final_state=True,
                                                  implementation="pallas_tpu")  # fmt: skip
        o, s = jax.vmap(per_rank, axis_name="context")({n: _split(a) for n, a in x.items()})
        return _merge(o), s[0]

    def run(f):
        def loss(x):
            o, s = f(x)
            return jnp.sum(o * cotangent) + jnp.sum(s * s), (o, s)

        (_, (o, s)), grads = jax.value_and_grad(loss, has_aux=True)(x)
        return o, s, grads

    return run(whole), run(parallel)


@pytest.mark.tpu
@pytest.mark.skipif(jax.default_backend() != "tpu", reason="a TPU test (make test-tpu): on a CPU "
                    "tests/parallel/test_context_parallel.py runs CP on simulated devices")
def test_context_parallel_on_one_device_equals_one_pass():
    x = random_kda_inputs(jax.random.key(5), 1, 512, 1, 128)
    cotangent = jax.random.normal(jax.random.key(6), x["v"].shape)
    (o, s, grads), (o_cp, s_cp, grads_cp) = _both(x, cotangent)
    scale = lambda a: float(np.abs(np.asarray(a)).max())
    np.testing.assert_allclose(o_cp, o, atol=1e-5 * scale(o))
    np.testing.assert_allclose(s_cp, s, atol=1e-5 * scale(s))
    for name in grads:
        np.testing.assert_allclose(grads_cp[name], grads[name], atol=1e-5 * scale(grads[name]),
                                   err_msg=name)  # fmt: skip
