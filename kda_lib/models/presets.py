"""The KDA (and MLA) layers of the published models that use KDA, as presets.

Each :class:`ModelPreset` records a model's KDA layer as its source publishes it (widths, gate
ranks, biases, layouts), its layer pattern (which layers are KDA and which global attention),
and, where the source gives it, its MLA layer. From a preset:

* :meth:`ModelPreset.kda_config` gives the :class:`kda_lib.KDAConfig` that builds the same
  layer here (the preset's KDA fields carry KDAConfig's names and are copied as they are), or
  raises NotImplementedError naming the options this layer does not have yet (never an
  approximation of them); :meth:`ModelPreset.kda_parameter_shapes` lists the layer's tensors
  from :meth:`kda_lib.KDAConfig.parameter_shapes` (the one formula for them);
* :func:`build_kda_layer` / :func:`build_mla_layer` build the layers with ``nnx.eval_shape``
  (shapes only, no memory), so the 7168-wide Kimi K3 layer costs nothing to inspect;
* :meth:`ModelPreset.from_hf_config` reads a preset from a Hugging Face ``config.json`` of
  Kimi Linear (``model_type`` ``"kimi_linear"``), layer pattern included, and refuses, naming
  the field, a config it cannot represent (see :data:`HF_LINEAR_ATTN_KEYS`);
  :func:`load_kimi_linear_checkpoint` builds and loads every attention layer of a checkpoint
  directory (``config.json`` + safetensors, in either naming of
  :mod:`kda_lib.layers.checkpoints`).

Sources (each number below cites one of them):

* Kimi-Linear-48B-A3B: ``config.json`` of ``Firworks/Kimi-Linear-48B-A3B-Instruct-nvfp4`` (a
  re-upload of ``moonshotai/Kimi-Linear-48B-A3B-Instruct``'s config, no commit id), and
  ``v_head_dim`` from NVIDIA-NeMo/Megatron-Bridge's Kimi Linear bridge test fixture; the layer
  structure from ``modeling_kimi.py`` (revision 6e163f3) as copied in axolotl-ai-cloud/axolotl
  ``src/axolotl/monkeypatch/models/kimi_linear/modeling_kimi.py`` @ 1e4d015.
* Kimi K3: AI-Hypercomputer/maxtext ``src/maxtext/configs/models/kimi-k3.yml`` and
  ``src/maxtext/layers/kda.py`` @ bf801f4.
* GLM-5.3-Flash: AI-Hypercomputer/maxtext ``src/maxtext/configs/models/glm5.3-flash.yml`` @
  efcd158 and ``src/maxtext/models/glm5_next.py`` @ 0630439.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import NamedTuple

from flax import nnx

from kda_lib.checks import check_int, check_number, shared_fields
from kda_lib.layers.checkpoints import (
    detect_kimi_linear_naming,
    kimi_linear_prefix,
    load_state_dict,
    read_safetensors,
)
from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention
from kda_lib.layers.mla import MLAConfig, MultiHeadLatentAttention
from kda_lib.ops.gating import LOWER_BOUND_RANGE, GateForm, check_gate_form


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLAShape:
    """A published MLA layer's widths, named as :class:`kda_lib.layers.mla.MLAConfig` names
    them (the sources use DeepSeek-V2's names: ``qk_nope_head_dim`` is ``head_dim``,
    ``v_head_dim`` is ``value_head_dim``, ``qk_rope_head_dim`` is ``shared_key_dim``).

    ``output_gate``: the layer gates its output (Kimi K3's ``mla_use_output_gate``: MaxText's
    ``attention_mla.py`` adds ``g_a_proj [d, output_gate_rank]``, ``g_b_proj
    [output_gate_rank, H Dv]`` and an ``o_norm [Dv]``), which
    :class:`kda_lib.layers.mla.MultiHeadLatentAttention` does not have. ``norm_eps``: epsilon
    of the latent RMSNorm (None: not given by the source; MLAConfig's default is used).
    """

    num_heads: int
    head_dim: int
    value_head_dim: int
    kv_lora_rank: int
    q_lora_rank: int | None = None
    shared_key_dim: int
    norm_eps: float | None = None
    output_gate: bool = False
    output_gate_rank: int | None = None

    def __post_init__(self):
        for name in ("num_heads", "kv_lora_rank", "value_head_dim"):
            check_int(f"MLAShape.{name}", getattr(self, name), 1)
        for name in ("head_dim", "shared_key_dim"):
            check_int(f"MLAShape.{name}", getattr(self, name), 0)
        for name in ("q_lora_rank", "output_gate_rank"):
            check_int(f"MLAShape.{name}", getattr(self, name), 1, optional=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelPreset:
    """A published model: its KDA layer, layer pattern and (where known) MLA layer.

    The KDA fields carry :class:`kda_lib.KDAConfig`'s names and order (widths, conv, gate,
    output); :meth:`kda_config` copies them.

    Attributes:
      name: the model.
      hidden_size, num_heads, head_dim: the KDA layer's width d, H and K (= V).
      num_v_heads: value heads (grouped value heads when more than ``num_heads``).
      conv_size: short-conv width W.
      fused_qkv_conv: q, k and v share one depthwise conv over their concatenation (one
        tensor; the same function as three convs, another checkpoint layout).
      gate_form: a :class:`kda_lib.ops.gating.GateForm` (or its string): how ``lower_bound``
        applies (``"softplus"``: no bound; ``"safe_sigmoid"``: ``lower_bound *
        sigmoid(exp(A_log) (f + dt_bias))``, this repository's safe gate;
        ``"clamped_softplus"``: ``max(-exp(A_log) softplus(f + dt_bias), lower_bound)``).
      lower_bound: None = softplus gate; a float = the gate's lower bound.
      use_a_log: the gate has a learned per-head ``A_log``.
      forget_gate_rank, output_gate_rank: rank of the low-rank forget / output gate
        projections; None = one full-rank projection.
      output_gate_bias: the output gate's last projection has a bias.
      norm_eps: the output RMSNorm's epsilon.
      layer_kinds: per layer, ``"kda"`` or ``"mla"`` (the global attention layer).
      mla: the global layer's widths, or None where the source does not give them.
      source: where the numbers come from (repository, path, commit).
      notes: what the source leaves open, or where it differs from other descriptions.
    """

    name: str
    hidden_size: int
    num_heads: int
    num_v_heads: int
    head_dim: int
    conv_size: int
    fused_qkv_conv: bool
    gate_form: GateForm
    lower_bound: float | None
    use_a_log: bool
    forget_gate_rank: int | None
    output_gate_rank: int | None
    output_gate_bias: bool
    norm_eps: float
    layer_kinds: tuple[str, ...]
    mla: MLAShape | None
    source: str
    notes: str = ""

    def __post_init__(self):
        # numpy scalars are accepted where a Python number is and stored as Python numbers
        for name in ("hidden_size", "num_heads", "num_v_heads", "head_dim"):
            self._set(name, check_int(f"ModelPreset.{name}", getattr(self, name), 1))
        self._set("conv_size", check_int("ModelPreset.conv_size", self.conv_size, 0))
        for name in ("forget_gate_rank", "output_gate_rank"):
            value = check_int(f"ModelPreset.{name}", getattr(self, name), 1, optional=True)
            self._set(name, value)
        for name in ("fused_qkv_conv", "use_a_log", "output_gate_bias"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"ModelPreset.{name} must be True or False, got {value!r}")
        self._set("norm_eps", check_number("ModelPreset.norm_eps", self.norm_eps, positive=True))
        if self.lower_bound is not None:
            bound = check_number("ModelPreset.lower_bound", self.lower_bound)
            if bound >= 0:  # a bound on a log-space decay: every form's gate is <= 0
                raise ValueError(
                    "ModelPreset.lower_bound must be a negative float (the gate's bound on the "
                    f"log decay) or None (the softplus gate), got {self.lower_bound!r}"
                )
            self._set("lower_bound", bound)
        if self.num_v_heads % self.num_heads:
            raise ValueError(
                f"ModelPreset.num_v_heads must be a multiple of num_heads={self.num_heads}, "
                f"got {self.num_v_heads}"
            )
        form = check_gate_form(self.gate_form, self.lower_bound, where="ModelPreset.gate_form")
        self._set("gate_form", form)  # a string is stored as the enum
        unknown = sorted(set(self.layer_kinds) - {"kda", "mla"})
        if unknown:
            raise ValueError(f"ModelPreset.layer_kinds: unknown kinds {unknown} (kda, mla)")

    def _set(self, name, value):
        object.__setattr__(self, name, value)  # frozen: normalise during __post_init__ only

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def kda_layers(self) -> tuple[int, ...]:
        """0-based indices of the KDA layers."""
        return tuple(i for i, kind in enumerate(self.layer_kinds) if kind == "kda")

    @property
    def global_layers(self) -> tuple[int, ...]:
        """0-based indices of the global attention layers."""
        return tuple(i for i, kind in enumerate(self.layer_kinds) if kind != "kda")

    # ------------------------------------------------------------ from a config.json
    @classmethod
    def from_hf_config(cls, config: dict, *, name: str | None = None) -> ModelPreset:
        """The preset a Hugging Face Kimi Linear ``config.json`` (as a dict) describes.

        Read: ``hidden_size``, ``num_hidden_layers``, ``rms_norm_eps`` (the KDA output norm);
        ``linear_attn_config``'s ``num_heads``, ``head_dim``, ``short_conv_kernel_size``,
        ``kda_layers`` and ``full_attn_layers`` (1-based layer numbers: layer N of the lists
        is ``layer_kinds[N - 1]``), ``gate_lower_bound`` (absent or null: the softplus gate; a
        number: the safe gate ``lower_bound * sigmoid(exp(A_log) (f + dt_bias))``, as the
        remote code passes it to fla's ``safe_gate`` and the transformers library computes
        it, ``modeling_kimi_linear.py`` @ 016bd12c) and ``use_full_rank_gate`` (a full-rank
        output gate ``g_proj``); the MLA's ``num_attention_heads``, ``q_lora_rank``,
        ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``,
        ``mla_use_nope`` and ``mla_use_output_gate``. The rest is the remote code's fixed
        layout (``modeling_kimi.py``): separate q/k/v convs, gates of rank ``head_dim``
        without bias, ``A_log`` per head, value heads = heads, the latent norm's eps 1e-6
        (``KimiRMSNorm``'s default; ``kv_a_layernorm`` is built without one). A config whose
        top level is a wrapper (``text_config`` with ``model_type`` ``"kimi_linear"``) is
        read from its ``text_config``. MoE, vocabulary and other fields outside the attention
        layers are not read.

        Args:
          config: the parsed ``config.json``.
          name: the preset's name (default: the config's ``_name_or_path``, else
            ``"kimi_linear"``).

        Raises:
          ValueError: naming the field, for another ``model_type``, a missing or ill-typed
            field, a layer listed twice, in both lists, out of range or in neither, a key of
            ``linear_attn_config`` outside :data:`HF_LINEAR_ATTN_KEYS` (it may change the
            layer: ``kda_layer_index_base``, ``safe_gate``, ...), ``mla_use_nope`` false with
            a rotary part (this MLA has no rotary embedding), or ``layer_types`` that
            disagree with the lists.
        """
        return _preset_from_hf_config(cls, config, name)

    # ------------------------------------------------------------ the published layer
    def kda_parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The KDA layer's parameters, path -> shape (``"q_proj.kernel": (d, H K)``, ...):
        :meth:`kda_lib.KDAConfig.parameter_shapes`, the one formula for them, of this
        preset's widths (see :meth:`_kda_widths`)."""
        return self._kda_widths().parameter_shapes()

    def kda_parameter_count(self) -> int:
        """Scalars in one published KDA layer: :meth:`kda_lib.KDAConfig.parameter_count` of
        this preset's widths (see :meth:`_kda_widths`)."""
        return self._kda_widths().parameter_count()

    def _kda_widths(self) -> KDAConfig:
        """A :class:`kda_lib.KDAConfig` with this preset's widths, for its parameter shapes.
        The gate's form and bound shape no parameter, so a gate the layer cannot express yet
        (:meth:`unsupported_options`) is replaced by the safe gate here."""
        gate = dict(gate_form=GateForm.SAFE_SIGMOID, lower_bound=LOWER_BOUND_RANGE[0])
        return KDAConfig(**{**shared_fields(self, KDAConfig), **gate})

    def mla_parameter_count(self) -> int:
        """Scalars in one published MLA layer: q (full, or low rank with its norm), latent
        down-projection with the shared key part, latent norm, up-projection, output, and the
        output gate with its norm where the layer has one."""
        m = self._mla_or_raise()
        d, h = self.hidden_size, m.num_heads
        qk = m.head_dim + m.shared_key_dim
        if m.q_lora_rank is None:
            q = d * h * qk
        else:
            q = d * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * h * qk
        down = d * (m.kv_lora_rank + m.shared_key_dim) + m.kv_lora_rank
        up = m.kv_lora_rank * h * (m.head_dim + m.value_head_dim)
        gate = 0
        if m.output_gate:
            rank = m.output_gate_rank
            gate = d * rank + rank * h * m.value_head_dim + m.value_head_dim
        return q + down + up + h * m.value_head_dim * d + gate

    # ------------------------------------------------------------ this repository's layers
    def unsupported_options(self) -> list[str]:
        """The options this preset needs that :class:`kda_lib.KimiDeltaAttention` lacks."""
        missing = []
        if not self.use_a_log and self.gate_form is GateForm.SOFTPLUS:
            missing.append(
                "the softplus gate without A_log (only a bounded gate has a rate-free form)"
            )
        low = LOWER_BOUND_RANGE[0]
        if self.lower_bound is not None and self.lower_bound < low:
            missing.append(
                f"lower_bound={self.lower_bound:g}, below the layer's range [{low:g}, 0)"
            )
        return missing

    def kda_config(self, **overrides) -> KDAConfig:
        """The :class:`kda_lib.KDAConfig` of this layer: every field the two share, copied
        (``overrides``: dtype, implementation, ...).

        Raises:
          NotImplementedError: naming every option the layer does not have yet.
        """
        missing = self.unsupported_options()
        if missing:
            raise NotImplementedError(
                f"{self.name}: KimiDeltaAttention cannot express this layer yet; missing "
                + "; ".join(missing)
            )
        return KDAConfig(**{**shared_fields(self, KDAConfig), **overrides})

    def _mla_or_raise(self) -> MLAShape:
        if self.mla is None:
            raise NotImplementedError(f"{self.name}: the source gives no MLA widths ({self.notes})")
        return self.mla

    def mla_config(self, **overrides) -> MLAConfig:
        """The :class:`kda_lib.layers.mla.MLAConfig` of the global layer: the shape's fields
        (NoPE: the rotary slot is the shared key part; ``norm_eps`` None keeps MLAConfig's).

        Raises:
          NotImplementedError: no MLA widths in the source, or an output-gated MLA.
        """
        m = self._mla_or_raise()
        if m.output_gate:
            raise NotImplementedError(
                f"{self.name}: MultiHeadLatentAttention has no output gate (mla_use_output_gate)"
            )
        fields = {k: v for k, v in shared_fields(m, MLAConfig).items() if v is not None}
        return MLAConfig(**{"hidden_size": self.hidden_size, **fields, **overrides})


