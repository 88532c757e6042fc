"""The tests `make test` (CI) leaves to `make test-all`, each with its reason.

On two cores the whole suite takes about 15 minutes, most of it XLA:CPU compiling programs that
run once (docs/DESIGN.md, section 7). Each test below repeats at a bigger size a check a test in
`make test` makes, or checks other inputs on code that `make test` checks (its reason names
which), or runs a whole program in another process. Keys are pytest node ids without xdist's
``@group`` suffix; tests/contracts/test_extended.py fails on a key that names no collected
test."""

BIG_T = ("T = 70 (a whole chunk and a partial one) and 1,024 (sixteen whole chunks) at the "
         "default chunk size 64: the chunked program make test runs at T = 17 (one partial "
         "chunk), at other trip counts; T = 16 (the recurrence) stays too")
PROCESS = "a whole program in another process; its parts are tested in-process in make test"

_API = "tests/ops/test_api.py::"
_FD = "match_float64_finite_differences"
EXTENDED = {
    f"{_API}test_hessian_and_jvp_through_the_default_{_FD}[70]": BIG_T,
    f"{_API}test_hessian_and_jvp_through_the_default_{_FD}[1024]": BIG_T,
    f"{_API}test_hessian_and_jvp_through_the_layer_{_FD}[1024]": BIG_T,
    f"{_API}test_forward_mode_autodiff_through_auto[70]":
        "T = 70, across a chunk boundary; make test keeps T = 16 and the jvp of the Hessian/jvp "
        "rows at T = 17, through the same chunked form",
    "tests/ops/test_interior_states.py::"
    "test_chunk_states_equal_the_recurrence_on_each_prefix_float64[one-document]":
        "without segment ids; make test keeps the segments row and runs the same states without "
        "segment ids in tests/parallel/test_context_parallel.py::test_kernel_cp_equals_one_device",
    "tests/contracts/test_validate_once.py::test_one_eager_call_checks_once[tokamax_xla_chunked-1]":
        "the tokamax_xla row in make test runs the same adapter's checks",
    "tests/ops/test_emulation.py::test_layer_and_cp_layer_through_mosaic_equal_chunked_layer":
        "tokamax's emulated kernel under the layer and CP, for values: make test runs the "
        "adapter's emulated values and test_grouped_heads' Mosaic CP test, and only traces the "
        "layer's own Mosaic CP program",
    "tests/teaching/test_notebooks.py::test_notebook_executes[08_synthetic_recall]":
        "notebook 08, a recorded sweep at CI scale (57-71 s under the suite's load); make test "
        "executes the other ten and tests run_sweep (tests/lab/test_train.py); its exercises' "
        "checkers are tested in tests/teaching",
    # whole programs: installs, second processes, a killed and resumed driver
    "tests/contracts/test_packaging.py::"
    "test_colab_path_installs_what_is_missing_says_why_pip_failed_and_runs_notebook_00": PROCESS,
    "tests/contracts/test_packaging.py::"
    "test_a_plain_install_brings_no_tokamax_and_runs_the_readme_first_snippet": PROCESS,
    "tests/lab/test_synthetic_protocol.py::"
    "test_a_killed_driver_resumes_to_the_record_of_an_uninterrupted_one": PROCESS,
    "tests/lab/test_stdlib_lm_seeds.py::test_two_processes_on_one_output_lose_nothing": PROCESS,
    "tests/lab/test_synthetic_sweep.py::test_two_processes_on_one_output_lose_nothing": PROCESS,
}
