"""The published models that use KDA (:data:`PRESETS`): each one's KDA layer, layer pattern and
MLA widths, with the source of the numbers; :meth:`ModelPreset.from_hf_config` reads a parsed
Hugging Face ``config.json`` (:mod:`.hf_config`)."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections import namedtuple
from collections.abc import Sequence

from flax import nnx

from kda_lib.checks import MAX_LAYERS, is_number, shared_fields
from kda_lib.layers.attention import check_fields
from kda_lib.layers.checkpoints import (
    detect_kimi_linear_naming,
    kimi_linear_prefix,
    load_state_dict,
    read_safetensors,
)
from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention
from kda_lib.layers.mla import MLAConfig, MultiHeadLatentAttention
from kda_lib.models import hf_config
from kda_lib.ops.gating import LOWER_BOUND_RANGE, GateForm, check_gate_form


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLAShape:
    """A published MLA layer's widths in :class:`~kda_lib.layers.mla.MLAConfig`'s names, plus
    ``output_gate`` of rank ``output_gate_rank`` (None: full), which that layer lacks."""

    num_heads: int
    head_dim: int
    value_head_dim: int
    kv_lora_rank: int
    q_lora_rank: int | None = None
    shared_key_dim: int
    norm_eps: float = 1e-6  # KimiRMSNorm's default: kv_a_layernorm is built without an eps
    output_gate: bool = False
    output_gate_rank: int | None = None

    def __post_init__(self):
        check_fields(self, int="num_heads kv_lora_rank value_head_dim",
                     int0="head_dim shared_key_dim", width="q_lora_rank output_gate_rank",
                     bool="output_gate", eps="norm_eps")  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelPreset:
    """A published model: the KDA fields in :class:`kda_lib.KDAConfig`'s names, ``layer_kinds``
    (``"kda"`` or ``"mla"``, the global layer), ``mla`` (its widths or None), ``source``
    (repository, path and commit of the numbers) and ``notes``."""

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
        check_fields(self, int="hidden_size num_heads num_v_heads head_dim", int0="conv_size",
                     width="forget_gate_rank output_gate_rank", eps="norm_eps",
                     bool="fused_qkv_conv use_a_log output_gate_bias")  # fmt: skip
        bound = self.lower_bound  # a bound on a log-space decay: every form's gate is <= 0
        if bound is not None and not (is_number(bound) and -math.inf < bound < 0):
            raise ValueError("ModelPreset.lower_bound must be a negative float (the bound on the "
                             f"log decay) or None (the softplus gate), got {bound!r}")  # fmt: skip
        object.__setattr__(self, "lower_bound", None if bound is None else float(bound))
        if self.num_v_heads % self.num_heads:
            raise ValueError(f"ModelPreset.num_v_heads must be a multiple of num_heads="
                             f"{self.num_heads}, got {self.num_v_heads}")  # fmt: skip
        form = check_gate_form(self.gate_form, self.lower_bound, where="ModelPreset.gate_form")
        object.__setattr__(self, "gate_form", form)  # a string is stored as the enum
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ModelPreset.name must be a non-empty str, got {self.name!r}")
        kinds = self.layer_kinds
        if isinstance(kinds, str) or not isinstance(kinds, Sequence) or not kinds:
            raise ValueError(f"ModelPreset.layer_kinds must be a tuple of 'kda' and 'mla', one "
                             f"per layer, got {kinds!r:.200}")  # fmt: skip
        if len(kinds) > MAX_LAYERS:
            raise ValueError(f"ModelPreset.layer_kinds must list at most {MAX_LAYERS:,} layers "
                             f"(more than any model), got {len(kinds):,}")  # fmt: skip
        if unknown := sorted(set(kinds) - {"kda", "mla"}, key=repr):
            raise ValueError(f"ModelPreset.layer_kinds: unknown kinds {unknown} (kda, mla)")
        object.__setattr__(self, "layer_kinds", tuple(kinds))
        if self.mla is not None and not isinstance(self.mla, MLAShape):
            raise ValueError(f"ModelPreset.mla must be an MLAShape or None, got {self.mla!r:.200}")

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

    @classmethod
    def from_hf_config(cls, config: dict, *, name: str | None = None) -> ModelPreset:
        """The preset a parsed ``config.json`` describes (``name``: ``_name_or_path``)."""
        fields = hf_config.preset_fields(config) | ({} if name is None else {"name": name})
        return cls(**fields | {"mla": fields["mla"] and MLAShape(**fields["mla"])})

    def kda_parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The KDA layer's parameter shapes by path (``"q_proj.kernel": (d, H K)``, ...)."""
        gate = dict(gate_form=GateForm.SAFE_SIGMOID, lower_bound=LOWER_BOUND_RANGE[0])
        return dict(_shapes(KDAConfig(**shared_fields(self, KDAConfig) | gate)))  # no gate shape

    def kda_parameter_count(self) -> int:
        """Scalars in one KDA layer."""
        return sum(math.prod(shape) for shape in self.kda_parameter_shapes().values())

    def mla_parameter_count(self) -> int:
        """Scalars in one MLA layer, with its output gate where the model has one."""
        m = self._mla_or_raise()
        shapes = _shapes(MLAConfig(hidden_size=self.hidden_size, **shared_fields(m, MLAConfig)))
        count = sum(math.prod(shape) for shape in shapes.values())
        d, r, hv = self.hidden_size, m.output_gate_rank, m.num_heads * m.value_head_dim
        if m.output_gate:
            count += d * hv if r is None else d * r + r * hv + m.value_head_dim
        return count

    def unsupported_options(self) -> list[str]:
        """The options this preset needs that :class:`kda_lib.KimiDeltaAttention` lacks."""
        missing, low, bound = [], LOWER_BOUND_RANGE[0], self.lower_bound
        if not self.use_a_log and self.gate_form is GateForm.SOFTPLUS:
            missing.append("the softplus gate without A_log (a bounded gate has a rate-free form)")
        if bound is not None and bound < low:
            missing.append(f"lower_bound={bound:g}, below the layer's range [{low:g}, 0)")
        return missing

    def kda_config(self, **overrides) -> KDAConfig:
        """This KDA layer's config (with ``overrides``), or NotImplementedError naming gaps."""
        if missing := self.unsupported_options():
            raise NotImplementedError(f"{self.name}: KimiDeltaAttention cannot express this "
                                      "layer yet; missing " + "; ".join(missing))  # fmt: skip
        return _with_overrides(KDAConfig, shared_fields(self, KDAConfig), overrides, "kda_config")

    def _mla_or_raise(self) -> MLAShape:
        if self.mla is None:
            raise NotImplementedError(f"{self.name}: the source gives no MLA widths ({self.notes})")
        return self.mla

    def mla_config(self, **overrides) -> MLAConfig:
        """The global layer's ``MLAConfig`` (NoPE), or NotImplementedError (no widths, a gate)."""
        m = self._mla_or_raise()
        if m.output_gate:
            raise NotImplementedError(f"{self.name}: MultiHeadLatentAttention has no output "
                                      "gate (mla_use_output_gate)")  # fmt: skip
        fields = {"hidden_size": self.hidden_size} | shared_fields(m, MLAConfig)
        return _with_overrides(MLAConfig, fields, overrides, "mla_config")


