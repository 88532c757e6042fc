"""Measuring what a compiled program does: collectives and the bytes they move.

:func:`hlo_collectives` reads compiled HLO text (``jax.jit(f).lower(...).compile().as_text()``)
and lists every collective with the bytes each rank sends. CPU compilers emit synchronous
collectives (``all-gather(...)``); GPU and TPU compilers split them into asynchronous pairs
(``all-gather-start`` / ``all-gather-done``) whose start returns a tuple of operands and
results (plus context scalars for ``collective-permute-start``). Both forms, and combined
collectives with tuple results, are counted once each, from the op that starts them.
"""

from __future__ import annotations

import math
import re

from kda_lib.checks import check_int

COLLECTIVE_OPS = ("all-gather", "collective-permute", "all-reduce", "reduce-scatter", "all-to-all")

# one HLO instruction: `%name = <result type> <op>(`; the result type is an array type or a
# (possibly nested) tuple of them
_INSTRUCTION = re.compile(
    r"=\s*(?P<type>\(.*?\)|[a-z]+\d*\[[\d,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>" + "|".join(COLLECTIVE_OPS) + r")(?P<start>-start)?\("
)
_ARRAY = re.compile(r"(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")
_BYTES = {
    "f64": 8,
    "f32": 4,
    "bf16": 2,
    "f16": 2,
    "s64": 8,
    "u64": 8,
    "s32": 4,
    "u32": 4,
    "s16": 2,
    "u16": 2,
    "s8": 1,
    "u8": 1,
    "pred": 1,
}


def _arrays(result_type: str) -> list[tuple[str, tuple[int, ...]]]:
    return [
        (m["dtype"], tuple(int(d) for d in m["dims"].split(",") if d))
        for m in _ARRAY.finditer(result_type)
    ]


def hlo_collectives(hlo_text: str, num_ranks: int) -> list[dict]:
    """Collectives in compiled HLO text, with the bytes each rank sends (ring algorithms).

    Args:
      hlo_text: compiled HLO module text.
      num_ranks: devices taking part in each collective.

    Returns:
      One dict per collective (an async ``-start``/``-done`` pair counts once) with ``op``,
      ``dtype``, ``shape`` (result shape; the first result of a combined collective),
      ``elements`` (all results), ``sent_bytes`` (per rank): all-gather ``(R-1)/R`` of its
      result, all-reduce ``2 (R-1)/R``, reduce-scatter ``(R-1)/R`` of its operand (``R`` times
      the result), all-to-all ``(R-1)/R``, collective-permute all of it.
    """
    check_int("num_ranks", num_ranks)
    found = []
    for match in _INSTRUCTION.finditer(hlo_text):
        arrays = _arrays(match["type"])
        if match["start"] and match["type"].startswith("("):
            # async start: (operands..., results..., [context scalars]); keep the results
            arrays = [a for a in arrays if a[1]] if match["op"] == "collective-permute" else arrays
            arrays = arrays[len(arrays) // 2 :]
        if not arrays:
            continue
        size = sum(math.prod(dims) * _BYTES.get(dtype, 4) for dtype, dims in arrays)
        elements = sum(math.prod(dims) for _, dims in arrays)
        share = (num_ranks - 1) / num_ranks
        op = match["op"]
        sent = {
            "all-gather": share * size,
            "all-reduce": 2 * share * size,
            "reduce-scatter": share * size * num_ranks,
            "all-to-all": share * size,
            "collective-permute": size,
        }[op]
        dtype, shape = arrays[0]
        found.append(dict(op=op, dtype=dtype, shape=shape, elements=elements, sent_bytes=int(sent)))
    return found


def timed_call(fn, *args, calls: int = 1) -> tuple[float, object]:
    """``(seconds per call, last output)`` of ``calls`` calls ``fn(*args)`` dispatched back to
    back, waiting once for the last one's results (``jax.block_until_ready``; calls run in
    order), so asynchronous dispatch is not mistaken for speed: the package's one timer (the
    benchmark, decode speed and :func:`median_ms` use it). ``calls=1`` includes the host's wait
    for the result; more calls leave the device's time per call."""
    import time

    import jax

    start = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    out = jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls, out


def xla_cost(program) -> dict[str, float]:
    """XLA's cost analysis of a lowered or compiled program, ``{"flops", "bytes accessed"}``
    (a loop's body counted once; a custom call such as a Pallas kernel counts nothing, 0.0):
    the package's one reader of ``cost_analysis()``."""
    cost = program.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    cost = cost if isinstance(cost, dict) else {}
    return {key: float(cost.get(key, 0.0)) for key in ("flops", "bytes accessed")}


def median_ms(fn, *args, repeats: int = 3):
    """``(median wall time of fn(*args) in ms, its output)`` over ``repeats`` timed calls, after
    one untimed warm-up call (which compiles a jitted ``fn``)."""
    _, out = timed_call(fn, *args)
    times = sorted(timed_call(fn, *args)[0] for _ in range(repeats))
    middle = len(times) // 2
    median = times[middle] if len(times) % 2 else 0.5 * (times[middle - 1] + times[middle])
    return 1e3 * median, out
