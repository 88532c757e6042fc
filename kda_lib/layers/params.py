"""The weight-decay policy, as a mark on each parameter where it is created.

AdamW decays matmul and convolution kernels; it must not decay gate parameters (``A_log``,
``dt_bias``, which fla marks ``_no_weight_decay``), norm weights, biases or embeddings. Each of
those is created with the metadata :data:`NO_DECAY` (``nnx.Param(value, **NO_DECAY)``, or
``bias_metadata=NO_DECAY`` / ``scale_metadata=NO_DECAY`` / ``embedding_metadata=NO_DECAY`` for
Flax's own layers), and :func:`weight_decay_mask` reads the mark: no parameter name is matched.
A parameter created without the mark decays.

:func:`check_parameters_fit` refuses, before any parameter is allocated, a layer whose
parameters (their shapes from ``nnx.eval_shape``) cannot fit this machine's memory.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from types import MappingProxyType

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kda_lib.checks import check_allocation

# Variable metadata of a parameter AdamW must not decay
NO_DECAY = MappingProxyType({"weight_decay": False})


def no_decay_param(value: jax.Array) -> nnx.Param:
    """``nnx.Param(value)`` marked :data:`NO_DECAY`."""
    return nnx.Param(value, **NO_DECAY)


def decays(variable: nnx.Variable) -> bool:
    """Does AdamW decay this parameter? True unless it was created with :data:`NO_DECAY`."""
    return bool(variable.get_metadata().get("weight_decay", True))


def weight_decay_mask(module: nnx.Module):
    """Pytree of bools over ``nnx.state(module, nnx.Param)``: each parameter's mark (False for
    the gate parameters, norm weights, biases and embeddings, True for matmul and conv kernels).
    Works for a :class:`kda_lib.KimiDeltaAttention` and for any model containing it."""
    params = nnx.state(module, nnx.Param)
    return jax.tree.map(decays, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def parameter_count(module: nnx.Module) -> int:
    """Scalars in ``module``'s parameters: the package's one parameter counter (works on
    ``nnx.eval_shape`` modules, whose parameters are shapes only)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


_BYTES: dict = {}  # (what, config) -> parameter bytes: one eval_shape per distinct config


def parameter_bytes(module) -> int:
    """Bytes of ``module``'s parameters (real or ``nnx.eval_shape`` shapes)."""
    leaves = jax.tree.leaves(nnx.state(module, nnx.Param))
    return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in leaves)


def check_parameters_fit(
    make: Callable[..., nnx.Module], config, what: str = "", *, fields=None
) -> None:
    """Refuse (ValueError ``"<Config>.<field>=<value>: the parameters of <what> would take
    ~X (more than this machine's memory, Y)"``, naming the largest int field of the dataclass
    ``config``, or of its ``fields`` when given) when the parameters of ``make(config,
    rngs=...)`` (a layer class; ``what`` defaults to its name) cannot fit this machine's
    memory; the bytes come from ``nnx.eval_shape``, nothing is allocated. Called at the top
    of a layer's ``__init__``; under a trace (``nnx.eval_shape``, ``jit``), where no memory is
    taken, nothing is checked, so a layer larger than this machine can still be inspected."""
    if isinstance(jnp.zeros(()), jax.core.Tracer):
        return
    what = what or make.__name__
    key = (what, config)
    if key not in _BYTES:
        _BYTES[key] = parameter_bytes(nnx.eval_shape(lambda: make(config, rngs=nnx.Rngs(0))))
    names = fields or [f.name for f in dataclasses.fields(config)]
    sizes = {name: getattr(config, name) for name in names}
    sizes = {k: v for k, v in sizes.items() if isinstance(v, int) and not isinstance(v, bool)}
    name = max(sizes, key=sizes.get)
    value = getattr(config, name)
    check_allocation(
        f"{type(config).__name__}.{name}", value, f"the parameters of {what}", _BYTES[key]
    )