# The keys of a Kimi Linear config's linear_attn_config that from_hf_config reads; any other
# key is refused by name (it may change the layer: kda_layer_index_base would renumber the
# lists, safe_gate would change the gate). The first five are those of the published
# moonshotai/Kimi-Linear-48B-A3B config; gate_lower_bound and use_full_rank_gate are read by
# the remote-code layer (Kimi K3's configs set them).
HF_LINEAR_ATTN_KEYS = (
    "num_heads",
    "head_dim",
    "short_conv_kernel_size",
    "kda_layers",
    "full_attn_layers",
    "gate_lower_bound",
    "use_full_rank_gate",
)
_HF_LAYER_TYPES = {"linear_attention": "kda", "kda_attention": "kda", "full_attention": "mla"}
_MISSING = object()


def _hf_get(config: dict, key: str, where: str = "", default=_MISSING):
    if key not in config:
        if default is _MISSING:
            raise ValueError(f"config field {where}{key} is missing (needed for the layer)")
        return default
    return config[key]


def _hf_int(config: dict, key: str, where: str = "", minimum: int = 1, optional=False, **kw):
    value = _hf_get(config, key, where, **kw)
    return check_int(f"config field {where}{key}", value, minimum, optional=optional)


def _hf_bool(config: dict, key: str, default: bool = False) -> bool:
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"config field {key} must be true or false, got {value!r}")
    return value


