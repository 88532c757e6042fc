"""KimiDeltaAttention: the KDA token mixer as a Flax NNX module, with a decode cache.

Dataflow for ``x [B, T, hidden]`` (parameter names follow fla's ``fla/layers/kda.py``)::

    q, k = silu(conv(q_proj(x))), silu(conv(k_proj(x)))   [B, T, H, K], L2-normalised in kda()
    v    = silu(conv(v_proj(x)))                          [B, T, HV, V]
    f    = f_proj(x)                                      [B, T, HV, K] raw forget gate
    beta = sigmoid(b_proj(x))   (x2 with allow_neg_eigval) [B, T, HV]
    o    = kda(q, k, v, f, beta, a_log=A_log, dt_bias=dt_bias, lower_bound=...,
              use_gate_in_kernel=True)                    [B, T, HV, V]
    y    = o_proj(rmsnorm(o) * o_norm.weight * sigmoid(g_proj(x)))

HV = ``num_v_heads`` value heads (grouped value heads, fla's ``num_v_heads``; default H): value
head ``j`` reads q/k head ``j // (HV // H)``; the gate, beta and the output gate are per value
head and the state is ``[B, HV, K, V]``. ``f_proj`` and ``g_proj`` are each a single full-rank
matmul (rank None, MaxText) or fla's two-matmul low-rank form (``forget_gate_rank=r``,
``output_gate_rank=r``; fla uses r = V for both, MaxText's Kimi K3 layer a low-rank ``f_proj``
beside a full-rank ``g_proj``). ``fused_qkv_conv``: one depthwise conv over ``concat(q, k, v)``
(GLM-5.3-Flash's layout; the same function as three convs). ``A_log``/``dt_bias`` stay float32.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from kda_lib.checks import (
    check_allocation,
    check_array,
    check_int,
    is_concrete,
    is_int,
    is_number,
)
from kda_lib.layers.checkpoints import load_fla_state_dict
from kda_lib.layers.conv import ShortConvolution, qkv_convolutions
from kda_lib.layers.params import NO_DECAY, no_decay_param
from kda_lib.ops.api import (
    check_implementation,
    kda,
    needs_segment_bound,
    option_problems,
    register_compiled_cache,
    segment_slots_problem,
    uses_own_context_parallel,
)
from kda_lib.ops.contract import Dims, check_chunk_size, check_segment_ids
from kda_lib.ops.gating import (
    GateForm,
    check_gate_form,
    check_lower_bound,
    init_a_log,
    init_dt_bias,
    kda_gate,
)
from kda_lib.ops.norms import gated_rms_norm
from kda_lib.ops.segments import canonical_segment_ids, check_max_num_segments, count_segments
from kda_lib.parallel.context_parallel import halo_exchange, kda_context_parallel, shard_as


def _config_int(name: str, value, expected: str, minimum: int) -> int:
    """``value`` as a Python int (numpy ints accepted, bools not), or a ValueError naming
    ``KDAConfig.<name>``."""
    return check_int(f"KDAConfig.{name}", value, minimum, expected=expected)


def _check_float_dtype(name: str, value) -> None:
    """``value`` must name a floating-point dtype (jnp.float32, "bfloat16", np.float16, ...)."""
    try:
        dtype = None if value is None else jnp.dtype(value)  # np.dtype(None) is float64
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"KDAConfig.{name} must be a floating-point dtype (e.g. jnp.float32, jnp.bfloat16), "
            f"got {value!r}"
        )


# The short convolution mixes a few neighbouring tokens (fla and Kimi Linear use 4); long-range
# mixing is the recurrence's job. Issue 30 measured compiling a layer gradient at 38 s for
# conv_size 1024 and over 2 minutes at 4096, and the decode cache holds W - 1 inputs per layer.
# 64, the default chunk length, bounds it far above any use while keeping those costs small.
MAX_CONV_SIZE = 64

# (field, what it must be, minimum, None allowed): KDAConfig's integer fields, in field order
_INT_FIELDS = (
    ("hidden_size", "a positive int", 1, False),
    ("num_heads", "a positive int", 1, False),
    ("num_v_heads", "a positive int or None", 1, True),
    ("head_dim", "a positive int", 1, False),
    ("value_head_dim", "a positive int or None", 1, True),
    ("conv_size", "an int >= 0 (0 disables the conv)", 0, False),
    ("forget_gate_rank", "a positive int or None", 1, True),
    ("output_gate_rank", "a positive int or None", 1, True),
    ("max_num_segments", "None or a positive int", 1, True),
)
# the fields a layer's parameter count grows with (the one a too-large layer's error names)
_WIDTH_FIELDS = (
    "hidden_size",
    "num_heads",
    "num_v_heads",
    "head_dim",
    "value_head_dim",
    "conv_size",
    "forget_gate_rank",
    "output_gate_rank",
)
_BOOL_FIELDS = (
    "fused_qkv_conv",
    "use_a_log",
    "per_head_decay",
    "allow_neg_eigval",
    "output_gate_bias",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KDAConfig:
    """Hyper-parameters of :class:`KimiDeltaAttention` (keyword-only, grouped by concept; the
    same names as :class:`kda_lib.models.presets.ModelPreset`'s KDA fields).

    Widths:
      hidden_size: model width d.
      num_heads: H, query/key heads.
      num_v_heads: HV, value heads (None = num_heads): a multiple of num_heads (grouped value
        heads, fla's ``num_v_heads``). v, the gates, beta, the output gate, ``A_log`` and
        ``dt_bias`` are per value head; the state is ``[B, HV, K, V]``.
      head_dim: K (query/key size per head).
      value_head_dim: V per head (None = K).

    Short convolution:
      conv_size: width W (default 4); 0 disables the convolutions.
      fused_qkv_conv: one depthwise conv ``qkv_conv1d`` over ``concat(q, k, v)`` instead of
        three (GLM-5.3-Flash's layout; depthwise, so the same function as three convs).

    Forget gate (:mod:`kda_lib.ops.gating`):
      gate_form: a :class:`kda_lib.ops.gating.GateForm` (or its string): ``"softplus"``
        ``-A softplus(f + dt_bias)``; ``"safe_sigmoid"`` ``lower_bound * sigmoid(A (f +
        dt_bias))``; ``"clamped_softplus"`` ``max(-A softplus(f + dt_bias), lower_bound)``
        (MaxText's Kimi K3 layer; the layer activates it and hands the kernel the log-space
        gate). None (default): ``"softplus"`` without ``lower_bound``, else ``"safe_sigmoid"``.
        Stored as the enum; a given form must fit ``lower_bound`` (only softplus has none).
      lower_bound: None = the softplus gate; a float in [-5, 0) = the bound of the other forms.
      use_a_log: the gate has a learned per-head rate ``A = exp(A_log)`` (default True). False:
        no ``A_log`` parameter, ``A = 1`` (fla's safe gate without ``A_log``); the kernel gets
        ``a_log=None``.
      per_head_decay: one forget-gate value per head, shared by its K channels (Gated
        DeltaNet) instead of KDA's per-channel gate; f_proj then has HV outputs, dt_bias [HV].
      forget_gate_rank: None = ``f_proj`` is one full-rank projection; int r = fla's low-rank
        pair ``[d, r]``, ``[r, HV K]``.

    Beta:
      allow_neg_eigval: beta = 2 * sigmoid(.) in [0, 2).

    Output:
      output_gate_rank: None = ``g_proj`` is one full-rank projection; int r = the low-rank
        pair ``[d, r]``, ``[r, HV V]``.
      output_gate_bias: the output gate's (last) projection has a bias (default True, as fla's
        layer); False as in the Hugging Face Kimi Linear checkpoint (``g_b_proj`` has none).
      norm_eps: output RMSNorm epsilon (1e-5).

    Kernel and runtime:
      implementation: kernel implementation for :func:`kda_lib.kda` ("auto").
      chunk_size: chunk length of the chunked kernel (64).
      max_num_segments: static bound on the segments in one row of ``segment_ids`` (one rank's
        slice under context parallelism), for tokamax backends, which keep one state slot per
        segment. None (default): counted from the ids when they are concrete; under ``jit``
        (traced ids) a tokamax backend then raises, asking for this bound.
      dtype: compute dtype (float32); param_dtype: parameter dtype (float32).
    """

    hidden_size: int
    num_heads: int
    num_v_heads: int | None = None
    head_dim: int
    value_head_dim: int | None = None
    conv_size: int = 4
    fused_qkv_conv: bool = False
    gate_form: GateForm | None = None
    lower_bound: float | None = None
    use_a_log: bool = True
    per_head_decay: bool = False
    forget_gate_rank: int | None = None
    allow_neg_eigval: bool = False
    output_gate_rank: int | None = None
    output_gate_bias: bool = True
    norm_eps: float = 1e-5
    implementation: str = "auto"
    chunk_size: int = 64
    max_num_segments: int | None = None
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def __post_init__(self):
        # every field is checked here, so a bad value fails at construction, not at first use;
        # numpy scalars are accepted where a Python number is and stored as Python numbers
        check_max_num_segments(self.max_num_segments, "KDAConfig.max_num_segments", optional=True)
        for name, expected, minimum, optional in _INT_FIELDS:
            value = getattr(self, name)
            if not (optional and value is None):
                self._set(name, _config_int(name, value, expected, minimum))
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"KDAConfig.{name} must be a bool, got {value!r}")
            self._set(name, bool(value))
        try:
            check_lower_bound(self.lower_bound)
        except ValueError as error:
            raise ValueError(f"KDAConfig.{error}") from None
        if self.lower_bound is not None:
            self._set("lower_bound", float(self.lower_bound))
        form = check_gate_form(self.gate_form, self.lower_bound, where="KDAConfig.gate_form")
        self._set("gate_form", form)
        eps = self.norm_eps
        if not is_number(eps) or not (np.isfinite(eps) and eps > 0):
            raise ValueError(f"KDAConfig.norm_eps must be a finite float > 0, got {eps!r}")
        self._set("norm_eps", float(eps))
        for name in ("dtype", "param_dtype"):
            _check_float_dtype(name, getattr(self, name))
        try:
            self._set("chunk_size", check_chunk_size(self.chunk_size))
        except ValueError as error:
            raise ValueError(f"KDAConfig.{error}") from None
        check_implementation(self.implementation, "KDAConfig.implementation")
        for problem in self._combination_problems():
            raise ValueError(f"KDAConfig{problem}")
        self._check_parameter_memory()

    def _check_parameter_memory(self) -> None:
        """Refuse widths whose parameters cannot fit this machine's memory
        (:func:`kda_lib.checks.check_allocation`), before any is allocated, naming the largest
        width field."""
        count = self.parameter_count()
        nbytes = count * jnp.dtype(self.param_dtype).itemsize
        widths = {name: getattr(self, name) or 0 for name in _WIDTH_FIELDS}
        name = max(widths, key=widths.get)
        check_allocation(
            f"KDAConfig.{name}",
            widths[name],
            f"the layer's parameters ({count:.3g} scalars of {jnp.dtype(self.param_dtype).name})",
            nbytes,
        )

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every parameter of ``KimiDeltaAttention(self)``, by its path in the
        layer (``"q_proj.kernel"``, ``"f_proj.layers.0.kernel"``, ...), from the widths alone:
        the package's one formula for the layer's parameters (nothing is built; the tests
        compare it with built layers)."""
        d, h, k, v, hv = (
            self.hidden_size,
            self.num_heads,
            self.head_dim,
            self.value_dim,
            self.value_heads,
        )
        gate_channels = 1 if self.per_head_decay else k
        shapes = {"q_proj.kernel": (d, h * k), "k_proj.kernel": (d, h * k)}
        shapes["v_proj.kernel"] = (d, hv * v)
        if self.conv_size and self.fused_qkv_conv:
            shapes["qkv_conv1d.kernel"] = (self.conv_size, 2 * h * k + hv * v)
        elif self.conv_size:
            for name, channels in (("q", h * k), ("k", h * k), ("v", hv * v)):
                shapes[f"{name}_conv1d.kernel"] = (self.conv_size, channels)
        gates = (
            ("f_proj", self.forget_gate_rank, hv * gate_channels, False),
            ("g_proj", self.output_gate_rank, hv * v, self.output_gate_bias),
        )
        for name, rank, out, bias in gates:
            last = name if rank is None else f"{name}.layers.1"
            if rank is None:
                shapes[f"{name}.kernel"] = (d, out)
            else:
                shapes[f"{name}.layers.0.kernel"] = (d, rank)
                shapes[f"{last}.kernel"] = (rank, out)
            if bias:
                shapes[f"{last}.bias"] = (out,)
        shapes["b_proj.kernel"] = (d, hv)
        if self.use_a_log:
            shapes["A_log"] = (hv,)
        shapes["dt_bias"] = (hv * gate_channels,)
        shapes["o_norm"] = (v,)
        shapes["o_proj.kernel"] = (hv * v, d)
        return shapes

    def parameter_count(self) -> int:
        """Scalars in the parameters of ``KimiDeltaAttention(self)``: the sum over
        :meth:`parameter_shapes` (equal to :func:`kda_lib.layers.params.parameter_count` of
        the layer)."""
        return sum(math.prod(shape) for shape in self.parameter_shapes().values())

    def _combination_problems(self):
        """Fields that are each valid but cannot go together, and what the implementation
        cannot serve whatever the machine (the registry says; the layer fuses the gate unless
        it is the clamped softplus)."""
        if self.conv_size > MAX_CONV_SIZE:
            yield (
                f".conv_size must be <= {MAX_CONV_SIZE} (a short convolution: local token mixing "
                "before the recurrence, 4 in fla and Kimi Linear; a wide window is what the "
                f"recurrence is for), got {self.conv_size}"
            )
        if self.num_v_heads is not None and self.num_v_heads % self.num_heads:
            yield (
                f".num_v_heads must be a multiple of num_heads={self.num_heads} (each q/k head "
                f"serves num_v_heads // num_heads value heads), got {self.num_v_heads}"
            )
        fused = self.gate_form is not GateForm.CLAMPED_SOFTPLUS
        for problem in option_problems(
            self.implementation,
            fused_gate=fused,
            lower_bound=self.lower_bound,
            allow_neg_eigval=self.allow_neg_eigval,
        ):
            hint = ""
            if "gate" in problem:
                hint = (
                    " (set lower_bound, e.g. -5.0)"
                    if fused
                    else "; with gate_form='clamped_softplus' the layer activates the gate "
                    "itself, so the kernel gets a log-space gate"
                )
            yield f": {problem}{hint}"
        if not self.use_a_log and self.lower_bound is None:
            yield (
                ".use_a_log=False is the safe gate without A_log (fla's A_log=None): set "
                "lower_bound (e.g. -5.0); the softplus gate has no rate-free form"
            )
        if self.fused_qkv_conv and not self.conv_size:
            yield ".fused_qkv_conv needs a conv: conv_size must be > 0"

    def _set(self, name, value):
        object.__setattr__(self, name, value)  # frozen: normalise during __post_init__ only

    @property
    def value_dim(self) -> int:
        return self.value_head_dim or self.head_dim

    @property
    def value_heads(self) -> int:
        """HV: ``num_v_heads``, or ``num_heads`` without grouped value heads."""
        return self.num_v_heads or self.num_heads


class Projected(NamedTuple):
    """What :meth:`KimiDeltaAttention.project` hands the kernel."""

    q: jax.Array  # [B, T, H, K] after conv + SiLU (not yet L2-normalised)
    k: jax.Array  # [B, T, H, K]
    v: jax.Array  # [B, T, HV, V]
    # [B, T, HV, K] raw forget-gate input (activated inside kda()); with the clamped softplus the
    # log-space gate itself (kernel_kwargs() then passes no a_log)
    f: jax.Array
    beta: jax.Array  # [B, T, HV] float32
    conv_states: tuple  # per stream q, k, v: [B, W-1, C] conv history after x (or None)


class KDACache(NamedTuple):
    """Decode state of one layer: recurrent state and the last W-1 conv inputs per stream."""

    state: jax.Array  # [B, HV, K, V] float32
    q_conv: jax.Array | None  # [B, W-1, H*K]
    k_conv: jax.Array | None  # [B, W-1, H*K]
    v_conv: jax.Array | None  # [B, W-1, HV*V] (fused_qkv_conv: the same channels, split)


def cache_at(caches: KDACache, index) -> KDACache:
    """One :class:`KDACache` out of stacked ones (:meth:`KimiDeltaAttention.prefill`'s chunk
    boundaries, :meth:`KimiDeltaAttention.draft`'s tokens: every field with an axis N after B).

    ``index``: an int (the same entry for every row) or ``[B]`` ints (one per row), in
    ``[0, N)``; checked when concrete, under ``jit`` a row whose index is outside gets NaN in
    every field. The result resumes decoding there: ``layer(x_rest, cache=cache_at(caches, i))``.
    A draft's accepted prefix (0 accepted included): :meth:`KimiDeltaAttention.accept_draft`.
    """
    if not isinstance(caches, KDACache) or getattr(caches.state, "ndim", None) != 5:
        raise ValueError(
            "caches must be a KDACache of stacked states [B, N, HV, K, V] (from "
            f"layer.prefill or layer.draft), got {type(caches).__name__}"
        )
    return _pick(caches, index, "index")


def _pick(caches: KDACache, index, name: str) -> KDACache:
    """Entry ``index`` (an int or ``[B]`` ints in ``[0, N)``) of every stacked field; under
    ``jit`` NaN in every field of a row whose index is outside."""
    batch, count = caches.state.shape[:2]
    if is_int(index, minimum=None):
        index = np.full(batch, index)
    shape = getattr(index, "shape", None)
    if shape != (batch,) or not jnp.issubdtype(index.dtype, jnp.integer):
        got = f"shape {shape} {index.dtype}" if shape is not None else repr(index)
        raise ValueError(f"{name} must be an int or [B]={batch} ints, got {got}")
    if is_concrete(index) and not ((index >= 0) & (index < count)).all():
        raise ValueError(f"{name} must be in [0, {count - 1}], got {np.asarray(index)}")
    inside, at = (index >= 0) & (index < count), jnp.clip(index, 0, count - 1)

    def pick(c):
        return jnp.where(inside.reshape(-1, *[1] * (c.ndim - 2)), c[jnp.arange(batch), at], jnp.nan)

    return KDACache(*(None if c is None else pick(c) for c in caches))


def _gate_projection(hidden, out, rank, *, use_bias, cfg, rngs):
    linear = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    if rank is None:
        return nnx.Linear(hidden, out, use_bias=use_bias, bias_metadata=NO_DECAY, **linear)
    return nnx.Sequential(
        nnx.Linear(hidden, rank, use_bias=False, **linear),
        nnx.Linear(rank, out, use_bias=use_bias, bias_metadata=NO_DECAY, **linear),
    )


class KimiDeltaAttention(nnx.Module):
    """KDA token mixer. ``layer(x)`` maps ``[B, T, hidden]`` to ``[B, T, hidden]``.

    Args:
      config: :class:`KDAConfig`.
      rngs: ``nnx.Rngs`` for parameter init.
      mesh, context_axis: run the conv halo exchange and the recurrence context-parallel over
        ``mesh``'s ``context_axis`` (see kda_lib.parallel.context_parallel); None = one device.
    """

    def __init__(
        self, config: KDAConfig, *, rngs: nnx.Rngs, mesh=None, context_axis: str = "context"
    ):
        cfg = config
        self.config = cfg
        self.mesh = mesh
        self.context_axis = context_axis
        if mesh is not None and context_axis not in mesh.axis_names:
            raise ValueError(
                f"mesh has axes {mesh.axis_names}; context_axis={context_axis!r} is not one of them"
            )
        h, kd, vd, hidden = cfg.num_heads, cfg.head_dim, cfg.value_dim, cfg.hidden_size
        hv = cfg.value_heads
        linear = dict(use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.q_proj = nnx.Linear(hidden, h * kd, **linear)
        self.k_proj = nnx.Linear(hidden, h * kd, **linear)
        self.v_proj = nnx.Linear(hidden, hv * vd, **linear)
        conv = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        if cfg.conv_size and not cfg.fused_qkv_conv:
            self.q_conv1d, self.k_conv1d, self.v_conv1d = qkv_convolutions(
                h * kd, hv * vd, cfg.conv_size, **conv
            )
        else:
            self.q_conv1d = self.k_conv1d = self.v_conv1d = None
        fused = cfg.conv_size and cfg.fused_qkv_conv
        channels = 2 * h * kd + hv * vd
        self.qkv_conv1d = (
            ShortConvolution(channels, conv_size=cfg.conv_size, **conv) if fused else None
        )
        gate_channels = 1 if cfg.per_head_decay else kd
        self.f_proj = _gate_projection(
            hidden, hv * gate_channels, cfg.forget_gate_rank, use_bias=False, cfg=cfg, rngs=rngs
        )
        self.b_proj = nnx.Linear(hidden, hv, **linear)
        self.g_proj = _gate_projection(
            hidden, hv * vd, cfg.output_gate_rank, use_bias=cfg.output_gate_bias, cfg=cfg, rngs=rngs
        )
        # gate parameters and the norm weight are not decayed (fla marks A_log and dt_bias)
        if cfg.use_a_log:
            safe_gate = cfg.gate_form is GateForm.SAFE_SIGMOID
            self.A_log = no_decay_param(init_a_log(rngs.params(), hv, safe_gate=safe_gate))
        else:
            self.A_log = None  # A = 1: the gate has no learned rate
        self.dt_bias = no_decay_param(init_dt_bias(rngs.params(), hv, gate_channels))
        self.o_norm = no_decay_param(jnp.ones((vd,), cfg.param_dtype))  # fla: o_norm.weight
        self.o_proj = nnx.Linear(hv * vd, hidden, **linear)

    # ----------------------------------------------------------------- decoding
    def _cache_shapes(self, batch_size: int) -> KDACache:
        """The shapes of a cache for ``batch_size`` rows (None where there is no conv)."""
        cfg = self.config
        h, kd, vd, hv = cfg.num_heads, cfg.head_dim, cfg.value_dim, cfg.value_heads
        state = (batch_size, hv, kd, vd)
        if not cfg.conv_size:
            return KDACache(state, None, None, None)
        width = cfg.conv_size - 1
        return KDACache(
            state,
            (batch_size, width, h * kd),
            (batch_size, width, h * kd),
            (batch_size, width, hv * vd),
        )

    def init_cache(self, batch_size: int) -> KDACache:
        """An empty cache for ``batch_size`` rows (a positive int): zero state, zero conv
        history."""
        batch_size = check_int("init_cache: batch_size", batch_size)
        shapes = self._cache_shapes(batch_size)
        state = jnp.zeros(shapes.state, jnp.float32)
        conv = [None if s is None else jnp.zeros(s, self.config.dtype) for s in shapes[1:]]
        return KDACache(state, *conv)

    def _check_cache(self, cache: KDACache, batch: int):
        if not isinstance(cache, KDACache):
            raise ValueError(
                f"cache must be a KDACache, got {type(cache).__name__}; build it with "
                f"layer.init_cache({batch}) (or pass on the cache a previous call returned)"
            )
        for name, got, want in zip(KDACache._fields, cache, self._cache_shapes(batch), strict=True):
            if got is not None and not (hasattr(got, "shape") and hasattr(got, "dtype")):
                raise ValueError(
                    f"cache.{name} must be an array, got {type(got).__name__}; build the cache "
                    f"with layer.init_cache({batch})"
                )
            if (got is None) != (want is None) or (got is not None and got.shape != want):
                raise ValueError(
                    f"cache.{name} has shape {None if got is None else got.shape}, expected "
                    f"{want} for batch size {batch}; build it with layer.init_cache({batch})"
                )
            if got is not None and not jnp.issubdtype(got.dtype, jnp.floating):
                raise ValueError(
                    f"cache.{name} must be a floating-point array, got dtype {got.dtype}; "
                    f"build the cache with layer.init_cache({batch})"
                )

    def _check_inputs(self, x, segment_ids, cache) -> None:
        """The eager checks of ``__call__``, the same for the one-device and the CP forward.

        Shapes and dtypes always; values (finite ``x``, the segment-id rule) when the arrays
        are concrete, i.e. outside ``jit``."""
        cfg = self.config
        check_array("x", x)
        if x.ndim != 3 or x.shape[-1] != cfg.hidden_size:
            raise ValueError(
                f"x must have shape [B, T, hidden_size={cfg.hidden_size}], got {x.shape}"
            )
        batch, seq_len, _ = x.shape
        if batch < 1 or seq_len < 1:
            empty = " and ".join(n for n, d in (("B", batch), ("T", seq_len)) if d < 1)
            raise ValueError(
                f"x [B, T, hidden] is empty: {empty} = 0 (shape {x.shape}); the layer needs at "
                "least one row and one token"
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"x must be a floating-point array, got dtype {x.dtype}")
        if segment_ids is not None:
            check_array("segment_ids", segment_ids)
            check_segment_ids(segment_ids, batch, seq_len)
            if cache is not None:
                raise ValueError(
                    "segment_ids cannot be combined with a cache: decode one document per row"
                )
            self._check_segment_slots(batch, seq_len)
        if cache is not None:
            self._check_cache(cache, batch)
        if self.mesh is not None and cache is not None:
            raise ValueError(
                "a layer built with a mesh (context parallel) does not decode; "
                "build one without a mesh for decoding"
            )
        if is_concrete(x):
            _check_finite("x", x)

    def _check_segment_slots(self, batch: int, seq_len: int) -> None:
        """A tokamax implementation keeps a state per segment slot: refuse a
        ``max_num_segments`` whose slots cannot fit this machine's memory before any work
        (:func:`kda_lib.ops.registry.segment_slots_problem`; per rank's slice under CP, and
        then counted from concrete ids without the config's bound in the kernel's check)."""
        cfg = self.config
        if cfg.max_num_segments is None or not needs_segment_bound(cfg.implementation):
            return
        ranks = 1 if self.mesh is None else self.mesh.shape[self.context_axis]
        dims = Dims(
            batch,
            -(-seq_len // ranks),
            cfg.value_heads,
            cfg.head_dim,
            cfg.value_dim,
            cfg.num_heads,
        )
        problem = segment_slots_problem(
            cfg.implementation, dims, cfg.max_num_segments, name="KDAConfig.max_num_segments"
        )
        if problem:
            raise ValueError(problem)

    # ------------------------------------------------ prefix caching, speculative decoding
    def prefill(self, x: jax.Array, *, cache: KDACache | None = None):
        """Run a prompt and keep the cache at every chunk boundary (prefix caching).

        Args:
          x: ``[B, T, hidden]`` as in ``__call__`` (one document per row).
          cache: a :class:`KDACache` to continue from (default: empty).

        Returns:
          ``(y [B, T, hidden], cache after x, boundaries)``; ``boundaries`` is a
          :class:`KDACache` with a chunk axis: ``state [B, N, HV, K, V]`` (the kernel's chunk
          states, ``N = T // config.chunk_size``) and each conv history ``[B, N, W-1, C]``
          (the W-1 conv inputs before each boundary). ``cache_at(boundaries, i)`` is the cache
          after the first ``(i + 1) * chunk_size`` tokens: a later prompt that shares them
          resumes there, ``layer(x[:, (i + 1) * C:], cache=cache_at(boundaries, i))``, and
          never recomputes them. The kernel gives the states with no second pass
          (:func:`kda_lib.kda`'s ``output_chunk_states``); the conv histories reproject the
          W-1 inputs before each boundary (W-1 tokens per chunk).
        """
        y, new_cache, result = self._run_with_states(x, cache, output_chunk_states=True)
        convs = self._conv_histories(x, cache, every=self.config.chunk_size)
        return y, new_cache, KDACache(result.chunk_states, *convs)

    def draft(self, x: jax.Array, *, cache: KDACache):
        """Run a short draft of ``T`` tokens and keep the cache after every token (speculative
        decoding: the verifier resumes after the accepted prefix).

        Returns ``(y [B, T, hidden], cache after all of x, token_caches)``: ``token_caches`` a
        :class:`KDACache` with a token axis, ``state [B, T, HV, K, V]`` and conv histories
        ``[B, T, W-1, C]``; :meth:`accept_draft` keeps each row's accepted prefix.
        """
        if cache is None:
            raise ValueError("draft continues a cache: pass cache=layer.init_cache(B) or one "
                             "a previous call returned")  # fmt: skip
        y, new_cache, result = self._run_with_states(x, cache, output_token_states=True)
        convs = self._conv_histories(x, cache, every=1)
        return y, new_cache, KDACache(result.token_states, *convs)

    def accept_draft(self, cache: KDACache, token_caches: KDACache, num_accepted_tokens):
        """The cache after each row's accepted prefix of a :meth:`draft` from ``cache``, equal to
        decoding only those tokens.

        ``num_accepted_tokens``: an int or ``[B]`` ints in ``[0, T]``: 0 gives ``cache``
        (nothing accepted), T the cache after the whole draft. Checked when concrete; under
        ``jit`` a row whose count is outside gets NaN in every field."""
        if not isinstance(token_caches, KDACache) or getattr(token_caches.state, "ndim", 0) != 5:
            raise ValueError("token_caches must be the KDACache layer.draft returned, got "
                             f"{type(token_caches).__name__}")  # fmt: skip
        batch = token_caches.state.shape[0]
        self._check_cache(cache, batch)
        for name, c, t in zip(KDACache._fields, cache, token_caches, strict=True):
            if (c is None) != (t is None) or (c is not None and t.shape[2:] != c.shape[1:]):
                want = None if c is None else f"[B, T, {', '.join(map(str, c.shape[1:]))}]"
                raise ValueError(f"token_caches.{name} must be {want} (as layer.draft returns), "
                                 f"got {getattr(t, 'shape', None)}")  # fmt: skip
        stacked = (None if c is None else jnp.concatenate([c[:, None].astype(t.dtype), t], 1)
                   for c, t in zip(cache, token_caches, strict=True))  # fmt: skip
        return _pick(KDACache(*stacked), num_accepted_tokens, "num_accepted_tokens")

    def _run_with_states(self, x, cache, **states):
        """The one-device forward asking the kernel for interior ``states``:
        ``(y, cache after x, the kernel's KDAResult)``."""
        self._check_inputs(x, None, cache)
        if self.mesh is not None:
            raise ValueError("prefill and draft run on one device; build the layer without a mesh")
        cfg = self.config
        q, k, v, f, beta, conv_states = self.project(x, cache=cache)
        result = kda(
            q,
            k,
            v,
            f,
            beta,
            **self.kernel_kwargs(),
            initial_state=None if cache is None else cache.state,
            output_final_state=True,
            chunk_size=cfg.chunk_size,
            implementation=cfg.implementation,
            **states,
        )
        y = self.project_output(x, result.output)
        return y, KDACache(result.final_state, *conv_states), result

    def _conv_histories(self, x, cache, *, every: int):
        """Per stream (q, k, v) the W-1 conv inputs before every ``every``-th token boundary,
        ``[B, T // every, W-1, C]`` (None without convolutions): the inputs reprojected from
        ``x`` at those positions, or the cache's history (zeros) before the first token."""
        cfg = self.config
        if not cfg.conv_size:
            return None, None, None
        width, seq_len = cfg.conv_size - 1, x.shape[1]
        ends = jnp.arange(1, seq_len // every + 1) * every  # tokens before each boundary
        pos = ends[:, None] - width + jnp.arange(width)[None]  # [N, W-1], < 0: the history
        picked = x[:, jnp.clip(pos, 0, seq_len - 1)].astype(cfg.dtype)  # [B, N, W-1, hidden]
        cached = self.init_cache(x.shape[0]) if cache is None else cache
        out = []
        for proj, history in zip((self.q_proj, self.k_proj, self.v_proj), cached[1:], strict=True):
            before = history[:, jnp.clip(width + pos, 0, width - 1)]  # [B, N, W-1, C]
            out.append(jnp.where((pos < 0)[None, :, :, None], before, proj(picked)))
        return tuple(out)

    # ----------------------------------------------------------------- forward
    def __call__(
        self, x: jax.Array, *, segment_ids: jax.Array | None = None, cache: KDACache | None = None
    ):
        """``x [B, T, hidden]`` -> ``y [B, T, hidden]``, or ``(y, new_cache)`` with a cache.

        Args:
          x: ``[B, T, hidden]`` floating-point array (jax or numpy; Python lists are rejected),
            B >= 1 and T >= 1 (an empty x raises ValueError). Outside ``jit`` a NaN or inf in x
            raises ValueError naming its position.
          segment_ids: ``[B, T]`` int, 1-based, 0 = padding: packed documents never see each
            other (neither through the conv nor through the state); padding outputs 0.
          cache: a :class:`KDACache` from :meth:`init_cache` (or a previous call); continues
            decoding from it.
        """
        self._check_inputs(x, segment_ids, cache)
        if segment_ids is not None:
            # one rule everywhere (kda_lib.ops.segments): each segment gets its own id before the
            # convolutions and the kernel see them, so jit cannot change what a segment is
            segment_ids = canonical_segment_ids(segment_ids)
        if self.mesh is not None:
            return self._forward_context_parallel(x, segment_ids=segment_ids)
        y, new_cache = self._forward(x, segment_ids=segment_ids, cache=cache)
        return y if cache is None else (y, new_cache)

    # ------------------------------------------ extension API: project, kernel, project_output
    # ``__call__`` is project -> kda(**kernel_kwargs()) -> project_output; subclasses and tools (the
    # benchmark times the parts separately) may call or override each step.
    def project(
        self, x, *, segment_ids=None, cache=None, halo=None, history_segment_ids=None
    ) -> Projected:
        """Everything before the kernel, for ``x [B, T, hidden]``: a :class:`Projected`.

        Args:
          segment_ids: ``[B, T]`` as in ``__call__`` (masks the convolutions).
          cache: a :class:`KDACache` whose conv states precede ``x`` (decoding).
          halo: a function mapping each conv input ``[B, T, C]`` to the ``[B, W-1, C]`` inputs
            before it (context parallelism); otherwise the cache's conv states (or zeros).
          history_segment_ids: ``[B, W-1]`` ids of the halo tokens (context parallelism).
        """
        cfg = self.config
        batch, seq_len, _ = x.shape
        h, kd, vd, hv = cfg.num_heads, cfg.head_dim, cfg.value_dim, cfg.value_heads
        x = x.astype(cfg.dtype)
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
        raw = [proj(x) for proj in (self.q_proj, self.k_proj, self.v_proj)]
        conv_kw = dict(segment_ids=segment_ids, history_segment_ids=history_segment_ids)

        def history(i, z):  # the W-1 inputs before x: a CP halo, the decode cache or zeros
            if halo is not None:
                return halo(z)
            if cache is None:
                return None
            return cache[1 + i] if i is not None else jnp.concatenate(cache[1:], axis=-1)

        if not cfg.conv_size:
            streams, conv_states = [jax.nn.silu(z) for z in raw], [None] * 3
        elif cfg.fused_qkv_conv:  # one depthwise conv over the concatenation, split after it
            z = jnp.concatenate(raw, axis=-1)
            z, state = self.qkv_conv1d(z, conv_state=history(None, z), **conv_kw)
            cuts = (h * kd, 2 * h * kd)
            streams, conv_states = jnp.split(z, cuts, axis=-1), jnp.split(state, cuts, axis=-1)
        else:
            streams, conv_states = [], []
            for i, (z, conv) in enumerate(zip(raw, convs, strict=True)):
                z, state = conv(z, conv_state=history(i, z), **conv_kw)
                streams.append(z)
                conv_states.append(state)
        q = streams[0].reshape(batch, seq_len, h, kd)
        k = streams[1].reshape(batch, seq_len, h, kd)
        v = streams[2].reshape(batch, seq_len, hv, vd)
        f = self.f_proj(x).reshape(batch, seq_len, hv, -1)
        if cfg.per_head_decay:  # Gated DeltaNet: every channel of a head decays alike
            f = jnp.broadcast_to(f, (batch, seq_len, hv, kd))
        if cfg.gate_form is GateForm.CLAMPED_SOFTPLUS:  # the kernels fuse only the other forms
            f = jnp.maximum(kda_gate(f, self._rate_log(), self._dt_bias()), cfg.lower_bound)
        beta = jax.nn.sigmoid(self.b_proj(x).astype(jnp.float32))
        if cfg.allow_neg_eigval:
            beta = 2.0 * beta
        return Projected(q, k, v, f, beta, tuple(conv_states))

    def _rate_log(self) -> jax.Array:
        """``A_log [HV]``, or zeros (A = 1) for a layer without it."""
        if self.A_log is None:
            return jnp.zeros((self.config.value_heads,), jnp.float32)
        return self.A_log[...]

    def _dt_bias(self) -> jax.Array:
        """``dt_bias [HV * K]`` (a per-head one repeated over K with per_head_decay)."""
        dt_bias = self.dt_bias[...]
        if self.config.per_head_decay:
            dt_bias = jnp.repeat(dt_bias, self.config.head_dim)
        return dt_bias

    def kernel_kwargs(self) -> dict:
        """The layer's parameters and options for :func:`kda_lib.kda`: ``a_log [HV]`` (None
        without ``A_log``), ``dt_bias [HV * K]``, ``lower_bound``, ``use_gate_in_kernel=True``,
        ``use_qk_l2norm=True``, ``allow_neg_eigval``. With the clamped softplus gate it arrives
        activated (see :meth:`project`), so no gate parameter goes to the kernel."""
        cfg = self.config
        options = dict(use_qk_l2norm=True, allow_neg_eigval=cfg.allow_neg_eigval)
        if cfg.gate_form is GateForm.CLAMPED_SOFTPLUS:
            return options
        return dict(
            a_log=None if self.A_log is None else self.A_log[...],
            dt_bias=self._dt_bias(),
            lower_bound=cfg.lower_bound,
            use_gate_in_kernel=True,
            **options,
        )

    def project_output(self, x, o) -> jax.Array:
        """Everything after the kernel: ``x [B, T, hidden]`` (for the output gate) and the
        kernel's ``o [B, T, HV, V]`` -> ``y [B, T, hidden]`` (gated RMSNorm, output projection)."""
        cfg = self.config
        batch, seq_len, _ = x.shape
        hv, vd = cfg.value_heads, cfg.value_dim
        gate = self.g_proj(x.astype(cfg.dtype)).reshape(batch, seq_len, hv, vd)
        normed = gated_rms_norm(o, self.o_norm[...], gate, eps=cfg.norm_eps)
        return self.o_proj(normed.astype(cfg.dtype).reshape(batch, seq_len, hv * vd))

    def _forward(self, x, *, segment_ids=None, cache=None):
        """Single-device forward: ``(y, new_cache | None)``."""
        cfg = self.config
        q, k, v, f, beta, conv_states = self.project(x, segment_ids=segment_ids, cache=cache)
        o, state = kda(
            q,
            k,
            v,
            f,
            beta,
            **self.kernel_kwargs(),
            initial_state=None if cache is None else cache.state,
            output_final_state=cache is not None,
            segment_ids=segment_ids,
            max_num_segments=max_segments_bound(segment_ids, cfg),
            chunk_size=cfg.chunk_size,
            implementation=cfg.implementation,
        )
        y = self.project_output(x, o)
        if cache is None:
            return y, None
        return y, KDACache(state, *conv_states)

    def _forward_context_parallel(self, x, *, segment_ids=None):
        """``layer(x)`` with the sequence split over ``self.mesh``'s ``self.context_axis``.

        x ``[B, T, hidden]`` (replicated or sharded along T). T that does not divide by the
        number of ranks is padded at the end (trailing tokens cannot change earlier outputs) and
        cut back.
        """
        axis, cfg = self.context_axis, self.config
        mesh = _auto_view(self.mesh)
        ranks = mesh.shape[axis]
        # arrays laid out on the user's mesh (e.g. fed per process on several hosts) are
        # relabelled onto the Auto view: same devices and spec, no data moves
        home = getattr(getattr(x, "sharding", None), "mesh", None)  # to return y there too
        x, segment_ids = (_onto_mesh(a, mesh) for a in (x, segment_ids))
        seq_len = x.shape[1]
        x, segment_ids = _pad_to_multiple(x, segment_ids, ranks)
        graphdef, state = nnx.split(self)
        has_segments = segment_ids is not None
        if uses_own_context_parallel(cfg.implementation):
            # tokamax's CP: its trace depends on the emulated chip (kda_lib.emulate_tpu), which
            # no cache key holds, so it is built for each call
            bound = max_segments_bound(segment_ids, cfg, ranks)
            program = _context_parallel_program(
                graphdef, axis, cfg, mesh, has_segments, own_cp=True, bound=bound
            )
        else:
            program = _cached_context_parallel_program(graphdef, axis, cfg, mesh, has_segments)
        y = program(state, x, segment_ids)[:, :seq_len]
        return _onto_mesh(y, home) if isinstance(home, jax.sharding.Mesh) else y

    # ----------------------------------------------------------------- fla checkpoints
    @classmethod
    def from_fla_state_dict(cls, state_dict, config: KDAConfig, *, rngs: nnx.Rngs, **kwargs):
        """Build a layer holding the weights of an fla ``KimiDeltaAttention.state_dict()``.

        ``state_dict`` maps fla names (``q_proj.weight``, ``q_conv1d.weight``,
        ``f_proj.0.weight``, ``o_norm.weight``, ...) to arrays (numpy or torch tensors converted
        with ``.numpy()``). Linear weights ``[out, in]`` are transposed; conv weights
        ``[C, 1, W]`` become ``[W, C]`` (same tap order, see kda_lib.layers.conv). The names and
        layouts live in :mod:`kda_lib.layers.checkpoints` (with the Kimi Linear checkpoint's).
        """
        layer = cls(config, rngs=rngs, **kwargs)
        load_fla_state_dict(layer, state_dict)
        return layer


def _check_finite(name: str, x) -> None:
    """Raise a ValueError naming ``name`` and the first position if concrete ``x`` has a NaN
    or an infinity."""
    values = np.asarray(x)
    bad = ~np.isfinite(values)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name} contains NaN/inf at {list(first)} ({int(bad.sum())} non-finite values in "
            f"all, the first is {float(values[first])})"
        )


def _auto_view(mesh):
    """An Auto-typed view of ``mesh``: outputs then carry ordinary shardings, so code outside
    needs no mesh context, whichever axis types the user's mesh has."""
    return jax.sharding.Mesh(
        mesh.devices,
        mesh.axis_names,
        axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axis_names),
    )


def _pad_to_multiple(x, segment_ids, ranks: int):
    """x ``[B, T, hidden]`` (and the ids) padded at the end to a multiple of ``ranks`` tokens
    (trailing tokens cannot change earlier outputs)."""
    pad = (-x.shape[1]) % ranks
    if not pad:
        return x, segment_ids
    x = jnp.pad(x, [(0, 0), (0, pad), (0, 0)])
    if segment_ids is not None:
        segment_ids = jnp.pad(segment_ids, [(0, 0), (0, pad)])
    return x, segment_ids


def _context_parallel_program(
    graphdef, axis: str, cfg: KDAConfig, mesh, has_segments: bool, own_cp=False, bound=None
):
    """The jitted CP forward ``(state, x, segment_ids) -> y`` over the Auto-typed ``mesh``'s
    ``axis``. ``own_cp``: the backend's own CP (tokamax's), which takes the mesh and the segment
    ``bound`` and runs without shard_map's vma check."""
    mosaic = dict(mesh=mesh, max_num_segments=bound) if own_cp else {}
    seq = P(None, axis)
    specs = (P(), P(None, axis, None), seq if has_segments else None)
    fn = jax.shard_map(
        _rank_forward(graphdef, axis, cfg, mosaic),
        mesh=mesh,
        in_specs=specs,
        out_specs=P(None, axis, None),
        check_vma=not own_cp,
    )

    def run(state, x, segment_ids):
        # put the inputs in the layout shard_map expects, whatever they arrive in
        state = jax.tree.map(lambda a: shard_as(a, mesh, P()), state)
        x = shard_as(x, mesh, specs[1])
        segment_ids = None if segment_ids is None else shard_as(segment_ids, mesh, seq)
        return fn(state, x, segment_ids)

    return jax.jit(run)


# kda_lib's own CP route: one program per (structure, axis, config, mesh, segments), so eager
# calls compile once instead of on every call
_cached_context_parallel_program = register_compiled_cache(
    functools.lru_cache(maxsize=32)(_context_parallel_program)
)


def _rank_forward(graphdef, axis: str, cfg: KDAConfig, mosaic: dict):
    """One rank's layer forward inside ``shard_map``: ``(state, x, segment_ids) -> y`` with the
    convs' halo from the previous ranks and the kernel through :func:`kda_context_parallel`
    (``mosaic``: the mesh and segment bound a backend's own CP takes, else empty)."""
    width = max(cfg.conv_size - 1, 0)

    def local(state, x, segment_ids):
        module = nnx.merge(graphdef, state)
        halo = (
            (lambda z: halo_exchange(z, axis_name=axis, halo_size=width)[:, :width])
            if width
            else None
        )
        history_ids = None if segment_ids is None or not width else halo(segment_ids)
        q, k, v, f, beta, _ = module.project(
            x, segment_ids=segment_ids, halo=halo, history_segment_ids=history_ids
        )
        o = kda_context_parallel(
            q,
            k,
            v,
            f,
            beta,
            axis_name=axis,
            segment_ids=segment_ids,
            implementation=cfg.implementation,
            chunk_size=cfg.chunk_size,
            **mosaic,
            **module.kernel_kwargs(),
        )
        return module.project_output(x, o)

    return local


def _onto_mesh(array, mesh):
    """``array`` on ``mesh`` if it is laid out on another mesh of the same devices."""
    sharding = getattr(array, "sharding", None) if not isinstance(array, jax.core.Tracer) else None
    if isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh != mesh:
        return jax.device_put(array, jax.sharding.NamedSharding(mesh, sharding.spec))
    return array


def max_segments_bound(segment_ids, config: KDAConfig, ranks: int = 1) -> int | None:
    """The static bound on segments per row (per rank's slice when ``ranks > 1``) that
    tokamax backends need; None for kda_lib's kernels or without ``segment_ids``.

    ``config.max_num_segments`` when set; otherwise counted from concrete ids: runs of one id,
    padding runs included, so it may exceed the true count by the padding runs. Traced ids
    without the config bound raise: the count is unknowable at trace time, and the only safe
    bound, T, would give tokamax T state slots.
    """
    if segment_ids is None or not needs_segment_bound(config.implementation):
        return None
    if config.max_num_segments is not None:
        return config.max_num_segments
    if isinstance(segment_ids, jax.core.Tracer):
        raise ValueError(
            f"implementation={config.implementation!r} with segment_ids under jit needs "
            f"KDAConfig.max_num_segments, a static bound on the segments in one row"
            f"{' (per rank)' if ranks > 1 else ''}; tokamax keeps one state slot per segment"
        )
    # padding runs count too (tokamax's CP gives padding the id before it): a safe bound
    return count_segments(segment_ids, ranks)
