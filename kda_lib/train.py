"""Tiny language models and a training loop, for the notebooks and tests (Flax NNX + optax).

The model is ``embed -> N x (RMSNorm, mixer, RMSNorm, MLP) -> RMSNorm -> head`` with residual
connections around the mixer and the MLP. The token mixer is chosen by name from
:data:`MIXERS`:

* ``"kda"``: :class:`kda_lib.KimiDeltaAttention` (short convs + the delta-rule recurrence);
* ``"gdn"``: Gated DeltaNet, the same layer with one decay per head instead of per channel
  (``KDAConfig(per_head_decay=True)``);
* ``"attention"``: :class:`CausalSelfAttention`, causal softmax attention with RoPE;
* ``"conv"``: :class:`ConvMixer`, the same layer's short-conv value path and output gate with
  the recurrence removed, so a token sees at most ``conv_size - 1`` tokens back per layer.

More mixers plug in with :func:`register_mixer`; a
mixer maps ``[B, T, hidden]`` to ``[B, T, hidden]`` and, for decoding, offers
``init_cache(batch)`` and ``mixer(x, cache=cache) -> (y, new_cache)``.

:func:`train` runs AdamW (no weight decay on norms, biases, embeddings, ``A_log``,
``dt_bias``) on batches drawn from a task of :mod:`kda_lib.tasks`, one jitted step per batch,
and returns a history of the masked loss and accuracy; :func:`evaluate` scores held-out
batches. Randomness: the model's init comes from the ``nnx.Rngs`` you build it with; batches
come from ``seed`` (training and evaluation draw from different streams of it, so they never
share a batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import inspect
import json
import pathlib
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from kda_lib.conv import ShortConvolution
from kda_lib.layer import KDAConfig, KimiDeltaAttention, weight_decay_mask
from kda_lib.tasks import TASKS, TaskBatch, TaskFn, chance_accuracy

TRAIN_STREAM = 0  # jax.random.fold_in(key(seed), stream): training batches
EVAL_STREAM = 1  # held-out batches for evaluate()
NO_DECAY_NAMES = frozenset({"A_log", "dt_bias", "o_norm", "bias", "scale", "embedding"})


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of :class:`TinyLM`.

    Attributes:
      vocab_size: tokens in and out.
      hidden_size: model width (default 64).
      num_layers: N blocks (default 2).
      mixer: a name in :data:`MIXERS` ("kda", "conv", ...).
      num_heads, head_dim, value_head_dim: the mixer's H, K, V (V defaults to K).
      conv_size: short-conv width W (default 4).
      lower_bound: None = KDA's softplus gate; a float in [-5, 0) = the safe gate.
      mlp_ratio: MLP width as a multiple of hidden_size (default 2).
      norm_eps: RMSNorm epsilon.
      implementation, chunk_size: the KDA kernel's (see :func:`kda_lib.kda`).
    """

    vocab_size: int
    hidden_size: int = 64
    num_layers: int = 2
    mixer: str = "kda"
    num_heads: int = 2
    head_dim: int = 32
    value_head_dim: int | None = None
    conv_size: int = 4
    lower_bound: float | None = None
    mlp_ratio: int = 2
    norm_eps: float = 1e-5
    implementation: str = "auto"
    chunk_size: int = 64

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.mixer not in MIXERS:
            raise ValueError(
                f"ModelConfig.mixer must be one of {sorted(MIXERS)}, got {self.mixer!r}"
            )

    def kda_config(self) -> KDAConfig:
        """The :class:`kda_lib.KDAConfig` of every mixer layer."""
        return KDAConfig(
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            value_head_dim=self.value_head_dim,
            conv_size=self.conv_size,
            lower_bound=self.lower_bound,
            implementation=self.implementation,
            chunk_size=self.chunk_size,
        )

    @property
    def conv_reach(self) -> int:
        """How many tokens back the convolutions alone can see through all layers:
        ``num_layers * (conv_size - 1)``. A conv-only model is blind beyond it."""
        return self.num_layers * max(self.conv_size - 1, 0)


# ----------------------------------------------------------------------------- mixers
MixerFactory = Callable[[ModelConfig, nnx.Rngs], nnx.Module]
MIXERS: dict[str, MixerFactory] = {}


