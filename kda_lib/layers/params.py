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

from kda_lib.checks import check_allocation, is_int

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
    the largest int of ``fields`` (``config``'s field names, default all, or a dict
    ``{"<Config>.<field>": value}``); not under a trace. ``nbytes(config)``: the parameters'
    bytes (default: ``make(config)``'s, built as shapes by ``nnx.eval_shape``)."""
    if isinstance(jnp.zeros(()), jax.core.Tracer):
        return
    if not isinstance(fields, dict):
        names = fields or [f.name for f in dataclasses.fields(config)]
        fields = {f"{type(config).__name__}.{name}": getattr(config, name) for name in names}
    name = max((n for n, v in fields.items() if is_int(v, None)), key=fields.get)
    nbytes = config_bytes(make, config) if nbytes is None else nbytes(config)
    check_allocation(name, fields[name], f"the parameters of {make.__name__}", nbytes)
