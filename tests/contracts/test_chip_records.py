"""The records in ``data/`` parse, and the README's TPU paragraph says what the v5e's records
hold (kernel and flash-attention timings, ``make test-tpu``'s count, the notebooks' runs)."""

from __future__ import annotations

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHIP = ROOT / "data" / "benchmarks" / "tpu-v5e" / "2026-12-06-accelerator-3-3-3.json"
TESTS = ROOT / "data" / "tests" / "tpu-v5e"


RECORDS = sorted(p.relative_to(ROOT) for p in (ROOT / "data").rglob("*.json"))


@pytest.mark.parametrize("path", RECORDS, ids=str)
def test_every_record_parses(path):
    json.loads((ROOT / path).read_text())


def test_the_readme_quotes_the_chips_records():
    readme = " ".join((ROOT / "README.md").read_text().split())
    medians = {(r["impl"], r["T"], r["mode"]): r["median_ms"]
               for r in json.loads(CHIP.read_text())["records"]}  # fmt: skip
    for impl, digits in (("pallas_tpu", 2), ("softmax", 2)):
        for mode in ("fwd", "fwd+bwd"):
            quoted = " / ".join(f"{medians[impl, t, mode]:,.{digits}f}" for t in (2048, 8192))
            assert quoted in readme, (impl, mode, quoted)
    run = json.loads((TESTS / "2026-12-06-test-tpu.json").read_text())
    passed = run["counts"]["passed"]
    assert run["counts"] == {"passed": passed} == {"passed": len(run["cases"])}
    assert f"`make test-tpu` passed {passed} of {passed} at commit {run['commit']}" in readme
    notebooks = json.loads((TESTS / "2026-12-06-notebooks.json").read_text())["summary"]
    assert notebooks["every_notebook_ran_to_the_end"] and "each of the 11 notebooks" in readme
    for commit in set(notebooks["latest_run_of_each"].values()):  # the README names the latest runs
        assert commit in readme, commit
