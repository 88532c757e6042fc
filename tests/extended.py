"""The tests `make test` (CI) leaves to `make test-all`, each with its reason.

On two cores the whole suite takes about 15 minutes, most of it XLA:CPU compiling programs that
run once (docs/DESIGN.md, section 7). Each test below repeats at a bigger size a check a test in
`make test` makes, or checks other inputs on code that `make test` checks (its reason names
which), runs a whole program in another process, or is marked `tpu` and run on the chip by
`make test-tpu`. Keys are pytest node ids without xdist's ``@group`` suffix;
tests/contracts/test_extended.py fails on a key that names no collected test."""

BIG_T = "T = 70 / 1,024: two / sixteen whole chunks of the program the T = 16 and 17 rows check"
PROCESS = "a whole program in another process; its parts are tested in-process in make test"
CHIP = "marked tpu: make test-tpu runs it compiled on the chip; make test keeps the bfloat16 row"

_API = "tests/ops/test_api.py::"
_FD = "match_float64_finite_differences"
EXTENDED = {
    f"{_API}test_hessian_and_jvp_through_the_default_{_FD}[70]": BIG_T,
    f"{_API}test_hessian_and_jvp_through_the_default_{_FD}[1024]": BIG_T,
    f"{_API}test_hessian_and_jvp_through_the_layer_{_FD}[1024]": BIG_T,
    f"{_API}test_forward_mode_autodiff_through_auto[70]": BIG_T,
    "tests/ops/test_chunked.py::test_unit_lower_inverse_holds_where_keys_share_a_direction[256]":
        "C = 256; the C = 16 and 64 rows run the same code in make test",
    "tests/ops/test_pallas_tpu.py::test_unit_lower_inverse_holds_where_keys_share_a_direction[64]":
        "C = 64; the C = 16 row runs the same code in make test",
    "tests/ops/test_pallas_tpu.py::test_unit_lower_inverse_holds_where_keys_share_a_direction[256]":
        "C = 256; the C = 16 row runs the same code in make test",
    # the Pallas kernels in the interpreter: auto never routes a CPU call to them
    "tests/ops/test_pallas_tpu.py::test_kernels_match_the_float64_oracle[float32]": CHIP,
    "tests/ops/test_pallas_tpu.py::test_non_finite_inputs_give_the_recurrences_result": CHIP,
    "tests/ops/test_pallas_tpu.py::test_bfloat16_with_correlated_keys_matches_the_oracle": CHIP,
    "tests/ops/test_interior_states.py::"
    "test_chunk_states_equal_the_recurrence_on_each_prefix_float64[one-document]":
        "one document; the segments row in make test holds one document and more",
    "tests/contracts/test_validate_once.py::test_one_eager_call_checks_once[tokamax_xla_chunked-1]":
        "the tokamax_xla row in make test runs the same adapter's checks",
    "tests/contracts/test_precision.py::test_fla_cp_inputs_pass_fla_tolerance_on_every_path":
        "fla's CP test inputs; make test holds every path to the float64 oracle on its own inputs",
    "tests/contracts/test_precision.py::test_fla_cp_inputs_fail_with_every_matmul_in_bf16":
        "the companion of the test above (fla's CP inputs, the same fixture)",
    "tests/ops/test_emulation.py::test_layer_and_cp_layer_through_mosaic_equal_chunked_layer":
        "tokamax's emulated kernel under the layer and CP; make test keeps the adapter's emulated "
        "test and test_grouped_heads' Mosaic CP test",
    "tests/teaching/test_notebooks.py::test_notebook_executes[08_synthetic_recall]":
        "notebook 08, a recorded sweep at CI scale (57-71 s under the suite's load); make test "
        "executes the other ten and tests run_sweep (tests/lab/test_train.py)",
    # whole programs: installs, second processes, a killed and resumed driver
    "tests/ops/test_emulation.py::test_environment_emulation_leaves_no_traceback_at_exit": PROCESS,
    "tests/parallel/test_multihost.py::test_context_parallel_layer_across_two_processes": PROCESS,
    "tests/contracts/test_packaging.py::"
    "test_colab_path_installs_what_is_missing_says_why_pip_failed_and_runs_notebook_00": PROCESS,
    "tests/contracts/test_packaging.py::"
    "test_a_plain_install_brings_no_tokamax_and_runs_the_readme_first_snippet": PROCESS,
    "tests/lab/test_synthetic_protocol.py::"
    "test_a_killed_driver_resumes_to_the_record_of_an_uninterrupted_one": PROCESS,
    "tests/lab/test_stdlib_lm_seeds.py::test_two_processes_on_one_output_lose_nothing": PROCESS,
    "tests/lab/test_synthetic_sweep.py::test_two_processes_on_one_output_lose_nothing": PROCESS,
    "tests/lab/test_notebook_runner.py::test_a_notebook_runs_over_unix_sockets_and_is_recorded":
        PROCESS,
}
