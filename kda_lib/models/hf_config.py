"""A parsed Hugging Face ``config.json`` read into :class:`~kda_lib.models.presets.ModelPreset`'s
fields by ``model_type``: ``"kimi_linear"`` (Kimi Linear, Kimi K3) or ``"glm5_next_text"``
(GLM-5.3-Flash). Refusals name the field (DESIGN section 2)."""

from __future__ import annotations

import json
import os
import stat

from kda_lib.checks import MAX_LAYERS, check_int, check_number

MAX_CONFIG_BYTES = 2**24  # 16 MiB: published config.json files are a few KiB
LIN = "linear_attn_config."
_WIDTHS = ("num_heads", "head_dim", "short_conv_kernel_size")
# model_type -> layer lists' base, linear_attn_config keys read (others refused), the gate
# bound's key, flat fields (and defaults) standing in for absent linear_attn_config keys
_FAMILIES = {
    "kimi_linear": (1, (*_WIDTHS, "kda_layers", "full_attn_layers", "gate_lower_bound",
                        "use_full_rank_gate", "kda_layer_index_base"),
                    "gate_lower_bound", {"gate_lower_bound": (None, None)}),
    "glm5_next_text": (0, (*_WIDTHS, "lower_bound", "safe_gate", "kda_layers",
                           "kda_layer_index_base"),
                       "lower_bound", {"num_heads": ("linear_num_heads", 64),
                                       "head_dim": ("linear_head_dim", 128),
                                       "short_conv_kernel_size": ("linear_conv_kernel_dim", 4),
                                       "lower_bound": ("linear_lower_bound", -5.0)}),
}  # fmt: skip
_LAYER_TYPES = {"linear_attention": "kda", "kda_attention": "kda", "full_attention": "mla",
                "deepseek_sparse_attention": "mla"}  # fmt: skip


def _get(config: dict, key: str, where: str = ""):
    if key not in config:
        raise ValueError(f"config field {where}{key} is missing (needed for the layer)")
    return config[key]


def _int(config: dict, key: str, minimum: int = 1) -> int:
    return check_int(f"config field {key}", _get(config, key), minimum)


def _bool(config: dict, key: str, where: str = "") -> bool:
    value = config.get(key)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"config field {where}{key} must be true or false, got {value!r}")
    return bool(value)


def _linear_attn(config, model_type: str) -> dict:
    base, keys = _FAMILIES[model_type][:2]
    linear = _get(config, "linear_attn_config") if base else config.get("linear_attn_config", {})
    if not isinstance(linear, dict):
        raise ValueError(f"config field linear_attn_config must be a dict, got {linear!r:.200}")
    if unknown := sorted(set(linear) - set(keys)):
        raise ValueError(f"config field linear_attn_config has keys {unknown} that "
                         "from_hf_config does not read and that may change the layer (read: "
                         f"{list(keys)})")  # fmt: skip
    given = linear.get("kda_layer_index_base", base)
    if given != base or isinstance(given, bool):
        raise ValueError(f"config field {LIN}kda_layer_index_base must be {base} for model_type "
                         f"{model_type!r} (its layer lists' base), got {given!r}")  # fmt: skip
    return linear


def _layer_lists(lists: dict, num_layers: int, base: int) -> tuple[str, ...]:
    """``layer_kinds`` from {field: layer numbers from ``base``}, the first list's ``"kda"``."""
    owner: dict[int, str] = {}
    for field, layers in lists.items():
        if not isinstance(layers, (list, tuple)):
            raise ValueError(f"config field {field} must be a list of layer numbers, got "
                             f"{layers!r:.200}")  # fmt: skip
        for number in layers:
            check_int(f"config field {field} entry", number, base)
            if number >= num_layers + base:
                raise ValueError(f"config field {field} lists layer {number}, beyond "
                                 f"num_hidden_layers={num_layers} (the numbers are "
                                 f"{base}-based)")  # fmt: skip
            if number in owner:
                where = "twice" if owner[number] == field else f"also in {owner[number]}"
                raise ValueError(f"config field {field} lists layer {number} {where}")
            owner[number] = field
    missing = [n for n in range(base, num_layers + base) if n not in owner]
    if missing and len(lists) > 1:  # at most 8 shown: the message stays short
        shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise ValueError(f"config fields {' / '.join(lists)} leave {len(missing)} layers in "
                         f"no list: [{shown}] ({base}-based; {num_layers} layers)")  # fmt: skip
    first = next(iter(lists))
    return tuple("kda" if owner.get(n) == first else "mla" for n in range(base, num_layers + base))