def _hf_layer_kinds(config: dict, linear: dict, num_layers: int) -> tuple[str, ...]:
    """``layer_kinds`` from the 1-based ``kda_layers`` / ``full_attn_layers``, each layer in
    exactly one list."""
    owner: dict[int, str] = {}
    for key in ("kda_layers", "full_attn_layers"):
        field = f"linear_attn_config.{key}"
        layers = _hf_get(linear, key, "linear_attn_config.")
        if not isinstance(layers, (list, tuple)):
            raise ValueError(f"config field {field} must be a list of layer numbers")
        for number in layers:
            check_int(f"config field {field} entry", number, 1)
            if number > num_layers:
                raise ValueError(
                    f"config field {field} lists layer {number}, beyond num_hidden_layers="
                    f"{num_layers} (the numbers are 1-based)"
                )
            if number in owner:
                where = "twice" if owner[number] == key else f"also in {owner[number]}"
                raise ValueError(f"config field {field} lists layer {number} {where}")
            owner[number] = key
    missing = [n for n in range(1, num_layers + 1) if n not in owner]
    if missing:
        raise ValueError(
            f"config fields linear_attn_config.kda_layers / full_attn_layers leave layers "
            f"{missing} in neither list (1-based; num_hidden_layers={num_layers})"
        )
    kinds = tuple("kda" if owner[n] == "kda_layers" else "mla" for n in range(1, num_layers + 1))
    layer_types = config.get("layer_types")
    if layer_types is not None:
        given = [_HF_LAYER_TYPES.get(t, t) for t in layer_types]
        if tuple(given) != kinds:
            raise ValueError(
                "config field layer_types disagrees with linear_attn_config's kda_layers / "
                "full_attn_layers"
            )
    return kinds


