"""Flop counts of the KDA forms, term by term from the code that runs (NOTEBOOK_NOTES, 03).

Multiply-adds count as 2 flops; the counts are per head and per forward pass and cover the
matrix products (``dot_general``), which dominate: elementwise work (decay factors, masks) is
O(T d) per head. :func:`matmul_flops` counts the same thing in a traced program (its jaxpr, loop
trip counts included), so a count here can be checked against the code exactly;
``jax.jit(f).lower(...).compile().cost_analysis()`` is XLA's count, which adds every elementwise
op (those that fusion recomputes included) and counts a loop's body once, whatever its trip
count.
"""

from __future__ import annotations

import jax
import numpy as np


def inverse_flops(C: int) -> int:
    """Flops of :func:`kda_lib.ops.chunked.unit_lower_inverse` on one ``C x C`` matrix: merges
    of ``m x m`` blocks (m = 2, 4, ..., C/2; the 2 x 2 blocks cost none), ``C / 2m`` of them,
    each ``X2 L21 X1``: two ``m x m`` products."""
    flops, m = 0, 2
    while m < C:
        flops += (C // (2 * m)) * 2 * (2 * m**3)
        m *= 2
    return flops


def chunk_terms(C: int, K: int, V: int) -> dict[str, int]:
    """Matmul flops of one chunk of :func:`kda_lib.kda_chunked`, per head, by term.

    ``scores``: the decayed q.k and k.k scores by merging segments (1 + 1 tokens, 2 + 2, ...):
    only the strictly lower blocks are multiplied, ``C (C - 1) / 2`` entries of ``2 K`` flops,
    for two row sets. ``inverse``: :func:`inverse_flops`. ``wu``: ``W = (I + L)^-1 diag(beta)
    K_in`` and ``U`` likewise with V. The sequential pass, per chunk: ``state``: corrected
    values ``U - W S`` and the new state ``Gamma_C S + K_out^T (U - W S)``; ``outputs``:
    ``Q_in S + P (U - W S)``. The associative scan forms the maps instead: ``maps`` (``Q_eff``,
    ``O_intra``, ``M``, ``E``) and ``apply`` (``M_cum S_0`` and ``Q_eff S_enter``); its
    compositions are counted in :func:`chunked_flops`.
    """
    return {
        "scores": 2 * K * C * (C - 1),
        "inverse": inverse_flops(C),
        "wu": 2 * C * C * (K + V),
        "state": 4 * C * K * V,
        "outputs": 2 * C * K * V + 2 * C * C * V,
        "maps": 2 * C * C * (K + V) + 2 * C * K * (K + V),
        "apply": 2 * K * K * V + 2 * C * K * V,
    }


SEQUENTIAL_TERMS = ("scores", "inverse", "wu", "state", "outputs")
ASSOCIATIVE_TERMS = ("scores", "inverse", "wu", "maps", "apply")


def compose_flops(K: int, V: int) -> int:
    """One composition of affine maps, ``(M2 M1, M2 E1 + E2)``: two products (the add is not
    a matmul)."""
    return 2 * K**3 + 2 * K * K * V


def associative_scan_rounds(n: int) -> list[int]:
    """Compositions in each round of ``jax.lax.associative_scan`` over ``n`` elements.

    Counted, not derived: the scan is traced on ``n`` shape-only elements with a combine
    function that records how many pairs each call combines (one call is one round: its
    compositions are independent of each other). Calls on zero pairs are not rounds.
    """
    calls = []

    def combine(a, b):
        calls.append(a.shape[0])
        return a + b

    jax.eval_shape(
        lambda x: jax.lax.associative_scan(combine, x), jax.ShapeDtypeStruct((n,), np.float32)
    )
    return [c for c in calls if c > 0]


def associative_scan_schedule(n: int) -> tuple[int, int]:
    """``(rounds, compositions)`` of ``jax.lax.associative_scan`` over ``n`` elements."""
    rounds = associative_scan_rounds(n)
    return len(rounds), sum(rounds)


def recurrent_flops(T: int, K: int, V: int) -> int:
    """The recurrence, per token: decay the state (``K V``), ``k^T S`` (``2 K V``), write the
    outer product into it (``2 K V``), read ``S^T q`` (``2 K V``)."""
    return 7 * T * K * V


def attention_flops(T: int, K: int, V: int) -> float:
    """Causal softmax attention computing only the causal half: ``T^2 / 2`` scores of
    ``2 K`` flops and as many weighted values of ``2 V``."""
    return T * T * (K + V)


def chunked_flops(T: int, C: int, K: int, V: int, scan: str = "streaming") -> float:
    """Matmul flops of :func:`kda_lib.kda_chunked` per head (T a multiple of C);
    ``scan="streaming"``: one chunk per scan step; ``"associative"``: the chunk maps composed."""
    if T % C:
        raise ValueError(f"T must be a multiple of C, got T={T}, C={C}")
    terms = chunk_terms(C, K, V)
    n = T // C
    if scan == "streaming":
        return n * sum(terms[t] for t in SEQUENTIAL_TERMS)
    if scan == "associative":
        _, compositions = associative_scan_schedule(n)
        return n * sum(terms[t] for t in ASSOCIATIVE_TERMS) + compositions * compose_flops(K, V)
    raise ValueError(f"scan must be 'streaming' or 'associative', got {scan!r}")


def matmul_flops(fn, *args) -> float:
    """Flops of every ``dot_general`` in ``fn(*args)``'s jaxpr, ``2 x`` (output size) ``x``
    (contracted size), a ``scan``'s body counted ``length`` times, a ``while`` loop's once (its
    trip count is not static) and a ``cond``'s costliest branch."""

    def subjaxprs(value):
        if hasattr(value, "eqns"):  # a Jaxpr
            yield value
        elif hasattr(getattr(value, "jaxpr", None), "eqns"):  # a ClosedJaxpr
            yield value.jaxpr
        elif isinstance(value, (tuple, list)):
            for item in value:
                yield from subjaxprs(item)

    def count(jaxpr) -> float:
        total = 0.0
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                (contract, _), _ = eqn.params["dimension_numbers"]
                lhs = eqn.invars[0].aval.shape
                out = eqn.outvars[0].aval.shape
                total += 2.0 * np.prod(out) * np.prod([lhs[d] for d in contract])
                continue
            inner = [count(sub) for value in eqn.params.values() for sub in subjaxprs(value)]
            if eqn.primitive.name == "cond":
                total += max(inner, default=0.0)
            else:
                times = eqn.params["length"] if eqn.primitive.name == "scan" else 1
                total += times * sum(inner)
        return total

    return count(jax.make_jaxpr(fn)(*args).jaxpr)