def _layer_kinds(config: dict, linear: dict, base: int) -> tuple[str, ...]:
    num_layers, types = _int(config, "num_hidden_layers"), config.get("layer_types")
    if num_layers > MAX_LAYERS:
        raise ValueError(f"config field num_hidden_layers must be <= {MAX_LAYERS} (no model "
                         f"has more), got {num_layers}")  # fmt: skip
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ValueError(f"config field layer_types must be a list of strings, got "
                             f"{types!r:.200}")  # fmt: skip
        if len(types) != num_layers:
            raise ValueError(f"config field layer_types has {len(types)} entries, "
                             f"num_hidden_layers is {num_layers}")  # fmt: skip
        if unknown := sorted(set(types) - set(_LAYER_TYPES)):
            raise ValueError(f"config field layer_types: unknown types {unknown[:8]} "
                             f"({list(_LAYER_TYPES)})")  # fmt: skip
        types = tuple(_LAYER_TYPES[t] for t in types)
    keys = ("kda_layers", "full_attn_layers") if base else ("kda_layers",)  # 0-based: optional
    lists = {LIN + key: _get(linear, key, LIN) for key in keys if base or key in linear}
    if not lists:
        return types or tuple("mla" if i % 4 == 3 else "kda" for i in range(num_layers))
    kinds = _layer_lists(lists, num_layers, base)
    if types is not None and types != kinds:
        raise ValueError(f"config field layer_types disagrees with {' / '.join(lists)}")
    return kinds


def _mla(config: dict) -> dict:
    rope = _int(config, "qk_rope_head_dim", minimum=0)
    if rope and not _bool(config, "mla_use_nope"):
        raise ValueError("config field mla_use_nope must be true (or qk_rope_head_dim 0): "
                         "MultiHeadLatentAttention has no rotary embedding; the shared key "
                         "part is used unrotated only in the NoPE form")  # fmt: skip
    return dict(
        num_heads=_int(config, "num_attention_heads"),
        head_dim=_int(config, "qk_nope_head_dim"),  # the NoPE part: MLA's head_dim
        value_head_dim=_int(config, "v_head_dim"),
        kv_lora_rank=_int(config, "kv_lora_rank"),
        q_lora_rank=None if config.get("q_lora_rank") is None else _int(config, "q_lora_rank"),
        shared_key_dim=rope,
        output_gate=_bool(config, "mla_use_output_gate"),
    )


