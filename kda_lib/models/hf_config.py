"""A Hugging Face ``config.json`` (parsed) read into :class:`kda_lib.models.presets.ModelPreset`'s
fields: one reader for both families, told by ``model_type`` (a wrapper's ``text_config`` is
read when the top level is neither).

* ``"kimi_linear"`` (Kimi Linear, Kimi K3's ``text_config``; ``modeling_kimi.py``'s layout):
  ``linear_attn_config`` holds the widths and **1-based** ``kda_layers`` / ``full_attn_layers``;
  ``gate_lower_bound`` is the safe gate ``lb * sigmoid(exp(A_log) (f + dt_bias))``, as the
  published model computes it; ``use_full_rank_gate`` a full-rank output gate; NoPE MLA widths.
* ``"glm5_next_text"`` (GLM-5.3-Flash, transformers' ``configuration_glm5_next.py``; MaxText's
  fused q/k/v conv): flat ``linear_num_heads``, ``linear_head_dim``, ``linear_conv_kernel_dim``,
  ``linear_lower_bound`` (defaults 64, 128, 4, -5), which a ``linear_attn_config`` may override
  (``safe_gate`` without a bound: -5), with **0-based** ``kda_layers``; else ``layer_types``;
  else layer ``i`` is KDA unless ``i % 4 == 3``. Its DSA layers are ``"mla"`` without widths.

``linear_attn_config.kda_layer_index_base`` (0 or 1), where given, must be the family's base.
Every refusal is a ValueError naming the field (``config field ...``).
"""

from __future__ import annotations

import json
import os

from kda_lib.checks import check_int, check_number

MAX_LAYERS = 100_000  # more layers than any model: a config past it is refused, not read
LIN = "linear_attn_config."
# per family: the layer lists' base; the linear_attn_config keys read (any other may change the
# layer: refused by name); the key of the gate's bound; flat fields (and defaults) standing in
# for an absent linear_attn_config key
_FAMILIES = {
    "kimi_linear": dict(
        base=1,
        keys=("num_heads", "head_dim", "short_conv_kernel_size", "kda_layers", "full_attn_layers",
              "gate_lower_bound", "use_full_rank_gate", "kda_layer_index_base"),
        bound="gate_lower_bound",
        flat={"gate_lower_bound": (None, None)},
    ),
    "glm5_next_text": dict(
        base=0,
        keys=("num_heads", "head_dim", "short_conv_kernel_size", "lower_bound", "safe_gate",
              "kda_layers", "kda_layer_index_base"),
        bound="lower_bound",
        flat={"num_heads": ("linear_num_heads", 64), "head_dim": ("linear_head_dim", 128),
              "short_conv_kernel_size": ("linear_conv_kernel_dim", 4),
              "lower_bound": ("linear_lower_bound", -5.0)},
    ),
}  # fmt: skip
_LAYER_TYPES = {"linear_attention": "kda", "kda_attention": "kda", "full_attention": "mla",
                "deepseek_sparse_attention": "mla"}  # fmt: skip
_WIDTHS = ("num_heads", "head_dim", "short_conv_kernel_size")
_MISSING = object()


def _get(config: dict, key: str, where: str = "", default=_MISSING):
    if key in config:
        return config[key]
    if default is _MISSING:
        raise ValueError(f"config field {where}{key} is missing (needed for the layer)")
    return default


def _int(config: dict, key: str, minimum: int = 1) -> int:
    return check_int(f"config field {key}", _get(config, key), minimum)


def _bool(config: dict, key: str, where: str = "") -> bool:
    value = config.get(key)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"config field {where}{key} must be true or false, got {value!r}")
    return bool(value)