def register_mixer(name: str):
    """Decorator: ``@register_mixer("name")`` on a ``factory(config, rngs) -> nnx.Module``."""

    def register(factory: MixerFactory) -> MixerFactory:
        MIXERS[name] = factory
        return factory

    return register


def make_mixer(config: ModelConfig, *, rngs: nnx.Rngs) -> nnx.Module:
    """The token mixer named by ``config.mixer``."""
    try:
        factory = MIXERS[config.mixer]
    except KeyError:
        raise ValueError(f"unknown mixer {config.mixer!r}; known: {sorted(MIXERS)}") from None
    return factory(config, rngs)


class ConvMixer(nnx.Module):
    """KDA's short-conv path without the recurrence: the ablation that cannot remember.

    ``y = o_proj(rmsnorm(silu(conv(v_proj(x)))) * o_norm * sigmoid(g_proj(x)))`` per head,
    i.e. :class:`kda_lib.KimiDeltaAttention` with the kernel's output replaced by its values
    (no state). Output ``t`` depends on inputs ``t - conv_size + 1 .. t`` only. Parameter names
    match the KDA layer's (``v_proj v_conv1d g_proj o_norm o_proj``).
    """

    def __init__(self, config: KDAConfig, *, rngs: nnx.Rngs):
        if config.conv_size < 1:
            raise ValueError("ConvMixer needs conv_size >= 1 (it has no other way to mix tokens)")
        self.config = config
        h, vd, hidden = config.num_heads, config.value_dim, config.hidden_size
        linear = dict(dtype=config.dtype, param_dtype=config.param_dtype, rngs=rngs)
        self.v_proj = nnx.Linear(hidden, h * vd, use_bias=False, **linear)
        self.v_conv1d = ShortConvolution(
            h * vd,
            conv_size=config.conv_size,
            dtype=config.dtype,
            param_dtype=config.param_dtype,
            rngs=rngs,
        )
        self.g_proj = nnx.Linear(hidden, h * vd, use_bias=True, **linear)
        self.o_norm = nnx.Param(jnp.ones((vd,), config.param_dtype))
        self.o_proj = nnx.Linear(h * vd, hidden, use_bias=False, **linear)

    def init_cache(self, batch_size: int) -> jax.Array:
        """Decode state: the last ``conv_size - 1`` value-stream inputs ``[B, W-1, H*V]``."""
        cfg = self.config
        return jnp.zeros((batch_size, cfg.conv_size - 1, cfg.num_heads * cfg.value_dim), cfg.dtype)

    def __call__(self, x: jax.Array, *, cache: jax.Array | None = None):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` when a cache is given."""
        cfg = self.config
        batch, seq_len, _ = x.shape
        h, vd = cfg.num_heads, cfg.value_dim
        x = x.astype(cfg.dtype)
        o, new_cache = self.v_conv1d(self.v_proj(x), conv_state=cache)
        of = o.reshape(batch, seq_len, h, vd).astype(jnp.float32)
        gate = self.g_proj(x).reshape(batch, seq_len, h, vd).astype(jnp.float32)
        normed = of * jax.lax.rsqrt(jnp.mean(of * of, axis=-1, keepdims=True) + cfg.norm_eps)
        normed = normed * self.o_norm[...].astype(jnp.float32) * jax.nn.sigmoid(gate)
        y = self.o_proj(normed.astype(cfg.dtype).reshape(batch, seq_len, h * vd))
        return y if cache is None else (y, new_cache)


def rotary_embedding(x: jax.Array, positions: jax.Array, base: float = 10_000.0) -> jax.Array:
    """Rotate channel pairs ``(i, i + D/2)`` of ``x [B, T, H, D]`` by ``positions [T] * freq_i``
    (RoPE), so a query-key dot product depends on positions only through their difference."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * freqs  # [T, D/2]
    cos, sin = jnp.cos(angles)[:, None], jnp.sin(angles)[:, None]  # [T, 1, D/2]
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


class AttentionCache(NamedTuple):
    """Decode state of :class:`CausalSelfAttention`: every key and value seen so far,
    ``[B, T_seen, H, K]`` and ``[B, T_seen, H, V]`` (it grows by one token per step, which is
    what makes softmax attention's decoding memory linear in T)."""

    keys: jax.Array
    values: jax.Array


class CausalSelfAttention(nnx.Module):
    """Multi-head causal softmax attention with rotary positions: the quadratic baseline.

    ``y = o_proj(softmax(mask(rope(q) rope(k)^T / sqrt(K))) v)`` per head, scores and softmax
    in float32. Uses the mixer's H, K and V (``num_heads``, ``head_dim``, ``value_dim``) of the
    :class:`kda_lib.KDAConfig`; it has no short convolution, gate or decay.
    """

    def __init__(self, config: KDAConfig, *, rngs: nnx.Rngs):
        if config.head_dim % 2:
            raise ValueError(f"attention needs an even head_dim for RoPE, got {config.head_dim}")
        self.config = config
        h, kd, vd, hidden = config.num_heads, config.head_dim, config.value_dim, config.hidden_size
        linear = dict(use_bias=False, dtype=config.dtype, param_dtype=config.param_dtype, rngs=rngs)
        self.q_proj = nnx.Linear(hidden, h * kd, **linear)
        self.k_proj = nnx.Linear(hidden, h * kd, **linear)
        self.v_proj = nnx.Linear(hidden, h * vd, **linear)
        self.o_proj = nnx.Linear(h * vd, hidden, **linear)

    def init_cache(self, batch_size: int) -> AttentionCache:
        """An empty cache (no tokens seen)."""
        cfg = self.config
        shape = (batch_size, 0, cfg.num_heads)
        return AttentionCache(
            jnp.zeros((*shape, cfg.head_dim), cfg.dtype),
            jnp.zeros((*shape, cfg.value_dim), cfg.dtype),
        )

    def __call__(self, x: jax.Array, *, cache: AttentionCache | None = None):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` when a cache is given."""
        cfg = self.config
        batch, seq_len, _ = x.shape
        h, kd, vd = cfg.num_heads, cfg.head_dim, cfg.value_dim
        x = x.astype(cfg.dtype)
        seen = 0 if cache is None else cache.keys.shape[1]
        positions = seen + jnp.arange(seq_len)
        q = rotary_embedding(self.q_proj(x).reshape(batch, seq_len, h, kd), positions)
        k = rotary_embedding(self.k_proj(x).reshape(batch, seq_len, h, kd), positions)
        v = self.v_proj(x).reshape(batch, seq_len, h, vd)
        if cache is not None:
            k = jnp.concatenate([cache.keys, k.astype(cache.keys.dtype)], axis=1)
            v = jnp.concatenate([cache.values, v.astype(cache.values.dtype)], axis=1)
        scores = jnp.einsum("bthk,bshk->bhts", q.astype(jnp.float32), k.astype(jnp.float32))
        causal = positions[:, None] >= jnp.arange(k.shape[1])[None, :]  # [T, seen + T]
        scores = jnp.where(causal, scores * kd**-0.5, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1)
        o = jnp.einsum("bhts,bshv->bthv", weights, v.astype(jnp.float32))
        y = self.o_proj(o.astype(cfg.dtype).reshape(batch, seq_len, h * vd))
        return y if cache is None else (y, AttentionCache(k, v))


@register_mixer("kda")
def _kda_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    return KimiDeltaAttention(config.kda_config(), rngs=rngs)


@register_mixer("gdn")
def _gated_deltanet_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    """Gated DeltaNet: the KDA layer with one forget-gate value per head (not per channel)."""
    return KimiDeltaAttention(
        dataclasses.replace(config.kda_config(), per_head_decay=True), rngs=rngs
    )


@register_mixer("attention")
def _attention_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    return CausalSelfAttention(config.kda_config(), rngs=rngs)


@register_mixer("conv")
def _conv_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    return ConvMixer(config.kda_config(), rngs=rngs)


# ----------------------------------------------------------------------------- model
class MLP(nnx.Module):
    """``down(gelu(up(x)))``."""

    def __init__(self, hidden: int, width: int, *, rngs: nnx.Rngs):
        self.up = nnx.Linear(hidden, width, rngs=rngs)
        self.down = nnx.Linear(width, hidden, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
    """Pre-norm residual block: ``x + mixer(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        hidden = config.hidden_size
        self.mixer_norm = nnx.RMSNorm(hidden, epsilon=config.norm_eps, rngs=rngs)
        self.mixer = make_mixer(config, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(hidden, epsilon=config.norm_eps, rngs=rngs)
        self.mlp = MLP(hidden, config.mlp_ratio * hidden, rngs=rngs)

    def __call__(self, x, *, cache=None):
        mixed = self.mixer(self.mixer_norm(x), cache=cache)
        if cache is not None:
            mixed, cache = mixed
        x = x + mixed
        x = x + self.mlp(self.mlp_norm(x))
        return x if cache is None else (x, cache)


class TinyLM(nnx.Module):
    """``embed -> N x Block -> RMSNorm -> head``: tokens ``[B, T]`` -> logits ``[B, T, vocab]``.

    ``model(tokens, cache=model.init_cache(B))`` also returns the per-layer caches after the
    tokens (for KDA layers a :class:`kda_lib.layer.KDACache`, whose ``state`` is
    ``[B, H, K, V]``), so decoding can continue from them.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm = nnx.RMSNorm(config.hidden_size, epsilon=config.norm_eps, rngs=rngs)
        self.head = nnx.Linear(config.hidden_size, config.vocab_size, use_bias=False, rngs=rngs)

    def init_cache(self, batch_size: int) -> tuple:
        """One empty cache per block (see the mixers' ``init_cache``)."""
        return tuple(block.mixer.init_cache(batch_size) for block in self.blocks)

    def __call__(self, tokens: jax.Array, *, cache: tuple | None = None):
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape [B, T], got {tokens.shape}")
        x = self.embed(tokens)
        new_cache = []
        for i, block in enumerate(self.blocks):
            if cache is None:
                x = block(x)
            else:
                x, layer_cache = block(x, cache=cache[i])
                new_cache.append(layer_cache)
        logits = self.head(self.final_norm(x))
        return logits if cache is None else (logits, tuple(new_cache))


def count_params(model: nnx.Module) -> int:
    """Number of trainable scalars."""
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


# ----------------------------------------------------------------------------- optimiser
def _path_names(path) -> tuple[str, ...]:
    """('blocks', '0', 'mixer', 'A_log') from a pytree path over nnx.state (no '.value')."""
    names = []
    for entry in path:
        key = getattr(entry, "key", getattr(entry, "idx", getattr(entry, "name", entry)))
        names.append(str(key))
    return tuple(n for n in names if n != "value")


def decay_mask(model: nnx.Module) -> dict[tuple[str, ...], bool]:
    """Parameter path -> whether AdamW decays it.

    KDA layers use :func:`kda_lib.layer.weight_decay_mask` (no decay for ``A_log``,
    ``dt_bias``, ``o_norm`` and biases); everywhere else norms' ``scale``, biases and embeddings
    are not decayed either. Matmul and conv kernels are.
    """
    params = nnx.state(model, nnx.Param)
    mask = {
        _path_names(path): not (set(_path_names(path)) & NO_DECAY_NAMES)
        for path, _ in jax.tree_util.tree_leaves_with_path(params)
    }
    for module_path, module in nnx.iter_modules(model):
        if isinstance(module, KimiDeltaAttention):
            prefix = tuple(str(p) for p in module_path)
            for path, decay in jax.tree_util.tree_leaves_with_path(weight_decay_mask(module)):
                mask[prefix + _path_names(path)] = bool(decay)
    return mask


def make_optimizer(
    model: nnx.Module,
    *,
    steps: int,
    learning_rate: float,
    weight_decay: float = 0.1,
    warmup_steps: int | None = None,
    clip_norm: float | None = 1.0,
) -> nnx.Optimizer:
    """AdamW with linear warmup then cosine decay to 10%, global-norm clipping and the
    :func:`decay_mask`. ``warmup_steps`` defaults to 10% of ``steps``."""
    warmup = max(1, steps // 10) if warmup_steps is None else warmup_steps
    mask = tuple(sorted(decay_mask(model).items()))
    transform = _adamw(steps, learning_rate, weight_decay, min(warmup, steps), clip_norm, mask)
    return nnx.Optimizer(model, transform, wrt=nnx.Param)


@functools.lru_cache(maxsize=64)
def _adamw(steps, learning_rate, weight_decay, warmup, clip_norm, mask_items):
    """One optax transform per setting: equal settings give the *same* object, so optimisers
    built for equal models have equal graphdefs and share compiled training steps."""
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=learning_rate,
        warmup_steps=warmup,
        decay_steps=max(steps, 1),
        end_value=0.1 * learning_rate,
    )
    mask = dict(mask_items)

    def mask_fn(params):
        return jax.tree_util.tree_map_with_path(lambda p, _: mask[_path_names(p)], params)

    chain = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    chain.append(optax.adamw(schedule, weight_decay=weight_decay, mask=mask_fn))
    return optax.chain(*chain)


# ----------------------------------------------------------------------------- training
def masked_metrics(logits: jax.Array, batch: TaskBatch) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy (nats) and accuracy over ``batch.mask``; logits ``[B, T, vocab]``."""
    mask = batch.mask.astype(jnp.float32)
    count = jnp.maximum(mask.sum(), 1.0)
    losses = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), batch.targets
    )
    correct = (jnp.argmax(logits, -1) == batch.targets).astype(jnp.float32)
    return (losses * mask).sum() / count, (correct * mask).sum() / count


def _stream(seed: int, stream: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), stream)


def _loss(model: nnx.Module, batch: TaskBatch):
    return masked_metrics(model(batch.inputs), batch)


# Module-level jitted steps, cached on the model's and optimiser's graphdefs (structure and
# static config): models of equal config share one compilation across tasks and runs, as long
# as their batches have the same shape (a sweep over tasks of one vocabulary and length
# compiles each mixer once).
@nnx.jit
def _train_step(model, optimizer, batch: TaskBatch):
    (loss, accuracy), grads = nnx.value_and_grad(_loss, has_aux=True)(model, batch)
    optimizer.update(model, grads)
    return loss, accuracy


@nnx.jit
def _eval_step(model, batch: TaskBatch):
    return _loss(model, batch)


def _batch_drawer(task_fn: TaskFn, batch_size: int, seq_len: int):
    """``key -> task_fn(key, batch_size, seq_len)``, jitted (batches are drawn outside the
    model's step so that the step does not depend on the task)."""
    return jax.jit(lambda key: task_fn(key, batch_size, seq_len))


def train(
    model: TinyLM,
    task_fn: TaskFn,
    *,
    steps: int,
    batch_size: int,
    seq_len: int,
    learning_rate: float = 3e-3,
    seed: int = 0,
    log_every: int = 10,
    progress: bool | Callable[[dict], None] = False,
    weight_decay: float = 0.1,
    warmup_steps: int | None = None,
    clip_norm: float | None = 1.0,
) -> dict[str, list]:
    """Train ``model`` in place on ``task_fn(key, batch_size, seq_len)`` batches.

    Batch ``i`` (0-based) is ``task_fn(fold_in(fold_in(key(seed), TRAIN_STREAM), i), ...)``.
    The jitted step is shared by every model of the same config and batch shape, so a sweep
    over tasks compiles it once per mixer.

    Args:
      model: e.g. :class:`TinyLM`; any module mapping ``[B, T]`` tokens to logits.
      task_fn: ``(key, batch, seq_len) -> TaskBatch``, jittable (see :mod:`kda_lib.tasks`).
      steps, batch_size, seq_len: optimiser steps and the batch shape.
      learning_rate: AdamW peak (see :func:`make_optimizer` for the schedule).
      seed: the batches' seed.
      log_every: record the mean loss/accuracy of every ``log_every`` steps (and of the last,
        possibly shorter, window).
      progress: False: silent. True: print one line per record. A callable: called with each
        record (``{"step", "loss", "accuracy", "seconds"}``).
      weight_decay, warmup_steps, clip_norm: see :func:`make_optimizer`.

    Returns:
      ``{"step": [...], "loss": [...], "accuracy": [...], "seconds": [...]}``: the last step of
      each window (1-based), the window's mean masked loss (nats) and accuracy, and the wall
      time since the start (the first record includes compilation).
    """
    if steps < 1 or log_every < 1:
        raise ValueError(f"steps and log_every must be >= 1, got {steps} and {log_every}")
    optimizer = make_optimizer(
        model,
        steps=steps,
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        clip_norm=clip_norm,
    )

    draw = _batch_drawer(task_fn, batch_size, seq_len)
    step_fn = nnx.cached_partial(_train_step, model, optimizer)
    data_key = _stream(seed, TRAIN_STREAM)
    history: dict[str, list] = {"step": [], "loss": [], "accuracy": [], "seconds": []}
    window: list[tuple[jax.Array, jax.Array]] = []
    report = print_record if progress is True else (progress or None)
    start = time.perf_counter()
    for i in range(steps):
        window.append(step_fn(draw(jax.random.fold_in(data_key, i))))
        if len(window) == log_every or i == steps - 1:
            losses, accuracies = zip(*jax.device_get(window), strict=True)
            record = dict(
                step=i + 1,
                loss=float(sum(losses) / len(losses)),
                accuracy=float(sum(accuracies) / len(accuracies)),
                seconds=time.perf_counter() - start,
            )
            for name, value in record.items():
                history[name].append(value)
            if report:
                report(record)
            window = []
    return history


def print_record(record: dict) -> None:
    """One plain line per training record."""
    print(
        f"step {record['step']:6d}  loss {record['loss']:.4f}  "
        f"accuracy {record['accuracy']:.3f}  {record['seconds']:.1f} s",
        flush=True,
    )


def evaluate(
    model: TinyLM,
    task_fn: TaskFn,
    *,
    batch_size: int,
    seq_len: int,
    num_batches: int = 4,
    seed: int = 0,
) -> dict[str, float]:
    """Masked loss (nats) and accuracy on ``num_batches`` held-out batches.

    The batches come from ``fold_in(key(seed), EVAL_STREAM)``, a stream :func:`train` never
    draws from, so with the same seed they are unseen. Returns ``{"loss", "accuracy"}``
    averaged over the batches (all have the same mask size for a fixed task).
    """

    if num_batches < 1:
        raise ValueError(f"num_batches must be >= 1, got {num_batches}")
    draw = _batch_drawer(task_fn, batch_size, seq_len)
    key = _stream(seed, EVAL_STREAM)
    results = [_eval_step(model, draw(jax.random.fold_in(key, i))) for i in range(num_batches)]
    results = jax.device_get(results)
    return dict(
        loss=sum(float(loss) for loss, _ in results) / num_batches,
        accuracy=sum(float(acc) for _, acc in results) / num_batches,
    )


# ----------------------------------------------------------------------------- experiments
# Task options used when neither the caller nor the command line gives one. Small enough for
# CI; the notebooks' "full" parameters and the command line scale them up.
DEFAULT_TASK_OPTIONS: dict[str, dict] = {
    "delayed_copy": dict(vocab_size=16, delay=8),
    "mqar": dict(vocab_size=64, num_pairs=8),
    "palindrome": dict(vocab_size=16),
    "stack": dict(vocab_size=16),
}
RESULTS_DIR = "data/results"


def make_task(name: str, **options) -> TaskFn:
    """``TASKS[name]`` with its options bound (missing ones from :data:`DEFAULT_TASK_OPTIONS`).

    Raises ValueError naming the task for an unknown task or an option it does not take.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    generator = TASKS[name]
    accepted = [
        p.name
        for p in inspect.signature(generator).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"task {name!r} takes the options {accepted}; got unknown {unknown}")
    bound = {**DEFAULT_TASK_OPTIONS.get(name, {}), **options}
    return functools.partial(generator, **bound)


def run_experiment(
    task: str,
    *,
    mixer: str,
    seq_len: int,
    steps: int,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    seed: int = 0,
    eval_batches: int = 4,
    task_options: dict | None = None,
    model_options: dict | None = None,
    log_every: int = 50,
    progress: bool | Callable[[dict], None] = False,
) -> dict:
    """Train a :class:`TinyLM` with ``mixer`` on ``task`` and score it on held-out batches.

    Args:
      task: a name in :data:`kda_lib.tasks.TASKS`.
      mixer: a name in :data:`MIXERS`.
      seq_len, batch_size: T and B of every batch (training and evaluation).
      steps, learning_rate, log_every, progress: see :func:`train`.
      seed: seeds the model's init (``nnx.Rngs(seed)``) and the batches (see :func:`train`).
      eval_batches: held-out batches for :func:`evaluate`.
      task_options: the task generator's keyword options (defaults from
        :data:`DEFAULT_TASK_OPTIONS`); ``vocab_size`` is also the model's.
      model_options: other :class:`ModelConfig` fields (hidden_size, num_layers, ...).

    Returns:
      A JSON-ready record: ``task``, ``task_options``, ``mixer``, ``model`` (the
      ModelConfig), ``params``, ``training`` (steps, batch_size, seq_len, learning_rate, seed),
      ``history`` (from :func:`train`), ``eval`` (``loss``, ``accuracy``, ``batches``),
      ``chance_accuracy`` (:func:`kda_lib.tasks.chance_accuracy`), ``train_seconds``
      (compilation included), ``platform``, ``versions`` and ``date`` (UTC).
    """
    task_fn = make_task(task, **(task_options or {}))
    # fail here, with the generator's own message, rather than inside the jitted step
    jax.eval_shape(lambda key: task_fn(key, batch_size, seq_len), jax.random.key(0))
    options = task_fn.keywords
    config = ModelConfig(vocab_size=options["vocab_size"], mixer=mixer, **(model_options or {}))
    model = TinyLM(config, rngs=nnx.Rngs(seed))
    start = time.perf_counter()
    history = train(
        model,
        task_fn,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        learning_rate=learning_rate,
        seed=seed,
        log_every=log_every,
        progress=progress,
    )
    train_seconds = time.perf_counter() - start
    scores = evaluate(
        model, task_fn, batch_size=batch_size, seq_len=seq_len, num_batches=eval_batches, seed=seed
    )
    return dict(
        task=task,
        task_options=dict(options),
        mixer=mixer,
        model=dataclasses.asdict(config),
        params=count_params(model),
        training=dict(
            steps=steps,
            batch_size=batch_size,
            seq_len=seq_len,
            learning_rate=learning_rate,
            seed=seed,
        ),
        history=history,
        eval=dict(scores, batches=eval_batches),
        chance_accuracy=chance_accuracy(task, **options),
        train_seconds=train_seconds,
        platform=jax.devices()[0].platform,
        versions={dist: importlib.metadata.version(dist) for dist in ("jax", "flax", "optax")},
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )


def run_sweep(
    tasks: dict[str, dict],
    mixers: list[str],
    seq_lens: list[int],
    *,
    report: Callable[[dict], None] | None = None,
    **experiment,
) -> list[dict]:
    """:func:`run_experiment` for every task x sequence length x mixer, in that order.

    Args:
      tasks: task name -> its options (e.g. ``{"mqar": {"vocab_size": 32, "num_pairs": 4}}``).
        Give every task the same ``vocab_size`` and the runs of one mixer and length share one
        compiled training step.
      mixers: names in :data:`MIXERS`.
      seq_lens: T values.
      report: called with each record as it finishes (e.g. to print a line).
      **experiment: the other :func:`run_experiment` arguments (steps, batch_size,
        learning_rate, seed, eval_batches, model_options, log_every).

    Returns:
      The records, one per run.
    """
    records = []
    for task, options in tasks.items():
        for seq_len in seq_lens:
            for mixer in mixers:
                record = run_experiment(
                    task, mixer=mixer, seq_len=seq_len, task_options=options, **experiment
                )
                records.append(record)
                if report:
                    report(record)
    return records


def summary_line(record: dict) -> str:
    """``mqar  T=64  kda  accuracy 0.941 (chance 0.062)  12.3 s`` for one record."""
    return (
        f"{record['task']:<12s} T={record['training']['seq_len']:<5d} {record['mixer']:<10s} "
        f"accuracy {record['eval']['accuracy']:.3f} (chance {record['chance_accuracy']:.3f})  "
        f"{record['train_seconds']:.1f} s"
    )


def default_result_path(record: dict, results_dir: str = RESULTS_DIR) -> pathlib.Path:
    """``<results_dir>/<task>-<mixer>-T<seq_len>-seed<seed>.json``."""
    training = record["training"]
    name = f"{record['task']}-{record['mixer']}-T{training['seq_len']}-seed{training['seed']}"
    return pathlib.Path(results_dir) / f"{name}.json"


def save_record(record: dict | list[dict], path: str | pathlib.Path) -> pathlib.Path:
    """Write a record (or a list of them) as indented JSON, creating folders; returns the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


class _ProgressBar:
    """A tqdm bar fed by :func:`train`'s records (for terminals)."""

    def __init__(self, steps: int, description: str):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=steps, desc=description, unit="step")
        self.done = 0

    def __call__(self, record: dict) -> None:
        self.bar.update(record["step"] - self.done)
        self.done = record["step"]
        self.bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.3f}")

    def close(self) -> None:
        self.bar.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kda_lib.train",
        description="Train a tiny language model on a synthetic task, score it on held-out "
        "batches and write a JSON record.",
    )
    parser.add_argument("task", choices=sorted(TASKS), help="synthetic task")
    parser.add_argument("--mixer", choices=sorted(MIXERS), default="kda", help="token mixer")
    parser.add_argument("--steps", type=int, default=1000, help="optimiser steps")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence T")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per batch B")
    parser.add_argument("--learning-rate", type=float, default=3e-3, help="AdamW peak rate")
    parser.add_argument("--seed", type=int, default=0, help="model init and batches")
    parser.add_argument("--eval-batches", type=int, default=8, help="held-out batches")
    parser.add_argument("--log-every", type=int, default=50, help="steps per progress record")
    task = parser.add_argument_group("task options (default: DEFAULT_TASK_OPTIONS)")
    task.add_argument("--vocab-size", type=int, help="tokens in the task and the model")
    task.add_argument("--num-pairs", type=int, help="mqar: key/value pairs per sequence")
    task.add_argument("--delay", type=int, help="delayed_copy: how far back to copy")
    task.add_argument("--pop-probability", type=float, help="stack: chance of a pop")
    model = parser.add_argument_group("model options (default: ModelConfig)")
    model_help = dict(
        hidden_size="model width",
        num_layers="blocks of (norm, mixer, norm, MLP)",
        num_heads="heads H of the mixer",
        head_dim="K (and V) per head",
        conv_size="short-conv width W (kda, gdn, conv)",
    )
    for field, meaning in model_help.items():
        model.add_argument(f"--{field.replace('_', '-')}", type=int, help=meaning)
    model.add_argument("--implementation", help="KDA kernel (see kda_lib.kda)")
    parser.add_argument(
        "--output",
        help="JSON record path (default: data/results/<task>-<mixer>-T<seq_len>-seed<seed>.json)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "bar", "lines", "none"),
        default="auto",
        help="auto: a tqdm bar on a terminal, plain lines otherwise",
    )
    return parser


