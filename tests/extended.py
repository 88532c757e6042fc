"""The tests `make test` (CI) leaves to `make test-all`.

On two cores the whole suite takes about 15 minutes, most of it XLA:CPU compiling programs that
run once (docs/DESIGN.md, section 7). Each test below repeats, at another size, dtype,
implementation or option, a check that a test in `make test` makes (its reason says which), runs
an experiment driver that notebooks in `make test` run too, runs a whole
program in a second process, or is run on the chip by `make test-tpu`; `make test-all` runs
them with the rest. Keys are pytest node ids without xdist's ``@group`` suffix, or a
file's path and ``::`` (every test in it); tests/contracts/test_extended.py fails on a key that
names no test."""

ROW = "a further row: the rows left in make test check the same code"
BIG_T = "T = 1,024 or 70: sixteen or two whole chunks of the program T = 17 checks (in make test)"
PROCESS = "a whole program in another process; its parts are tested in-process in make test"
RUN = "an experiment driver's whole run and record; make test runs its steps and record format"
LAB = ("an experiment driver's tests (training, sweeps, generation, scale); notebooks 06, 09 "
       "and 10 run these drivers in make test")
NOTEBOOK = ("notebook 08, a recorded sweep at CI scale (29 s alone, the longest); make test "
            "executes the other ten, 06 and 09 training through the same kda_lib.lab.train")
CHIP = "make test-tpu runs it on the chip, where its branch is compiled; make test keeps the rest"

