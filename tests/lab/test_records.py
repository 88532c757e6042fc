"""kda_lib.lab.records: records that several processes add to, under a lock."""

import json
import multiprocessing
import time

import pytest

from kda_lib.lab import records


def _add_runs(path: str, name: str) -> None:
    """A writer: 10 runs, each merged into the record at ``path`` under its lock."""

    def add(key):
        def merge(document):
            document = document or {"runs": []}
            time.sleep(0.01)  # a read-modify-write window another writer could fall into
            return {"runs": [*document["runs"], key]}

        return merge

    for i in range(10):
        records.update_json(path, add(f"{name}{i}"))


# the forked writers run only file I/O and flock: none of JAX's threads is needed in them
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_two_processes_updating_one_record_lose_nothing(tmp_path):
    """One writer reaches the record through a symlink, the other by its real path: both
    share one lock, so all 20 runs are kept (the link's own lock kept 10 of 20)."""
    path = tmp_path / "data" / "record.json"
    path.parent.mkdir()
    (tmp_path / "link.json").symlink_to(path)
    context = multiprocessing.get_context("fork")  # the child inherits the imports: no JAX load
    writers = [
        context.Process(target=_add_runs, args=(str(tmp_path / where), name))
        for where, name in (("link.json", "a"), ("data/record.json", "b"))
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    assert [w.exitcode for w in writers] == [0, 0]
    runs = json.loads(path.read_text())["runs"]
    assert sorted(runs) == sorted(f"{n}{i}" for n in "ab" for i in range(10))
    assert (tmp_path / "link.json").is_symlink()
    assert (path.parent / ".record.json.lock").exists()  # the sidecar, never the record itself


@pytest.mark.parametrize(
    ("text", "match"),
    [('{"runs": [', "not a readable JSON record"), ("[1, 2]", "holds JSON list")],
)
def test_a_damaged_record_is_refused_and_left_alone(tmp_path, text, match):
    path = tmp_path / "record.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        records.update_json(path, lambda document: {"runs": []})
    assert path.read_text() == text


def test_an_absent_record_reads_as_none(tmp_path):
    assert records.read_json_document(tmp_path / "none.json") is None
    document = records.update_json(tmp_path / "new.json", lambda d: {"was": d})
    assert document == {"was": None} == json.loads((tmp_path / "new.json").read_text())
