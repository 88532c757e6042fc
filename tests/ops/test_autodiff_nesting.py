"""Which autodiff kda()'s hand-written backwards serve when transforms over different inputs
nest (api.unserved_autodiff orders the transforms by depth, not by input)."""

import functools

import jax
import jax.numpy as jnp
import pytest

from kda_lib import kda
from kda_lib.ops import api
from kda_lib.testing import assert_close, random_kda_inputs


@pytest.mark.tpu  # the tracers of the TPU image's JAX (0.10.2) too
def test_the_innermost_transform_decides_across_inputs():
    """Two inputs, each carried by a different transform: forward over reverse (a jvp in q of a
    gradient in k) is served where one reverse pass is ("pure"), reverse over forward is not;
    two reverse passes over two inputs count as a gradient of a gradient ("any")."""
    seen = {}

    def probe(name):
        def f(q, k):
            seen[name] = (api.unserved_autodiff([q, k], "pure"),
                          api.unserved_autodiff([q, k], "any"))  # fmt: skip
            return jnp.sum(jnp.sin(q) * k)

        return f

    x = jnp.ones(3)
    jax.jvp(lambda q: jax.grad(probe("jvp_q(grad_k)"), 1)(q, x), (x,), (x,))
    jax.grad(lambda k: jax.jvp(lambda q: probe("grad_k(jvp_q)")(q, k), (x,), (x,))[1])(x)
    jax.grad(lambda q: jax.grad(probe("grad_q(grad_k)"), 1)(q, x).sum())(x)
    jax.jit(lambda q: jax.jvp(lambda q: jax.grad(probe("jit(jvp_q(grad_k))"), 1)(q, x),
                              (q,), (q,)))(x)  # fmt: skip
    assert seen == {"jvp_q(grad_k)": (False, True), "grad_k(jvp_q)": (True, True),
                    "grad_q(grad_k)": (False, True),
                    "jit(jvp_q(grad_k))": (False, True)}  # fmt: skip


def test_forward_over_reverse_across_inputs_through_chunked_and_pallas():
    """A jvp in q of the gradient in k (a mixed second derivative) runs through the chunked
    form's backward and equals the recurrence's (before: refused, as if forward mode were
    innermost); through the Pallas kernels it, and a gradient in q of the gradient in k, are
    refused by name before any kernel runs. T = 20 in chunks of 4 (five, one merge)."""
    x = random_kda_inputs(jax.random.key(5), 1, 20, 1, 4, 4)

    def mixed(implementation, **kw):
        loss = lambda q, k: jnp.sum(kda(q, k, x["v"], x["g"], x["beta"], chunk_size=4,  # noqa: E731
                                        implementation=implementation, **kw)[0] ** 2)
        return jax.jvp(lambda q: jax.grad(loss, 1)(q, x["k"]), (x["q"],), (x["q"],))[1]

    assert_close(mixed("chunked"), mixed("recurrent"), atol=1e-6, rtol=1e-5)
    big = random_kda_inputs(jax.random.key(9), 1, 40, 1, 128)
    run = functools.partial(kda, implementation="pallas_tpu")
    loss = lambda q, k: jnp.sum(run(q, k, big["v"], big["g"], big["beta"])[0])  # noqa: E731
    refusal = "implementation='pallas_tpu'.*implementation='recurrent'"
    with pytest.raises(TypeError, match=refusal):
        jax.jvp(lambda q: jax.grad(loss, 1)(q, big["k"]), (big["q"],), (big["q"],))
    with pytest.raises(TypeError, match=refusal):
        jax.grad(lambda q: jax.grad(loss, 1)(q, big["k"]).sum())(big["q"])