def main(argv: list[str] | None = None) -> dict:
    """The command line; returns the record it wrote."""
    args = _parser().parse_args(argv)
    task_options = {
        name: getattr(args, name)
        for name in ("vocab_size", "num_pairs", "delay", "pop_probability")
        if getattr(args, name) is not None
    }
    model_options = {
        name: getattr(args, name)
        for name in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "head_dim",
            "conv_size",
            "implementation",
        )
        if getattr(args, name) is not None
    }
    style = args.progress
    if style == "auto":
        style = "bar" if sys.stdout.isatty() else "lines"
    bar = _ProgressBar(args.steps, f"{args.task}/{args.mixer}") if style == "bar" else None
    progress = bar if bar else (style == "lines")
    try:
        record = run_experiment(
            args.task,
            mixer=args.mixer,
            seq_len=args.seq_len,
            steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            seed=args.seed,
            eval_batches=args.eval_batches,
            task_options=task_options,
            model_options=model_options,
            log_every=args.log_every,
            progress=progress,
        )
    except ValueError as error:
        _parser().error(str(error))
    finally:
        if bar:
            bar.close()
    path = save_record(record, args.output or default_result_path(record))
    print(
        f"{args.task} / {args.mixer}, T={args.seq_len}: held-out accuracy "
        f"{record['eval']['accuracy']:.3f} (chance {record['chance_accuracy']:.3f}), "
        f"loss {record['eval']['loss']:.3f}; {record['train_seconds']:.0f} s; wrote {path}",
        flush=True,
    )
    return record


if __name__ == "__main__":
    main()
