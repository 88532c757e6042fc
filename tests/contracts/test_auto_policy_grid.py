"""``auto``'s CPU policy against the recorded grid (``data/benchmarks/policy/``, written by
``kda-bench --preset auto-grid --record``): at every recorded point and mode, the form the
policy picks (:func:`kda_lib.ops.api.portable_forms`) has a median within 10% of the
fastest recorded form's. The test reads whatever points are recorded (docs/DESIGN.md section 4
says which); rows the grid skipped (the scan's backward where its states do not fit) are
compared on what was recorded."""

from __future__ import annotations

import json
import pathlib

import pytest

from kda_lib.ops.api import portable_forms

GRID_DIR = pathlib.Path(__file__).resolve().parents[2] / "data" / "benchmarks" / "policy"
FORMS = ("recurrent", "chunked")
TOLERANCE = 1.10


def _points():
    found = []
    for path in sorted(GRID_DIR.glob("auto-policy-cpu-*.json")):
        document = json.loads(path.read_text())
        found += [(path.name, point) for point in document["points"]]
    return found


def test_a_grid_is_recorded():
    assert _points(), f"no recorded grid point in {GRID_DIR}"


@pytest.mark.parametrize(
    "name,point", _points(), ids=[f"{n}:BH={p['BH']},T={p['T']},K={p['K']}" for n, p in _points()]
)
def test_the_policy_is_within_10_percent_of_the_fastest_form(name, point):
    medians = {
        (r["impl"], r["mode"]): r["median_ms"]
        for r in point["records"]
        if r["impl"] in FORMS and r.get("median_ms")
    }
    forward, training = portable_forms(point["T"], point["BH"] * point["K"] ** 2, "cpu")
    for mode, picked in (("fwd", forward), ("fwd+bwd", training)):
        times = {form: medians[(form, mode)] for form in FORMS if (form, mode) in medians}
        assert picked in times, (mode, picked, times)
        fastest = min(times.values())
        assert times[picked] <= TOLERANCE * fastest, (mode, picked, times)
