"""Smoke test of ``python -m kda_lib.lab.bench``: tiny shapes, JSON schema, every requested entry.

Not a timed test: it only checks that the benchmark runs and writes what it promises.
"""

import datetime
import json

import jax
import pytest
from conftest import closed_stdout

from kda_lib.lab import bench, costs

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


@pytest.fixture
def small_matmul(monkeypatch):
    """The roofline's matmul row at 256 instead of 2048: a smoke test times nothing that
    matters, and the big matmul is most of a tiny run."""
    monkeypatch.setattr(bench, "MATMUL_SIZE", 256)


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
    # every run also times the roofline's matmul
    assert seen == {(i, t, m) for i in impls for t in seq_lens for m in modes} | {
        (bench.MATMUL_ENTRY, bench.MATMUL_SIZE, "fwd")
    }
    assert document["matmul_gflops"] > 0


def test_bench_kernels_both_modes(tmp_path, small_matmul):
    impls = ["recurrent", "softmax"]
    document = _run(tmp_path, "--seq-lens", "64", "--impls", *impls, "--modes", "fwd", "fwd+bwd")
    _check_schema(document, impls, [64], ["fwd", "fwd+bwd"])
    # the roofline counts matrix products with loop trip counts: the recurrence's 64 steps of
    # 4 flops per state entry (XLA's own count sees the scan's body once)
    row = next(r for r in document["records"] if (r["impl"], r["mode"]) == ("recurrent", "fwd"))
    assert row["matmul_flops"] == 2 * 64 * 4 * 16 * 16


def test_bench_chunked_and_layer(tmp_path, small_matmul):
    # the layer runs the recurrent kernel here: it compiles in a fraction of the chunked time
    impls = ["chunked", "layer"]
    document = _run(
        tmp_path,
        *("--seq-lens", "64", "--impls", *impls, "--modes", "fwd", "--layer-impl", "recurrent"),
    )
    _check_schema(document, ["chunked", *bench.LAYER_ENTRIES], [64], ["fwd"])
    row = next(r for r in document["records"] if r["impl"] == "chunked")
    assert row["matmul_flops"] == 2 * costs.chunked_flops(64, 64, 16, 16)
    assert set(document["ratios"]["layer/(layer_kernel+layer_projections)"]["fwd"]) == {"64"}


def test_default_impls_and_out_path():
    assert bench.default_impls(lambda name: None)[-2:] == ["softmax", "layer"]
    assert "tokamax_mosaic" not in bench.default_impls(
        lambda name: "TPU only" if name == "tokamax_mosaic" else None
    )
    path = bench.default_out_path("cpu", datetime.date(2026, 1, 2))
    # a run never replaces the recorded benchmark unless asked to (--record)
    assert str(path) == "build/runs/benchmarks/cpu-2026-01-02.json"
    recorded = bench.default_out_path("cpu", datetime.date(2026, 1, 2), record=True)
    assert str(recorded) == "data/benchmarks/cpu-2026-01-02.json"


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--layer-impl", "bogus"], "argument --layer-impl: invalid choice: 'bogus' (choose from "),
        (["--heads", "0"], "--heads must be >= 1, got 0"),
        (["--batch", "0"], "--batch must be >= 1, got 0"),
        (["--key-dim", "-1"], "--key-dim must be >= 1, got -1"),
        (["--value-dim", "0"], "--value-dim must be >= 1, got 0"),
        (["--seq-lens", "64", "0"], "--seq-lens must all be >= 1, got [64, 0]"),
        (["--reps", "0"], "--reps must be >= 1, got 0"),
        (["--calls", "0"], "--calls must be >= 1, got 0"),
        (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (["--sequential-max-t", "-1"], "--sequential-max-t must be >= 0, got -1"),
        (["--skip-rows", "chunked:fwd", "chunkd:fwd"], "--skip-rows: unknown rows ['chunkd:fwd']"),
        (["--preset", "auto-grid", "--grid-max-s", "-1"], "--grid-max-s must be > 0, got -1.0"),
        (["--grid-max-s", "60"], "--grid-max-s applies to --preset auto-grid only"),
    ],
)
def test_bad_arguments_are_argparse_errors_before_any_timing(options, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.run([*TINY, *options, "--out", str(tmp_path / "b.json")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"kda-bench: error: {message}" in err
    if "--layer-impl" in options:
        assert all(f"'{name}'" in err for name in ("auto", *bench.IMPLEMENTATIONS))


def test_the_output_path_is_checked_before_any_timing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench.TimedProgram, "prepare", None)  # timing anything would fail
    (tmp_path / "afile").write_text("not a folder")
    for out, message in [
        (tmp_path / "afile" / "b.json", f"'{tmp_path / 'afile'}' is a file, so"),
        (tmp_path, f"'{tmp_path}' is a directory; give a file path"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench.run([*TINY, "--impls", "softmax", "--seq-lens", "8", "--out", str(out)])
        assert exit_info.value.code == 2
        assert f"error: --out: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--out", ""], "--out: the path is empty"),  # was: the default path
        (["--preset", "auto-grid", "--out", "-"], "--out -: --preset auto-grid records its grid"),
        (["--preset", "auto-grid", "--out", "grid.json"], "--out: 'grid.json' is not a readable"),
    ],
)
def test_an_output_that_cannot_be_used_is_refused_before_any_timing(
    options, message, tmp_path, monkeypatch, capsys
):
    """An empty --out is not the default path; an auto-grid file to resume that is damaged
    is named (it gave json's bare JSONDecodeError after the first point)."""
    monkeypatch.setattr(bench.TimedProgram, "prepare", None)  # timing anything would fail
    monkeypatch.setattr(bench.policy_grid, "run_grid", None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.json").write_text('{"points": [')
    with pytest.raises(SystemExit) as exit_info:
        bench.run([*TINY, *options])
    assert exit_info.value.code == 2
    assert f"kda-bench: error: {message}" in capsys.readouterr().err
    assert not (tmp_path / "build").exists()


def test_a_run_never_replaces_the_recorded_benchmark_unless_asked(tmp_path, monkeypatch, capsys):
    """The default output is build/runs/benchmarks/; data/benchmarks/ (what the README and the
    notebooks cite) only with --record, which excludes --out."""
    monkeypatch.setattr(bench.TimedProgram, "prepare", None)  # timing anything would fail
    monkeypatch.chdir(tmp_path)
    for where in ("build", "data"):  # make each default folder impossible, to see it checked
        (tmp_path / where).write_text("a file")
    for options, folder in (([], "build/runs/benchmarks/"), (["--record"], "data/benchmarks/")):
        with pytest.raises(SystemExit):
            bench.run([*TINY, "--impls", "softmax", "--seq-lens", "8", *options])
        assert f"so '{folder}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.run([*TINY, "--seq-lens", "8", "--record", "--out", str(tmp_path / "b.json")])
    assert "give --out or --record" in capsys.readouterr().err


def test_the_json_is_written_before_the_table_and_never_lost(
    tmp_path, monkeypatch, capsys, small_matmul
):
    # T = 64: test_bench_kernels_both_modes's program (from the compilation cache)
    args = [*TINY, "--impls", "softmax", "--seq-lens", "64", "--modes", "fwd"]
    out = tmp_path / "b.json"
    document = bench.run([*args, "--out", str(out)])
    printed = capsys.readouterr().out
    assert json.loads(out.read_text()) == document
    assert printed.rstrip().endswith(f"wrote {out}") and "median ms" in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]  # no temp file left

    def disk_full(document, path):
        raise OSError("disk full")

    monkeypatch.setattr(bench, "write_json", disk_full)
    with pytest.raises(SystemExit, match=r"could not write .*b2.json \(disk full\); the JSON"):
        bench.run([*args, "--out", str(tmp_path / "b2.json")])
    printed = capsys.readouterr().out
    impls = {r["impl"] for r in json.loads(printed)["records"]}  # the timings, as JSON
    assert impls == {"softmax", bench.MATMUL_ENTRY}
    assert "median ms" not in printed  # no table whose JSON went missing


