"""Fail when a cell of a notebook executed by papermill ran for the whole cell timeout.

    python scripts/check_cell_times.py TIMEOUT_S build/notebooks/NN_name.ipynb [...]

``make notebooks`` runs it after each papermill call. A cell whose execute reply nbclient
waited for until the timeout can still be recorded as completed (a widget's messages can make
the reply arrive unseen until then: jupyter/nbclient#312); its recorded duration
(``metadata.papermill.duration``) gives it away. Exit 1 naming each such cell, 0 otherwise.
"""

from __future__ import annotations

import sys

import nbformat


def stalled_cells(nb, timeout_s: float) -> list[str]:
    """``cell N (seconds): first line`` for each cell of ``nb`` that ran ``timeout_s`` or longer."""
    found = []
    for index, cell in enumerate(nb.cells):
        duration = cell.get("metadata", {}).get("papermill", {}).get("duration") or 0.0
        if duration >= timeout_s:
            first = (cell.source.strip().splitlines() or [""])[0]
            found.append(f"cell {index} ({duration:.0f} s): {first[:60]}")
    return found


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    timeout_s, paths = float(argv[0]), argv[1:]
    status = 0
    for path in paths:
        for cell in stalled_cells(nbformat.read(path, as_version=4), timeout_s):
            print(f"{path}: {cell} reached the {timeout_s:.0f} s cell timeout", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