def text_config(config) -> tuple[dict, str]:
    """``(the model's config, its model_type)``, unwrapped from ``text_config`` when needed."""
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict (a parsed config.json), got {type(config)}")
    if config.get("model_type") not in _FAMILIES and isinstance(config.get("text_config"), dict):
        config = config["text_config"]  # a wrapper (Kimi K3's, GLM-5-Next's multimodal one)
    if (model_type := config.get("model_type")) not in _FAMILIES:
        raise ValueError(
            f"config field model_type must be one of {sorted(_FAMILIES)} (Kimi Linear / Kimi "
            f"K3, GLM-5-Next), got {model_type!r}"
        )
    return config, model_type


def _linear_attn(config: dict, model_type: str) -> dict:
    family = _FAMILIES[model_type]
    linear = _get(config, "linear_attn_config", default=_MISSING if family["base"] else {})
    if not isinstance(linear, dict):
        raise ValueError(f"config field linear_attn_config must be a dict, got {linear!r:.200}")
    if unknown := sorted(set(linear) - set(family["keys"])):
        raise ValueError(
            f"config field linear_attn_config has keys {unknown} that from_hf_config does not "
            f"read and that may change the layer (read: {list(family['keys'])})"
        )
    base = linear.get("kda_layer_index_base", family["base"])
    if base != family["base"] or isinstance(base, bool):
        raise ValueError(
            f"config field {LIN}kda_layer_index_base must be {family['base']} for model_type "
            f"{model_type!r} (its layer lists' base), got {base!r}"
        )
    return linear


def _width(config: dict, linear: dict, model_type: str, key: str):
    """``linear_attn_config[key]``, else the family's flat field (or its default), with the
    field's name; missing from both: a refusal naming ``linear_attn_config.key``."""
    if key in linear or key not in _FAMILIES[model_type]["flat"]:
        return _get(linear, key, LIN), LIN + key
    flat, default = _FAMILIES[model_type]["flat"][key]
    return (default, key) if flat is None else (config.get(flat, default), flat)


def layer_kinds_from_lists(lists: dict, num_layers: int, base: int, complete=True) -> tuple:
    """``layer_kinds`` from layer lists (``{"linear_attn_config.kda_layers": [...], ...}``,
    the first list's layers ``"kda"``, the others ``"mla"``) numbered from ``base``; each
    layer in at most one list (``complete``: in exactly one; else an unlisted one is
    ``"mla"``)."""
    owner: dict[int, str] = {}
    for field, layers in lists.items():
        if not isinstance(layers, (list, tuple)):
            raise ValueError(f"config field {field} must be a list of layer numbers, got "
                             f"{layers!r:.200}")  # fmt: skip
        for number in layers:
            check_int(f"config field {field} entry", number, base)
            if number >= num_layers + base:
                raise ValueError(
                    f"config field {field} lists layer {number}, beyond num_hidden_layers="
                    f"{num_layers} (the numbers are {base}-based)"
                )
            if number in owner:
                where = "twice" if owner[number] == field else f"also in {owner[number]}"
                raise ValueError(f"config field {field} lists layer {number} {where}")
            owner[number] = field
    missing = [n for n in range(base, num_layers + base) if n not in owner]
    if missing and complete:  # at most 8 shown: a huge num_hidden_layers stays a short message
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
            f"config field layer_types must be a list of strings, got {layer_types!r:.200}"
        )
    if len(layer_types) != num_layers:
        raise ValueError(
            f"config field layer_types has {len(layer_types)} entries, num_hidden_layers is "
            f"{num_layers}"
        )
    if unknown := sorted(set(layer_types) - set(_LAYER_TYPES)):
        raise ValueError(
            f"config field layer_types: unknown types {unknown[:8]} ({list(_LAYER_TYPES)})"
        )
    return tuple(_LAYER_TYPES[t] for t in layer_types)


