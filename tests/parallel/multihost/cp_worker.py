"""One process of the two-process context-parallel check (run by tests/parallel/test_multihost.py).

Usage: ``python cp_worker.py PROCESS_ID NUM_PROCESSES COORDINATOR OUT_JSON``. Each process has
2 simulated CPU devices; the mesh spans all 4. The recipe is the README's several-hosts one:
``jax.distributed.initialize``, a mesh over every device, each process feeding its part of the
sequence with ``jax.make_array_from_process_local_data``, then the layer as usual. The output
and both processes' gradients are gathered on every process; process 0 compares them with the
one-device reference and writes the errors (process 1 writes its device count).
"""

import json
import os
import sys

# two simulated devices per process; fast-compile flags as the rest of the suite uses
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true"
)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import kda_lib  # noqa: E402


def _loss_and_output(layer, x, ids, cot):
    y = layer(x, segment_ids=ids)
    return jnp.sum(y * cot), y


def _flat_grads(grads):
    """``(paths, sizes, one vector of every parameter's gradient)``: this process's copy."""
    pairs = jax.tree_util.tree_leaves_with_path(nnx.state(grads, nnx.Param))
    values = [np.ravel(np.asarray(g.addressable_data(0))) for _, g in pairs]
    return [p for p, _ in pairs], [v.size for v in values], np.concatenate(values)


def _errors(config, inputs, y_all, grads_all):
    """The one-device reference on ``inputs`` (x, ids, cotangent): the largest absolute error
    of the gathered CP output, and of each process's gradient of each parameter relative to the
    reference's largest entry."""
    reference = kda_lib.KimiDeltaAttention(config, rngs=nnx.Rngs(0))
    with jax.default_device(jax.local_devices()[0]):  # one compiled program: y and grads
        grads_ref, y_ref = nnx.jit(nnx.grad(_loss_and_output, has_aux=True))(
            reference, *(jnp.asarray(a) for a in inputs)
        )
    errors = {"y": float(np.max(np.abs(y_all - np.asarray(y_ref))))}
    paths, sizes, want = _flat_grads(grads_ref)
    cuts = np.cumsum(sizes)[:-1]
    for process, got in enumerate(grads_all):
        pieces = zip(paths, np.split(got - want, cuts), np.split(want, cuts), strict=True)
        for path, diff, ref in pieces:
            name = f"grad process {process} {jax.tree_util.keystr(path)}"
            errors[name] = float(np.max(np.abs(diff))) / max(float(np.max(np.abs(ref))), 1e-6)
    return errors


def main():
    process_id, num_processes, coordinator, out_path = sys.argv[1:5]
    process_id, num_processes = int(process_id), int(num_processes)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )
    assert jax.device_count() == 2 * num_processes and jax.local_device_count() == 2

    # the recurrent form compiles fastest; the chunked one under CP: tests/parallel
    config = kda_lib.KDAConfig(hidden_size=16, num_heads=2, head_dim=8, implementation="recurrent")
    batch, seq_len = 2, 48
    x_full = np.asarray(jax.random.normal(jax.random.key(1), (batch, seq_len, 16)), np.float32)
    ids_full = np.ones((batch, seq_len), np.int32)
    ids_full[0, 20:] = 2  # a document boundary inside process 0's half
    ids_full[1, 30:34] = 0  # padding inside process 1's half
    ids_full[1, 34:] = 3
    cotangent = np.asarray(jax.random.normal(jax.random.key(2), (batch, seq_len, 16)), np.float32)

    # the mesh over every device of every process; each process feeds its half of T
    mesh = jax.make_mesh(
        (jax.device_count(),), ("context",), axis_types=(jax.sharding.AxisType.Auto,)
    )
    layer = kda_lib.KimiDeltaAttention(config, rngs=nnx.Rngs(0), mesh=mesh)
    half = seq_len // num_processes
    mine = slice(process_id * half, (process_id + 1) * half)

    def global_array(full, spec):
        local = full[:, mine] if spec != P() else full
        return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), local)

    seq3, seq2 = P(None, "context", None), P(None, "context")
    x = global_array(x_full, seq3)
    ids = global_array(ids_full, seq2)
    cot = global_array(cotangent, seq3)
    # one program across the processes: op by op, every eager op would be compiled and
    # synchronised across them separately
    grads, y = nnx.jit(nnx.grad(_loss_and_output, has_aux=True))(layer, x, ids, cot)
    # both processes take part: y whole (its slices live on both), each one's gradients [2, N]
    y_all, grads_all = multihost_utils.process_allgather(
        (y, _flat_grads(grads)[2][None]), tiled=True
    )
    result = {"process": process_id, "devices": jax.device_count()}
    if process_id == 0:  # the one-device reference, once, after the processes' common work
        result["errors"] = _errors(config, (x_full, ids_full, cotangent), y_all, grads_all)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
