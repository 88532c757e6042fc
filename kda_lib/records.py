"""JSON records written by the command lines (benchmark tables, training runs).

One policy for both: the output path is checked before any work (:func:`output_path_problem`),
records are strict JSON (a NaN or infinite number becomes null: :func:`strict_json`), and they
are written atomically (:func:`write_json`), so an interrupted run never leaves a truncated
file nor destroys an older one.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import tempfile


def output_path_problem(path: str | pathlib.Path) -> str | None:
    """Why a JSON record cannot be written to ``path`` (None: it can): ``path`` is a folder, a
    parent is a file, or the folder cannot be created or written to. Creates the folder (as
    writing the record would) to find out."""
    path = pathlib.Path(path)
    if path.is_dir():
        return f"{str(path)!r} is a directory; give a file path such as {str(path / 'run.json')!r}"
    for ancestor in (path.parent, *path.parent.parents):
        if ancestor.exists() and not ancestor.is_dir():
            return f"{str(ancestor)!r} is a file, so {str(path)!r} cannot be created"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as error:
        return f"cannot write {str(path)!r}: {error}"
    return None


def strict_json(value):
    """``value`` with every non-finite float replaced by None: JSON has no NaN or infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def dumps(document) -> str:
    """Indented strict JSON text of ``document``, with a final newline."""
    return json.dumps(strict_json(document), indent=1, allow_nan=False) + "\n"


def write_json(document, path: str | pathlib.Path) -> pathlib.Path:
    """Write ``document`` as strict JSON, atomically: a temporary file in the same folder, then
    ``os.replace``. Creates folders; returns the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(dumps(document))
            file.flush()
            os.fsync(file.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes it 0600; a record is world-readable
        os.replace(temporary, path)
    except BaseException:
        pathlib.Path(temporary).unlink(missing_ok=True)
        raise
    return path