def _with_overrides(cls, fields: dict, overrides: dict, method: str):
    """``cls(**fields | overrides)``; an override that is no field of ``cls`` refused by name
    (before: Python's own 'unexpected keyword argument')."""
    if unknown := sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)}):
        raise TypeError(f"ModelPreset.{method} got overrides {unknown} that {cls.__name__} "
                        "has no field for")  # fmt: skip
    return cls(**fields | overrides)


def _eval_shape(config):
    """The layer ``config`` builds, as shapes only (``nnx.eval_shape``: nothing allocated)."""
    layer = KimiDeltaAttention if isinstance(config, KDAConfig) else MultiHeadLatentAttention
    return nnx.eval_shape(lambda: layer(config, rngs=nnx.Rngs(0)))


@functools.lru_cache(maxsize=32)
def _shapes(config) -> dict[str, tuple[int, ...]]:
    flat = nnx.to_flat_state(nnx.state(_eval_shape(config), nnx.Param))
    return {".".join(map(str, path)): tuple(variable.shape) for path, variable in flat}


def _check_preset(preset) -> ModelPreset:
    if not isinstance(preset, ModelPreset):
        raise TypeError(f"preset must be a ModelPreset (e.g. PRESETS[name]), got "
                        f"{type(preset).__name__}")  # fmt: skip
    return preset