def test_roofline_fraction_is_relative_to_the_matmul_row():
    records = [
        dict(impl="matmul", T=2048, mode="fwd", median_ms=100.0, achieved_gflops=171.8),
        dict(impl="chunked", T=4096, mode="fwd", median_ms=50.0, achieved_gflops=42.95),
        dict(impl="tokamax_mosaic", T=4096, mode="fwd", median_ms=5.0),  # no FLOP count
    ]
    ceiling = bench.add_roofline(records)
    assert ceiling == pytest.approx(2 * 2048**3 / 0.1 / 1e9)
    assert records[1]["roofline_fraction"] == pytest.approx(42.95 / ceiling)
    assert "roofline_fraction" not in records[2]
    assert bench.add_roofline([dict(impl="matmul", T=2048, mode="fwd", median_ms=None)]) is None


@pytest.mark.parametrize("model", sorted(bench.TRAIN_MODELS))
def test_training_step_entries_trace(model):
    step, args = bench.train_step_entry(model, batch=2, seq_len=8, key=jax.random.key(0))
    loss, state = jax.eval_shape(step, *args)  # traced, not compiled: cheap
    assert loss.shape == () and jax.tree.structure(state) == jax.tree.structure(args[0])


def test_every_option_has_help_and_the_output_names_its_units(tmp_path, capsys):
    """--help explains every option; the table's time columns and the ratio block say what
    they are; --no-roofline skips the matmul row; --warmup 0 warns that first calls are timed."""
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = capsys.readouterr().out
    blocks = text[text.index("\n  --preset") :].split("\n  --")[1:]
    options = [block.split()[0] for block in blocks]
    assert "no-roofline" in options and "warmup" in options
    # the defaults formatter adds "(default: ...)" to an option only if it has help text
    assert [o for o, block in zip(options, blocks, strict=True) if "(default:" not in block] == []
    # T = 64: the programs of test_bench_chunked_and_layer and test_bench_kernels_both_modes
    # (from the compilation cache)
    args = [*TINY, "--impls", "chunked", "softmax", "--seq-lens", "64", "--modes", "fwd"]
    document = bench.run([*args, "--no-roofline", "--warmup", "0", "--out", str(tmp_path / "b")])
    captured = capsys.readouterr()
    assert "warning: --warmup 0" in captured.err
    assert {r["impl"] for r in document["records"]} == {"chunked", "softmax"}
    assert document["matmul_gflops"] is None and document["config"]["roofline"] is False
    header = next(line for line in captured.out.splitlines() if line.startswith("impl"))
    assert header.split()[3:] == [
        *("median", "ms", "p25", "ms", "p75", "ms", "min", "ms", "reps", "compile", "s")
    ]
    assert bench.RATIOS_HEADER in captured.out
    ratios = captured.out[captured.out.index(bench.RATIOS_HEADER) :]
    assert "chunked/softmax" in ratios.replace(" ", "")


def test_a_closed_stdout_ends_kda_bench_with_status_1_and_no_traceback(monkeypatch):
    """Issue 75.4: ``kda-bench --out - | true`` ended in a BrokenPipeError traceback."""
    monkeypatch.setattr(bench, "_plan_jobs", lambda *args: ([], []))  # nothing to time
    with closed_stdout(), pytest.raises(SystemExit) as exit_info:
        bench.main([*TINY, "--seq-lens", "8", "--no-roofline", "--out", "-"])
    assert exit_info.value.code == 1
