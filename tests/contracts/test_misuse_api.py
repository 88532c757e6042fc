"""The misuse suite of the public API (issue 55, "misuse is designed"): every name of
``kda_lib.__all__`` and the layer's methods, each with a table of hostile inputs (wrong rank,
wrong dtype, bool for int, NaN where a value check is promised, out-of-range indices, sizes past
memory, unknown names) and the refusal it must give: ValueError or TypeError whose message names
the argument, before any work, eagerly and under ``jax.jit`` where the name is jittable.

Messages are matched on the argument's name only (their wording may change). A row that fails
today is marked ``xfail(strict=True)`` with the fault it shows; fixing the fault turns it into an
XPASS failure, so the mark must then be removed. A new public name is not done until it has rows.
"""

import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import PYTHONS_OWN_REFUSAL
from flax import nnx

import kda_lib
from kda_lib import (
    GateForm,
    KDAConfig,
    KimiDeltaAttention,
    emulate_tpu,
    init_a_log,
    init_dt_bias,
    kda,
    kda_chunked,
    kda_gate,
    kda_pool_step,
    kda_pool_verify,
    kda_recurrent,
    kda_step,
)
from kda_lib.layers import cache_at
from kda_lib.layers.checkpoints import export_state_dict

B, T, H, K, V, N = 2, 4, 2, 8, 8, 3
F32 = jnp.float32


def _x(*shape, dtype=F32, fill=None):
    if fill is not None:
        return jnp.full(shape, fill, dtype)
    return jax.random.normal(jax.random.key(sum(shape)), shape, F32).astype(dtype)


Q, KK, VV, G = _x(B, T, H, K), _x(B, T, H, K), _x(B, T, H, V), -jnp.abs(_x(B, T, H, K))
BETA = jnp.full((B, T, H), 0.5, F32)
QT, KT, VT, GT, BT = Q[:, 0], KK[:, 0], VV[:, 0], G[:, 0], BETA[:, 0]
STATE = jnp.zeros((B, H, K, V), F32)
POOL = jnp.zeros((N, H, K, V), F32)
SLOTS = jnp.array([0, 2], jnp.int32)
A_LOG = init_a_log(jax.random.key(0), H)
DT_BIAS = init_dt_bias(jax.random.key(1), H, K)
BIG = 2**20  # a T or a batch whose states (B * T * H * K * V * 4 bytes) are far past memory

CFG = dict(hidden_size=16, num_heads=H, head_dim=K, chunk_size=4)


def _layer(**overrides):
    return KimiDeltaAttention(KDAConfig(**{**CFG, **overrides}), rngs=nnx.Rngs(0))


LAYER = _layer()
HID = _x(B, T, 16)


@dataclass(frozen=True)
class Row:
    target: str  # the public name (or Class.method) the row exercises
    case: str
    call: object  # call(*arrays): the misuse
    arrays: tuple = ()  # traced under jit (everything else is closed over)
    match: str = ""  # regex on the argument's name
    jit: bool = True
    jit_nan: bool = False  # a value check: under jit, NaN in the outputs is the documented answer
    exc: tuple = field(default=(ValueError, TypeError))


def _kda(**kw):
    def call(q=Q, k=KK, v=VV, g=G, beta=BETA):
        return kda(q, k, v, g, beta, **kw)

    return call


def _qkv(fn, name, value, **kw):
    """fn(q, k, v, g, beta) with argument ``name`` replaced by a traced ``value``."""
    order = ["q", "k", "v", "g", "beta"]
    base = dict(zip(order, [Q, KK, VV, G, BETA], strict=True))

    def call(x):
        return fn(*[x if n == name else base[n] for n in order], **kw)

    return call, (value,)


def _seq_rows(target, fn, **kw):
    rows = []
    for case, name, value, match in [
        ("q rank 3", "q", Q[0], "q"),
        ("k wrong K", "k", KK[..., :4], "k"),
        ("v wrong T", "v", VV[:, :2], "v"),
        ("g wrong heads", "g", G[:, :, :1], "g"),
        ("beta rank 4", "beta", BETA[..., None], "beta"),
        ("q int", "q", Q.astype(jnp.int32), "q"),
        ("q bool", "q", Q > 0, "q"),
        ("beta int", "beta", BETA.astype(jnp.int32), "beta"),
    ]:
        call, arrays = _qkv(fn, name, value, **kw)
        rows.append(Row(target, case, call, arrays, match))
    return rows


def _step(**replace):
    base = dict(state=STATE, q_t=QT, k_t=KT, v_t=VT, g_t=GT, beta_t=BT)
    base.update(replace)
    names = list(base)

    def call(*xs):
        return kda_step(*xs)

    return call, tuple(base[n] for n in names)


