"""A Hugging Face ``config.json`` (parsed) read into a :class:`kda_lib.models.presets.ModelPreset`.

Two families, told by ``model_type`` (a wrapper's ``text_config`` is read when the top level is
not one of them):

* ``"kimi_linear"`` (Kimi Linear, and Kimi K3's ``text_config``): ``linear_attn_config``'s
  ``kda_layers`` / ``full_attn_layers`` are **1-based** layer numbers; ``gate_lower_bound`` is
  the safe gate ``lb * sigmoid(exp(A_log) (f + dt_bias))``; layout of ``modeling_kimi.py``.
* ``"glm5_next_text"`` (GLM-5.3-Flash, transformers' ``configuration_glm5_next.py``):
  ``linear_num_heads``, ``linear_head_dim``, ``linear_conv_kernel_dim``,
  ``linear_lower_bound``, ``layer_types`` (default: layer ``i`` is KDA unless ``i % 4 == 3``);
  a ``linear_attn_config`` may override them (``num_heads``, ``head_dim``,
  ``short_conv_kernel_size``, ``lower_bound``, ``safe_gate``) and list **0-based**
  ``kda_layers``. Its DSA (sparse MLA) layers are ``"mla"`` kinds without MLA widths.

``linear_attn_config.kda_layer_index_base`` (0 or 1), where given, must agree with the
family's base. Every refusal is a ValueError naming the field.
"""

from __future__ import annotations

import json
import os

from kda_lib.checks import check_int, check_number
from kda_lib.ops.gating import GateForm

MAX_LAYERS = 100_000  # more layers than any model: a config past it is refused, not read
_BASE = {"kimi_linear": 1, "glm5_next_text": 0}
# linear_attn_config keys read (any other may change the layer, so it is refused by name)
HF_LINEAR_ATTN_KEYS = {
    "kimi_linear": (
        "num_heads", "head_dim", "short_conv_kernel_size", "kda_layers", "full_attn_layers",
        "gate_lower_bound", "use_full_rank_gate", "kda_layer_index_base",
    ),
    "glm5_next_text": (
        "num_heads", "head_dim", "short_conv_kernel_size", "lower_bound", "safe_gate",
        "kda_layers", "kda_layer_index_base",
    ),
}  # fmt: skip
_LAYER_TYPES = {
    "linear_attention": "kda",
    "kda_attention": "kda",
    "full_attention": "mla",
    "deepseek_sparse_attention": "mla",
}
_MISSING = object()


def _field(name: str) -> str:
    return f"config field {name}"


def _get(config: dict, key: str, where: str = "", default=_MISSING):
    if key not in config:
        if default is _MISSING:
            raise ValueError(f"{_field(where + key)} is missing (needed for the layer)")
        return default
    return config[key]


def _int(config: dict, key: str, where: str = "", minimum: int = 1, **kw) -> int:
    return check_int(_field(where + key), _get(config, key, where, **kw), minimum)


def _bool(config: dict, key: str, where: str = "", default: bool = False) -> bool:
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{_field(where + key)} must be true or false, got {value!r}")
    return value


def _bound(value, key: str):
    return None if value is None else check_number(_field(key), value)


def text_config(config) -> tuple[dict, str]:
    """``(the model's config, its model_type)``, unwrapped from ``text_config`` when needed."""
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict (a parsed config.json), got {type(config)}")
    if config.get("model_type") not in _BASE and isinstance(config.get("text_config"), dict):
        config = config["text_config"]  # a wrapper (Kimi K3's, GLM-5-Next's multimodal one)
    model_type = config.get("model_type")
    if model_type not in _BASE:
        raise ValueError(
            f"config field model_type must be one of {sorted(_BASE)} (Kimi Linear / Kimi K3, "
            f"GLM-5-Next), got {model_type!r}"
        )
    return config, model_type


def _linear_attn(config: dict, model_type: str, required: bool) -> dict:
    linear = _get(config, "linear_attn_config", default=_MISSING if required else {})
    if not isinstance(linear, dict):
        raise ValueError(f"{_field('linear_attn_config')} must be a dict, got {linear!r}")
    unknown = sorted(set(linear) - set(HF_LINEAR_ATTN_KEYS[model_type]))
    if unknown:
        raise ValueError(
            f"{_field('linear_attn_config')} has keys {unknown} that from_hf_config does not "
            f"read and that may change the layer (read: {list(HF_LINEAR_ATTN_KEYS[model_type])})"
        )
    base = linear.get("kda_layer_index_base", _BASE[model_type])
    if base != _BASE[model_type] or isinstance(base, bool):
        raise ValueError(
            f"{_field('linear_attn_config.kda_layer_index_base')} must be {_BASE[model_type]} "
            f"for model_type {model_type!r} (its layer lists' base), got {base!r}"
        )
    return linear