def _layer_kinds(config: dict, linear: dict, model_type: str) -> tuple[str, ...]:
    num_layers, types = _int(config, "num_hidden_layers"), config.get("layer_types")
    if num_layers > MAX_LAYERS:
        raise ValueError(f"config field num_hidden_layers must be <= {MAX_LAYERS} (no model "
                         f"has more), got {num_layers}")  # fmt: skip
    if model_type == "kimi_linear":
        lists = {LIN + key: _get(linear, key, LIN) for key in ("kda_layers", "full_attn_layers")}
        kinds, what = layer_kinds_from_lists(lists, num_layers, 1), "linear_attn_config's lists"
    elif "kda_layers" in linear:
        lists, what = {LIN + "kda_layers": linear["kda_layers"]}, LIN + "kda_layers (0-based)"
        kinds = layer_kinds_from_lists(lists, num_layers, 0, complete=False)
    elif types is not None:
        return layer_kinds_from_types(types, num_layers)
    else:
        return tuple("mla" if i % 4 == 3 else "kda" for i in range(num_layers))
    if types is not None and layer_kinds_from_types(types, num_layers) != kinds:
        raise ValueError(f"config field layer_types disagrees with {what}")
    return kinds


def _mla(config: dict) -> dict:
    """The MLA widths of a Kimi Linear config (NoPE only), as :class:`MLAShape` fields."""
    rope = _int(config, "qk_rope_head_dim", minimum=0)
    if rope and not _bool(config, "mla_use_nope"):
        raise ValueError(
            "config field mla_use_nope must be true (or qk_rope_head_dim 0): "
            "MultiHeadLatentAttention has no rotary embedding; the shared key part is used "
            "unrotated only in the NoPE form"
        )
    q_rank = _get(config, "q_lora_rank", default=None)
    return dict(
        num_heads=_int(config, "num_attention_heads"),
        head_dim=_int(config, "qk_nope_head_dim", minimum=0),
        value_head_dim=_int(config, "v_head_dim"),
        kv_lora_rank=_int(config, "kv_lora_rank"),
        q_lora_rank=None if q_rank is None else _int(config, "q_lora_rank"),
        shared_key_dim=rope,
        norm_eps=1e-6,  # KimiRMSNorm's default: kv_a_layernorm is built without an eps
        output_gate=_bool(config, "mla_use_output_gate"),
    )


def preset_fields(config) -> dict:
    """The fields of the :class:`~kda_lib.models.presets.ModelPreset` a parsed ``config.json``
    describes (``mla``: :class:`MLAShape` fields, or None; ``name``: ``_name_or_path``, else
    the model type)."""
    config, model_type = text_config(config)
    linear = _linear_attn(config, model_type)
    width = {key: _width(config, linear, model_type, key) for key in _WIDTHS}
    heads, head_dim, conv = (check_int(f"config field {f}", v) for v, f in width.values())
    bound, field = _width(config, linear, model_type, _FAMILIES[model_type]["bound"])
    bound = None if bound is None else check_number(f"config field {field}", bound)
    if bound is None and _bool(linear, "safe_gate", LIN):
        bound = -5.0  # configuration_glm5_next.py: safe_gate without a bound means -5
    kimi = model_type == "kimi_linear"
    rms = check_number("config field rms_norm_eps", _get(config, "rms_norm_eps"), positive=True)
    return dict(
        name=config.get("_name_or_path") or model_type,
        hidden_size=_int(config, "hidden_size"),
        num_heads=heads,
        num_v_heads=heads,
        head_dim=head_dim,
        conv_size=conv,
        fused_qkv_conv=not kimi,
        gate_form="softplus" if bound is None else "safe_sigmoid",
        lower_bound=bound,
        use_a_log=True,
        forget_gate_rank=head_dim,
        output_gate_rank=None if _bool(linear, "use_full_rank_gate", LIN) else head_dim,
        output_gate_bias=False,
        norm_eps=rms,
        layer_kinds=_layer_kinds(config, linear, model_type),
        mla=_mla(config) if kimi else None,
        source=f"Hugging Face config.json (model_type {model_type}), read by from_hf_config",
        notes="the KDA layout of " + ("modeling_kimi.py" if kimi else "MaxText's glm5_next.py"),
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
