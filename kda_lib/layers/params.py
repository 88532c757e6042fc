"""Weight decay marked where each parameter is created (:data:`NO_DECAY` on ``A_log``,
``dt_bias``, norms, biases, embeddings; :func:`weight_decay_mask` reads it), and the memory
check a layer makes before it allocates its parameters."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from types import MappingProxyType

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kda_lib.checks import allocation_problem, check_allocation, dominant_size, is_int

NO_DECAY = MappingProxyType({"weight_decay": False})  # metadata: AdamW does not decay it


def no_decay_param(value: jax.Array) -> nnx.Param:
    """``nnx.Param(value)`` marked :data:`NO_DECAY`."""
    return nnx.Param(value, **NO_DECAY)


def weight_decay_mask(module: nnx.Module):
    """Bools over ``nnx.state(module, nnx.Param)``: True but where marked :data:`NO_DECAY`."""
    return jax.tree.map(lambda v: bool(v.get_metadata().get("weight_decay", True)),
                        nnx.state(module, nnx.Param),
                        is_leaf=lambda x: isinstance(x, nnx.Variable))  # fmt: skip


def parameter_count(module: nnx.Module, *, nbytes: bool = False) -> int:
    """Scalars (``nbytes``: bytes) in ``module``'s parameters, real or ``nnx.eval_shape``'s."""
    size = lambda x: math.prod(x.shape) * (np.dtype(x.dtype).itemsize if nbytes else 1)
    return sum(size(x) for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


@functools.lru_cache(maxsize=64)  # one eval_shape per recent (layer class, config)
def config_bytes(make, config) -> int:
    """Bytes of ``make(config, rngs=...)``'s parameters, built as shapes (``nnx.eval_shape``)."""
    return parameter_count(nnx.eval_shape(lambda: make(config, rngs=nnx.Rngs(0))), nbytes=True)


def check_parameters_fit(make: Callable[..., nnx.Module], config, *, fields=None,
                         nbytes: Callable | None = None) -> None:  # fmt: skip
    """Refuse a layer ``make(config, rngs=...)`` whose parameters cannot fit in memory, naming
    the int of ``fields`` behind most of the bytes (:func:`kda_lib.checks.dominant_size`;
    ``config``'s field names, default all, or ``"<Config>.<field>"`` names of ``config`` or of
    a config it holds); not under a trace. ``nbytes(config)``: the parameters' bytes (default:
    ``make(config)``'s, built as shapes by ``nnx.eval_shape``)."""
    if isinstance(jnp.zeros(()), jax.core.Tracer):
        return
    owner = type(config).__name__
    names = fields or [f"{owner}.{f.name}" for f in dataclasses.fields(config)]
    names = [n if "." in n else f"{owner}.{n}" for n in names]
    sizes = {n: v for n in names
             if is_int(v := getattr(_holder(config, n)[1], n.split(".")[1]), None)}  # fmt: skip
    nbytes = functools.partial(config_bytes, make) if nbytes is None else nbytes
    what = f"the parameters of {make.__name__}"
    if allocation_problem(what, total := nbytes(config)) is None:
        return
    changed = lambda s: {n: v for n, v in s.items() if v != sizes[n]}  # noqa: E731
    name = dominant_size(sizes, lambda s: nbytes(_with(config, changed(s))))
    check_allocation(name, sizes[name], what, total)


def _holder(config, name: str) -> tuple[str | None, object]:
    """``(field, holder)`` of ``name`` (``"<Config>.<field>"``): ``(None, config)``, or the
    field of ``config`` holding the ``<Config>`` and that config."""
    owner = name.split(".")[0]
    if type(config).__name__ == owner:
        return None, config
    return next((f.name, getattr(config, f.name)) for f in dataclasses.fields(config)
                if type(getattr(config, f.name)).__name__ == owner)  # fmt: skip


def _with(config, values: dict):
    """``config`` with ``values`` (``{"<Config>.<field>": value}``) replaced, nested too."""
    for name, value in values.items():
        outer, holder = _holder(config, name)
        holder = dataclasses.replace(holder, **{name.split(".")[1]: value})
        config = holder if outer is None else dataclasses.replace(config, **{outer: holder})
    return config