def _hf_text_config(config) -> tuple[dict, dict]:
    """The Kimi Linear config (unwrapped from ``text_config``) and its ``linear_attn_config``,
    both checked for their type, ``model_type`` and unknown ``linear_attn_config`` keys."""
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict (a parsed config.json), got {type(config)}")
    text = config.get("text_config")
    if config.get("model_type") != "kimi_linear" and isinstance(text, dict):
        config = text  # a wrapper (Kimi K3's multimodal config) around the text model
    model_type = config.get("model_type")
    if model_type != "kimi_linear":
        raise ValueError(
            f"config field model_type must be 'kimi_linear' (Kimi Linear's config), got "
            f"{model_type!r}"
        )
    linear = _hf_get(config, "linear_attn_config")
    if not isinstance(linear, dict):
        raise ValueError(f"config field linear_attn_config must be a dict, got {linear!r}")
    unknown = sorted(set(linear) - set(HF_LINEAR_ATTN_KEYS))
    if unknown:
        raise ValueError(
            f"config field linear_attn_config has keys {unknown} that from_hf_config does not "
            f"read and that may change the layer (read: {list(HF_LINEAR_ATTN_KEYS)})"
        )
    return config, linear


def _hf_mla(config: dict) -> MLAShape:
    """The MLA widths of a Kimi Linear config (NoPE only)."""
    rope = _hf_int(config, "qk_rope_head_dim", minimum=0)
    if rope and not _hf_bool(config, "mla_use_nope"):
        raise ValueError(
            "config field mla_use_nope must be true (or qk_rope_head_dim 0): "
            "MultiHeadLatentAttention has no rotary embedding; the shared key part is used "
            "unrotated only in the NoPE form"
        )
    return MLAShape(
        num_heads=_hf_int(config, "num_attention_heads"),
        head_dim=_hf_int(config, "qk_nope_head_dim", minimum=0),
        value_head_dim=_hf_int(config, "v_head_dim"),
        kv_lora_rank=_hf_int(config, "kv_lora_rank"),
        q_lora_rank=_hf_int(config, "q_lora_rank", optional=True, default=None),
        shared_key_dim=rope,
        norm_eps=1e-6,  # KimiRMSNorm's default: kv_a_layernorm is built without an eps
        output_gate=_hf_bool(config, "mla_use_output_gate"),
    )


