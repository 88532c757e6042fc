"""A byte-level text corpus that every machine has: the Python standard library's source.

:func:`load_stdlib_corpus` reads the ``.py`` files under ``sysconfig.get_paths()["stdlib"]``
(leaving out test suites and installed third-party packages), assigns each file to the
training, the validation or the test split by a hash of its path relative to the root
(:func:`split_of`: a file's split never depends on which other files exist, and no file is cut
in two), and concatenates each split's files in sorted path order, each followed by one
:data:`SEPARATOR` byte. Tokens are the bytes themselves (vocabulary 256): no tokenizer, no
download, and the same corpus on every machine with the same Python version
(:attr:`ByteCorpus.fingerprint` tells two apart).

The test split (issue 39: the reported score comes from bytes that no decision has read) is
carved out of the training files only: a file's hash fraction ``u`` below
``validation_fraction`` puts it in validation, ``u`` in ``[validation_fraction,
validation_fraction + test_fraction)`` in test, any other ``u`` in training. So the validation
split (and every validation window) is the same with or without a test split, and
``test_fraction=0`` (the default) gives exactly the corpus, and the fingerprint, that the
records made before the test split existed were made with (``data/results/stdlib_lm_full.json``
and ``stdlib_lm_seeds.json``: trained on every non-validation file). With a test split the
training split lacks the test files, so its runs are not those records' runs.

:func:`text_task` turns a split into a training task for :func:`kda_lib.lab.train.train`: batch
``i`` is random windows of the split, the target of every position the next byte.
:func:`validation_windows` cuts fixed, evenly spaced windows of a held-out split (validation or
test) for a deterministic score.
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
    """The splits of a byte corpus: training, validation and (possibly empty) test.

    Attributes:
      train, validation, test: ``uint8`` arrays, the split's files concatenated (each followed
        by :data:`SEPARATOR`); ``test`` is empty when the corpus was loaded with
        ``test_fraction=0``.
      train_files, validation_files, test_files: the files (paths relative to ``root``), in
        order.
      root: the folder the files were read from.
      python_version: ``major.minor.micro`` of the interpreter that owns ``root``'s files.
    """

    train: np.ndarray
    validation: np.ndarray
    train_files: tuple[str, ...]
    validation_files: tuple[str, ...]
    root: str
    python_version: str
    test: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.uint8))
    test_files: tuple[str, ...] = ()

    @property
    def fingerprint(self) -> str:
        """sha256 (16 hex digits) of the splits' bytes and file lists: equal on two machines
        exactly when the corpora are. An empty test split adds nothing, so a corpus without one
        keeps the fingerprint it had before test splits existed."""
        digest = hashlib.sha256()
        splits = [(self.train_files, self.train), (self.validation_files, self.validation)]
        if self.test_files:
            splits.append((self.test_files, self.test))
        for files, data in splits:
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
            test_files=len(self.test_files),
            train_bytes=int(self.train.size),
            validation_bytes=int(self.validation.size),
            test_bytes=int(self.test.size),
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


def hash_fraction(relative_path: str) -> float:
    """The first 8 bytes of the sha256 of ``relative_path``, read as a fraction of 2^64 (in
    [0, 1)): where the file falls in :func:`split_of`."""
    # os.fsencode: a file name that is not valid UTF-8 (kept by Python as surrogate escapes)
    # hashes as its raw bytes; a valid one as its UTF-8 bytes, as before
    value = int.from_bytes(hashlib.sha256(os.fsencode(relative_path)).digest()[:8], "big")
    return value / 2**64


def in_validation(relative_path: str, validation_fraction: float) -> bool:
    """Whether a file goes to the validation split: its :func:`hash_fraction` falls below
    ``validation_fraction``."""
    return hash_fraction(relative_path) < validation_fraction


def split_of(relative_path: str, validation_fraction: float, test_fraction: float = 0.0) -> str:
    """``"validation"``, ``"test"`` or ``"train"``: the file's :func:`hash_fraction` ``u``
    below ``validation_fraction``, in ``[validation_fraction, validation_fraction +
    test_fraction)``, or above (so the validation files do not depend on ``test_fraction``)."""
    u = hash_fraction(relative_path)
    if u < validation_fraction:
        return "validation"
    return "test" if u < validation_fraction + test_fraction else "train"


def load_stdlib_corpus(
    root: str | pathlib.Path | None = None,
    *,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.0,
    max_bytes: int | None = None,
) -> ByteCorpus:
    """Read the standard library's source files into a :class:`ByteCorpus`.

    Args:
      root: folder to read (default :func:`stdlib_root`; another folder of ``.py`` files
        works the same way, e.g. in tests).
      validation_fraction: expected share of files in the validation split, in (0, 1).
      test_fraction: expected share of files in the test split, in [0, 1), taken from the
        training files (:func:`split_of`); 0 (the default) leaves the test split empty and the
        corpus as it was before test splits existed.
      max_bytes: keep only the first ``max_bytes`` bytes of each split (whole files first,
        then a cut), for small runs; None keeps everything.

    Raises:
      ValueError: a bad argument (named), or a split that ends up empty (the test split only
        when ``test_fraction`` > 0).
    """
    if isinstance(validation_fraction, bool) or not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction!r}")
    if isinstance(test_fraction, bool) or not 0.0 <= test_fraction < 1.0 - validation_fraction:
        raise ValueError(
            f"test_fraction must be in [0, 1 - validation_fraction) = [0, "
            f"{1.0 - validation_fraction:g}), got {test_fraction!r}"
        )
    check_int("max_bytes", max_bytes, 2, optional=True)
    root = stdlib_root() if root is None else pathlib.Path(root)
    names: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    for name in source_files(root):
        names[split_of(name, validation_fraction, test_fraction)].append(name)
    data, files = {}, {}
    for split, split_names in names.items():
        if not split_names and (split != "test" or test_fraction > 0):
            raise ValueError(
                f"the {split} split of {str(root)!r} is empty: more files or another "
                f"validation_fraction/test_fraction (got {validation_fraction}, {test_fraction})"
            )
        files[split], data[split] = _read_split(root, split_names, max_bytes)
    version = sys.version.split()[0] if root == stdlib_root() else "unknown"
    return ByteCorpus(
        train=data["train"],
        validation=data["validation"],
        train_files=files["train"],
        validation_files=files["validation"],
        root=str(root),
        python_version=version,
        test=data["test"],
        test_files=files["test"],
    )


def _read_split(
    root: pathlib.Path, names: list[str], max_bytes: int | None
) -> tuple[tuple[str, ...], np.ndarray]:
    """The files read (whole files until ``max_bytes``) and their bytes, each file followed by
    :data:`SEPARATOR`, cut at ``max_bytes``; ``((), empty)`` for no files."""
    parts, size = [], 0
    for name in names:
        parts.append((root / name).read_bytes() + bytes([SEPARATOR]))
        size += len(parts[-1])
        if max_bytes is not None and size >= max_bytes:
            break
    joined = b"".join(parts)
    data = np.frombuffer(joined[:max_bytes] if max_bytes else joined, np.uint8)
    return tuple(names[: len(parts)]), data


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
    evenly spaced offsets of ``data`` (a held-out split: validation or test): the same windows
    on every call, for a score that changes only when the model does. Windows share bytes
    when packed closer than ``seq_len + 1`` bytes apart (about when ``count * (seq_len + 1)``
    exceeds ``data.size``; :func:`windows_overlap` says exactly)."""
    starts = _window_starts(data, seq_len, count)
    windows = np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int32)
    return TextBatch(
        jnp.asarray(windows[:, :-1]),
        jnp.asarray(windows[:, 1:]),
        jnp.ones((count, seq_len), bool),
    )