def _num_layers(config: dict) -> int:
    count = _int(config, "num_hidden_layers")
    if count > MAX_LAYERS:
        raise ValueError(
            f"{_field('num_hidden_layers')} must be <= {MAX_LAYERS} (no model has more), got "
            f"{count}"
        )
    return count


def layer_kinds_from_lists(lists: dict, num_layers: int, base: int, complete=True) -> tuple:
    """``layer_kinds`` from layer lists (``{"linear_attn_config.kda_layers": [...], ...}``,
    the first list's layers ``"kda"``, the others ``"mla"``) numbered from ``base``; each
    layer in at most one list (``complete``: in exactly one; else an unlisted one is
    ``"mla"``)."""
    owner: dict[int, str] = {}
    for field, layers in lists.items():
        if not isinstance(layers, (list, tuple)):
            raise ValueError(
                f"{_field(field)} must be a list of layer numbers, got {layers!r:.200}"
            )
        for number in layers:
            check_int(f"{_field(field)} entry", number, base)
            if number >= num_layers + base:
                raise ValueError(
                    f"{_field(field)} lists layer {number}, beyond num_hidden_layers="
                    f"{num_layers} (the numbers are {base}-based)"
                )
            if number in owner:
                where = "twice" if owner[number] == field else f"also in {owner[number]}"
                raise ValueError(f"{_field(field)} lists layer {number} {where}")
            owner[number] = field
    missing = [n for n in range(base, num_layers + base) if n not in owner]
    if missing and complete:
        shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise ValueError(
            f"config fields {' / '.join(lists)} leave {len(missing)} layers in no list: "
            f"[{shown}] ({base}-based; num_hidden_layers={num_layers})"
        )
    first = next(iter(lists))
    return tuple("kda" if owner.get(n) == first else "mla" for n in range(base, num_layers + base))


def layer_kinds_from_types(layer_types, num_layers: int) -> tuple[str, ...]:
    """``layer_kinds`` from ``layer_types`` (one known string per layer)."""
    if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
        raise ValueError(
            f"{_field('layer_types')} must be a list of strings, got {layer_types!r:.200}"
        )
    if len(layer_types) != num_layers:
        raise ValueError(
            f"{_field('layer_types')} has {len(layer_types)} entries, num_hidden_layers is "
            f"{num_layers}"
        )
    unknown = sorted(set(layer_types) - set(_LAYER_TYPES))
    if unknown:
        raise ValueError(
            f"{_field('layer_types')}: unknown types {unknown[:8]} ({list(_LAYER_TYPES)})"
        )
    return tuple(_LAYER_TYPES[t] for t in layer_types)


def _agree(kinds: tuple, config: dict, num_layers: int, lists: str) -> tuple:
    if config.get("layer_types") is not None:
        if layer_kinds_from_types(config["layer_types"], num_layers) != kinds:
            raise ValueError(f"{_field('layer_types')} disagrees with {lists}")
    return kinds


def _mla(config: dict, shape_cls):
    """The MLA widths of a Kimi Linear config (NoPE only)."""
    rope = _int(config, "qk_rope_head_dim", minimum=0)
    if rope and not _bool(config, "mla_use_nope"):
        raise ValueError(
            f"{_field('mla_use_nope')} must be true (or qk_rope_head_dim 0): "
            "MultiHeadLatentAttention has no rotary embedding; the shared key part is used "
            "unrotated only in the NoPE form"
        )
    q_rank = _get(config, "q_lora_rank", default=None)
    return shape_cls(
        num_heads=_int(config, "num_attention_heads"),
        head_dim=_int(config, "qk_nope_head_dim", minimum=0),
        value_head_dim=_int(config, "v_head_dim"),
        kv_lora_rank=_int(config, "kv_lora_rank"),
        q_lora_rank=None if q_rank is None else _int(config, "q_lora_rank"),
        shared_key_dim=rope,
        norm_eps=1e-6,  # KimiRMSNorm's default: kv_a_layernorm is built without an eps
        output_gate=_bool(config, "mla_use_output_gate"),
    )