def _preset_from_hf_config(cls, config, name):
    config, linear = _hf_text_config(config)
    lin = "linear_attn_config."
    head_dim = _hf_int(linear, "head_dim", lin)
    bound = linear.get("gate_lower_bound")
    if bound is not None:
        check_number(f"config field {lin}gate_lower_bound", bound)
    full_rank_output = linear.get("use_full_rank_gate", False)
    if not isinstance(full_rank_output, bool):
        raise ValueError(f"config field {lin}use_full_rank_gate must be true or false")
    eps = _hf_get(config, "rms_norm_eps")
    check_number("config field rms_norm_eps", eps, positive=True)
    num_layers = _hf_int(config, "num_hidden_layers")
    heads = _hf_int(linear, "num_heads", lin)
    return cls(
        name=name if name is not None else (config.get("_name_or_path") or "kimi_linear"),
        hidden_size=_hf_int(config, "hidden_size"),
        num_heads=heads,
        num_v_heads=heads,
        head_dim=head_dim,
        conv_size=_hf_int(linear, "short_conv_kernel_size", lin),
        fused_qkv_conv=False,
        gate_form=GateForm.SOFTPLUS if bound is None else GateForm.SAFE_SIGMOID,
        lower_bound=None if bound is None else float(bound),
        use_a_log=True,
        forget_gate_rank=head_dim,
        output_gate_rank=None if full_rank_output else head_dim,
        output_gate_bias=False,
        norm_eps=float(eps),
        layer_kinds=_hf_layer_kinds(config, linear, num_layers),
        mla=_hf_mla(config),
        source="Hugging Face config.json (model_type kimi_linear), read by from_hf_config",
        notes="the layout fixed by modeling_kimi.py; see ModelPreset.from_hf_config",
    )