def windows_overlap(data: np.ndarray, seq_len: int, count: int) -> bool:
    """Whether :func:`validation_windows` of ``data`` would share bytes between windows (then
    the windows are not independent draws, and a standard error over them is too small)."""
    starts = _window_starts(data, seq_len, count)
    return bool(count > 1 and np.diff(starts).min() < seq_len + 1)


def _window_starts(data: np.ndarray, seq_len: int, count: int) -> np.ndarray:
    _check_window(data, seq_len)
    check_int("count", count)
    return np.linspace(0, data.size - seq_len - 1, count).astype(np.int64)


class CopyProbe(NamedTuple):
    """Paired windows that test whether a model reads more than its last ``reach`` bytes.

    Every window is ``[first half | span]``, ``2 h`` bytes (``h = seq_len // 2``) with the span's
    next byte as the last target. In ``copy`` the first half is the span itself (the text
    repeats, ``h`` bytes back); in ``control`` it is another window's span. The two differ only
    in the first half, so at the ``scored`` positions (``[h + reach, 2 h)``, where the last
    ``reach + 1`` input bytes are the same in both) a model that reads at most its last
    ``reach`` bytes scores both alike; bits saved on ``copy`` come from the repeat ``h`` bytes
    back. ``copy`` and ``control``: :class:`TextBatch` ``[N, 2 h]``; ``scored``: ``(start,
    stop)`` positions."""

    copy: TextBatch
    control: TextBatch
    scored: tuple[int, int]


def copy_probe_windows(data: np.ndarray, seq_len: int, count: int, reach: int) -> CopyProbe:
    """:class:`CopyProbe` of ``count`` spans of ``seq_len // 2`` bytes at evenly spaced offsets
    of ``data`` (a held-out split); the control of span ``i`` starts with span ``i + 1``
    (cyclically). Needs ``count >= 2`` and ``reach < seq_len // 2``; the spans share no bytes
    when ``windows_overlap(data, seq_len // 2, count)`` is False."""
    check_int("count", count, 2)
    check_int("reach", reach)
    half = seq_len // 2
    if not reach < half:
        raise ValueError(f"reach must be below seq_len // 2 = {half}, got reach={reach}")
    spans = np.stack([data[s : s + half + 1] for s in _window_starts(data, half, count)])
    spans = spans.astype(np.int32)  # [N, h + 1]: the span and its next byte

    def windows(first_halves: np.ndarray) -> TextBatch:
        text = np.concatenate([first_halves, spans], axis=1)  # [N, 2 h + 1]
        return TextBatch(
            jnp.asarray(text[:, :-1]), jnp.asarray(text[:, 1:]), jnp.ones((count, 2 * half), bool)
        )

    return CopyProbe(
        windows(spans[:, :half]),
        windows(np.roll(spans[:, :half], -1, axis=0)),
        (half + reach, 2 * half),
    )
