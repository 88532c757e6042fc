"""Smoke test of ``python -m kda_lib.bench``: tiny shapes, JSON schema, every requested entry.

Not a timed test: it only checks that the benchmark runs and writes what it promises.
"""

import datetime
import json

from kda_lib import bench

RECORD_KEYS = {"impl", "T", "mode", "median_ms", "min_ms", "max_ms", "compile_s"}
TOP_KEYS = {
    "platform",
    "device_kind",
    "jax_version",
    "tokamax_version",
    "date",
    "config",
    "records",
    "ratios",
}
TINY = ["--batch", "1", "--heads", "2", "--key-dim", "16", "--value-dim", "16"]
TINY += ["--reps", "2", "--warmup", "1"]


def _run(tmp_path, *args):
    out = tmp_path / "bench.json"
    document = bench.run([*TINY, *args, "--out", str(out)])
    assert json.loads(out.read_text()) == document
    return document


def _check_schema(document, impls, seq_lens, modes):
    assert TOP_KEYS <= set(document)
    assert document["config"]["seq_lens"] == seq_lens
    for record in document["records"]:
        assert RECORD_KEYS <= set(record), record
        assert record.get("error") is None, record
        assert record["min_ms"] <= record["median_ms"] <= record["max_ms"]
        assert record["compile_s"] > 0
    seen = {(r["impl"], r["T"], r["mode"]) for r in document["records"]}
    assert seen == {(i, t, m) for i in impls for t in seq_lens for m in modes}


def test_bench_kernels_both_modes(tmp_path):
    impls = ["recurrent", "softmax"]
    document = _run(tmp_path, "--seq-lens", "64", "--impls", *impls, "--modes", "fwd", "fwd+bwd")
    _check_schema(document, impls, [64], ["fwd", "fwd+bwd"])


def test_bench_chunked_and_layer(tmp_path):
    # the layer runs the recurrent kernel here: it compiles in a fraction of the chunked time
    impls = ["chunked", "layer"]
    document = _run(
        tmp_path,
        *("--seq-lens", "64", "--impls", *impls, "--modes", "fwd", "--layer-impl", "recurrent"),
    )
    _check_schema(document, ["chunked", *bench.LAYER_ENTRIES], [64], ["fwd"])
    assert set(document["ratios"]["layer/(layer_kernel+layer_projections)"]["fwd"]) == {"64"}


def test_default_impls_and_out_path():
    assert bench.default_impls(lambda name: None)[-2:] == ["softmax", "layer"]
    assert "tokamax_mosaic" not in bench.default_impls(
        lambda name: "TPU only" if name == "tokamax_mosaic" else None
    )
    path = bench.default_out_path("cpu", datetime.date(2026, 1, 2))
    assert str(path) == "data/benchmarks/cpu-2026-01-02.json"