def build_kda_layer(preset: ModelPreset, **overrides) -> KimiDeltaAttention:
    """The preset's KDA layer as shapes only (``nnx.eval_shape``: no parameter memory)."""
    config = preset.kda_config(**overrides)
    return nnx.eval_shape(lambda: KimiDeltaAttention(config, rngs=nnx.Rngs(0)))


def build_mla_layer(preset: ModelPreset, **overrides) -> MultiHeadLatentAttention:
    """The preset's MLA layer as shapes only (``nnx.eval_shape``)."""
    config = preset.mla_config(**overrides)
    return nnx.eval_shape(lambda: MultiHeadLatentAttention(config, rngs=nnx.Rngs(0)))


def _kinds(num_layers: int, global_layers_1based) -> tuple[str, ...]:
    globals_ = set(global_layers_1based)
    return tuple("mla" if i + 1 in globals_ else "kda" for i in range(num_layers))


# Kimi-Linear-48B-A3B. config.json (stored copy, see the module docstring): hidden_size 2304,
# num_hidden_layers 27, linear_attn_config {num_heads 32, head_dim 128,
# short_conv_kernel_size 4, kda_layers [1, 2, 3, 5, ..., 25, 26] (20), full_attn_layers
# [4, 8, 12, 16, 20, 24, 27] (7, 1-based)}, no gate_lower_bound (softplus gate);
# num_attention_heads 32, q_lora_rank null, kv_lora_rank 512, qk_nope_head_dim 128,
# qk_rope_head_dim 64, mla_use_nope true; v_head_dim 128 (Megatron-Bridge fixture).
# modeling_kimi.py @ 6e163f3 (axolotl copy @ 1e4d0154...): f_a_proj [d -> head_dim],
# f_b_proj [head_dim -> H K], g_a_proj / g_b_proj the same, all without bias; A_log [H];
# dt_bias [H K]; three ShortConvolution (no bias); o_norm [head_dim]; o_proj without bias;
# o_norm eps = rms_norm_eps (1e-5 in the config); the MLA's kv_a_proj_with_mqa gives
# kv_lora_rank + qk_rope_head_dim, and with mla_use_nope the rope part is used unrotated.
KIMI_LINEAR_48B = ModelPreset(
    name="Kimi-Linear-48B-A3B",
    hidden_size=2304,
    num_heads=32,
    num_v_heads=32,
    head_dim=128,
    conv_size=4,
    fused_qkv_conv=False,
    gate_form=GateForm.SOFTPLUS,
    lower_bound=None,
    use_a_log=True,
    forget_gate_rank=128,
    output_gate_rank=128,
    output_gate_bias=False,
    norm_eps=1e-5,
    layer_kinds=_kinds(27, (4, 8, 12, 16, 20, 24, 27)),
    mla=MLAShape(
        num_heads=32,
        head_dim=128,
        value_head_dim=128,
        kv_lora_rank=512,
        shared_key_dim=64,
        norm_eps=1e-6,  # KimiRMSNorm's default eps; kv_a_layernorm is built without one
    ),
    source=(
        "HF config.json of moonshotai/Kimi-Linear-48B-A3B-Instruct (stored copy: "
        "Firworks/Kimi-Linear-48B-A3B-Instruct-nvfp4 config.json); modeling_kimi.py @ 6e163f3 "
        "via axolotl-ai-cloud/axolotl src/axolotl/monkeypatch/models/kimi_linear/"
        "modeling_kimi.py @ 1e4d015475e3f5d48e6fb5517484f0bfd08b96bd"
    ),
    notes=(
        "the original Hugging Face config.json is not in the stored material (a re-upload's "
        "copy is); v_head_dim 128 from NVIDIA-NeMo/Megatron-Bridge's test fixture"
    ),
)

