"""Notebook 07's decode-step timing: ``steps`` decode steps of a layer in one compiled loop,
several layers' loops timed interleaved, the fastest round kept; and the cache's shapes after a
``T``-token prompt, traced (nothing runs).

One loop per call (``jax.lax.scan``) pays Python's per-call dispatch once for all its steps.
"""

from __future__ import annotations

import functools

import jax
from flax import nnx

from kda_lib.lab.measure import timed_call


@functools.partial(jax.jit, static_argnums=(0, 4))
def _decode_loop(graph, params, x_t, cache, steps):
    """``steps`` calls ``module(x_t, cache=c)`` of the module ``nnx.split`` gave as
    ``(graph, params)``, the cache carried: ``(final cache, outputs [steps, B, 1, hidden])``."""
    module = nnx.merge(graph, params)

    def step(c, _):
        y, c = module(x_t, cache=c)
        return c, y

    return jax.lax.scan(step, cache, length=steps)


def step_ms(calls: dict, steps: int, repeats: int) -> dict:
    """``{name: ms per decode step}`` for ``calls = {name: (module, x_t [B, 1, hidden], cache)}``:
    each a loop of ``steps`` steps, one round that compiles, then ``repeats`` rounds with the
    loops interleaved, the fastest round of each kept."""
    if steps < 1 or repeats < 1:
        raise ValueError(f"steps and repeats must be >= 1, got {steps}, {repeats}")
    args = {name: (*nnx.split(module), x_t, cache, steps)
            for name, (module, x_t, cache) in calls.items()}
    rounds = [{name: 1e3 * timed_call(_decode_loop, *a)[0] / steps for name, a in args.items()}
              for _ in range(1 + repeats)]
    return {name: min(r[name] for r in rounds[1:]) for name in calls}


def cache_shapes_after(layer, batch: int, context: int, hidden: int, dtype=jax.numpy.float32):
    """The shapes of ``layer``'s cache after a ``[batch, context, hidden]`` prompt, traced with
    ``jax.eval_shape`` (nothing is computed)."""
    graph, params = nnx.split(layer)

    def prefill(p, xs):
        return nnx.merge(graph, p)(xs, cache=layer.init_cache(batch))[1]

    after = jax.eval_shape(prefill, params, jax.ShapeDtypeStruct((batch, context, hidden), dtype))
    return jax.tree.map(lambda a: a.shape, after)
