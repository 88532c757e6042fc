"""kda_lib.lab.corpus: the standard library as a byte corpus, split by file, deterministic."""

import hashlib

import jax
import numpy as np
import pytest

from kda_lib.lab.corpus import (
    SEPARATOR,
    copy_probe_windows,
    hash_fraction,
    in_validation,
    load_stdlib_corpus,
    source_files,
    split_of,
    stdlib_root,
    text_task,
    validation_windows,
    windows_overlap,
)


@pytest.fixture
def tree(tmp_path):
    """A small library: 40 modules, plus files the corpus must leave out."""
    for i in range(40):
        folder = tmp_path / ("pkg" if i % 3 else "") / ""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i:02d}.py").write_text(f"# module {i}\nvalue = {i} * 2\n")
    for skipped in ("test", "site-packages", "pkg/tests", "__pycache__"):
        (tmp_path / skipped).mkdir(parents=True, exist_ok=True)
        (tmp_path / skipped / "skip_me.py").write_text("raise SystemExit\n")
    (tmp_path / "notes.txt").write_text("not python\n")
    return tmp_path


def test_files_split_and_concatenation(tree):
    files = source_files(tree)
    assert len(files) == 40 and files == sorted(files)
    assert not any("skip_me" in f for f in files)
    corpus = load_stdlib_corpus(tree, validation_fraction=0.25)
    # the split of a file depends on its path alone: the sha256 rule, recomputed here
    for name in files:
        fraction = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64
        assert (name in corpus.validation_files) == (fraction < 0.25)
    assert sorted(corpus.train_files + corpus.validation_files) == files
    assert 0 < len(corpus.validation_files) < 40
    expected = b"".join((tree / f).read_bytes() + bytes([SEPARATOR]) for f in corpus.train_files)
    assert corpus.train.tobytes() == expected and corpus.train.dtype == np.uint8
    # deterministic, and adding a file moves no other file between the splits
    again = load_stdlib_corpus(tree, validation_fraction=0.25)
    assert again.fingerprint == corpus.fingerprint
    (tree / "zzz_new.py").write_text("x = 1\n")
    grown = load_stdlib_corpus(tree, validation_fraction=0.25)
    assert set(corpus.validation_files) <= set(grown.validation_files)
    assert set(corpus.train_files) <= set(grown.train_files)
    assert grown.fingerprint != corpus.fingerprint
    info = corpus.describe()
    assert info["train_bytes"] == corpus.train.size and info["train_files"] == len(files) - len(
        corpus.validation_files
    )


def test_a_test_split_leaves_the_validation_split_as_it_was(tree):
    """The test files come out of the training files only (issue 39's third stream): the
    validation split, its windows and, without a test split, the fingerprint stay those of the
    records made before test splits existed."""
    old = load_stdlib_corpus(tree, validation_fraction=0.25)
    assert old.test.size == 0 and old.test_files == ()
    split = load_stdlib_corpus(tree, validation_fraction=0.25, test_fraction=0.25)
    assert split.validation_files == old.validation_files
    np.testing.assert_array_equal(split.validation, old.validation)
    assert 0 < len(split.test_files) < len(old.train_files)
    assert sorted(split.train_files + split.test_files) == sorted(old.train_files)
    for name in source_files(tree):  # the rule, recomputed
        u = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64
        assert hash_fraction(name) == u
        expected = "validation" if u < 0.25 else "test" if u < 0.5 else "train"
        assert split_of(name, 0.25, 0.25) == expected
        assert (name in split.test_files) == (expected == "test")
    expected = b"".join((tree / f).read_bytes() + bytes([SEPARATOR]) for f in split.test_files)
    assert split.test.tobytes() == expected
    assert split.fingerprint != old.fingerprint
    # without a test split, the fingerprint is the one of the two-split corpus (older records)
    digest = hashlib.sha256()
    for files, data in ((old.train_files, old.train), (old.validation_files, old.validation)):
        digest.update("\n".join(files).encode())
        digest.update(data.tobytes())
    assert old.fingerprint == digest.hexdigest()[:16]
    info = split.describe()
    assert (info["test_files"], info["test_bytes"]) == (len(split.test_files), split.test.size)
    for bad in (-0.1, 0.75, True):
        with pytest.raises(ValueError, match="test_fraction must be in"):
            load_stdlib_corpus(tree, validation_fraction=0.25, test_fraction=bad)
    with pytest.raises(ValueError, match="the test split of .* is empty"):
        load_stdlib_corpus(tree, validation_fraction=0.25, test_fraction=1e-12)