# Kimi K3. kimi-k3.yml @ bf801f44: base_emb_dim 7168, base_num_decoder_layers 93,
# base_num_query_heads 96 (the KDA layer's heads, kda.py: num_heads = num_query_heads),
# head_dim 128, kda_layers [1, 2, 3, 5, ..., 91] (69), full_attn_layers [4, 8, ..., 92, 93]
# (24, 1-based), kda_conv_kernel_size 4, kda_use_full_rank_gate true, kda_gate_lower_bound
# -5.0, normalization_layer_epsilon 1e-5; MLA: q_lora_rank 1536, kv_lora_rank 512,
# qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, mla_use_output_gate true
# (src/maxtext/layers/attention_mla.py @ bf801f44: wq_a, q_norm, wq_b, wkv_a [emb, r + rope],
# kv_norm, wkv_b, out, and for the gate g_a_proj [emb, head_dim], g_b_proj, o_norm [v]).
# kda.py @ bf801f44: separate q/k/v projections and convs (no bias), f_a_proj [d -> head_dim]
# + f_b_proj (the forget gate stays low rank), g_proj [d -> H K] full rank without bias (the
# full-rank gate is the output gate), b_proj, A_log [H], dt_bias [H K], o_norm [head_dim];
# gate max(-exp(A_log) softplus(f + dt_bias), kda_gate_lower_bound): a clamp, not a sigmoid.
KIMI_K3 = ModelPreset(
    name="Kimi-K3",
    hidden_size=7168,
    num_heads=96,
    num_v_heads=96,
    head_dim=128,
    conv_size=4,
    fused_qkv_conv=False,
    gate_form=GateForm.CLAMPED_SOFTPLUS,
    lower_bound=-5.0,
    use_a_log=True,
    forget_gate_rank=128,
    output_gate_rank=None,
    output_gate_bias=False,
    norm_eps=1e-5,
    layer_kinds=_kinds(93, (*range(4, 93, 4), 93)),
    mla=MLAShape(
        num_heads=96,
        head_dim=128,
        value_head_dim=128,
        kv_lora_rank=512,
        q_lora_rank=1536,
        shared_key_dim=64,
        output_gate=True,
        output_gate_rank=128,  # attention_mla.py @ bf801f44: g_a_proj [emb_dim, head_dim]
    ),
    source=(
        "AI-Hypercomputer/maxtext src/maxtext/configs/models/kimi-k3.yml and "
        "src/maxtext/layers/kda.py @ bf801f4474c4367f1b03a202e793ec7724f1f3db"
    ),
    notes=(
        "MaxText's kda.py at this commit has separate q/k/v projections and convs, not a fused "
        "q/k/v layout; a later commit (25f141af9) makes A_log one value per head_dim channel "
        "instead of per head. A third-party MLX port's technical report (mlxcel PR #1741, "
        "'add the Kimi K3 text backbone', read in the code index without its repository) "
        "describes the Hugging Face Kimi K3 checkpoint differently: six separate q/k/v "
        "projection and conv tensors that the port fuses at load time, the sigmoid safe gate "
        "(not a clamp) and an A_log of 128 entries for 96 heads; this preset follows MaxText. "
        "No Kimi K3 config.json is in the stored sources: NVIDIA-NeMo/Megatron-Bridge's K3 "
        "bridge test (@ caa6c44c7) holds its text_config truncated to four layers, whose "
        "linear_attn_config sets gate_lower_bound -5.0; the remote code and the transformers "
        "library (modeling_kimi_linear.py @ 016bd12cb) read that bound as the safe sigmoid "
        "gate, so ModelPreset.from_hf_config of a K3 config gives gate_form safe_sigmoid where "
        "this preset has clamped_softplus (kept until the config itself can be read)"
    ),
)

# GLM-5.3-Flash. glm5.3-flash.yml @ efcd1586: base_emb_dim 4096, base_num_decoder_layers 45,
# inhomogeneous_layer_cycle_interval 4, linear_conv_kernel_dim 4, linear_head_dim 128,
# linear_num_heads 64, linear_lower_bound -5.0, normalization_layer_epsilon 1e-5.
# glm5_next.py @ 06304397: layer i is attention when (i + 1) % interval == 0 (11 of 45);
# KDA: separate q/k/v projections, ONE depthwise conv over concat(q, k, v) without bias,
# f_a_proj/f_b_proj and g_a_proj/g_b_proj of rank linear_head_dim without bias, b_proj,
# A_log [H], dt_bias [H K], o_norm [head_dim], o_proj; safe gate
# lower_bound * sigmoid(exp(A_log) * (f + dt_bias)).
GLM_5_3_FLASH = ModelPreset(
    name="GLM-5.3-Flash",
    hidden_size=4096,
    num_heads=64,
    num_v_heads=64,
    head_dim=128,
    conv_size=4,
    fused_qkv_conv=True,
    gate_form=GateForm.SAFE_SIGMOID,
    lower_bound=-5.0,
    use_a_log=True,
    forget_gate_rank=128,
    output_gate_rank=128,
    output_gate_bias=False,
    norm_eps=1e-5,
    layer_kinds=tuple("mla" if (i + 1) % 4 == 0 else "kda" for i in range(45)),
    mla=None,
    source=(
        "AI-Hypercomputer/maxtext src/maxtext/configs/models/glm5.3-flash.yml @ "
        "efcd1586fa6a42f8dca0aebbcc06f53d82898514; src/maxtext/models/glm5_next.py @ "
        "06304397847ce203b976f17e53631a4b271e434e"
    ),
    notes=(
        "glm5.3-flash.yml gives no MLA widths (glm5_next.py reads q_lora_rank, kv_lora_rank, "
        "qk_nope_head_dim, v_head_dim from the config with fallbacks whose precedence over "
        "MaxText's base config was not checked), so no MLA preset"
    ),
)