def _kimi_fields(config: dict, shape_cls) -> dict:
    """The preset fields of a ``kimi_linear`` config (the layout of ``modeling_kimi.py``)."""
    linear, lin = _linear_attn(config, "kimi_linear", True), "linear_attn_config."
    num_layers, head_dim = _num_layers(config), _int(linear, "head_dim", lin)
    lists = {lin + key: _get(linear, key, lin) for key in ("kda_layers", "full_attn_layers")}
    kinds = layer_kinds_from_lists(lists, num_layers, base=1)
    return dict(
        num_heads=_int(linear, "num_heads", lin),
        head_dim=head_dim,
        conv_size=_int(linear, "short_conv_kernel_size", lin),
        fused_qkv_conv=False,
        lower_bound=_bound(linear.get("gate_lower_bound"), lin + "gate_lower_bound"),
        output_gate_rank=None if _bool(linear, "use_full_rank_gate", lin) else head_dim,
        layer_kinds=_agree(kinds, config, num_layers, "linear_attn_config's layer lists"),
        mla=_mla(config, shape_cls),
        notes="the layout fixed by modeling_kimi.py; see ModelPreset.from_hf_config",
    )


def _glm_fields(config: dict, shape_cls) -> dict:
    """The preset fields of a ``glm5_next_text`` config (the layout of MaxText's
    ``glm5_next.py``: one fused q/k/v conv)."""
    linear, lin = _linear_attn(config, "glm5_next_text", False), "linear_attn_config."
    num_layers = _num_layers(config)

    def width(key, glm_key, default):  # linear_attn_config overrides the flat field
        if key in linear:
            return _int(linear, key, lin)
        return _int(config, glm_key, default=default)

    heads, head_dim = (
        width("num_heads", "linear_num_heads", 64),
        width("head_dim", "linear_head_dim", 128),
    )
    conv = width("short_conv_kernel_size", "linear_conv_kernel_dim", 4)
    if "lower_bound" in linear:
        bound = _bound(linear["lower_bound"], lin + "lower_bound")
    else:
        bound = _bound(config.get("linear_lower_bound", -5.0), "linear_lower_bound")
    if bound is None and _bool(linear, "safe_gate", lin):
        bound = -5.0  # configuration_glm5_next.py: safe_gate without a bound means -5
    if "kda_layers" in linear:
        lists = {lin + "kda_layers": linear["kda_layers"]}
        kinds = layer_kinds_from_lists(lists, num_layers, base=0, complete=False)
        kinds = _agree(kinds, config, num_layers, lin + "kda_layers (0-based)")
    elif config.get("layer_types") is not None:
        kinds = layer_kinds_from_types(config["layer_types"], num_layers)
    else:
        kinds = tuple("mla" if i % 4 == 3 else "kda" for i in range(num_layers))
    return dict(
        num_heads=heads,
        head_dim=head_dim,
        conv_size=conv,
        fused_qkv_conv=True,
        lower_bound=bound,
        output_gate_rank=head_dim,
        layer_kinds=kinds,
        mla=None,
        notes="DSA (sparse MLA) layers: no MLA widths; the KDA layout of MaxText's glm5_next.py",
    )


def preset_from_hf_config(cls, mla_cls, config, name=None):
    """The :class:`~kda_lib.models.presets.ModelPreset` (``cls``, its MLA widths ``mla_cls``) a
    parsed ``config.json`` describes (see :meth:`ModelPreset.from_hf_config`)."""
    config, model_type = text_config(config)
    read = _kimi_fields if model_type == "kimi_linear" else _glm_fields
    fields = read(config, mla_cls)
    eps = check_number(_field("rms_norm_eps"), _get(config, "rms_norm_eps"), positive=True)
    return cls(
        name=name if name is not None else (config.get("_name_or_path") or model_type),
        hidden_size=_int(config, "hidden_size"),
        num_v_heads=fields["num_heads"],
        gate_form=GateForm.SOFTPLUS if fields["lower_bound"] is None else GateForm.SAFE_SIGMOID,
        use_a_log=True,
        forget_gate_rank=fields["head_dim"],
        output_gate_bias=False,
        norm_eps=eps,
        source=f"Hugging Face config.json (model_type {model_type}), read by from_hf_config",
        **fields,
    )


def read_config_json(directory: str) -> dict:
    """``directory/config.json`` parsed, or a ValueError naming the file."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"no config.json in {directory!r}")
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error})") from None
    except (json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
