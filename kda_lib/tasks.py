"""Synthetic sequence tasks for tiny language models: deterministic by key, any batch and length.

Every task is a function ``task(key, batch, seq_len, **options) -> TaskBatch`` built only from
``jax.random``, so the same key gives the same batch on every platform, and the function can
run inside ``jax.jit`` (the options and shapes are static). A :class:`TaskBatch` holds

* ``inputs``  ``[B, T]`` int32 tokens the model reads,
* ``targets`` ``[B, T]`` int32 tokens it should predict at each position,
* ``mask``    ``[B, T]`` bool, True where the prediction is scored (the loss and accuracy of
  :mod:`kda_lib.train` average over these positions only).

Positions outside the mask have target 0 by convention; nothing may read them.
``functools.partial(delayed_copy, vocab_size=16, delay=8)`` is a ``task_fn`` for
:func:`kda_lib.train.train`. :data:`TASKS` maps names to generators (for a command line).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp


class TaskBatch(NamedTuple):
    """One batch of a synthetic task (see the module docstring)."""

    inputs: jax.Array  # [B, T] int32
    targets: jax.Array  # [B, T] int32
    mask: jax.Array  # [B, T] bool


TaskFn = Callable[[jax.Array, int, int], TaskBatch]


def _check_shape(batch: int, seq_len: int) -> None:
    for name, value in (("batch", batch), ("seq_len", seq_len)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def delayed_copy(
    key: jax.Array, batch: int, seq_len: int, *, vocab_size: int, delay: int
) -> TaskBatch:
    """Repeat the token seen ``delay`` steps ago.

    The inputs are i.i.d. uniform tokens in ``[0, vocab_size)``. The target at position ``t``
    is the input at ``t - delay``; only positions ``t >= delay`` are scored (before that there
    is nothing to repeat). A model that cannot see ``delay`` tokens back does no better than
    chance there: cross-entropy ``log(vocab_size)``, accuracy ``1 / vocab_size``.

    Example (``delay=2``)::

        inputs   5 1 7 2 0 ...
        targets  0 0 5 1 7 ...      (t < 2: placeholder 0)
        mask     F F T T T ...

    Args:
      key: a ``jax.random`` key; the batch is a pure function of it.
      batch: B, sequences per batch.
      seq_len: T, tokens per sequence (may be <= delay: then nothing is scored).
      vocab_size: number of distinct tokens (>= 2).
      delay: how far back to copy from (>= 1).

    Returns:
      :class:`TaskBatch` of ``[B, T]`` int32 inputs and targets and a bool mask.
    """
    _check_shape(batch, seq_len)
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
    if not isinstance(delay, int) or delay < 1:
        raise ValueError(f"delay must be an int >= 1, got {delay!r}")
    inputs = jax.random.randint(key, (batch, seq_len), 0, vocab_size, dtype=jnp.int32)
    shift = min(delay, seq_len)
    targets = jnp.pad(inputs[:, : seq_len - shift], ((0, 0), (shift, 0)))
    positions = jnp.arange(seq_len)
    mask = jnp.broadcast_to(positions >= delay, (batch, seq_len))
    return TaskBatch(inputs, targets, mask)


def chance_loss(vocab_size: int) -> float:
    """Cross-entropy (nats) of guessing uniformly over ``vocab_size`` tokens: ``log(V)``."""
    return math.log(vocab_size)


# name -> generator; later tasks (MQAR, palindrome, stack) register here too
TASKS: dict[str, Callable[..., TaskBatch]] = {
    "delayed_copy": delayed_copy,
}
