"""Synthetic sequence tasks for tiny language models: deterministic by key, any batch and length.

Every task is a function ``task(key, batch, seq_len, **options) -> TaskBatch`` built only from
``jax.random``, so the same key gives the same batch on every platform, and the function can
run inside ``jax.jit`` (the options and shapes are static). A :class:`TaskBatch` holds

* ``inputs``  ``[B, T]`` int32 tokens the model reads,
* ``targets`` ``[B, T]`` int32 tokens it should predict at each position,
* ``mask``    ``[B, T]`` bool, True where the prediction is scored (the loss and accuracy of
  :mod:`kda_lib.lab.train` average over these positions only).

Positions outside the mask have target 0 by convention, except in :func:`stack`, whose target
(the top of the stack) is defined at every position; a loss must not read them either way.
``functools.partial(delayed_copy, vocab_size=16, delay=8)`` is a ``task_fn`` for
:func:`kda_lib.lab.train.train`. :data:`TASKS` maps names to generators (for a command line):
``delayed_copy``, ``mqar`` (multi-query associative recall), ``palindrome`` (reverse the first
half) and ``stack`` (top of a push/pop stack).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from kda_lib.checks import check_int, check_positive_int, is_int


class TaskBatch(NamedTuple):
    """One batch of a synthetic task (see the module docstring)."""

    inputs: jax.Array  # [B, T] int32
    targets: jax.Array  # [B, T] int32
    mask: jax.Array  # [B, T] bool


TaskFn = Callable[[jax.Array, int, int], TaskBatch]


def _check_shape(batch: int, seq_len: int) -> None:
    for name, value in (("batch", batch), ("seq_len", seq_len)):
        check_int(name, value)


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
    check_int("vocab_size", vocab_size, 2)
    check_positive_int("delay", delay)
    inputs = jax.random.randint(key, (batch, seq_len), 0, vocab_size, dtype=jnp.int32)
    shift = min(delay, seq_len)
    targets = jnp.pad(inputs[:, : seq_len - shift], ((0, 0), (shift, 0)))
    positions = jnp.arange(seq_len)
    mask = jnp.broadcast_to(positions >= delay, (batch, seq_len))
    return TaskBatch(inputs, targets, mask)


def _check_vocab(vocab_size: int, minimum: int, why: str) -> None:
    if not is_int(vocab_size, minimum):
        raise ValueError(f"vocab_size must be an int >= {minimum} ({why}), got {vocab_size!r}")


def mqar(key: jax.Array, batch: int, seq_len: int, *, vocab_size: int, num_pairs: int) -> TaskBatch:
    """Multi-query associative recall: read key/value pairs, then answer each key's value.

    Vocabulary: token ``0`` is a filler; the other ids form a block of key tokens,
    ``1 .. (vocab_size - 1) // 2``, followed by a block of value tokens (the rest).

    Each sequence opens with ``num_pairs`` pairs ``k1 v1 k2 v2 ...`` (keys distinct within the
    sequence, drawn without replacement; values drawn uniformly with replacement). The rest,
    the query region of length ``seq_len - 2 * num_pairs``, is filler except that every key
    appears exactly once more, at distinct random positions in random order. At such a query
    the target is the value paired with that key; the mask is True exactly at the queries.
    Without recall a model can only guess among the value tokens (:func:`chance_accuracy`).

    Example (``vocab_size=9``: keys 1..4, values 5..8; ``num_pairs=2``, ``seq_len=8``)::

        inputs   3 7 1 5 0 1 0 3
        targets  0 0 0 0 0 5 0 7
        mask     F F F F F T F T

    Args:
      key: a ``jax.random`` key; the batch is a pure function of it.
      batch: B, sequences per batch.
      seq_len: T, tokens per sequence (>= 3 * num_pairs: the pairs plus a query region with
        room for every key).
      vocab_size: number of distinct tokens (filler + keys + values; ``(vocab_size - 1) // 2``
        must be >= num_pairs).
      num_pairs: key/value pairs per sequence (>= 1), each queried once.

    Returns:
      :class:`TaskBatch` of ``[B, T]`` int32 inputs and targets and a bool mask.
    """
    _check_shape(batch, seq_len)
    check_positive_int("num_pairs", num_pairs)
    check_int("vocab_size", vocab_size, None, expected="an int")
    n_keys = (vocab_size - 1) // 2
    if n_keys < num_pairs:
        raise ValueError(
            f"vocab_size must be >= {2 * num_pairs + 1} so that its (vocab_size - 1) // 2 key "
            f"tokens cover num_pairs={num_pairs} distinct keys, got {vocab_size!r}"
        )
    n_values = vocab_size - 1 - n_keys
    if n_values < 1:  # pragma: no cover - implied by n_keys >= num_pairs >= 1
        raise ValueError(f"vocab_size must leave at least 1 value token, got {vocab_size!r}")
    n_queries = seq_len - 2 * num_pairs
    if n_queries < num_pairs:
        raise ValueError(
            f"seq_len must be >= 3 * num_pairs = {3 * num_pairs} (2 * num_pairs tokens of "
            f"pairs, then a query region with room for all num_pairs queries), got {seq_len!r}"
        )
    return _mqar(key, batch, seq_len, vocab_size, num_pairs)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))  # one compiled program per shape
def _mqar(key: jax.Array, batch: int, seq_len: int, vocab_size: int, num_pairs: int) -> TaskBatch:
    n_keys = (vocab_size - 1) // 2
    n_queries = seq_len - 2 * num_pairs

    def one_row(row_key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        k_keys, k_values, k_where = jax.random.split(row_key, 3)
        keys = jax.random.permutation(k_keys, n_keys)[:num_pairs].astype(jnp.int32) + 1
        values = jax.random.randint(k_values, (num_pairs,), 1 + n_keys, vocab_size, jnp.int32)
        where = jax.random.permutation(k_where, n_queries)[:num_pairs]  # query i asks keys[i]
        pairs = jnp.stack([keys, values], axis=1).reshape(2 * num_pairs)
        zeros = jnp.zeros((n_queries,), jnp.int32)
        inputs = jnp.concatenate([pairs, zeros.at[where].set(keys)])
        targets = jnp.concatenate([jnp.zeros_like(pairs), zeros.at[where].set(values)])
        scored = jnp.zeros((n_queries,), bool).at[where].set(True)
        mask = jnp.concatenate([jnp.zeros((2 * num_pairs,), bool), scored])
        return inputs, targets, mask

    return TaskBatch(*jax.vmap(one_row)(jax.random.split(key, batch)))


def palindrome(key: jax.Array, batch: int, seq_len: int, *, vocab_size: int) -> TaskBatch:
    """Read a random string, then after a separator emit it reversed.

    Vocabulary: ``0`` filler, ``1`` separator, content tokens uniform in ``[2, vocab_size)``.
    With ``n = (seq_len - 1) // 2``, positions ``0..n-1`` hold the content ``x_0..x_{n-1}``,
    position ``n`` the separator, and every later position filler. From the separator on,
    position ``n + i`` has target ``x_{n-1-i}`` for ``i = 0..n-1`` (the separator itself is
    scored: it asks for the last token); the mask is True exactly there. Positions ``2n`` and
    up (one when ``seq_len`` is odd, two when even) are unscored. Chance accuracy is
    ``1 / (vocab_size - 2)``.

    Example (``seq_len=7``, so ``n=3``)::

        inputs   4 9 3 1 0 0 0
        targets  0 0 0 3 9 4 0
        mask     F F F T T T F

    Args:
      key: a ``jax.random`` key; the batch is a pure function of it.
      batch: B, sequences per batch.
      seq_len: T, tokens per sequence (>= 3: one content token, the separator, one answer).
      vocab_size: number of distinct tokens (>= 3: filler, separator, content).

    Returns:
      :class:`TaskBatch` of ``[B, T]`` int32 inputs and targets and a bool mask.
    """
    _check_shape(batch, seq_len)
    if seq_len < 3:
        raise ValueError(f"seq_len must be >= 3 (content, separator, answer), got {seq_len!r}")
    _check_vocab(vocab_size, 3, "filler 0, separator 1, content from 2 on")
    n = (seq_len - 1) // 2
    content = jax.random.randint(key, (batch, n), 2, vocab_size, dtype=jnp.int32)
    separator = jnp.ones((batch, 1), jnp.int32)
    filler = jnp.zeros((batch, seq_len - n - 1), jnp.int32)
    inputs = jnp.concatenate([content, separator, filler], axis=1)
    targets = jnp.pad(content[:, ::-1], ((0, 0), (n, seq_len - 2 * n)))
    positions = jnp.arange(seq_len)
    mask = jnp.broadcast_to((positions >= n) & (positions < 2 * n), (batch, seq_len))
    return TaskBatch(inputs, targets, mask)


def stack(
    key: jax.Array, batch: int, seq_len: int, *, vocab_size: int, pop_probability: float = 0.4
) -> TaskBatch:
    """Follow a stream of pushes and pops; after each pop name the new top of the stack.

    Vocabulary: ``1`` is POP, a token ``v`` in ``[2, vocab_size)`` is PUSH ``v``; ``0`` never
    appears in the inputs (it is the "empty stack" target). Each step pushes a uniform value if
    the stack is empty, and otherwise pops with probability ``pop_probability`` or pushes. The
    target at each position is the top of the stack after that token's operation (0 when
    empty). Only POPs that leave a non-empty stack are scored: after a PUSH the answer is the
    input itself, after a POP it must be remembered from earlier.

    Example::

        inputs   5 7 1 3 1 1 6
        targets  5 7 5 3 5 0 6
        mask     F F T F T F F      (the last POP empties the stack: unscored)

    Args:
      key: a ``jax.random`` key; the batch is a pure function of it.
      batch: B, sequences per batch.
      seq_len: T, tokens per sequence.
      vocab_size: number of distinct tokens (>= 3: POP and at least one value; 0 is reserved).
      pop_probability: chance of a POP on a non-empty stack, strictly between 0 and 1
        (default 0.4, so stacks tend to grow).

    Returns:
      :class:`TaskBatch` of ``[B, T]`` int32 inputs and targets and a bool mask.
    """
    _check_shape(batch, seq_len)
    _check_vocab(vocab_size, 3, "POP 1 and push values from 2 on")
    if (
        isinstance(pop_probability, bool)
        or not isinstance(pop_probability, (int, float))
        or not 0 < pop_probability < 1
    ):
        raise ValueError(
            "pop_probability must be a number with 0 < pop_probability < 1, "
            f"got {pop_probability!r}"
        )
    return _stack(key, batch, seq_len, vocab_size, float(pop_probability))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))  # one compiled program per shape
def _stack(
    key: jax.Array, batch: int, seq_len: int, vocab_size: int, pop_probability: float
) -> TaskBatch:
    def step(state, draws):
        buffer, depth = state
        uniform, value = draws
        pop = (depth > 0) & (uniform < pop_probability)
        buffer = jnp.where(pop, buffer, buffer.at[depth].set(value))
        depth = jnp.where(pop, depth - 1, depth + 1)
        top = jnp.where(depth > 0, buffer[jnp.maximum(depth - 1, 0)], 0)
        return (buffer, depth), (jnp.where(pop, 1, value), top, pop & (depth > 0))

    def one_row(row_key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        k_op, k_value = jax.random.split(row_key)
        uniforms = jax.random.uniform(k_op, (seq_len,))
        values = jax.random.randint(k_value, (seq_len,), 2, vocab_size, jnp.int32)
        start = (jnp.zeros((seq_len,), jnp.int32), jnp.int32(0))
        _, (inputs, targets, mask) = jax.lax.scan(step, start, (uniforms, values))
        return inputs.astype(jnp.int32), targets.astype(jnp.int32), mask

    return TaskBatch(*jax.vmap(one_row)(jax.random.split(key, batch)))


def chance_loss(vocab_size: int) -> float:
    """Cross-entropy (nats) of guessing uniformly over ``vocab_size`` tokens: ``log(V)``."""
    return math.log(vocab_size)


def chance_accuracy(task: str, **options) -> float:
    """Accuracy of guessing uniformly among the tokens a scored position can hold.

    ``delayed_copy``: ``1 / vocab_size``; ``mqar``: one over the number of value tokens,
    ``vocab_size - 1 - (vocab_size - 1) // 2``; ``palindrome`` and ``stack``:
    ``1 / (vocab_size - 2)`` (content / pushed values). ``options`` are the task's (only
    ``vocab_size`` is read).
    """
    vocab_size = options.get("vocab_size")
    if not is_int(vocab_size, None):
        raise ValueError(f"chance_accuracy needs the task's vocab_size, got {vocab_size!r}")
    answers = {
        "delayed_copy": vocab_size,
        "mqar": vocab_size - 1 - (vocab_size - 1) // 2,
        "palindrome": vocab_size - 2,
        "stack": vocab_size - 2,
    }
    if task not in answers:
        raise ValueError(f"unknown task {task!r}; known: {sorted(answers)}")
    return 1.0 / answers[task]


@jax.jit
def stack_answer_positions(inputs: jax.Array) -> jax.Array:
    """For :func:`stack` inputs ``[B, T]``: at each position, where the answer was pushed.

    Position ``t``'s target is the top of the stack after token ``t``; this returns the
    position of the PUSH that put that value there (``t`` itself after a PUSH), or -1 when the
    stack is empty. A POP (token 1) on an empty stack leaves it empty.

    Example::

        inputs     5 7 1 3 1 1 6
        positions  0 1 0 3 0 -1 6
    """

    def step(state, token_and_t):
        buffer, depth = state
        token, t = token_and_t
        pop = token == 1
        buffer = jnp.where(pop, buffer, buffer.at[depth].set(t))
        depth = jnp.where(pop, jnp.maximum(depth - 1, 0), depth + 1)
        top = jnp.where(depth > 0, buffer[jnp.maximum(depth - 1, 0)], -1)
        return (buffer, depth), top

    seq_len = inputs.shape[1]
    times = jnp.arange(seq_len, dtype=jnp.int32)

    def one_row(row):
        start = (jnp.zeros((seq_len,), jnp.int32), jnp.int32(0))
        return jax.lax.scan(step, start, (row, times))[1]

    return jax.vmap(one_row)(jnp.asarray(inputs, jnp.int32))


# task name -> inputs [B, T] -> the position each target is read from ([B, T] int, -1: none)
ANSWER_POSITIONS: dict[str, Callable[[jax.Array], jax.Array]] = {"stack": stack_answer_positions}


def beyond_reach_mask(task: str, batch: TaskBatch, reach: int) -> jax.Array:
    """``[B, T]`` bool: the scored positions whose answer lies more than ``reach`` tokens back
    (``t - source > reach``), where a model that sees only ``reach`` tokens back (a conv-only
    model: ``ModelConfig.conv_reach``) cannot read it. For the tasks of
    :data:`ANSWER_POSITIONS` (stack).

    Raises:
      ValueError: a task without answer positions, or ``reach`` not an int >= 0.
    """
    if task not in ANSWER_POSITIONS:
        raise ValueError(
            f"task {task!r} has no answer positions; beyond_reach_mask knows "
            f"{sorted(ANSWER_POSITIONS)}"
        )
    check_int("reach", reach, 0)
    source = ANSWER_POSITIONS[task](batch.inputs)
    distance = jnp.arange(batch.inputs.shape[1]) - source
    return batch.mask & (source >= 0) & (distance > reach)


# name -> generator
TASKS: dict[str, Callable[..., TaskBatch]] = {
    "delayed_copy": delayed_copy,
    "mqar": mqar,
    "palindrome": palindrome,
    "stack": stack,
}
