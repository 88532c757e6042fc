"""A byte-level text corpus that every machine has: the Python standard library's source.

:func:`load_stdlib_corpus` reads the ``.py`` files under ``sysconfig.get_paths()["stdlib"]``
(leaving out test suites and installed third-party packages), assigns each file to the
training or the validation split by a hash of its path relative to the root (so a file's split
never depends on which other files exist, and no file is cut in two), and concatenates each
split's files in sorted path order, each followed by one :data:`SEPARATOR` byte. Tokens are the
bytes themselves (vocabulary 256): no tokenizer, no download, and the same corpus on every
machine with the same Python version (:attr:`ByteCorpus.fingerprint` tells two apart).

:func:`text_task` turns a split into a training task for :func:`kda_lib.lab.train.train`: batch
``i`` is random windows of the split, the target of every position the next byte.
:func:`validation_windows` cuts fixed, evenly spaced windows for a deterministic validation
score.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pathlib
import sys
import sysconfig
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.checks import check_int

SEPARATOR = 0  # the byte written after every file (source files contain no NUL byte)
# folders whose files are not the library itself: test suites, installed packages, caches
EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)


class TextBatch(NamedTuple):
    """Windows of text: ``inputs [B, T]`` bytes, ``targets [B, T]`` the next byte of each,
    ``mask [B, T]`` all True (every position is scored). Same fields as
    :class:`kda_lib.lab.tasks.TaskBatch`, so :func:`kda_lib.lab.train.train` accepts it."""

    inputs: jax.Array
    targets: jax.Array
    mask: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class ByteCorpus:
    """The two splits of a byte corpus.

    Attributes:
      train, validation: ``uint8`` arrays, the split's files concatenated (each followed by
        :data:`SEPARATOR`).
      train_files, validation_files: the files (paths relative to ``root``), in order.
      root: the folder the files were read from.
      python_version: ``major.minor.micro`` of the interpreter that owns ``root``'s files.
    """

    train: np.ndarray
    validation: np.ndarray
    train_files: tuple[str, ...]
    validation_files: tuple[str, ...]
    root: str
    python_version: str

    @property
    def fingerprint(self) -> str:
        """sha256 (16 hex digits) of both splits' bytes and file lists: equal on two machines
        exactly when the corpora are."""
        digest = hashlib.sha256()
        for files, data in (
            (self.train_files, self.train),
            (self.validation_files, self.validation),
        ):
            digest.update("\n".join(files).encode())
            digest.update(data.tobytes())
        return digest.hexdigest()[:16]

    def describe(self) -> dict:
        """A JSON-ready summary: root, Python version, files and bytes per split, fingerprint."""
        return dict(
            root=self.root,
            python_version=self.python_version,
            train_files=len(self.train_files),
            validation_files=len(self.validation_files),
            train_bytes=int(self.train.size),
            validation_bytes=int(self.validation.size),
            fingerprint=self.fingerprint,
        )


def stdlib_root() -> pathlib.Path:
    """``sysconfig.get_paths()["stdlib"]``: where this interpreter's standard library lives."""
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def source_files(root: str | pathlib.Path) -> list[str]:
    """The ``*.py`` files under ``root`` (relative POSIX paths, sorted), leaving out any file
    inside a folder named in :data:`EXCLUDED_DIRS`.

    Raises:
      ValueError: ``root`` is not a folder, or holds no such file.
    """
    root = pathlib.Path(root)
    if not root.is_dir():
        raise ValueError(f"root must be a folder, got {str(root)!r}")
    files = sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if path.is_file() and not EXCLUDED_DIRS.intersection(path.relative_to(root).parts[:-1])
    )
    if not files:
        raise ValueError(f"no .py files under {str(root)!r} (outside {sorted(EXCLUDED_DIRS)})")
    return files


def in_validation(relative_path: str, validation_fraction: float) -> bool:
    """Whether a file goes to the validation split: the first 8 bytes of the sha256 of its
    relative path, read as a fraction of 2^64, fall below ``validation_fraction``."""
    # os.fsencode: a file name that is not valid UTF-8 (kept by Python as surrogate escapes)
    # hashes as its raw bytes; a valid one as its UTF-8 bytes, as before
    value = int.from_bytes(hashlib.sha256(os.fsencode(relative_path)).digest()[:8], "big")
    return value / 2**64 < validation_fraction


