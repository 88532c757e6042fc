"""The suite's scheduling contract: ``make test`` runs ``pytest -n 2 --dist loadgroup`` (Makefile
``XDIST``), and the
tests marked ``xdist_group`` share an expensive session fixture (the site, the compiled cost
rows, the fla CP oracle, the wheel, ...) on one worker, built once. pytest 9.2 stores node ids
where pytest-xdist 3.8 cannot append its ``@group`` suffix, and the grouping then fails in
silence: every worker builds every shared fixture again (measured: the site built on both
workers). This test fails instead."""

import pytest


@pytest.mark.xdist_group("grouping_probe")
def test_grouped_tests_carry_their_group_under_loadgroup(request):
    # xdist sets option.loadgroup on its workers under --dist loadgroup
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("only meaningful on an xdist worker under --dist loadgroup (make test)")
    assert request.node.nodeid.endswith("@grouping_probe"), (
        f"xdist did not tag {request.node.nodeid!r} with its group: tests marked xdist_group "
        "are spread over the workers and their shared fixtures built on each (see pyproject's "
        "pin of pytest)"
    )
