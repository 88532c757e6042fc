"""tests/extended.py (what `make test` leaves to `make test-all`) names only tests that exist."""

import pathlib

from conftest import COLLECTED
from extended import EXTENDED

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_extended_key_names_a_collected_test(request):
    """Each key whose file this run collected is one of that file's tests (a renamed test or
    a changed parameter id would otherwise fall back into make test unnoticed)."""
    collected = request.config.stash[COLLECTED]
    files = {node.split("::")[0] for node in collected}
    stale = [key for key in EXTENDED if key.split("::")[0] in files and key not in collected
             or not (ROOT / key.split("::")[0]).is_file()]
    assert not stale, f"tests/extended.py names no collected test: {stale}"
