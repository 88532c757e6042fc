"""Context parallelism across processes, as on several hosts: two JAX processes on this
machine (CPU collectives through gloo, coordinator on 127.0.0.1), two simulated devices each,
one mesh over all four devices. The CP layer's forward and backward on data fed with
``jax.make_array_from_process_local_data`` equal one device's: the output gathered from both
processes and each process's copy of every parameter's gradient
(tests/parallel/multihost/cp_worker.py)."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

WORKER = pathlib.Path(__file__).parent / "multihost" / "cp_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_context_parallel_layer_across_two_processes(tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), "2", coordinator, str(tmp_path / f"{i}.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for i, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"process {i} failed:\n{out[-4000:]}"
    results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    assert [r["devices"] for r in results] == [4, 4]
    errors = results[0]["errors"]  # process 0 compared y and both processes' gradients
    assert errors["y"] < 1e-5, errors
    assert max(errors.values()) < 1e-4, errors
    counts = [sum(n.startswith(f"grad process {i} ") for n in errors) for i in range(2)]
    assert counts[0] == counts[1] > 10, counts  # every parameter's gradient, on each process
