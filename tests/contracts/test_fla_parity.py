# SPDX-License-Identifier: Apache-2.0
"""Parity with fla (flash-linear-attention 0.6.0) on stored fixtures; torch is not needed.

The fixtures ``data/fixtures/fla_ops_*.npz`` were written by
``data/fixtures/make_fla_fixtures.py`` from fla's torch reference ops
(``naive_recurrent_kda``, ``naive_chunk_kda``, ``naive_kda_gate``,
``naive_kda_lowerbound_gate``); see ``data/fixtures/README.md``. Each holds the inputs, fla's
float32 outputs (``o_recurrent``/``state_recurrent``, ``o_chunk``/``state_chunk``) and the
same fla code run in float64 (``o_ref_f64``/``state_ref_f64``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kda_lib

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "data" / "fixtures"
OP_FILES = sorted(FIXTURES.glob("fla_ops_*.npz"))

# Against fla's float32 outputs (fla itself is ~1e-6 off the float64 run on these cases).
TOL_VS_FLA_F32 = dict(atol=1e-4, rtol=1e-4)
# Our float64 run against fla's float64 run: both exact up to rounding, so much tighter.
TOL_F64_VS_F64 = dict(atol=1e-6, rtol=1e-6)
# Our float32 run against fla's float64 run.
TOL_F32_VS_F64 = dict(atol=1e-4, rtol=1e-4)
# The gate is elementwise; fla computes it in float32.
TOL_GATE = dict(atol=1e-5, rtol=1e-5)

IMPLEMENTATIONS = {
    "recurrent": lambda *a, **kw: kda_lib.kda_recurrent(*a, **kw),
    "chunked": lambda *a, **kw: kda_lib.kda_chunked(*a, chunk_size=64, **kw),
}


def _assert_close(actual, expected, label: str, **tol) -> None:
    from kda_lib.testing import assert_close

    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
    err = float(
        np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64)), initial=0.0)
    )
    print(f"{label}: max_abs_err={err:.3e}")
    assert_close(actual, expected, name=label, **tol)


@contextlib.contextmanager
def _x64():
    """float64 on for the block (jax.enable_x64 in new JAX, the experimental one in old)."""
    ctx = getattr(jax, "enable_x64", None)
    if ctx is None:
        from jax.experimental import enable_x64 as ctx  # older JAX
    with ctx(True):
        yield


def _load(path: pathlib.Path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        case = {key: data[key] for key in data.files}
    case["meta"] = json.loads(str(case["meta"]))
    lower_bound = float(case["lower_bound"])
    case["lower_bound"] = None if np.isnan(lower_bound) else lower_bound  # NaN means "None"
    case["scale"] = float(case["scale"])
    case.setdefault("initial_state", None)
    return case


def _case_id(path: pathlib.Path) -> str:
    return path.stem.removeprefix("fla_ops_")


@pytest.fixture(params=OP_FILES, ids=_case_id)
def op_case(request) -> dict:
    return _load(request.param)


# (implementation, fixture) rows of the core tests. At T = 1 the chunked form runs the t100
# cases' program modulo sizes (a last chunk right-padded to 64; t1_safe: t100_vgtk_safe's sizes
# but T, no initial state; t1_softplus_h0: an initial state, as t100_kneqv_softplus_h0), so it
# leaves the two T = 1 fixtures out; the recurrence runs every fixture
CORE_ROWS = [
    pytest.param(impl, path, id=f"{_case_id(path)}-{impl}")
    for path in OP_FILES
    for impl in sorted(IMPLEMENTATIONS)
    if not (impl == "chunked" and _case_id(path).startswith("t1_"))
]


def test_fixtures_present():
    assert len(OP_FILES) >= 5, f"fla op fixtures missing under {FIXTURES}; run make_fla_fixtures.py"


def _run(impl: str, case: dict, dtype):
    arrays = [jnp.asarray(case[name], dtype) for name in ("q", "k", "v", "g", "beta")]
    h0 = case["initial_state"]
    h0 = None if h0 is None else jnp.asarray(h0, dtype)
    # jitted: one compilation instead of one per op in eager mode (about 5x faster for the
    # chunked form); the same numerics, and the eager value checks are tested elsewhere
    run = jax.jit(
        functools.partial(IMPLEMENTATIONS[impl], scale=case["scale"], output_final_state=True)
    )
    o, state = run(*arrays, initial_state=h0)
    assert state is not None
    return np.asarray(o), np.asarray(state)


@pytest.mark.tpu
@pytest.mark.parametrize("impl,path", CORE_ROWS)
def test_core_matches_fla_float64(impl, path):
    op_case = _load(path)
    name = op_case["meta"]["case"]
    with _x64():
        o, state = _run(impl, op_case, jnp.float64)
    shape = op_case["meta"]["shape"]
    B, T, H, K, V = (shape[d] for d in "BTHKV")
    assert o.shape == (B, T, H, V) and state.shape == (B, H, K, V)
    _assert_close(o, op_case["o_ref_f64"], f"{name}/{impl}/f64 o vs fla f64", **TOL_F64_VS_F64)
    _assert_close(
        state, op_case["state_ref_f64"], f"{name}/{impl}/f64 state vs fla f64", **TOL_F64_VS_F64
    )
    for fla_form in ("recurrent", "chunk"):
        _assert_close(
            o,
            op_case[f"o_{fla_form}"],
            f"{name}/{impl}/f64 o vs fla {fla_form} f32",
            **TOL_VS_FLA_F32,
        )
        _assert_close(
            state,
            op_case[f"state_{fla_form}"],
            f"{name}/{impl}/f64 state vs fla {fla_form} f32",
            **TOL_VS_FLA_F32,
        )


@pytest.mark.tpu
@pytest.mark.parametrize("impl,path", CORE_ROWS)
def test_core_matches_fla_float32(impl, path):
    op_case = _load(path)
    name = op_case["meta"]["case"]
    o, state = _run(impl, op_case, jnp.float32)
    assert state.dtype == np.float32
    _assert_close(o, op_case["o_ref_f64"], f"{name}/{impl}/f32 o vs fla f64", **TOL_F32_VS_F64)
    _assert_close(
        state, op_case["state_ref_f64"], f"{name}/{impl}/f32 state vs fla f64", **TOL_F32_VS_F64
    )
    fla_form = "recurrent" if impl == "recurrent" else "chunk"
    _assert_close(
        o, op_case[f"o_{fla_form}"], f"{name}/{impl}/f32 o vs fla {fla_form} f32", **TOL_VS_FLA_F32
    )
    _assert_close(
        state,
        op_case[f"state_{fla_form}"],
        f"{name}/{impl}/f32 state vs fla {fla_form} f32",
        **TOL_VS_FLA_F32,
    )


# one program per case (eagerly: one per operation)
_gate = jax.jit(kda_lib.kda_gate, static_argnames="lower_bound")


@pytest.mark.parametrize("dt_bias_layout", ["flat_HK", "H_K"])
@pytest.mark.parametrize("x64", [True, False], ids=["f64", "f32"])
def test_gate_matches_fla(op_case, dt_bias_layout, x64):
    """kda_gate(f, A_log, dt_bias) against fla's naive_kda_gate / naive_kda_lowerbound_gate."""
    name = op_case["meta"]["case"]
    H, K = op_case["meta"]["shape"]["H"], op_case["meta"]["shape"]["K"]
    dt_bias = op_case["dt_bias"]  # stored flat [H*K], fla's layout: index h*K + k
    if dt_bias_layout == "H_K":
        dt_bias = dt_bias.reshape(H, K)
    dtype = jnp.float64 if x64 else jnp.float32
    ctx = _x64() if x64 else contextlib.nullcontext()
    with ctx:
        g = _gate(
            jnp.asarray(op_case["f"], dtype),
            jnp.asarray(op_case["A_log"], dtype),
            jnp.asarray(dt_bias, dtype),
            lower_bound=op_case["lower_bound"],
        )
        g = np.asarray(g)
    assert np.all(g <= 0.0)
    _assert_close(
        g, op_case["g"], f"{name}/gate/{dt_bias_layout}/{'f64' if x64 else 'f32'}", **TOL_GATE
    )