def build_kda_layer(preset: ModelPreset, **overrides) -> KimiDeltaAttention:
    """The preset's KDA layer as shapes only (``nnx.eval_shape``: no parameter memory)."""
    return _eval_shape(_check_preset(preset).kda_config(**overrides))


def build_mla_layer(preset: ModelPreset, **overrides) -> MultiHeadLatentAttention:
    """The preset's MLA layer as shapes only (``nnx.eval_shape``)."""
    return _eval_shape(_check_preset(preset).mla_config(**overrides))


def _kinds(num_layers: int, global_layers_1based) -> tuple[str, ...]:
    return tuple("mla" if i + 1 in global_layers_1based else "kda" for i in range(num_layers))


# Kimi Linear's KDA layout, which all three share (modeling_kimi.py; MaxText's kda.py, glm5_next.py)
_KIMI = dict(head_dim=128, conv_size=4, fused_qkv_conv=False, use_a_log=True,
             forget_gate_rank=128, output_gate_bias=False, norm_eps=1e-5)  # fmt: skip
_KIMI_MLA = dict(head_dim=128, value_head_dim=128, kv_lora_rank=512, shared_key_dim=64)

KIMI_LINEAR_48B = ModelPreset(
    **_KIMI, name="Kimi-Linear-48B-A3B", hidden_size=2304, num_heads=32, num_v_heads=32,
    gate_form="softplus", lower_bound=None, output_gate_rank=128,
    layer_kinds=_kinds(27, (4, 8, 12, 16, 20, 24, 27)), mla=MLAShape(**_KIMI_MLA, num_heads=32),
    source="HF config.json of moonshotai/Kimi-Linear-48B-A3B-Instruct (stored copy: "
    "Firworks/Kimi-Linear-48B-A3B-Instruct-nvfp4); modeling_kimi.py via axolotl-ai-cloud/axolotl "
    "src/axolotl/monkeypatch/models/kimi_linear/modeling_kimi.py @ "
    "1e4d015475e3f5d48e6fb5517484f0bfd08b96bd",
    notes="v_head_dim 128 from NVIDIA-NeMo/Megatron-Bridge's test fixture",
)  # fmt: skip

KIMI_K3 = ModelPreset(
    **_KIMI, name="Kimi-K3", hidden_size=7168, num_heads=96, num_v_heads=96,
    gate_form="safe_sigmoid", lower_bound=-5.0, output_gate_rank=None,  # use_full_rank_gate
    layer_kinds=_kinds(93, (*range(4, 93, 4), 93)),
    mla=MLAShape(**_KIMI_MLA, num_heads=96, q_lora_rank=1536, output_gate=True),
    source="text_config of moonshotai/Kimi-K3 config.json as stored in lablup/mlxcel "
    "src/models/kimi_k3_tests.rs (PUBLISHED_CONFIG) @ 1b37521e5afafc982e4eda4d1f126dc29d57df95",
    notes="MaxText's bring-up (kda.py @ bf801f4) clamps the gate and gives the MLA output gate "
    "rank 128; the published model has the safe sigmoid gate and a full-rank MLA output gate",
)  # fmt: skip

