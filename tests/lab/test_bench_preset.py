"""``python -m kda_lib.lab.bench --preset accelerator``: the published GPU shapes as defaults that
explicit flags override, and the comparison with the H200 anchors."""

from __future__ import annotations

import pytest

from kda_lib.lab import bench


def test_preset_sets_the_accelerator_shapes():
    args = bench.parse_args(["--preset", "accelerator", "--out", "-"])
    assert (args.seq_lens, args.batch, args.heads, args.key_dim, args.value_dim, args.dtype) == (
        [2048, 8192, 32768],
        1,
        16,
        128,
        128,
        "bfloat16",
    )
    assert args.impls == [
        "pallas_tpu", "chunked", "tokamax_xla_chunked", "tokamax_mosaic", "softmax"
    ]  # fmt: skip
    plain = bench.parse_args(["--out", "-"])
    assert (plain.heads, plain.dtype, plain.impls, plain.preset) == (4, "float32", None, None)


def test_explicit_flags_override_the_preset():
    args = bench.parse_args(
        ["--preset", "accelerator", "--seq-lens", "64", "--heads", "2", "--out", "-"]
    )
    assert (args.seq_lens, args.heads, args.key_dim) == ([64], 2, 128)


def test_unknown_preset_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--preset", "tpu-pod", "--out", "-"])
    assert "--preset" in capsys.readouterr().err


def test_a_small_preset_run_records_it_and_skips_what_cannot_run(monkeypatch):
    # the roofline's matmul row at 256 instead of 2048 (test_bench.py's small_matmul): nothing
    # here reads it, and the big matmul is most of a tiny run
    monkeypatch.setattr(bench, "MATMUL_SIZE", 256)
    document = bench.run(
        [
            "--preset",
            "accelerator",
            "--seq-lens",
            "64",
            "--heads",
            "1",
            "--key-dim",
            "16",
            "--value-dim",
            "16",
            "--reps",
            "1",
            "--warmup",
            "0",
            "--modes",
            "fwd",
            "--impls",
            "chunked",
            "tokamax_mosaic",
            "--out",
            "-",
        ]
    )
    assert document["config"]["preset"] == "accelerator"
    assert document["config"]["dtype"] == "bfloat16"
    rows = {r["impl"]: r for r in document["records"] if r["impl"] != "matmul"}
    assert rows["chunked"]["median_ms"] > 0 and rows["chunked"]["compiled_bytes"] > 0
    assert rows["tokamax_mosaic"]["median_ms"] is None and "TPU" in rows["tokamax_mosaic"]["error"]


def test_comparison_with_the_h200_anchors():
    records = [
        dict(impl="chunked", T=2048, mode="fwd+bwd", median_ms=7.44),
        dict(impl="chunked", T=2048, mode="fwd", median_ms=1.0),
        dict(impl="tokamax_xla_chunked", T=2048, mode="fwd+bwd", median_ms=9.0),
    ]
    ratios = bench.compare_with_anchors(records)
    assert ratios["chunked / fla_chunk_kda"] == {2048: pytest.approx(7.44 / 3.72)}
    assert ratios["chunked / tokamax_xla_chunked"] == {2048: pytest.approx(7.44 / 7.27)}
