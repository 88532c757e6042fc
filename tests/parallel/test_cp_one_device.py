"""Context parallelism's algorithm on one device (:func:`kda_lib.teaching.context_parallel.
context_parallel_on_one_device`: the sequence in R slices under ``jax.vmap`` with the context
axis named) equals one pass over the whole sequence: outputs, final state, gradients. On a TPU
(``make test-tpu``) each slice runs the Pallas kernels; on a CPU the portable chunked form (the
interpreted kernels under vmap also run the recurrence: the non-finite fallback's cond becomes a
select), and CP on simulated devices is tests/parallel/test_context_parallel.py's."""

import jax
import pytest

from kda_lib.teaching.context_parallel import context_parallel_on_one_device, layer_inputs


def _errors(seq_len, key_dim, implementation):
    # the layer's initial gate: a slice's incoming state matters (random_kda_inputs' own gate
    # forgets it within tens of tokens)
    x = layer_inputs(jax.random.key(5), 1, seq_len, 1, key_dim, key_dim)
    cotangent = jax.random.normal(jax.random.key(6), x["v"].shape)
    return context_parallel_on_one_device(x, cotangent, ranks=2, implementation=implementation)


def test_context_parallel_on_one_device_equals_one_pass_on_the_cpu():
    errors = _errors(64, 16, "chunked")
    assert set(errors) == {"o", "state", "dq", "dk", "dv", "dg", "dbeta"}
    assert max(errors.values()) < 1e-5, errors


@pytest.mark.tpu
@pytest.mark.skipif(jax.default_backend() != "tpu", reason="a TPU test (make test-tpu): the "
                    "Pallas kernels compiled; the CPU test above runs the chunked form")
def test_context_parallel_on_one_device_equals_one_pass():
    errors = _errors(512, 128, "pallas_tpu")
    assert max(errors.values()) < 1e-5, errors