PRESETS: dict[str, ModelPreset] = {p.name: p for p in (KIMI_LINEAR_48B, KIMI_K3, GLM_5_3_FLASH)}


# ------------------------------------------------------------------ a whole Kimi Linear checkpoint
class KimiLinearCheckpoint(NamedTuple):
    """What :func:`load_kimi_linear_checkpoint` returns: the preset read from ``config.json``,
    the naming the tensors were found in, and one attention layer per decoder layer (a
    :class:`kda_lib.KimiDeltaAttention` where ``preset.layer_kinds`` says ``"kda"``, a
    :class:`kda_lib.layers.mla.MultiHeadLatentAttention` where it says ``"mla"``)."""

    preset: ModelPreset
    naming: str
    layers: list


def load_kimi_linear_checkpoint(directory, *, naming: str = "auto", **overrides):
    """Every attention layer of a Kimi Linear checkpoint directory (``config.json`` and its
    ``*.safetensors`` shards), built as the config describes and loaded, all or nothing per
    layer.

    The config is read with :meth:`ModelPreset.from_hf_config` (a config
    it cannot represent is refused naming the field); each layer's tensors are read from
    ``model.layers.N.self_attn.`` (``N`` 0-based) in ``naming``: ``"kimi_linear"`` (the
    remote code's names), ``"transformers"`` (the transformers library's), or ``"auto"``
    (told from the first KDA layer's names,
    :func:`kda_lib.layers.checkpoints.detect_kimi_linear_naming`). MLA tensors
    have the same names in both. The layers are built with real parameters (``nnx.Rngs(0)``,
    then overwritten): at the published size this is the whole attention stack in memory.
    ``overrides`` go to both configs (``dtype``, ``param_dtype``; ``implementation`` is a
    KDAConfig field only and is not accepted here).

    Returns:
      :class:`KimiLinearCheckpoint`.
    """
    directory = os.fspath(directory)
    preset = ModelPreset.from_hf_config(_read_config_json(directory))
    shards = sorted(
        os.path.join(directory, name)
        for name in os.listdir(directory)
        if name.endswith(".safetensors")
    )
    if not shards:
        raise ValueError(f"no .safetensors file in {directory!r}")
    if naming not in ("auto", "kimi_linear", "transformers"):
        raise ValueError(f"naming must be 'auto', 'kimi_linear' or 'transformers', got {naming!r}")
    layers = []
    for index, kind in enumerate(preset.layer_kinds):
        prefix = kimi_linear_prefix(index)
        tensors = read_safetensors(shards, prefix)
        if not tensors:
            raise ValueError(f"no tensor named {prefix}* in {directory!r} (a {kind} layer)")
        if kind == "kda":
            if naming == "auto":
                naming = detect_kimi_linear_naming(tensors)
            layer = KimiDeltaAttention(preset.kda_config(**overrides), rngs=nnx.Rngs(0))
        else:
            layer = MultiHeadLatentAttention(preset.mla_config(**overrides), rngs=nnx.Rngs(0))
        load_state_dict(
            layer, tensors, "kimi_linear" if naming == "auto" else naming, prefix=prefix
        )
        layers.append(layer)
    return KimiLinearCheckpoint(preset, naming, layers)


def _read_config_json(directory: str) -> dict:
    config_path = os.path.join(directory, "config.json")
    if not os.path.isfile(config_path):
        raise ValueError(f"no config.json in {directory!r}")
    with open(config_path, encoding="utf-8") as handle:
        try:
            return json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(f"{config_path}: not JSON ({error})") from None