def preset_fields(config) -> dict:
    """The ``ModelPreset`` fields ``config`` describes (``mla``: ``MLAShape``'s or None)."""
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict (a parsed config.json), got {type(config)}")
    if config.get("model_type") not in _FAMILIES and isinstance(config.get("text_config"), dict):
        config = config["text_config"]  # a wrapper (Kimi K3's, GLM-5-Next's multimodal one)
    if (model_type := config.get("model_type")) not in _FAMILIES:
        raise ValueError(f"config field model_type must be one of {sorted(_FAMILIES)} (Kimi "
                         f"Linear / Kimi K3, GLM-5-Next), got {model_type!r}")  # fmt: skip
    linear, (_, _, bound_key, flat) = _linear_attn(config, model_type), _FAMILIES[model_type]
    read = {}  # key -> (value, field name): linear_attn_config's, else the flat stand-in's
    for key in (*_WIDTHS, bound_key):
        if key in linear or key not in flat:
            read[key] = _get(linear, key, LIN), LIN + key
        else:
            read[key] = config.get(flat[key][0], flat[key][1]), flat[key][0] or key
    heads, head_dim, conv = (check_int(f"config field {f}", v) for v, f in map(read.get, _WIDTHS))
    bound, field = read[bound_key]
    bound = None if bound is None else check_number(f"config field {field}", bound)
    if bound is not None and not bound < 0:  # -0.0 too: no decay bound is 0
        raise ValueError(f"config field {field} must be < 0 (a bound on the log decay), got "
                         f"{bound!r}")  # fmt: skip
    if "safe_gate" in linear:  # the gate's switch, by name (never the bound alone)
        explicit = bound_key in linear or flat.get(bound_key, (None,))[0] in config
        if not _bool(linear, "safe_gate", LIN) and bound is not None and explicit:
            raise ValueError(f"config fields {LIN}safe_gate (false) and {field} ({bound}) "
                             "disagree: a gate bound needs the safe gate; drop one")  # fmt: skip
        # configuration_glm5_next.py: safe_gate without a bound means -5
        bound = (bound if bound is not None else -5.0) if linear["safe_gate"] else None
    kimi = model_type == "kimi_linear"
    if not isinstance(name := config.get("_name_or_path") or model_type, str):
        raise ValueError(f"config field _name_or_path must be a string, got {name!r:.200}")
    return dict(
        name=name, hidden_size=_int(config, "hidden_size"),
        num_heads=heads, num_v_heads=heads, head_dim=head_dim, conv_size=conv,
        fused_qkv_conv=not kimi, gate_form="softplus" if bound is None else "safe_sigmoid",
        lower_bound=bound, use_a_log=True, forget_gate_rank=head_dim,
        output_gate_rank=None if _bool(linear, "use_full_rank_gate", LIN) else head_dim,
        output_gate_bias=False,
        norm_eps=check_number("config field rms_norm_eps", _get(config, "rms_norm_eps"),
                              positive=True),
        layer_kinds=_layer_kinds(config, linear, _FAMILIES[model_type][0]),
        mla=_mla(config) if kimi else None,
        source=f"Hugging Face config.json (model_type {model_type}), read by from_hf_config",
        notes="the KDA layout of " + ("modeling_kimi.py" if kimi else "MaxText's glm5_next.py"),
    )  # fmt: skip


def read_config_json(directory) -> dict:
    """``directory/config.json`` parsed (``directory`` a str or os.PathLike folder), or a
    ValueError naming the file: a regular file of at most :data:`MAX_CONFIG_BYTES` (a FIFO,
    device, folder or larger file is refused unread)."""
    if not isinstance(directory, (str, os.PathLike)) or not isinstance(os.fspath(directory), str):
        raise TypeError(f"directory must be a folder's path (str or os.PathLike), got "
                        f"{type(directory).__name__}")  # fmt: skip
    if not os.path.isdir(directory):
        raise ValueError(f"directory {os.fspath(directory)!r} is not a folder (a checkpoint "
                         "folder holds config.json and *.safetensors)")  # fmt: skip
    path = os.path.join(directory, "config.json")
    try:  # non-blocking: opening a FIFO waits for a writer
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ValueError(f"no config.json in {directory!r}") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror})") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise ValueError(f"{path} is not a regular file (a FIFO, device or folder): refused "
                         "unread")  # fmt: skip
    with os.fdopen(descriptor, "rb") as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)  # at most: the file may grow meanwhile
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is larger than {MAX_CONFIG_BYTES:,} bytes (a config.json is "
                         "a few KiB): refused unread")  # fmt: skip
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        what = "not UTF-8 text" if isinstance(error, UnicodeDecodeError) else "not JSON"
        raise ValueError(f"{path}: {what} ({error})") from None