def _pool(**replace):
    base = dict(pool=POOL, state_indices=SLOTS, q_t=QT, k_t=KT, v_t=VT, g_t=GT, beta_t=BT)
    base.update(replace)
    return (lambda *xs: kda_pool_step(*xs)), tuple(base.values())


def _verify(**replace):
    base = dict(
        pool=POOL,
        state_indices=SLOTS,
        q=Q,
        k=KK,
        v=VV,
        g=G,
        beta=BETA,
        num_accepted_tokens=jnp.array([1, 2], jnp.int32),
    )
    base.update(replace)
    return (lambda *xs: kda_pool_verify(*xs)), tuple(base.values())


# the rows that may kill the interpreter, evaluated in a child process (kda_lib's names in scope)
ISOLATED = ("init_a_log(jax.random.key(0), 2**40)",
            "init_dt_bias(jax.random.key(0), 2**20, 2**20)")  # fmt: skip
ERRORS = {"ValueError": ValueError, "TypeError": TypeError}


def _child(expressions) -> subprocess.CompletedProcess:
    """``expressions`` run one after the other in one child process; each one's ValueError or
    TypeError printed as a JSON line ``[kind, message]`` (``null`` if it returned)."""
    code = "import jax, json, sys\nfrom kda_lib import *\n" + "".join(
        f"try:\n    {e}\n    print('null')\nexcept (ValueError, TypeError) as e:\n"
        "    print(json.dumps([type(e).__name__, str(e)]))\n"
        for e in expressions
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@functools.cache
def _isolated_outcomes() -> dict:
    """expression -> its ``[kind, message]`` (None: it returned), the ISOLATED rows in one child
    process (one interpreter start, not one each); empty if that child died: each row then
    runs in a child of its own, so a crash is reported by the row that crashed."""
    run = _child(ISOLATED)
    lines = run.stdout.splitlines()
    if run.returncode != 0 or len(lines) != len(ISOLATED):
        return {}
    return dict(zip(ISOLATED, map(json.loads, lines), strict=True))


def _isolated(expression: str):
    """Evaluate ``expression`` (kda_lib's names in scope) in a child process, for rows that may
    kill the interpreter; its ValueError/TypeError is raised here, a crash (or no error) as
    RuntimeError."""
    assert expression in ISOLATED, expression

    def call():
        outcomes = _isolated_outcomes()
        if expression in outcomes:
            outcome = outcomes[expression]
        else:  # the shared child died: this row alone, in a child of its own
            run = _child([expression])
            if run.returncode != 0:
                raise RuntimeError(f"exit status {run.returncode}: {run.stderr[-300:]}")
            outcome = json.loads(run.stdout)
        if outcome is None:
            raise RuntimeError(f"{expression} returned without an error")
        kind, message = outcome
        raise ERRORS[kind](message)

    return call


def _cfg(**overrides):
    return lambda: KDAConfig(**{**CFG, **overrides})


@functools.cache
def _drafted():
    """``(cache, token_caches)`` of ``LAYER.draft(HID)`` and the boundaries of its prefill, for
    the rows that misuse them: built when such a row first runs (concretely, also when that is
    under ``jax.jit``), not at import, which every worker pays (eagerly: compiling either call
    as one program takes longer than its ops one by one)."""
    with jax.ensure_compile_time_eval():
        _, cache, token_caches = LAYER.draft(HID, cache=LAYER.init_cache(B))
        return cache, token_caches, LAYER.prefill(HID)[-1]


def _cache():
    return _drafted()[0]


def _tokens():
    return _drafted()[1]


def _bounds():
    return _drafted()[2]


ROWS = [
    # -- kda (the dispatcher) ------------------------------------------------------------------
    *_seq_rows("kda", kda),
    Row("kda", "chunk_size 0", _kda(chunk_size=0), match="chunk_size", jit=False),
    Row("kda", "chunk_size bool", _kda(chunk_size=True), match="chunk_size", jit=False),
    Row("kda", "chunk_size float", _kda(chunk_size=4.0), match="chunk_size", jit=False),
    Row("kda", "implementation unknown", _kda(implementation="bogus"), match="implementation"),
    # switches are bools (numpy bools too); an int, a word or an array of them is refused
    Row("kda", "allow_neg_eigval a word", _kda(allow_neg_eigval="no"), match="allow_neg_eigval"),
    Row("kda", "use_qk_l2norm a word", _kda(use_qk_l2norm="no"), match="use_qk_l2norm"),
    Row("kda", "chunk_size past memory", _kda(chunk_size=np.int64(2**40)), match="chunk_size",
        jit=False),
    Row("kda", "output_final_state int", _kda(output_final_state=1), match="output_final_state"),
    Row("kda", "output_chunk_states array", _kda(output_chunk_states=np.array([True])),
        match="output_chunk_states"),
    Row("kda", "use_gate_in_kernel jax bool", _kda(use_gate_in_kernel=jnp.array(True)),
        match="use_gate_in_kernel"),
    Row("kda", "max_num_segments negative, no ids", _kda(max_num_segments=-3),
        match="max_num_segments"),
    Row(
        "kda",
        "initial_state wrong shape",
        lambda s: kda(Q, KK, VV, G, BETA, initial_state=s),
        (STATE[:, :, :4],),
        "initial_state",
    ),
    Row(
        "kda",
        "initial_state int",
        lambda s: kda(Q, KK, VV, G, BETA, initial_state=s),
        (STATE.astype(jnp.int32),),
        "initial_state",
    ),
    Row(
        "kda",
        "segment_ids float",
        lambda s: kda(Q, KK, VV, G, BETA, segment_ids=s),
        (jnp.zeros((B, T), F32),),
        "segment_ids",
    ),
    Row(
        "kda",
        "segment_ids wrong shape",
        lambda s: kda(Q, KK, VV, G, BETA, segment_ids=s),
        (jnp.zeros((B, T + 1), jnp.int32),),
        "segment_ids",
    ),
    Row(
        "kda",
        "a_log wrong shape",
        lambda a: kda(Q, KK, VV, G, BETA, a_log=a, dt_bias=DT_BIAS, use_gate_in_kernel=True),
        (A_LOG[:1],),
        "a_log",
    ),
    # -- kda_chunked, kda_recurrent ------------------------------------------------------------
    *_seq_rows("kda_chunked", kda_chunked, chunk_size=4),
    Row(
        "kda_chunked",
        "chunk_size 3 (T=4 not a multiple)",
        lambda: kda_chunked(Q, KK, VV, G, BETA, chunk_size=3),
        match="chunk_size",
        jit=False,
    ),
    Row(
        "kda_chunked",
        "chunk_size bool",
        lambda: kda_chunked(Q, KK, VV, G, BETA, chunk_size=True),
        match="chunk_size",
        jit=False,
    ),
    *_seq_rows("kda_recurrent", kda_recurrent),
    Row(
        "kda_recurrent",
        "segment_ids float",
        lambda s: kda_recurrent(Q, KK, VV, G, BETA, segment_ids=s),
        (jnp.zeros((B, T), F32),),
        "segment_ids",
    ),
    # -- kda_step --------------------------------------------------------------------------------
    Row("kda_step", "state rank 3", *_step(state=STATE[0]), "state"),
    Row("kda_step", "state int", *_step(state=STATE.astype(jnp.int32)), "state"),
    Row("kda_step", "q_t with a T axis", *_step(q_t=Q), "q_t"),
    Row("kda_step", "k_t wrong K", *_step(k_t=KT[..., :4]), "k_t"),
    Row("kda_step", "v_t wrong V", *_step(v_t=VT[..., :4]), "v_t|state"),
    Row("kda_step", "g_t bool", *_step(g_t=GT > 0), "g_t"),
    Row("kda_step", "beta_t wrong shape", *_step(beta_t=BT[:, :1]), "beta_t"),
    # -- kda_pool_step -------------------------------------------------------------------------
    Row("kda_pool_step", "pool rank 3", *_pool(pool=POOL[0]), "pool"),
    Row(
        "kda_pool_step",
        "state_indices float",
        *_pool(state_indices=SLOTS.astype(F32)),
        "state_indices",
    ),
    Row("kda_pool_step", "state_indices bool", *_pool(state_indices=SLOTS > 0), "state_indices"),
    Row(
        "kda_pool_step",
        "state_indices wrong length",
        *_pool(state_indices=SLOTS[:1]),
        "state_indices",
    ),
    Row(
        "kda_pool_step",
        "state_indices out of range",
        *_pool(state_indices=jnp.array([0, N])),
        "state_indices",
        jit_nan=True,
    ),
    Row(
        "kda_pool_step",
        "state_indices -1",
        *_pool(state_indices=jnp.array([0, -1])),
        "state_indices",
        jit_nan=True,
    ),
    Row(
        "kda_pool_step",
        "state_indices duplicate",
        *_pool(state_indices=jnp.array([1, 1])),
        "state_indices",
        jit_nan=True,
    ),
    Row("kda_pool_step", "q_t with a T axis", *_pool(q_t=Q), "q_t"),
    # issue 75.5: the value checks name the step's arguments (they named g and beta)
    Row("kda_pool_step", "g_t positive", *_pool(g_t=-GT), "g_t", jit=False),
    Row("kda_pool_step", "beta_t past 1", *_pool(beta_t=BT * 3), "beta_t", jit=False),
    Row("kda_step", "g_t positive", *_step(g_t=-GT), "g_t", jit=False),
    Row("kda_pool_step", "g_t wrong K", *_pool(g_t=GT[..., :4]), "g_t"),
    Row("kda_pool_step", "beta_t int", *_pool(beta_t=BT.astype(jnp.int32)), "beta_t"),
    # -- kda_pool_verify -----------------------------------------------------------------------
    Row(
        "kda_pool_verify",
        "num_accepted_tokens float",
        *_verify(num_accepted_tokens=jnp.array([1.0, 2.0])),
        "num_accepted_tokens",
    ),
    Row(
        "kda_pool_verify",
        "num_accepted_tokens past T",
        *_verify(num_accepted_tokens=jnp.array([1, T + 1])),
        "num_accepted_tokens",
        jit_nan=True,
    ),
    Row(
        "kda_pool_verify",
        "num_accepted_tokens -1",
        *_verify(num_accepted_tokens=jnp.array([-1, 1])),
        "num_accepted_tokens",
        jit_nan=True,
    ),
    Row(
        "kda_pool_verify",
        "state_indices out of range",
        *_verify(state_indices=jnp.array([0, N])),
        "state_indices",
        jit_nan=True,
    ),
    Row(
        "kda_pool_verify",
        "state_indices duplicate",
        *_verify(state_indices=jnp.array([2, 2])),
        "state_indices",
        jit_nan=True,
    ),
    Row("kda_pool_verify", "q rank 3", *_verify(q=Q[0]), "q"),
    Row("kda_pool_verify", "beta int", *_verify(beta=BETA.astype(jnp.int32)), "beta"),
    # -- kda_gate, init_a_log, init_dt_bias ------------------------------------------------------
    Row(
        "kda_gate",
        "a_log a list",
        lambda: kda_gate(G, [1.0] * H, DT_BIAS),
        match="a_log",
        jit=False,
    ),
    Row("kda_gate", "a_log wrong length", lambda a: kda_gate(G, a, DT_BIAS), (A_LOG[:1],), "a_log"),
    Row(
        "kda_gate",
        "dt_bias wrong length",
        lambda d: kda_gate(G, A_LOG, d),
        (DT_BIAS[:3],),
        "dt_bias",
    ),
    Row("kda_gate", "f int", lambda f: kda_gate(f, A_LOG, DT_BIAS), (G.astype(jnp.int32),), "f"),
    Row(
        "kda_gate",
        "lower_bound positive",
        lambda: kda_gate(G, A_LOG, DT_BIAS, lower_bound=1.0),
        match="lower_bound",
        jit=False,
    ),
    Row(
        "init_a_log",
        "num_heads 0",
        lambda: init_a_log(jax.random.key(0), 0),
        match="num_heads",
        jit=False,
    ),
    Row(
        "init_a_log",
        "num_heads bool",
        lambda: init_a_log(jax.random.key(0), True),
        match="num_heads",
        jit=False,
    ),
    Row(
        "init_a_log",
        "low > high",
        lambda: init_a_log(jax.random.key(0), H, low=4.0, high=1.0),
        match="low|high",
        jit=False,
    ),
    Row(
        "init_a_log",
        "num_heads past memory",
        _isolated(ISOLATED[0]),
        match="num_heads",
        jit=False,
    ),
    Row(
        "init_dt_bias",
        "head_dim float",
        lambda: init_dt_bias(jax.random.key(0), H, 8.0),
        match="head_dim",
        jit=False,
    ),
    Row(
        "init_dt_bias",
        "dt_min > dt_max",
        lambda: init_dt_bias(jax.random.key(0), H, K, dt_min=0.5, dt_max=0.1),
        match="dt_min|dt_max",
        jit=False,
    ),
    Row(
        "init_dt_bias",
        "sizes past memory",
        _isolated(ISOLATED[1]),
        match="num_heads|head_dim",
        jit=False,
    ),
    # -- GateForm, emulate_tpu -------------------------------------------------------------------
    Row("GateForm", "unknown form", lambda: GateForm("bogus"), match="GateForm", jit=False),
    Row(
        "emulate_tpu",
        "unknown generation",
        lambda: emulate_tpu("v99").__enter__(),
        match="generation",
        jit=False,
    ),
    Row(
        "emulate_tpu",
        "unknown uninitialized_memory",
        lambda: emulate_tpu(uninitialized_memory="bogus").__enter__(),
        match="uninitialized_memory",
        jit=False,
    ),
    # -- KDAConfig --------------------------------------------------------------------------------
    Row("KDAConfig", "hidden_size bool", _cfg(hidden_size=True), match="hidden_size", jit=False),
    Row("KDAConfig", "num_heads 0", _cfg(num_heads=0), match="num_heads", jit=False),
    Row("KDAConfig", "head_dim float", _cfg(head_dim=8.0), match="head_dim", jit=False),
    Row("KDAConfig", "chunk_size -4", _cfg(chunk_size=-4), match="chunk_size", jit=False),
    Row("KDAConfig", "conv_size bool", _cfg(conv_size=True), match="conv_size", jit=False),
    Row(
        "KDAConfig",
        "implementation unknown",
        _cfg(implementation="bogus"),
        match="implementation",
        jit=False,
    ),
    Row("KDAConfig", "dtype int", _cfg(dtype=jnp.int32), match="dtype", jit=False),
    Row(
        "KDAConfig", "param_dtype bool", _cfg(param_dtype=jnp.bool_), match="param_dtype", jit=False
    ),
    Row("KDAConfig", "norm_eps NaN", _cfg(norm_eps=float("nan")), match="norm_eps", jit=False),
    Row("KDAConfig", "lower_bound positive", _cfg(lower_bound=1.0), match="lower_bound", jit=False),
    Row("KDAConfig", "gate_form a word", _cfg(gate_form="bogus"), match="gate_form", jit=False),
    # -- KimiDeltaAttention: constructor and methods --------------------------------------------
    Row(
        "KimiDeltaAttention",
        "config a dict",
        lambda: KimiDeltaAttention(CFG, rngs=nnx.Rngs(0)),
        match="config",
        jit=False,
    ),
    Row(
        "KimiDeltaAttention",
        "hidden_size past memory",
        lambda: _layer(hidden_size=2**34, num_heads=1, head_dim=8),
        match="hidden_size",
        jit=False,
    ),
    # the fla checkpoint loader (issue 75.6)
    Row("KimiDeltaAttention.from_fla_state_dict", "state_dict a list",
        lambda: KimiDeltaAttention.from_fla_state_dict([], KDAConfig(**CFG), rngs=nnx.Rngs(0)),
        match="state_dict", jit=False),
    Row("KimiDeltaAttention.from_fla_state_dict", "config a dict",
        lambda: KimiDeltaAttention.from_fla_state_dict({}, CFG, rngs=nnx.Rngs(0)),
        match="config", jit=False),
    Row("KimiDeltaAttention.from_fla_state_dict", "a tensor of another shape",
        lambda: KimiDeltaAttention.from_fla_state_dict(
            {**export_state_dict(LAYER), "A_log": np.zeros(H + 1, np.float32)},
            KDAConfig(**CFG), rngs=nnx.Rngs(0)), match="A_log", jit=False),
    Row("KimiDeltaAttention.__call__", "x rank 2", lambda x: LAYER(x), (HID[0],), "x"),
    Row("KimiDeltaAttention.__call__", "x wrong hidden", lambda x: LAYER(x), (HID[..., :8],), "x"),
    Row("KimiDeltaAttention.__call__", "x int", lambda x: LAYER(x), (HID.astype(jnp.int32),), "x"),
    Row("KimiDeltaAttention.__call__", "x bool", lambda x: LAYER(x), (HID > 0,), "x"),
    # x NaN: no row since issue 75.9 (x is never read on the host; NaN outputs, eager as under
    # jit: test_input_validation.py::test_nan_in_x_is_not_read_on_the_host_and_gives_nan_...)
    Row(
        "KimiDeltaAttention.__call__",
        "segment_ids float",
        lambda s: LAYER(HID, segment_ids=s),
        (jnp.zeros((B, T), F32),),
        "segment_ids",
    ),
    Row(
        "KimiDeltaAttention.__call__",
        "cache of another batch",
        lambda: LAYER(HID, cache=LAYER.init_cache(B + 1)),
        match="cache",
        jit=False,
    ),
    Row(
        "KimiDeltaAttention.__call__",
        "cache not a KDACache",
        lambda: LAYER(HID, cache=(STATE,)),
        match="cache",
        jit=False,
    ),
    Row(
        "KimiDeltaAttention.init_cache",
        "batch_size 0",
        lambda: LAYER.init_cache(0),
        match="batch_size",
        jit=False,
    ),
    Row(
        "KimiDeltaAttention.init_cache",
        "batch_size bool",
        lambda: LAYER.init_cache(True),
        match="batch_size",
        jit=False,
    ),
    Row(
        "KimiDeltaAttention.init_cache",
        "batch_size past memory",
        lambda: LAYER.init_cache(2**40),
        match="batch_size",
        jit=False,
    ),
    Row(
        "KimiDeltaAttention.prefill",
        "x int",
        lambda x: LAYER.prefill(x),
        (HID.astype(jnp.int32),),
        "x",
    ),
    Row(
        "KimiDeltaAttention.draft",
        "cache None",
        lambda: LAYER.draft(HID, cache=None),
        match="cache",
        jit=False,
    ),
    Row(
        "KimiDeltaAttention.draft",
        "x rank 2",
        lambda x: LAYER.draft(x, cache=_cache()),
        (HID[0],),
        "x",
    ),
    Row(
        "KimiDeltaAttention.accept_draft",
        "num_accepted_tokens float",
        lambda n: LAYER.accept_draft(_cache(), _tokens(), n),
        (jnp.array([1.0, 2.0]),),
        "num_accepted_tokens",
    ),
    Row(
        "KimiDeltaAttention.accept_draft",
        "num_accepted_tokens past T",
        lambda: LAYER.accept_draft(_cache(), _tokens(), T + 1),
        match="num_accepted_tokens",
        jit=False,
    ),
    Row(
        "KimiDeltaAttention.accept_draft",
        "num_accepted_tokens bool",
        lambda: LAYER.accept_draft(_cache(), _tokens(), True),
        match="num_accepted_tokens",
        jit=False,
    ),
    Row(
        "KimiDeltaAttention.accept_draft",
        "token_caches a cache without T axis",
        lambda: LAYER.accept_draft(_cache(), _cache(), 1),
        match="token_caches",
        jit=False,
    ),
    Row(
        "cache_at", "index float", lambda i: cache_at(_bounds(), i), (jnp.array([0.0, 0.0]),),
        "index",
    ),
    Row(
        "cache_at",
        "index array out of range",
        lambda i: cache_at(_bounds(), i),
        (jnp.array([0, 5]),),
        "index",
        jit_nan=True,
    ),
    Row(
        "KimiDeltaAttention.accept_draft",
        "num_accepted_tokens array -1 and past T",
        lambda n: LAYER.accept_draft(_cache(), _tokens(), n),
        (jnp.array([-1, T + 1]),),
        "num_accepted_tokens",
        jit_nan=True,
    ),
    Row("cache_at", "index out of range", lambda: cache_at(_bounds(), 5), match="index", jit=False),
    Row("cache_at", "index -1", lambda: cache_at(_bounds(), -1), match="index", jit=False),
    Row("cache_at", "index bool", lambda: cache_at(_bounds(), True), match="index", jit=False),
    Row("cache_at", "caches unstacked", lambda: cache_at(_cache(), 0), match="caches", jit=False),
]


def _abstract(*shape):
    return jax.ShapeDtypeStruct(shape, F32)


# traced inputs (nothing allocated) of 2 GiB whose token states [B, T, HV, K, V] are 256 GiB:
# refused while tracing, naming the argument that asks for them
ROWS.append(
    Row(
        "kda",
        "token states past memory",
        lambda: jax.eval_shape(
            lambda q, k, v, g, b: kda(q, k, v, g, b, output_token_states=True),
            *[_abstract(1, 2**16, 64, 128)] * 4,
            _abstract(1, 2**16, 64),
        ),
        match="output_token_states|q",
        jit=False,
    )
)

# -- the questions asked of kda's table before a call (kda_lib.ops.api) ------------------------
def _question_rows():
    from kda_lib.ops.api import refusals, select_implementation

    ok = dict(seq_len=8, key_dim=8)
    rows = [
        Row("select_implementation", case, lambda kw=kw: select_implementation(**{**ok, **kw}),
            match=name, jit=False)
        for case, name, kw in [
            ("seq_len 0", "seq_len", dict(seq_len=0)),
            ("key_dim bool", "key_dim", dict(key_dim=True)),
            ("batch float", "batch", dict(batch=2.0)),
            ("value_dim negative", "value_dim", dict(value_dim=-1)),
            ("dtype int", "dtype", dict(dtype=jnp.int32)),
            ("dtype unknown word", "dtype", dict(dtype="float33")),
            ("dtype None", "dtype", dict(dtype=None)),
            ("fused_gate int", "fused_gate", dict(fused_gate=1)),
            ("lower_bound positive", "lower_bound", dict(lower_bound=7.0)),
            ("chunk_size 3", "chunk_size", dict(chunk_size=3)),
            ("precision unknown", "precision", dict(precision="low")),
            ("differentiated a word", "differentiated", dict(differentiated="yes")),
            ("an unknown field", "sequence_length", dict(sequence_length=8)),
        ]
    ]  # fmt: skip
    rows += [
        Row("refusals", "implementation unknown", lambda: refusals("triton", **ok),
            match="implementation", jit=False),
        Row("refusals", "here int", lambda: refusals("chunked", here=1, **ok), match="here",
            jit=False),
        Row("refusals", "seq_len float", lambda: refusals("chunked", seq_len=8.0),
            match="seq_len", jit=False),
    ]  # fmt: skip
    return rows


ROWS += _question_rows()


# -- the other mixers and TinyLM (kda_lib.layers, kda_lib.models) ------------------------------
def _mixer_rows():
    from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention
    from kda_lib.layers.mamba2 import Mamba2Config, Mamba2Mixer
    from kda_lib.layers.mla import MLAConfig, MultiHeadLatentAttention
    from kda_lib.models.tiny_lm import ConvMixer, ModelConfig, TinyLM

    def attention(**kw):
        return AttentionConfig(**{"hidden_size": 16, "num_heads": H, "head_dim": K, **kw})

    def mla(**kw):
        return MLAConfig(**{"hidden_size": 16, "num_heads": H, "head_dim": K, "kv_lora_rank": 4,
                            **kw})  # fmt: skip

    def mamba2(**kw):
        return Mamba2Config(**{"hidden_size": 16, "num_heads": H, "head_dim": K, **kw})

    conv_attention = CausalSelfAttention(attention(short_conv=True), rngs=nnx.Rngs(0))
    mixer = Mamba2Mixer(mamba2(chunk_size=4), rngs=nnx.Rngs(0))
    conv_mixer = ConvMixer(KDAConfig(**CFG), rngs=nnx.Rngs(0))
    rows = []
    for target, make in (("AttentionConfig", attention), ("MLAConfig", mla),
                         ("Mamba2Config", mamba2)):  # fmt: skip
        rows.append(Row(target, "hidden_size bool", lambda m=make: m(hidden_size=True),
                        match="hidden_size", jit=False))  # fmt: skip
        if target != "Mamba2Config":  # Mamba2 computes in float32: it has no dtype fields
            rows += [Row(target, "dtype int", lambda m=make: m(dtype=jnp.int32), match="dtype",
                         jit=False),
                     Row(target, "param_dtype bool", lambda m=make: m(param_dtype=jnp.bool_),
                         match="param_dtype", jit=False)]  # fmt: skip
        if target != "AttentionConfig":  # attention has no float field
            rows += [Row(target, f"norm_eps {eps}", lambda m=make, e=eps: m(norm_eps=e),
                         match="norm_eps", jit=False)
                     for eps in (float("inf"), float("nan"), 0.0, -1e-5)]  # fmt: skip
    for target, build, name in (
        ("CausalSelfAttention", lambda: CausalSelfAttention(attention(hidden_size=2**34),
                                                            rngs=nnx.Rngs(0)), "hidden_size"),
        ("MultiHeadLatentAttention", lambda: MultiHeadLatentAttention(mla(hidden_size=2**34),
                                                                      rngs=nnx.Rngs(0)),
         "hidden_size"),
        ("Mamba2Mixer", lambda: Mamba2Mixer(mamba2(hidden_size=2**34), rngs=nnx.Rngs(0)),
         "hidden_size"),
        ("TinyLM", lambda: TinyLM(ModelConfig(vocab_size=2**40), rngs=nnx.Rngs(0)),
         "vocab_size"),
    ):  # fmt: skip
        rows.append(Row(target, f"{name} past memory", build, match=name, jit=False))
    rows += [
        Row("ModelConfig", "rope 1", lambda: ModelConfig(vocab_size=8, rope=1), match="rope",
            jit=False),
        Row("ModelConfig", "mlp_width 0", lambda: ModelConfig(vocab_size=8, mlp_width=0),
            match="mlp_width", jit=False),
        # segment ids are checked once, at the layer's entry, not again by each short conv
        Row("CausalSelfAttention.__call__", "short_conv, segment_ids float",
            lambda s: conv_attention(HID, segment_ids=s), (jnp.ones((B, T), F32),),
            "segment_ids"),
        Row("CausalSelfAttention.__call__", "short_conv, segment_ids wrong T",
            lambda s: conv_attention(HID, segment_ids=s), (jnp.ones((B, T - 1), jnp.int32),),
            "segment_ids"),
        Row("CausalSelfAttention.__call__", "x int", lambda x: conv_attention(x),
            (HID.astype(jnp.int32),), "x"),
        Row("Mamba2Mixer.__call__", "segment_ids float", lambda s: mixer(HID, segment_ids=s),
            (jnp.ones((B, T), F32),), "segment_ids"),
        Row("Mamba2Mixer.__call__", "segment_ids wrong B", lambda s: mixer(HID, segment_ids=s),
            (jnp.ones((B + 1, T), jnp.int32),), "segment_ids"),
        Row("Mamba2Mixer.__call__", "cache of another batch",
            lambda: mixer(HID, cache=mixer.init_cache(B + 1)), match="cache", jit=False),
        Row("KimiDeltaAttention.__call__", "a Mamba2Cache of the same shapes",
            lambda: LAYER(HID, cache=mixer.init_cache(B)), match="cache must be a KDACache",
            jit=False),
        # issue 75.5: the larger size is named (it named batch_size=1)
        Row("CausalSelfAttention.init_cache", "max_len past memory",
            lambda: conv_attention.init_cache(1, max_len=2**40), match="max_len", jit=False),
        Row("MultiHeadLatentAttention.init_cache", "max_len past memory",
            lambda: MultiHeadLatentAttention(mla(), rngs=nnx.Rngs(0)).init_cache(1, max_len=2**40),
            match="max_len", jit=False),
        Row("ConvMixer.init_cache", "batch_size 0", lambda: conv_mixer.init_cache(0),
            match="batch_size", jit=False),
        Row("ConvMixer.init_cache", "batch_size bool", lambda: conv_mixer.init_cache(True),
            match="batch_size", jit=False),
        Row("ConvMixer.init_cache", "batch_size float", lambda: conv_mixer.init_cache(1.5),
            match="batch_size", jit=False),
    ]  # fmt: skip
    return rows


ROWS += _mixer_rows()

# Faults found today (2026-12-04): (target, case, mode) -> what happens. Modes "eager" / "jit".
FAULTS: dict[tuple[str, str, str], str] = {}  # rows that fail today (none)

# Public names without rows, each with its reason (none today).
EXEMPT: dict[str, str] = {}


def _params():
    out = []
    for row in ROWS:
        for mode in ("eager", "jit") if row.jit else ("eager",):
            marks = []
            fault = FAULTS.get((row.target, row.case, mode))
            if fault:
                marks.append(pytest.mark.xfail(strict=True, reason=f"fault: {fault}"))
            out.append(pytest.param(row, mode, marks=marks, id=f"{row.target}[{row.case}]-{mode}"))
    return out


@pytest.mark.parametrize(("row", "mode"), _params())
def test_misuse_refused_naming_the_argument(row, mode):
    call = jax.jit(row.call) if mode == "jit" else row.call
    if mode == "jit" and row.jit_nan:
        try:
            out = jax.block_until_ready(call(*row.arrays))
        except (ValueError, TypeError) as error:
            assert re.search(rf"\b({row.match})\b", str(error)), error
            assert not PYTHONS_OWN_REFUSAL.search(str(error)), f"Python's refusal: {error}"
            return
        leaves = [np.asarray(x) for x in jax.tree.leaves(out)]
        assert any(np.isnan(x).any() for x in leaves if x.dtype.kind == "f"), (
            f"{row.match}: finite result, no error"
        )
        return
    with pytest.raises(row.exc) as info:
        jax.block_until_ready(call(*row.arrays))
    assert info.type in (ValueError, TypeError)
    assert re.search(rf"\b({row.match})\b", str(info.value)), (
        f"message does not name {row.match!r}: {info.value}"
    )
    assert not PYTHONS_OWN_REFUSAL.search(str(info.value)), f"Python's refusal: {info.value}"


def test_every_public_name_has_rows():
    covered = {row.target.split(".")[0] for row in ROWS}
    missing = [n for n in kda_lib.__all__ if n not in covered and n not in EXEMPT]
    assert not missing, f"public names with no misuse rows: {missing}"
    methods = {"__call__", "init_cache", "prefill", "draft", "accept_draft", "from_fla_state_dict"}
    have = {row.target.split(".")[1] for row in ROWS if "." in row.target}
    assert methods <= have, f"layer methods with no misuse rows: {sorted(methods - have)}"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(a_log=jnp.zeros(H), lower_bound=-5.0), "a_log"),  # no silent in-kernel gate
        (dict(use_gate_in_kernel=1, lower_bound=-5.0), "use_gate_in_kernel"),
        (dict(lower_bound=7.0), "lower_bound"),
    ],
)
def test_mosaic_context_parallel_gate_switch_is_explicit(kwargs, match):
    """tokamax Mosaic's context parallelism checks the gate switch as kda() does, before
    any work: a_log without use_gate_in_kernel=True is refused, not read as the switch."""
    from kda_lib.parallel.context_parallel import kda_context_parallel

    with pytest.raises(ValueError, match=match):
        kda_context_parallel(Q, KK, VV, G, BETA, implementation="tokamax_mosaic", **kwargs)
