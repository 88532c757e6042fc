"""Checkpoints of other code read into (and written from) a :class:`kda_lib.KimiDeltaAttention`.

One table, :func:`_entries`, says for each naming which tensor holds which layer parameter, in
which layout; :func:`state_dict_names`, :func:`load_state_dict` and :func:`export_state_dict`
all read it. Namings:

* ``"fla"``: ``fla.layers.kda.KimiDeltaAttention.state_dict()`` (``q_proj.weight``,
  ``q_conv1d.weight``, ``f_proj.0.weight``, ``A_log [HV]``, ``g_proj.1.bias``, ...).
* ``"kimi_linear"``: the Hugging Face Kimi Linear checkpoint (``modeling_kimi.py`` @
  6e163f3, copied in axolotl-ai-cloud/axolotl @ 1e4d015475e3f5d48e6fb5517484f0bfd08b96bd),
  layers at ``model.layers.N.self_attn.*``: ``f_a_proj``/``f_b_proj``,
  ``g_a_proj``/``g_b_proj`` (or ``g_proj`` full rank), ``b_proj``, three ``*_conv1d``,
  ``A_log [1, 1, H, 1]``, ``dt_bias [H K]``, ``o_norm.weight [K]``, no biases.
* ``"transformers"``: the same checkpoint as the transformers library's
  ``KimiLinearDeltaAttention`` names it (``modeling_kimi_linear.py`` @
  c1a44bc9cde33bee2282b77e2b9638550a8d4c80; ``output_gate`` @
  016bd12cbf941618d91c303ba44f7ca9d4f3f4da): ONE ``conv1d [2HK + HV V, 1, W]`` over
  ``concat(q, k, v)`` (split for an unfused layer), ``forget_gate_down``/``_up``,
  ``beta_proj``, ``output_gate_down``/``_up`` (or ``output_gate``), ``A_log [HV, 1]``,
  ``dt_bias [HV, V]``.

MLA layers (:class:`kda_lib.layers.mla.MultiHeadLatentAttention`) have DeepSeek-V2's names in
both Kimi Linear namings. Layouts: a linear weight is PyTorch's ``[out, in]`` (the kernel's
``[in, out]``), a conv weight ``[C, 1, W]`` (the layer's ``[W, C]``). Loading is all or
nothing: every name, shape and value is checked before the first parameter is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import safetensors
from flax import nnx

from kda_lib.checks import check_int
from kda_lib.layers.conv import kernel_from_torch
from kda_lib.layers.mla import MultiHeadLatentAttention

NAMINGS = ("fla", "kimi_linear", "transformers")


class _Entry(NamedTuple):
    """One checkpoint tensor: the layer parameters it holds (one, or several it is split into:
    the transformers naming's one ``conv1d`` for the three convs of an unfused layer)."""

    variables: tuple  # the layer's parameters
    to_layer: Callable  # checkpoint array -> tuple of arrays, one per variable
    to_checkpoint: Callable  # the variables' arrays -> checkpoint array


def _entry(variable, to_layer, to_checkpoint) -> _Entry:
    """An entry of one parameter."""
    return _Entry((variable,), lambda w: (to_layer(w),), to_checkpoint)


def _transpose(w):
    return np.asarray(w).T  # torch Linear [out, in] <-> kernel [in, out]


def _same(w):
    return np.asarray(w)


def _conv_to_checkpoint(kernel):
    return np.asarray(kernel).T[:, None, :]  # [W, C] -> torch's [C, 1, W]


def _reshaped(layout: str, fits, checkpoint_shape) -> dict:
    """A parameter the checkpoint stores reshaped (the layer's is flat): ``fits(shape)`` says
    whether a checkpoint tensor's shape is ``layout``."""

    def to_layer(w):
        w = np.asarray(w)
        if not fits(w.shape):
            raise ValueError(f"expected {layout}, got {w.shape}")
        return w.reshape(-1)

    return dict(to_layer=to_layer, to_checkpoint=lambda w: np.asarray(w).reshape(checkpoint_shape))


_KIMI_A_LOG = _reshaped(  # it broadcasts over [B, T, H, K]
    "Kimi Linear's A_log layout [1, 1, H, 1]",
    lambda s: len(s) == 4 and s[:2] == (1, 1) and s[3] == 1,
    (1, 1, -1, 1),
)
_TRANSFORMERS_A_LOG = _reshaped(
    "the transformers A_log layout [HV, 1]", lambda s: len(s) == 2 and s[1] == 1, (-1, 1)
)


def _per_head(heads: int) -> dict:
    """``dt_bias``'s transformers layout ``[HV, channels]``."""
    layout = f"the transformers layout [HV={heads}, channels]"
    return _reshaped(layout, lambda s: len(s) == 2 and s[0] == heads, (heads, -1))


_LINEAR = dict(to_layer=_transpose, to_checkpoint=_transpose)
_SAME = dict(to_layer=_same, to_checkpoint=_same)
_CONV = dict(to_layer=kernel_from_torch, to_checkpoint=_conv_to_checkpoint)
# the low-rank gate projections' names: fla's nn.Sequential indices, Kimi Linear's a/b pair,
# the transformers implementation's down/up pair
_LOW_RANK = {
    "fla": ("{}.0", "{}.1"),
    "kimi_linear": ("{}_a_proj", "{}_b_proj"),
    "transformers": ("{}_down", "{}_up"),
}
# the transformers implementation's names of the gate and beta projections
_TRANSFORMERS_NAMES = {"f_proj": "forget_gate", "g_proj": "output_gate", "b_proj": "beta_proj"}


def _split_conv(widths):
    """One depthwise conv ``[C, 1, W]`` over ``concat(q, k, v)`` <-> the three kernels
    ``[W, C_q]``, ``[W, C_k]``, ``[W, C_v]`` (channel blocks in that order)."""
    cuts = np.cumsum(widths)[:-1]

    def to_layer(w):
        return tuple(np.split(kernel_from_torch(w), cuts, axis=1))

    def to_checkpoint(*kernels):
        return _conv_to_checkpoint(np.concatenate([np.asarray(k) for k in kernels], axis=1))

    return to_layer, to_checkpoint


def _entries(layer, naming: str) -> dict[str, _Entry]:
    """Checkpoint name -> :class:`_Entry` for ``layer`` in ``naming`` (the one table)."""
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {NAMINGS}, got {naming!r}")
    if isinstance(layer, MultiHeadLatentAttention):
        return _mla_entries(layer)
    cfg = layer.config
    hf = naming == "transformers"
    if cfg.fused_qkv_conv and not hf:
        raise ValueError(
            f"the {naming!r} naming has separate q_conv1d/k_conv1d/v_conv1d weights; this layer "
            "has one fused qkv_conv1d (KDAConfig.fused_qkv_conv=True): build it with "
            "fused_qkv_conv=False to read this checkpoint (the same function)"
        )
    if hf:
        _check_transformers_layout(cfg)
    entries = {}
    for proj in ("q_proj", "k_proj", "v_proj", "b_proj", "o_proj"):
        name = _TRANSFORMERS_NAMES.get(proj, proj) if hf else proj
        entries[f"{name}.weight"] = _entry(getattr(layer, proj).kernel, **_LINEAR)
    entries.update(_conv_entries(layer, hf))
    for gate, has_bias in (("f_proj", False), ("g_proj", cfg.output_gate_bias)):
        entries.update(_gate_entries(getattr(layer, gate), gate, naming, has_bias))
    if layer.A_log is not None:
        layout = {"kimi_linear": _KIMI_A_LOG, "transformers": _TRANSFORMERS_A_LOG}
        entries["A_log"] = _entry(layer.A_log, **layout.get(naming, _SAME))
    dt_bias = _per_head(cfg.value_heads) if hf else _SAME
    entries["dt_bias"] = _entry(layer.dt_bias, **dt_bias)
    entries["o_norm.weight"] = _entry(layer.o_norm, **_SAME)
    return entries


def _conv_entries(layer, hf: bool) -> dict[str, _Entry]:
    """The short convs: three ``*_conv1d`` tensors, or the transformers naming's one
    ``conv1d`` (one parameter of a fused layer, or split into an unfused layer's three)."""
    convs = [getattr(layer, conv) for conv in ("q_conv1d", "k_conv1d", "v_conv1d")]
    if hf and layer.qkv_conv1d is not None:
        return {"conv1d.weight": _entry(layer.qkv_conv1d.kernel, **_CONV)}
    if hf and convs[0] is not None:
        widths = [module.kernel.get_value().shape[1] for module in convs]
        variables = tuple(module.kernel for module in convs)
        return {"conv1d.weight": _Entry(variables, *_split_conv(widths))}
    return {
        f"{conv}.weight": _entry(module.kernel, **_CONV)
        for conv, module in zip(("q_conv1d", "k_conv1d", "v_conv1d"), convs, strict=True)
        if module is not None
    }


def _gate_entries(module, gate: str, naming: str, has_bias: bool) -> dict[str, _Entry]:
    """A gate projection (``f_proj`` or ``g_proj``): full rank, or low rank (down, then up)."""
    hf = naming == "transformers"
    entries = {}
    if isinstance(module, nnx.Sequential):
        if naming == "fla":
            base = gate
        else:
            base = _TRANSFORMERS_NAMES[gate] if hf else gate.removesuffix("_proj")
        names = [pattern.format(base) for pattern in _LOW_RANK[naming]]
        for name, sub in zip(names, module.layers, strict=True):
            entries[f"{name}.weight"] = _entry(sub.kernel, **_LINEAR)
        last, last_name = module.layers[-1], names[-1]
    else:
        last, last_name = module, _TRANSFORMERS_NAMES[gate] if hf else gate
        entries[f"{last_name}.weight"] = _entry(module.kernel, **_LINEAR)
    if has_bias:
        entries[f"{last_name}.bias"] = _entry(last.bias, **_SAME)
    return entries


def _check_transformers_layout(cfg) -> None:
    """The transformers implementation's layer has a low-rank forget gate, an ``A_log`` and
    no output-gate bias; a layer without them has no name there."""
    missing = []
    if cfg.forget_gate_rank is None:
        missing.append("a full-rank forget gate (forget_gate_rank=None)")
    if not cfg.use_a_log:
        missing.append("no A_log (use_a_log=False)")
    if cfg.output_gate_bias:
        missing.append("an output-gate bias (output_gate_bias=True)")
    if missing:
        raise ValueError(
            "the 'transformers' naming (KimiLinearDeltaAttention of the transformers library) "
            "has no tensors for " + "; ".join(missing)
        )


def _mla_entries(layer) -> dict[str, _Entry]:
    """:class:`kda_lib.layers.mla.MultiHeadLatentAttention`'s tensors: the same names in every
    Kimi Linear naming (DeepSeek-V2's, kept by the remote code and by transformers)."""
    entries = {}
    projections = ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    if layer.config.q_lora_rank is None:
        projections.append("q_proj")
    else:
        projections += ["q_a_proj", "q_b_proj"]
        entries["q_a_layernorm.weight"] = _entry(layer.q_a_layernorm.scale, **_SAME)
    for proj in projections:
        entries[f"{proj}.weight"] = _entry(getattr(layer, proj).kernel, **_LINEAR)
    entries["kv_a_layernorm.weight"] = _entry(layer.kv_a_layernorm.scale, **_SAME)
    return entries


def state_dict_names(layer, naming: str = "fla") -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint in ``naming`` must hold for ``layer``: name -> shape (in the
    checkpoint's own layout, e.g. ``[out, in]`` for a linear weight)."""
    return {
        name: _checkpoint_shape(entry) for name, entry in sorted(_entries(layer, naming).items())
    }


def _checkpoint_shape(entry: _Entry) -> tuple[int, ...]:
    probes = [np.zeros(v.get_value().shape, np.float32) for v in entry.variables]
    return tuple(entry.to_checkpoint(*probes).shape)


def export_state_dict(layer, naming: str = "fla") -> dict[str, np.ndarray]:
    """``layer``'s parameters as a checkpoint in ``naming`` (numpy arrays in the checkpoint's
    layouts): what :func:`load_state_dict` reads back into an equal layer."""
    return {
        name: np.ascontiguousarray(
            entry.to_checkpoint(*(np.asarray(v[...]) for v in entry.variables))
        )
        for name, entry in _entries(layer, naming).items()
    }


def checkpoint_array(label: str, value) -> np.ndarray:
    """One checkpoint tensor (numpy, torch, jax, nested lists) as a real-valued numpy array, or
    a ValueError naming ``label``. bfloat16 (torch or numpy's ml_dtypes) is widened to float32,
    exactly."""
    if hasattr(value, "detach"):  # a torch tensor: numpy has no bfloat16, so widen it first
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{label}: not convertible to an array ({error})") from None
    if array.dtype == jnp.bfloat16:  # ml_dtypes' bfloat16 (safetensors, jax): not np.floating
        array = array.astype(np.float32)
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        # np.asarray([None, None]) is an object array; strings, bools and complex numbers are
        # no weights either
        raise ValueError(
            f"{label}: expected an array of real numbers, got dtype {array.dtype} "
            f"({type(value).__name__} {value!r:.80})"
        )
    return array


def load_state_dict(layer, state_dict, naming: str = "fla", *, prefix: str = "") -> None:
    """Copy a checkpoint in ``naming`` into ``layer`` in place, all or nothing.

    Args:
      layer: a :class:`kda_lib.KimiDeltaAttention` whose config matches the checkpoint (or,
        in the ``"kimi_linear"`` and ``"transformers"`` namings, a
        :class:`kda_lib.layers.mla.MultiHeadLatentAttention`: Kimi Linear's global layer).
      state_dict: mapping of names (without ``prefix``) to arrays (numpy, torch, jax, nested
        lists of numbers).
      naming: ``"fla"``, ``"kimi_linear"`` or ``"transformers"`` (module docstring).
      prefix: printed before each name in errors (e.g. ``model.layers.3.self_attn.``).

    Raises:
      ValueError: naming every missing or unexpected name, or the first tensor of a wrong
        shape or with a non-finite or non-real value; the layer is unchanged then.
    """
    source = "fla" if naming == "fla" else "checkpoint"
    if not isinstance(state_dict, Mapping):
        raise ValueError(
            f"state_dict must be a mapping of {source} names to arrays, got "
            f"{type(state_dict).__name__}"
        )
    entries = _entries(layer, naming)

    def label(name):
        return f"fla {name}" if naming == "fla" and not prefix else f"{prefix}{name}"

    missing = sorted(set(entries) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(entries), key=str)
    if missing or unexpected:
        kind = type(layer.config).__name__
        raise ValueError(
            f"{source} state_dict does not match this {kind}: "
            + (f"missing {[prefix + n for n in missing]}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (f"unexpected {[f'{prefix}{n}' for n in unexpected]}" if unexpected else "")
            + (
                " (check num_heads, num_v_heads, forget_gate_rank, output_gate_rank, "
                "output_gate_bias, use_a_log, conv_size; conv biases are not supported)"
                if kind == "KDAConfig"
                else " (check q_lora_rank)"
            )
        )
    converted = []
    for name, entry in entries.items():
        given = checkpoint_array(label(name), state_dict[name])
        try:
            values = entry.to_layer(given)
        except ValueError as error:
            raise ValueError(f"{label(name)}: {error}") from None
        for variable, value in zip(entry.variables, values, strict=True):
            expected = variable[...]
            if value.shape != expected.shape:
                raise ValueError(
                    f"{label(name)}: shape {given.shape} converts to {value.shape}, "
                    f"but the layer expects {expected.shape} (a checkpoint of shape "
                    f"{_checkpoint_shape(entry)})"
                )
            value = np.asarray(value, expected.dtype)
            if not np.isfinite(value).all():
                raise ValueError(f"{label(name)}: contains NaN or inf values (as {expected.dtype})")
            converted.append((variable, jnp.asarray(value)))
    for variable, value in converted:  # nothing raises from here on
        variable.set_value(value)


def load_fla_state_dict(layer, state_dict) -> None:
    """:func:`load_state_dict` in fla's naming (see ``KimiDeltaAttention.from_fla_state_dict``)."""
    load_state_dict(layer, state_dict, "fla")


# ------------------------------------------------------------------ Kimi Linear safetensors
def kimi_linear_prefix(layer_index: int) -> str:
    """``model.layers.N.self_attn.``: where the Hugging Face Kimi Linear checkpoint keeps
    decoder layer ``N``'s (0-based) attention tensors."""
    layer_index = check_int("layer_index", layer_index, minimum=0)
    return f"model.layers.{layer_index}.self_attn."


# safetensors dtypes read (little-endian); any other (FP8, complex, bool, ...) is refused by name
SAFETENSORS_DTYPES = {name: np.dtype(dtype) for name, dtype in dict(
    F64="<f8", F32="<f4", F16="<f2", BF16=jnp.bfloat16, I64="<i8", I32="<i4", I16="<i2",
    I8="i1", U8="u1").items()}  # fmt: skip


def file_version(stat) -> tuple[int, int, int]:
    """What tells two versions of a file apart: inode, size, modification time."""
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def check_unchanged(versions: dict[str, tuple]) -> None:
    """Refuse, naming the file, when a file of ``versions`` (path -> :func:`file_version` when
    it was read) is now another version: a load would mix the two."""
    for path, version in versions.items():
        if not os.path.exists(path) or file_version(os.stat(path)) != version:
            raise ValueError(
                f"{path}: the file changed while the checkpoint was read (replaced or "
                "rewritten): its tensors may be of two versions; read it again"
            )


def read_safetensors(paths, prefix: str = "") -> dict[str, np.ndarray]:
    """The tensors named ``prefix...`` in the ``.safetensors`` file(s) ``paths`` (one path or a
    list of shards), ``prefix`` cut off; bfloat16 stays ml_dtypes' bfloat16.

    Each file is checked by ``safetensors.safe_open``; the wanted tensors are then read with
    ordinary reads (DESIGN, "Checkpoints": no memory map). Raises ValueError naming the file
    (and tensor) for a malformed file, a dtype outside :data:`SAFETENSORS_DTYPES`, more than 64
    dimensions, a name in two files, or a file changed before the last one is read; TypeError
    for a path that is not a str or ``os.PathLike`` of str."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if isinstance(paths, (bytes, bytearray)) or not isinstance(paths, Sequence):
        raise TypeError(f"paths must be a file (str or os.PathLike) or a list of them: {paths!r}")
    if not paths:
        raise ValueError("paths must name at least one file, got an empty list")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    out: dict[str, np.ndarray] = {}
    versions = {}
    for path in paths:
        if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
            raise TypeError(f"paths: each file must be a str or os.PathLike, got {path!r}")
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ValueError(f"no safetensors file at {path!r}")
        tensors, versions[path] = _read_safetensors_file(path, prefix)
        if twice := sorted(tensors.keys() & out.keys()):
            raise ValueError(f"{prefix}{twice[0]} appears in more than one of the files {paths}")
        out.update(tensors)
    check_unchanged(versions)
    return out


def _read_safetensors_file(path: str, prefix: str) -> tuple[dict[str, np.ndarray], tuple]:
    """One file's tensors under ``prefix`` (cut off), and the file's :func:`file_version`."""
    with open(path, "rb") as handle:
        version = file_version(os.fstat(handle.fileno()))
        try:
            with safetensors.safe_open(path, framework="numpy") as checked:
                names = [name for name in checked.keys() if name.startswith(prefix)]
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        except Exception as error:  # safetensors' SafetensorError and what it lets through
            raise ValueError(f"{path}: not a valid safetensors file ({error})") from None
        check_unchanged({path: version})  # the file checked is the file open
        start, out = handle.tell(), {}
        for name in names:
            where, entry = f"{path}: tensor {name}", header[name]
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            if dtype not in SAFETENSORS_DTYPES:
                raise ValueError(
                    f"{where}: dtype {dtype!r} is not supported (supported: "
                    f"{', '.join(SAFETENSORS_DTYPES)}); convert the checkpoint first"
                )
            if len(shape) > 64:
                raise ValueError(f"{where}: {len(shape)} dimensions (numpy holds at most 64)")
            buffer = bytearray(end - begin)
            handle.seek(start + begin)
            if handle.readinto(buffer) != len(buffer):
                raise ValueError(
                    f"{where} could not be read whole (the file is shorter than its header "
                    "says: truncated, or changed while reading)"
                )
            out[name[len(prefix) :]] = np.frombuffer(buffer, SAFETENSORS_DTYPES[dtype]).reshape(
                shape
            )
        check_unchanged({path: version})
    return out, version


def load_kimi_linear_safetensors(layer, paths, layer_index: int) -> None:
    """Read decoder layer ``layer_index``'s KDA tensors (``model.layers.N.self_attn.*``) from
    the Kimi Linear checkpoint file(s) ``paths`` into ``layer`` (all or nothing, see
    :func:`load_state_dict`). ``layer``'s config must describe that layer, e.g.
    ``kda_lib.models.presets.KIMI_LINEAR_48B.kda_config()`` (the published model's KDA layer).

    A tensor of the layer that is missing, one more under the layer's prefix (say a conv
    bias), and one of the wrong shape are refused by their full names.
    """
    prefix = kimi_linear_prefix(layer_index)
    tensors = read_safetensors(paths, prefix)
    if not tensors:
        raise ValueError(
            f"no tensor named {prefix}* in {paths!r}: not a Kimi Linear checkpoint, or layer "
            f"{layer_index} is not in these files (or is an MLA layer, "
            f"model.layers.{layer_index}.self_attn.kv_a_proj_with_mqa etc.)"
        )
    load_state_dict(layer, tensors, "kimi_linear", prefix=prefix)


# a name only one of the two Kimi Linear namings has, for each
_NAMING_MARKERS = {
    "kimi_linear": ("q_conv1d.weight", "f_a_proj.weight", "b_proj.weight"),
    "transformers": ("conv1d.weight", "forget_gate_down.weight", "beta_proj.weight"),
}


def detect_kimi_linear_naming(names) -> str:
    """``"kimi_linear"`` or ``"transformers"``: the naming of one KDA layer's tensor names
    (without the layer prefix), or a ValueError when they fit neither or both."""
    names = set(names)
    found = [n for n, markers in _NAMING_MARKERS.items() if names & set(markers)]
    if len(found) != 1:
        raise ValueError(
            f"cannot tell the naming of a KDA layer with tensors {sorted(names)}: expected the "
            f"remote code's (any of {_NAMING_MARKERS['kimi_linear']}) or the transformers "
            f"library's (any of {_NAMING_MARKERS['transformers']})"
        )
    return found[0]