def load_stdlib_corpus(
    root: str | pathlib.Path | None = None,
    *,
    validation_fraction: float = 0.1,
    max_bytes: int | None = None,
) -> ByteCorpus:
    """Read the standard library's source files into a :class:`ByteCorpus`.

    Args:
      root: folder to read (default :func:`stdlib_root`; another folder of ``.py`` files
        works the same way, e.g. in tests).
      validation_fraction: expected share of files in the validation split, in (0, 1).
      max_bytes: keep only the first ``max_bytes`` bytes of each split (whole files first,
        then a cut), for small runs; None keeps everything.

    Raises:
      ValueError: a bad argument (named), or a split that ends up empty.
    """
    if isinstance(validation_fraction, bool) or not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction!r}")
    check_int("max_bytes", max_bytes, 2, optional=True)
    root = stdlib_root() if root is None else pathlib.Path(root)
    splits: dict[bool, list[str]] = {False: [], True: []}
    for name in source_files(root):
        splits[in_validation(name, validation_fraction)].append(name)
    data = {}
    for is_validation, names in splits.items():
        split = "validation" if is_validation else "train"
        if not names:
            raise ValueError(
                f"the {split} split of {str(root)!r} is empty: more files or another "
                f"validation_fraction (got {validation_fraction})"
            )
        parts, size = [], 0
        for name in names:
            parts.append((root / name).read_bytes() + bytes([SEPARATOR]))
            size += len(parts[-1])
            if max_bytes is not None and size >= max_bytes:
                break
        splits[is_validation] = names[: len(parts)]
        joined = b"".join(parts)
        data[split] = np.frombuffer(joined[:max_bytes] if max_bytes else joined, np.uint8)
    version = sys.version.split()[0] if root == stdlib_root() else "unknown"
    return ByteCorpus(
        train=data["train"],
        validation=data["validation"],
        train_files=tuple(splits[False]),
        validation_files=tuple(splits[True]),
        root=str(root),
        python_version=version,
    )


def _check_window(data: np.ndarray, seq_len: int) -> None:
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
        raise ValueError("data must be a 1-D uint8 array (a split of a ByteCorpus)")
    check_int("seq_len", seq_len)
    if data.size < seq_len + 1:
        raise ValueError(f"seq_len={seq_len} needs at least {seq_len + 1} bytes, got {data.size}")


@functools.partial(jax.jit, static_argnums=(2, 3))
def _draw_windows(key: jax.Array, data: jax.Array, batch: int, seq_len: int) -> TextBatch:
    starts = jax.random.randint(key, (batch,), 0, data.shape[0] - seq_len)
    windows = jax.vmap(lambda s: jax.lax.dynamic_slice(data, (s,), (seq_len + 1,)))(starts)
    windows = windows.astype(jnp.int32)
    return TextBatch(windows[:, :-1], windows[:, 1:], jnp.ones((batch, seq_len), bool))


def text_task(data: np.ndarray) -> Callable[[jax.Array, int, int], TextBatch]:
    """A task for :func:`kda_lib.lab.train.train` over one split: ``(key, batch, seq_len)`` ->
    :class:`TextBatch` of ``batch`` windows starting at uniform random offsets."""
    _check_window(data, 1)
    device_data = jnp.asarray(data)

    def task(key: jax.Array, batch: int, seq_len: int) -> TextBatch:
        _check_window(data, seq_len)
        return _draw_windows(key, device_data, batch, seq_len)

    return task


def validation_windows(data: np.ndarray, seq_len: int, count: int) -> TextBatch:
    """``count`` windows of ``seq_len`` bytes (plus the next byte as the last target) at
    evenly spaced offsets of ``data``: the same windows on every call, for a validation score
    that changes only when the model does."""
    _check_window(data, seq_len)
    check_int("count", count)
    starts = np.linspace(0, data.size - seq_len - 1, count).astype(np.int64)
    windows = np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int32)
    return TextBatch(
        jnp.asarray(windows[:, :-1]),
        jnp.asarray(windows[:, 1:]),
        jnp.ones((count, seq_len), bool),
    )