GLM_5_3_FLASH = ModelPreset(
    **_KIMI | {"fused_qkv_conv": True}, name="GLM-5.3-Flash", hidden_size=4096, num_heads=64,
    num_v_heads=64, gate_form="safe_sigmoid", lower_bound=-5.0, output_gate_rank=128,
    layer_kinds=_kinds(45, range(4, 46, 4)), mla=None,
    source="huggingface/transformers src/transformers/models/glm5_next/configuration_glm5_next"
    ".py @ 02106f7d89617f572b33cbd27dc3e3fed63866e9; AI-Hypercomputer/maxtext "
    "src/maxtext/models/glm5_next.py @ 06304397847ce203b976f17e53631a4b271e434e (fused conv)",
    notes="the global layers are DeepSeek sparse attention (MLA with an indexer), which "
    "MultiHeadLatentAttention does not have",
)  # fmt: skip

PRESETS: dict[str, ModelPreset] = {p.name: p for p in (KIMI_LINEAR_48B, KIMI_K3, GLM_5_3_FLASH)}

# what load_kimi_linear_checkpoint returns: one layer per preset.layer_kinds
KimiLinearCheckpoint = namedtuple("KimiLinearCheckpoint", "preset naming layers")


def load_kimi_linear_checkpoint(directory, *, naming: str = "auto", **overrides):
    """Every attention layer of a Kimi Linear checkpoint directory (``config.json``,
    ``*.safetensors``). ``naming``: "kimi_linear", "transformers" or "auto" (from the first KDA
    layer); ``overrides``: fields of :class:`kda_lib.KDAConfig` (e.g. ``chunk_size``,
    ``implementation``) or :class:`~kda_lib.layers.mla.MLAConfig`, each given to the layers
    whose config has it (a name neither has is refused). A shard replaced during the load is
    refused."""
    if naming not in ("auto", "kimi_linear", "transformers"):
        raise ValueError(f"naming must be 'auto', 'kimi_linear' or 'transformers', got {naming!r}")
    fields = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (KDAConfig, MLAConfig)}
    if unknown := sorted(set(overrides).difference(*fields.values())):
        raise TypeError(f"load_kimi_linear_checkpoint got overrides {unknown} that neither "
                        f"KDAConfig nor MLAConfig has")  # fmt: skip
    routed = {cls: {n: v for n, v in overrides.items() if n in names}
              for cls, names in fields.items()}  # fmt: skip
    preset = ModelPreset.from_hf_config(hf_config.read_config_json(directory))
    directory = os.fspath(directory)
    configs = {kind: (KimiDeltaAttention, preset.kda_config(**routed[KDAConfig])) if kind == "kda"
               else (MultiHeadLatentAttention, preset.mla_config(**routed[MLAConfig]))
               for kind in set(preset.layer_kinds)}  # fmt: skip  # checked before any read
    shards = sorted(os.path.join(directory, n) for n in os.listdir(directory)
                    if n.endswith(".safetensors"))  # fmt: skip
    if not shards:
        raise ValueError(f"no .safetensors file in {directory!r}")
    versions, headers, layers = {}, {}, []  # each shard's version and header at its first read
    for index, kind in enumerate(preset.layer_kinds):
        prefix = kimi_linear_prefix(index)
        tensors = read_safetensors(shards, prefix, versions=versions, headers=headers)
        if not tensors:
            raise ValueError(f"no tensor named {prefix}* in {directory!r} (a {kind} layer)")
        if kind == "kda":
            naming = detect_kimi_linear_naming(tensors) if naming == "auto" else naming
        cls, config = configs[kind]
        layer = nnx.eval_shape(lambda c=cls, cfg=config: c(cfg, rngs=nnx.Rngs(0)))  # shapes only
        read_as = "kimi_linear" if naming == "auto" else naming  # no KDA layer seen yet
        load_state_dict(layer, tensors, read_as, prefix=prefix)
        layers.append(layer)
    return KimiLinearCheckpoint(preset, naming, layers)