def test_max_bytes_and_errors(tree, tmp_path_factory):
    small = load_stdlib_corpus(tree, validation_fraction=0.5, max_bytes=50)
    assert small.train.size == 50 and small.validation.size == 50
    assert len(small.train_files) < 20
    with pytest.raises(ValueError, match="validation_fraction must be in"):
        load_stdlib_corpus(tree, validation_fraction=1.0)
    with pytest.raises(ValueError, match="max_bytes must be None or an int >= 2"):
        load_stdlib_corpus(tree, max_bytes=1)
    with pytest.raises(ValueError, match="root must be a folder"):
        load_stdlib_corpus(tree / "missing")
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(ValueError, match="no .py files"):
        load_stdlib_corpus(empty)
    (empty / "only.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="split of .* is empty"):
        load_stdlib_corpus(empty)
    assert in_validation("a.py", 0.999999) and not in_validation("a.py", 1e-9)


def test_windows_are_next_byte_pairs(tree):
    corpus = load_stdlib_corpus(tree, validation_fraction=0.25)
    task = text_task(corpus.train)
    batch = task(jax.random.key(0), 5, 12)
    inputs, targets = np.asarray(batch.inputs), np.asarray(batch.targets)
    assert inputs.shape == targets.shape == (5, 12) and bool(np.asarray(batch.mask).all())
    data = corpus.train.tobytes()
    for row_in, row_out in zip(inputs, targets, strict=True):
        np.testing.assert_array_equal(row_in[1:], row_out[:-1])
        window = bytes(row_in.astype(np.uint8).tolist()) + bytes([int(row_out[-1])])
        assert window in data
    np.testing.assert_array_equal(task(jax.random.key(0), 5, 12).inputs, inputs)
    assert not np.array_equal(task(jax.random.key(1), 5, 12).inputs, inputs)
    fixed = validation_windows(corpus.validation, 8, 3)
    assert fixed.inputs.shape == (3, 8)
    np.testing.assert_array_equal(fixed.inputs[0], corpus.validation[:8])
    np.testing.assert_array_equal(fixed.targets[-1], corpus.validation[-8:])
    with pytest.raises(ValueError, match="needs at least"):
        task(jax.random.key(0), 1, corpus.train.size)
    with pytest.raises(ValueError, match="count must be a positive int"):
        validation_windows(corpus.validation, 8, 0)
    # 90 bytes hold exactly 10 windows of 8 + 1 bytes side by side, not 11
    data = np.arange(90, dtype=np.uint8)
    assert not windows_overlap(data, 8, 10) and not windows_overlap(data, 8, 1)
    assert windows_overlap(data, 8, 11)
    side_by_side = validation_windows(data, 8, 10)
    np.testing.assert_array_equal(np.asarray(side_by_side.inputs).ravel()[::8] % 9, 0)
    with pytest.raises(ValueError, match="1-D uint8 array"):
        text_task(np.zeros(10, np.int32))


def test_copy_probe_windows_differ_only_beyond_the_reach():
    """Copy: the span twice; control: another span, then the span. At every scored position
    the last reach + 1 inputs (and the target) are the same in both; the copy's first half is
    its second half, so the repeat lies exactly h bytes back."""
    data = np.random.default_rng(0).integers(1, 256, 400).astype(np.uint8)
    probe = copy_probe_windows(data, 20, 6, reach=4)
    half, (start, stop) = 10, probe.scored
    assert (start, stop) == (14, 20) and probe.copy.inputs.shape == (6, 20)
    copy, control = (np.asarray(w.inputs) for w in (probe.copy, probe.control))
    targets = [np.asarray(w.targets) for w in (probe.copy, probe.control)]
    np.testing.assert_array_equal(copy[:, :half], copy[:, half:])
    np.testing.assert_array_equal(control[:, half:], copy[:, half:])
    np.testing.assert_array_equal(control[:, :half], np.roll(copy[:, :half], -1, axis=0))
    assert not (control[:, :half] == copy[:, :half]).all(axis=1).any()
    np.testing.assert_array_equal(targets[0][:, half:], targets[1][:, half:])
    np.testing.assert_array_equal(targets[0][:, :-1], copy[:, 1:])  # next-byte targets
    for p in range(start, stop):
        np.testing.assert_array_equal(copy[:, p - 4 : p + 1], control[:, p - 4 : p + 1])
    spans = [bytes(row[half:].astype(np.uint8).tolist()) for row in copy]
    assert all(span in data.tobytes() for span in spans)
    with pytest.raises(ValueError, match="reach must be below seq_len // 2 = 10"):
        copy_probe_windows(data, 20, 6, reach=10)
    with pytest.raises(ValueError, match="count must be an int >= 2"):
        copy_probe_windows(data, 20, 1, reach=4)


def test_the_standard_library_corpus():
    corpus = load_stdlib_corpus()
    assert corpus.root == str(stdlib_root())
    assert {"os.py", "json/decoder.py"} <= set(corpus.train_files + corpus.validation_files)
    assert not any(f.startswith("test/") for f in corpus.train_files)
    assert corpus.train.size > 1_000_000 and corpus.validation.size > 100_000
    assert 0.03 < len(corpus.validation_files) / len(source_files(stdlib_root())) < 0.2
    assert b"def " in corpus.validation[:100_000].tobytes()
