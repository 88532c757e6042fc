"""Execute notebooks with papermill where no network socket may open, and record what ran.

    python3 scripts/run_notebooks_sandboxed.py --output RECORD.json [--cell-timeout S] [NB ...]

For a machine whose sandbox refuses every TCP socket, loopback included (the lent TPU VM):
the Jupyter kernel talks to papermill over unix sockets (``transport="ipc"``) instead of
jupyter_client's default TCP. Runs the notebooks (default: every ``notebooks/NN_*.ipynb``) at
their own (CI) parameters with ``KDA_NONINTERACTIVE=1``, as ``make notebooks`` does, one at a
time into ``--executed`` (default ``build/notebooks/``), and rewrites the JSON record after
each: the device kind and platform JAX sees, the implementation ``auto`` picks at T = 2,048
there, versions, and per notebook its wall time, its slowest cell and whether it ran to the end
(every assert held) or its first error. Exit status 1 if any notebook failed. On the TPU VM,
what its package index lacks (papermill, ipykernel and their needs) travels as wheels:
docs/RUNNING.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # kda_lib from the checkout
PROBE = """
import importlib.metadata as m, json, jax
from kda_lib.ops.api import select_implementation
d = jax.devices()[0]
print(json.dumps(dict(device_kind=d.device_kind, platform=d.platform,
    auto_at_2048=select_implementation(seq_len=2048, num_heads=16, key_dim=128, batch=1),
    versions={n: m.version(n) for n in ("jax", "jaxlib", "flax", "optax", "numpy", "papermill")})))
"""


# ipykernel's kernel with its IOPub pipe off: the pipe (output of forked subprocesses) binds
# tcp://127.0.0.1 whatever the transport, and where no TCP socket may open zmq aborts the kernel
# there ("Address family not supported by protocol", the lent v5e, 2026-12-06)
KERNEL_WITHOUT_TCP = (
    "from ipykernel import iostream, kernelapp\n"
    "iostream.IOPubThread._setup_pipe_in = lambda self: setattr(self, '_pipe_flag', False)\n"
    "kernelapp.launch_new_instance()"
)


def _kernel_manager_class(socket_dir: str):
    """A jupyter_client KernelManager whose kernel opens no TCP socket: its channels are unix
    sockets under ``socket_dir``, its IOPub pipe is off (:data:`KERNEL_WITHOUT_TCP`)."""
    from jupyter_client.manager import KernelManager
    from traitlets import default

    class UnixSocketKernelManager(KernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            cmd = super().format_kernel_cmd(extra_arguments)
            if cmd[1:3] != ["-m", "ipykernel_launcher"]:
                raise RuntimeError(f"expected ipykernel's kernel command, got {cmd}")
            return [cmd[0], "-c", KERNEL_WITHOUT_TCP, *cmd[3:]]

        @default("transport")
        def _transport_default(self):
            return "ipc"

        @default("ip")
        def _ip_default(self):
            return os.path.join(socket_dir, "kernel")

    return UnixSocketKernelManager


def _first_error(nb) -> str | None:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"{out.get('ename')}: {out.get('evalue', '')[:300]}"
    return None


def parse_args(argv=None):
    """The checked arguments (argparse's error, exit status 2, before any work)."""
    from kda_lib.lab.records import output_path_problem, replace_problem

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output", required=True, help="the JSON record (replaced)")
    p.add_argument("--cell-timeout", type=int, default=600, help="seconds a cell may run")
    p.add_argument("--executed", default=str(ROOT / "build" / "notebooks"),
                   help="the folder of the executed notebooks (default build/notebooks)")
    p.add_argument("notebooks", nargs="*", help="default: every notebooks/NN_*.ipynb")
    args = p.parse_args(argv)
    if args.cell_timeout <= 0:
        p.error(f"--cell-timeout must be positive, got {args.cell_timeout}")
    args.notebooks = [pathlib.Path(n) for n in args.notebooks] or sorted(
        ROOT.glob("notebooks/[0-9]*.ipynb"))
    if missing := [str(n) for n in args.notebooks if not n.is_file()]:
        p.error(f"no such notebook: {', '.join(missing)}")
    if problem := output_path_problem(args.output) or replace_problem(
            args.output, "notebook run", ("kind", "device_kind", "notebooks")):
        p.error(f"--output: {problem}")
    executed = pathlib.Path(args.executed)
    if executed.exists() and not executed.is_dir():
        p.error(f"--executed: {args.executed!r} is not a folder")
    here = executed.resolve()
    if sources := sorted({str(n.parent) for n in args.notebooks if n.parent.resolve() == here}):
        p.error(f"--executed: {sources[0]!r} holds the notebooks run: their executed "
                "copies would replace them; give another folder")
    if len({n.name for n in args.notebooks}) < len(args.notebooks):
        p.error("two notebooks have one name: their executed copies would replace each other")
    return args


def run(paths, output: str, cell_timeout: int, executed: str) -> bool:
    """Execute ``paths`` in order into the folder ``executed``, rewriting the record at
    ``output`` after each; True if all ran to the end."""
    import nbformat
    import papermill

    from kda_lib.lab.records import write_json

    # the probe and every kernel import this checkout's kda_lib, as the record describes
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ.update(KDA_NONINTERACTIVE="1", PYTHONPATH=path)
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    if probe.returncode:
        sys.exit(f"the device probe failed (no notebook ran):\n{probe.stderr[-2000:]}")
    record = dict(kind="notebook_run", **json.loads(probe.stdout.strip().splitlines()[-1]),
                  python=sys.version.split()[0], cell_timeout_s=cell_timeout,
                  date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  notebooks=[])  # fmt: skip
    out_dir = pathlib.Path(executed)
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = True
    with tempfile.TemporaryDirectory(prefix="kda-nb-") as sockets:
        manager = _kernel_manager_class(sockets)
        for path in paths:
            out = out_dir / path.name
            start, failure = time.perf_counter(), None
            try:
                papermill.execute_notebook(str(path), str(out), kernel_name="python3",
                                           cwd=str(path.parent), progress_bar=False,
                                           execution_timeout=cell_timeout,
                                           kernel_manager_class=manager)  # fmt: skip
            except Exception as e:  # papermill's error names the cell; the record keeps it
                failure = f"{type(e).__name__}: {str(e)[:300]}"
            seconds = time.perf_counter() - start
            nb = nbformat.read(out, as_version=4) if out.exists() else None
            durations = [c.get("metadata", {}).get("papermill", {}).get("duration") or 0.0
                         for c in (nb.cells if nb else [])]  # fmt: skip
            row = dict(notebook=path.stem, seconds=round(seconds, 1),
                       slowest_cell_s=round(max(durations, default=0.0), 1),
                       completed=failure is None,
                       error=failure and ((nb and _first_error(nb)) or failure))
            ok &= failure is None
            record["notebooks"].append(row)
            print(json.dumps(row), flush=True)
            write_json(record, output)
    return ok


def main(argv=None) -> int:
    args = parse_args(argv)
    return 0 if run(args.notebooks, args.output, args.cell_timeout, args.executed) else 1


if __name__ == "__main__":
    sys.exit(main())