_API = "tests/ops/test_api.py::"
_HESSIAN = "match_float64_finite_differences"
_MATCHES = "matches_float64_finite_differences"
EXTENDED = {
    **{f"tests/lab/{name}.py::": LAB for name in (
        "test_train", "test_generate", "test_synthetic_sweep", "test_stdlib_lm_seeds",
        "test_at_scale", "test_synthetic_protocol", "test_notebook_runner")},
    "tests/teaching/test_notebooks.py::test_notebook_executes[08_synthetic_recall]": NOTEBOOK,
    "tests/ops/test_pallas_tpu.py::test_the_gradient_keeps_no_per_token_states":
        "the kernels' saved residuals by their shapes; make test runs their gradients' values",
    # ops: every implementation still meets the float64 oracle in make test
    "tests/contracts/test_precision.py::test_fla_cp_inputs_pass_fla_tolerance_on_every_path":
        "fla's CP inputs on every path; each path meets the float64 oracle in make test",
    "tests/contracts/test_precision.py::test_fla_cp_inputs_fail_with_every_matmul_in_bf16":
        "the companion of the test above (its fla inputs, the same fixture)",
    "tests/contracts/test_precision.py::test_both_policies_close_to_float64_oracle[T256_segments]":
        ROW,
    "tests/contracts/test_precision.py::"
    "test_float16_large_values_stay_finite_and_match_the_recurrence[streaming]": ROW,
    f"{_API}test_hessian_and_jvp_through_the_default_{_HESSIAN}[70]": BIG_T,
    f"{_API}test_hessian_and_jvp_through_the_default_{_HESSIAN}[1024]": BIG_T,
    f"{_API}test_hessian_and_jvp_through_the_layer_{_HESSIAN}[1024]": BIG_T,
    f"{_API}test_forward_mode_autodiff_through_auto[70]": BIG_T,
    f"{_API}test_grad_of_grad_through_the_chunked_form_{_MATCHES}[auto-17-4]": ROW,
    f"{_API}test_grad_of_grad_through_the_chunked_form_{_MATCHES}[chunked-17-4]": ROW,
    f"{_API}test_reverse_over_forward_through_auto_{_MATCHES}[17-4]": ROW,
    f"{_API}test_tokamax_direct_parity[-5.0]": ROW,
    "tests/ops/test_chunked.py::test_chunked_matches_float64_oracle[200]": ROW,
    "tests/ops/test_chunked.py::test_unit_lower_inverse_holds_where_keys_share_a_direction[256]":
        ROW,
    "tests/ops/test_combinations.py::"
    "test_a_half_precision_initial_state_is_read_as_its_float32_values[chunked-float16]": ROW,
    "tests/ops/test_interior_states.py::"
    "test_chunk_states_equal_the_recurrence_on_each_prefix_float64[one-document]":
        "the segments row (in make test) holds one document and more",
    "tests/ops/test_interior_states.py::test_chunk_states_float32_and_bf16_close_to_the_oracle":
        "the float32 and bfloat16 rows; the float64 states (segments) are checked in make test",
    "tests/ops/test_emulation.py::test_layer_and_cp_layer_through_mosaic_equal_chunked_layer":
        "tokamax's emulated kernel under the layer and CP; the adapter's own test is in make test",
    "tests/ops/test_emulation.py::test_cp_mosaic_segments_across_ranks_and_padding": ROW,
    "tests/ops/test_emulation.py::test_environment_emulation_leaves_no_traceback_at_exit": PROCESS,
    # the Pallas kernels in the interpreter: the float32 and bfloat16 oracle rows stay
    "tests/ops/test_pallas_tpu.py::"
    "test_compiled_branches_equal_the_reshapes_under_the_tpu_interpreter": CHIP,
    "tests/ops/test_pallas_tpu.py::test_bfloat16_with_correlated_keys_matches_the_oracle": CHIP,
    "tests/ops/test_pallas_tpu.py::test_kernels_match_the_float64_oracle[float32]":
        "make test-tpu runs it on the chip; make test keeps the bfloat16 row (the chip's dtype)",
    "tests/ops/test_pallas_tpu.py::test_non_finite_inputs_give_the_recurrences_result":
        "make test-tpu runs it on the chip; auto never routes a CPU call to the kernels",
    "tests/ops/test_pallas_tpu.py::test_unit_lower_inverse_holds_where_keys_share_a_direction[64]":
        ROW,
    "tests/ops/test_pallas_tpu.py::test_unit_lower_inverse_holds_where_keys_share_a_direction[256]":
        ROW,
    "tests/ops/test_pallas_tpu.py::test_kernels_lower_for_the_tpu_without_one[V256]": ROW,
    # contracts, layers, CP
    "tests/contracts/test_grouped_heads.py::"
    "test_every_implementation_matches_the_oracle[tokamax_xla_chunked-a_log]": ROW,
    "tests/contracts/test_grouped_heads.py::"
    "test_every_implementation_matches_the_oracle[auto-a_log-softplus]": ROW,
    "tests/contracts/test_non_finite.py::"
    "test_non_finite_footprint_equals_the_recurrence[context_parallel]": ROW,
    "tests/contracts/test_non_finite.py::test_padding_values_change_nothing[tokamax_xla_chunked]":
        ROW,
    "tests/contracts/test_segment_rule.py::"
    "test_int64_segment_ids_are_not_cut_to_32_bits[mixer attention_conv]": ROW,
    "tests/contracts/test_segment_rule.py::"
    "test_int64_segment_ids_are_not_cut_to_32_bits[mixer mamba2_dt]": ROW,
    "tests/contracts/test_validate_once.py::test_one_eager_call_checks_once[tokamax_xla_chunked-1]":
        ROW,
    "tests/layers/test_kda_layer.py::"
    "test_options_match_the_float64_oracle_and_implementations_agree"
    "[grouped_fused_full_rank_output]": ROW,
    "tests/parallel/test_context_parallel.py::"
    "test_layer_cp_equals_one_device[8-16-recurrent-segments-sharded_x-no_a_log_grouped]": ROW,
    "tests/parallel/test_multihost.py::test_context_parallel_layer_across_two_processes": PROCESS,
    # whole programs: installs, second processes, a killed and resumed driver
    "tests/contracts/test_packaging.py::"
    "test_colab_path_installs_what_is_missing_says_why_pip_failed_and_runs_notebook_00": PROCESS,
    "tests/contracts/test_packaging.py::"
    "test_a_plain_install_brings_no_tokamax_and_runs_the_readme_first_snippet": PROCESS,
}
