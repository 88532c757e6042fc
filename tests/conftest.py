"""Shared fixtures. Eight simulated CPU devices are configured before jax is imported so the
context-parallel tests can build meshes; every other test runs on device 0 as usual.

The tests compile many small programs and run each once or twice, so XLA:CPU's compile time
dominates the suite; its fast-compile flags (no LLVM optimisation) roughly halve it. Notebooks
are executed with the environment's own XLA_FLAGS (``USER_XLA_FLAGS``), as a user runs them."""

import os

USER_XLA_FLAGS = os.environ.get("XLA_FLAGS")
# the suite's defaults; a flag the user already set keeps the user's value. The last two are
# kda_lib.emulation.FAST_COMPILE_OPTIONS as flags (importing kda_lib here would import jax).
SUITE_XLA_FLAGS = (
    "--xla_force_host_platform_device_count=8",
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)
_user = USER_XLA_FLAGS or ""
_added = [f for f in SUITE_XLA_FLAGS if f.split("=")[0] not in _user]
os.environ["XLA_FLAGS"] = " ".join([*_user.split(), *_added])
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402

from kda_lib.gating import kda_gate  # noqa: E402


@pytest.fixture
def x64():
    """Run the test body with float64 enabled (the oracle's precision)."""
    with jax.enable_x64(True):
        yield


def make_inputs(
    key,
    batch,
    seq_len,
    heads,
    key_dim,
    value_dim,
    *,
    dtype=jnp.float32,
    gate="softplus",
    gate_scale=1.0,
    with_state=False,
):
    """Random KDA inputs: L2-normalised q/k, gates from kda_gate, beta in (0, 1)."""
    ks = jax.random.split(key, 7)
    shape = (batch, seq_len, heads, key_dim)
    q = jax.random.normal(ks[0], shape, jnp.float32)
    k = jax.random.normal(ks[1], shape, jnp.float32)
    q = q / jnp.linalg.norm(q, axis=-1, keepdims=True)
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jax.random.normal(ks[2], (batch, seq_len, heads, value_dim), jnp.float32)
    f = jax.random.normal(ks[3], shape, jnp.float32)
    a_log = jnp.log(jnp.linspace(1.0, 16.0, heads))
    dt_bias = jax.random.normal(ks[4], (heads * key_dim,)) * 0.5
    lower_bound = None if gate == "softplus" else -5.0
    g = kda_gate(f, a_log, dt_bias, lower_bound=lower_bound) * gate_scale
    beta = jax.nn.sigmoid(jax.random.normal(ks[5], (batch, seq_len, heads)))
    out = dict(q=q, k=k, v=v, g=g, beta=beta)
    if with_state:
        out["initial_state"] = 0.5 * jax.random.normal(
            ks[6], (batch, heads, key_dim, value_dim), jnp.float32
        )
    return {n: x if n == "initial_state" else x.astype(dtype) for n, x in out.items()}


def to_dtype(inputs, dtype):
    return {n: x.astype(dtype) for n, x in inputs.items()}


def pytest_collection_modifyitems(config, items):
    """Start the notebook executions first, 07 (the longest test, minutes) at the very front:
    `pytest -n 2` hands tests out in collection order, so a long test collected last would run
    alone at the end while the other worker idles."""

    def rank(item):
        if item.originalname != "test_notebook_executes":
            return 2
        return 0 if "07_synthetic_recall" in item.name else 1

    items.sort(key=rank)  # stable: the original order within each rank
