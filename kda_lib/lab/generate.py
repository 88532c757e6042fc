"""Using a trained :class:`kda_lib.models.tiny_lm.TinyLM`: generation, scoring text, decode cost.

* :func:`generate` -- prefill a prompt, then sample one token at a time from the per-layer
  caches (a fixed-size state for KDA and GDN layers, a key/value buffer for attention layers),
  with one compiled step for the whole generation.
* :func:`generate_text` -- the same for byte-level models, from and to a string.
* :func:`score_text` -- cross-entropy per position over fixed windows: bits per byte and the
  bits against the position in the context, with standard errors over the windows
  (:func:`window_losses`: the per-window, per-position losses they come from).
* :func:`copy_probe_scores` -- the bits a repeat of the text far back saves (the long-range
  probe of :func:`kda_lib.lab.corpus.copy_probe_windows`).
* :func:`decode_cost` -- the time of one decode step and the bytes of the cache at growing
  context lengths (a KDA layer's cache does not grow; an attention layer's grows linearly).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from kda_lib.checks import check_number, check_positive_int, check_seed, check_token_ids
from kda_lib.lab.measure import timed_call
from kda_lib.layers.attention import AttentionCache
from kda_lib.layers.mla import MLACache
from kda_lib.models.tiny_lm import TinyLM
from kda_lib.ops.api import register_compiled_cache


def _check_positive(name: str, value, minimum: int = 1) -> None:
    check_positive_int(name, value, minimum)


def _check_temperature(temperature) -> float:
    # numpy scalars (np.float32(0.7)) count as numbers, bools do not
    number = isinstance(temperature, (int, float, np.integer, np.floating))
    if isinstance(temperature, (bool, np.bool_)) or not number:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    return check_number("temperature", temperature, minimum=0)


def _pick(logits: jax.Array, key: jax.Array, temperature: jax.Array) -> jax.Array:
    """Next token ``[B]`` from the last logits ``[B, vocab]``: sampled at ``temperature``,
    the argmax at temperature 0."""
    logits = logits.astype(jnp.float32)
    sampled = jax.random.categorical(key, logits / jnp.maximum(temperature, 1e-6), axis=-1)
    return jnp.where(temperature > 0, sampled, jnp.argmax(logits, axis=-1)).astype(jnp.int32)


class _Steps(NamedTuple):
    prefill: Callable  # (state, prompt [B, T], cache, key, temperature) -> (token [B], cache)
    decode: Callable  # (state, token [B], cache, key, temperature) -> (token [B], cache)


# The model enters as (graphdef, state), split once per generation: a step then dispatches like
# any jitted function. nnx.jit would walk the module graph on every call, and a graphdef passed
# as a static argument is hashed on every call (about 1 ms for a 4-layer model, as long as the
# step itself); here it is hashed once per generation, to find the model's compiled steps.
# Decoding changes no parameter, so nothing has to be merged back into the model.
@register_compiled_cache
@functools.lru_cache(maxsize=32)
def _steps(graphdef: nnx.GraphDef) -> _Steps:
    """Jitted prefill and decode steps for models of ``graphdef``'s structure (models of one
    config share them, and their compilations)."""

    @jax.jit
    def prefill(state: nnx.State, prompt, cache, key, temperature):
        logits, cache = nnx.merge(graphdef, state)(prompt, cache=cache)
        return _pick(logits[:, -1], key, temperature), cache

    @jax.jit
    def decode(state: nnx.State, token, cache, key, temperature):
        logits, cache = nnx.merge(graphdef, state)(token[:, None], cache=cache)
        return _pick(logits[:, -1], key, temperature), cache

    return _Steps(prefill, decode)


def generate(
    model: TinyLM,
    prompt,
    steps: int,
    *,
    temperature: float = 1.0,
    seed: int = 0,
) -> np.ndarray:
    """Continue ``prompt`` by ``steps`` tokens.

    The prompt goes through the model at once (prefill), filling one cache per layer, each of
    its own kind (see :meth:`TinyLM.init_cache`; attention caches get room for
    ``len(prompt) + steps`` tokens, so every step has the same shapes and one compiled step
    serves the whole generation); then each new token is fed back one at a time.

    Args:
      model: a :class:`TinyLM` (any mix of layers).
      prompt: token ids ``[T]`` or ``[B, T]`` (T >= 1), each below the model's vocabulary.
      steps: tokens to generate (>= 1).
      temperature: softmax temperature; 0 picks the most likely token (greedy).
      seed: seeds the sampling (step ``i`` uses ``fold_in(key(seed), i)``).

    Returns:
      ``[B, T + steps]`` (or ``[T + steps]`` for a 1-D prompt) int32: the prompt and its
      continuation.
    """
    _check_positive("steps", steps)
    check_seed("seed", seed)
    temperature = jnp.float32(_check_temperature(temperature))
    try:
        prompt = np.asarray(prompt)
    except ValueError as error:  # numpy: "inhomogeneous shape" for rows of different lengths
        raise ValueError(
            f"prompt must be token ids of shape [T] or [B, T] (every row the same length): {error}"
        ) from None
    if prompt.ndim not in (1, 2) or prompt.shape[-1] < 1 or prompt.size == 0:
        raise ValueError(
            f"prompt must be token ids of shape [T] or [B, T], T >= 1; got shape {prompt.shape}"
        )
    if not np.issubdtype(prompt.dtype, np.integer):
        raise ValueError(f"prompt must hold integer token ids, got dtype {prompt.dtype}")
    vocab = model.config.vocab_size
    if prompt.min() < 0 or prompt.max() >= vocab:
        raise ValueError(
            f"prompt token ids must lie in [0, {vocab}), got [{prompt.min()}, {prompt.max()}]"
        )
    batch = prompt[None] if prompt.ndim == 1 else prompt
    key = jax.random.key(seed)
    cache = model.init_cache(batch.shape[0], max_len=batch.shape[1] + steps)
    graphdef, state = nnx.split(model)
    step = _steps(graphdef)
    prompt_ids = jnp.asarray(batch, jnp.int32)
    token, cache = step.prefill(state, prompt_ids, cache, jax.random.fold_in(key, 0), temperature)
    tokens = [token]
    for i in range(1, steps):
        token, cache = step.decode(state, token, cache, jax.random.fold_in(key, i), temperature)
        tokens.append(token)
    out = np.concatenate([batch.astype(np.int32), np.stack(jax.device_get(tokens), 1)], 1)
    return out[0] if prompt.ndim == 1 else out


def generate_text(
    model: TinyLM, prompt: str, steps: int, *, temperature: float = 0.8, seed: int = 0
) -> str:
    """:func:`generate` for a byte-level model (vocabulary 256): the prompt's UTF-8 bytes in,
    prompt + continuation out as text (undecodable bytes shown as U+FFFD)."""
    if model.config.vocab_size != 256:
        raise ValueError(
            f"generate_text needs a byte-level model (vocab_size 256), got "
            f"{model.config.vocab_size}"
        )
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty str, got {prompt!r}")
    ids = np.frombuffer(prompt.encode(), np.uint8).astype(np.int32)
    out = generate(model, ids, steps, temperature=temperature, seed=seed)
    return bytes(out.astype(np.uint8).tolist()).decode("utf-8", errors="replace")


@nnx.jit
def _token_losses(model: TinyLM, inputs, targets):
    logits = model(inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def score_text(model: TinyLM, windows, *, batch_size: int = 8) -> dict:
    """Cross-entropy of ``model`` on fixed windows (e.g.
    :func:`kda_lib.lab.corpus.validation_windows`), with standard errors over the windows.

    Args:
      windows: ``inputs`` and ``targets`` ``[N, T]`` (a :class:`kda_lib.lab.corpus.TextBatch`);
        scored ``batch_size`` at a time (the last group padded, the padding dropped).
      batch_size: windows per forward pass (one compilation for every group).

    Returns:
      ``{"loss": mean nats per token, "bits_per_token": loss / ln 2, "loss_by_position":
      [T] list, the mean loss at each position of the window (position 0 sees one token)}``,
      and, in bits (for a byte-level model bits per token are bits per byte):
      ``bits_per_token_se``, the standard error of ``bits_per_token`` over the ``N`` windows
      (the sample standard deviation of the windows' mean bits over sqrt(N); NaN for N = 1),
      ``bits_by_position`` ``[T]``, the mean bits at each position, and
      ``bits_by_position_se`` ``[T]``, their standard errors over the windows. The errors
      treat the windows as independent draws: true for windows that share no bytes
      (:func:`kda_lib.lab.corpus.windows_overlap`), optimistic otherwise.
    """
    losses = window_losses(model, windows, batch_size=batch_size)  # [N, T] nats
    bits = losses / math.log(2)
    count = bits.shape[0]
    loss = float(losses.mean())

    def standard_error(x: np.ndarray) -> np.ndarray:
        if count < 2:
            return np.full(x.shape[1:], np.nan)
        return x.std(axis=0, ddof=1) / math.sqrt(count)

    return dict(
        loss=loss,
        bits_per_token=loss / math.log(2),
        loss_by_position=losses.mean(0).tolist(),
        bits_per_token_se=float(standard_error(bits.mean(1, keepdims=True))[0]),
        bits_by_position=bits.mean(0).tolist(),
        bits_by_position_se=standard_error(bits).tolist(),
    )


def copy_probe_scores(model: TinyLM, probe, *, batch_size: int = 8) -> dict:
    """Bits per byte of ``model`` at the scored positions of a
    :class:`kda_lib.lab.corpus.CopyProbe`, on the repeated text and on the control.

    Returns ``{"copy_bpb", "control_bpb"}`` (means over windows and scored positions),
    ``gain_bpb`` (control minus copy: the bits the repeat ``h`` bytes back saves, where the
    last ``reach + 1`` bytes are the same in both), ``gain_se`` (its standard error over the
    windows, paired window by window), ``windows`` and ``scored`` (the positions)."""
    start, stop = probe.scored
    bits = [
        window_losses(model, windows, batch_size=batch_size)[:, start:stop].mean(1) / math.log(2)
        for windows in (probe.copy, probe.control)
    ]  # two [N]: each window's mean bits at the scored positions
    gain = bits[1] - bits[0]
    count = gain.size
    return dict(
        copy_bpb=float(bits[0].mean()),
        control_bpb=float(bits[1].mean()),
        gain_bpb=float(gain.mean()),
        gain_se=float(gain.std(ddof=1) / math.sqrt(count)) if count > 1 else math.nan,
        windows=int(count),
        scored=[int(start), int(stop)],
    )


def window_losses(model: TinyLM, windows, *, batch_size: int = 8) -> np.ndarray:
    """The cross-entropy (nats) of every position of every window: ``[N, T]`` float32, for
    ``windows`` as in :func:`score_text` (checked: shapes, token ids below the vocabulary)."""
    _check_positive("batch_size", batch_size)
    inputs, targets = np.asarray(windows.inputs), np.asarray(windows.targets)
    if inputs.ndim != 2 or inputs.shape != targets.shape:
        raise ValueError(
            f"windows.inputs and .targets must both be [N, T], got "
            f"{inputs.shape} and {targets.shape}"
        )
    count = inputs.shape[0]
    if count == 0 or inputs.shape[1] == 0:
        raise ValueError(f"windows must hold at least one window of T >= 1, got {inputs.shape}")
    check_token_ids("windows.inputs", inputs, model.config.vocab_size)
    check_token_ids("windows.targets", targets, model.config.vocab_size)
    pad = -count % batch_size
    if pad:
        inputs = np.concatenate([inputs, np.repeat(inputs[-1:], pad, 0)])
        targets = np.concatenate([targets, np.repeat(targets[-1:], pad, 0)])
    losses = [
        _token_losses(
            model, jnp.asarray(inputs[i : i + batch_size]), jnp.asarray(targets[i : i + batch_size])
        )
        for i in range(0, inputs.shape[0], batch_size)
    ]
    return np.concatenate(jax.device_get(losses))[:count]


def cache_bytes(cache) -> int:
    """Bytes held by a model's decode caches (every array of the pytree)."""
    return int(sum(x.nbytes for x in jax.tree.leaves(cache)))


def _as_if_seen(cache: tuple, context: int, key: jax.Array) -> tuple:
    """Caches with random contents, sized and marked as if ``context`` tokens had been seen
    (a decode step's cost depends on the shapes and the fill level, not on the values).

    The fixed-capacity caches that grow with the context (:class:`AttentionCache` of the
    attention layers, :class:`kda_lib.layers.mla.MLACache` of the MLA layers) are marked as holding
    ``context`` tokens, so the next step writes at position ``context``; the recurrent layers'
    states have no fill level."""

    def fill(leaf, k):
        return (
            jax.random.normal(k, leaf.shape, leaf.dtype)
            if jnp.issubdtype(leaf.dtype, jnp.floating)
            else leaf
        )

    out = []
    for i, layer_cache in enumerate(cache):
        leaves, treedef = jax.tree.flatten(layer_cache)
        keys = jax.random.split(jax.random.fold_in(key, i), max(len(leaves), 1))
        layer_cache = jax.tree.unflatten(
            treedef, [fill(x, k) for x, k in zip(leaves, keys, strict=False)]
        )
        if isinstance(layer_cache, (AttentionCache, MLACache)):
            if layer_cache.length is None:
                raise ValueError("decode_cost needs fixed-capacity caches (init_cache(max_len=))")
            layer_cache = layer_cache._replace(length=jnp.asarray(context, jnp.int32))
        out.append(layer_cache)
    return tuple(out)


def decode_cost(
    model: TinyLM,
    contexts: Sequence[int],
    *,
    batch_size: int = 1,
    steps: int = 16,
    repeats: int = 3,
    seed: int = 0,
) -> list[dict]:
    """Time per decoded token and cache memory after ``context`` tokens, for each context.

    For each context length ``L`` the caches are built with room for ``L + steps + 1`` tokens
    (one untimed step that compiles, then ``steps`` timed ones) and filled (random values) as
    if ``L`` tokens had been seen; then ``steps`` decode steps run (after the untimed step) and
    the best of ``repeats`` such runs is kept. The compiled step depends only on the caches'
    shapes: a model whose layers are all recurrent compiles once for every context, one with
    attention once per context.

    Returns:
      One dict per context: ``context``, ``seconds_per_token`` (per step, all ``batch_size``
      rows together), ``tokens_per_second`` (``batch_size`` / that), ``cache_bytes`` (the
      caches after the steps) and ``cache_bytes_per_row``.
    """
    for name, value in (("batch_size", batch_size), ("steps", steps), ("repeats", repeats)):
        _check_positive(name, value)
    contexts = list(contexts)
    if not contexts:
        raise ValueError("contexts must name at least one context length")
    for context in contexts:
        _check_positive("every context", context, minimum=0)
    key = jax.random.key(seed)
    temperature = jnp.float32(0.0)
    graphdef, state = nnx.split(model)
    decode = _steps(graphdef).decode
    results = []
    for context in contexts:
        cache = _as_if_seen(model.init_cache(batch_size, max_len=context + steps + 1), context, key)
        token = jnp.zeros((batch_size,), jnp.int32)
        token, cache = decode(state, token, cache, key, temperature)  # compiles
        jax.block_until_ready(cache)
        best = math.inf

        def generate_steps(run_token, run_cache):
            for i in range(steps):
                run_token, run_cache = decode(
                    state, run_token, run_cache, jax.random.fold_in(key, i), temperature
                )
            return run_cache

        for _ in range(repeats):
            seconds, run_cache = timed_call(generate_steps, token, cache)
            best = min(best, seconds / steps)
        size = cache_bytes(run_cache)
        results.append(
            dict(
                context=context,
                seconds_per_token=best,
                tokens_per_second=batch_size / best,
                cache_bytes=size,
                cache_bytes_per_row=size // batch_size,
            )
        )
    return results
