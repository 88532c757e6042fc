"""kda_lib.lab.records: records that several processes add to, under a lock."""

import json
import subprocess
import sys
import textwrap

import pytest

from kda_lib.lab import records

WRITER = textwrap.dedent(
    """
    import sys, time
    from kda_lib.lab.records import update_json

    path, name = sys.argv[1], sys.argv[2]

    def add(key):
        def merge(document):
            document = document or {"runs": []}
            time.sleep(0.01)  # a read-modify-write window another writer could fall into
            return {"runs": [*document["runs"], key]}
        return merge

    for i in range(20):
        update_json(path, add(f"{name}{i}"))
    """
)


def test_two_processes_updating_one_record_lose_nothing(tmp_path):
    path = tmp_path / "record.json"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name]) for name in "ab"]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    runs = json.loads(path.read_text())["runs"]
    assert sorted(runs) == sorted(f"{n}{i}" for n in "ab" for i in range(20))
    assert (tmp_path / ".record.json.lock").exists()  # the sidecar, never the record itself


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
