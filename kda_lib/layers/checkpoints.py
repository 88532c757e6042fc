"""Checkpoints of other code read into (and written from) a :class:`kda_lib.KimiDeltaAttention`.

One table, :func:`state_dict_names`, says for each naming which tensor holds which parameter of
the layer, in which layout; loading (:func:`load_state_dict`), exporting
(:func:`export_state_dict`) and the safetensors reader all go through it. Namings:

* ``"fla"``: fla's ``fla.layers.kda.KimiDeltaAttention.state_dict()`` (``q_proj.weight``,
  ``q_conv1d.weight``, ``f_proj.0.weight``, ``A_log [HV]``, ``g_proj.1.bias``, ...). fla's
  grouped value heads (``num_v_heads``) use the same names with HV-sized shapes.
* ``"kimi_linear"``: the Hugging Face Kimi Linear checkpoint
  (``moonshotai/Kimi-Linear-48B-A3B-Instruct``), whose KDA layers sit at
  ``model.layers.N.self_attn.*``: ``q_proj``, ``k_proj``, ``v_proj``, ``q_conv1d``,
  ``k_conv1d``, ``v_conv1d``, ``f_a_proj``, ``f_b_proj``, ``b_proj``, ``g_a_proj``, ``g_b_proj``
  and ``o_proj`` (``.weight``, no biases), ``A_log [1, 1, H, 1]``, ``dt_bias [H K]`` and
  ``o_norm.weight [K]``. Source: ``modeling_kimi.py`` at revision 6e163f3, as copied into
  axolotl-ai-cloud/axolotl ``src/axolotl/monkeypatch/models/kimi_linear/modeling_kimi.py`` @
  1e4d015475e3f5d48e6fb5517484f0bfd08b96bd (``KimiDecoderLayer.self_attn`` is a
  ``KimiDeltaAttention``; ``KimiLinearForCausalLM.model.layers`` holds the decoder layers).

Layouts: a linear weight is PyTorch's ``[out, in]`` (the layer's kernel is ``[in, out]``); a
conv weight is PyTorch's depthwise ``[C, 1, W]`` (the layer's ``[W, C]``, same tap order, see
:mod:`kda_lib.layers.conv`). Loading is all or nothing: every name, shape and value is checked
before
the first parameter is written, and a bad checkpoint raises ValueError naming the tensor.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx

from kda_lib.checks import check_int
from kda_lib.layers.conv import kernel_from_torch

NAMINGS = ("fla", "kimi_linear")


class _Entry(NamedTuple):
    variable: nnx.Variable  # the layer's parameter
    to_layer: Callable  # checkpoint array -> the parameter's layout
    to_checkpoint: Callable  # the parameter's layout -> checkpoint array


def _transpose(w):
    return np.asarray(w).T  # torch Linear [out, in] <-> kernel [in, out]


def _same(w):
    return np.asarray(w)


def _conv_to_checkpoint(kernel):
    return np.asarray(kernel).T[:, None, :]  # [W, C] -> torch's [C, 1, W]


def _a_log_from_kimi(a_log):
    """Kimi Linear stores ``A_log`` as ``[1, 1, H, 1]`` (it broadcasts over ``[B, T, H, K]``)."""
    a_log = np.asarray(a_log)
    if a_log.ndim != 4 or a_log.shape[:2] != (1, 1) or a_log.shape[3] != 1:
        raise ValueError(f"expected Kimi Linear's A_log layout [1, 1, H, 1], got {a_log.shape}")
    return a_log.reshape(-1)


def _a_log_to_kimi(a_log):
    return np.asarray(a_log).reshape(1, 1, -1, 1)


_LINEAR = dict(to_layer=_transpose, to_checkpoint=_transpose)
_SAME = dict(to_layer=_same, to_checkpoint=_same)
_CONV = dict(to_layer=kernel_from_torch, to_checkpoint=_conv_to_checkpoint)
# the low-rank gate projections' names: fla's nn.Sequential indices, Kimi Linear's a/b pair
_LOW_RANK = {"fla": ("{}.0", "{}.1"), "kimi_linear": ("{}_a_proj", "{}_b_proj")}


def _entries(layer, naming: str) -> dict[str, _Entry]:
    """Checkpoint name -> :class:`_Entry` for ``layer`` in ``naming`` (the one table)."""
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {NAMINGS}, got {naming!r}")
    cfg = layer.config
    if cfg.fused_qkv_conv:
        raise ValueError(
            f"the {naming!r} naming has separate q_conv1d/k_conv1d/v_conv1d weights; this layer "
            "has one fused qkv_conv1d (KDAConfig.fused_qkv_conv=True): build it with "
            "fused_qkv_conv=False to read this checkpoint (the same function)"
        )
    entries = {}
    for proj in ("q_proj", "k_proj", "v_proj", "b_proj", "o_proj"):
        entries[f"{proj}.weight"] = _Entry(getattr(layer, proj).kernel, **_LINEAR)
    for conv in ("q_conv1d", "k_conv1d", "v_conv1d"):
        module = getattr(layer, conv)
        if module is not None:
            entries[f"{conv}.weight"] = _Entry(module.kernel, **_CONV)
    for gate, has_bias in (("f_proj", False), ("g_proj", cfg.output_gate_bias)):
        module = getattr(layer, gate)
        if isinstance(module, nnx.Sequential):  # low rank: down, then up
            base = gate if naming == "fla" else gate.removesuffix("_proj")
            names = [pattern.format(base) for pattern in _LOW_RANK[naming]]
            for name, sub in zip(names, module.layers, strict=True):
                entries[f"{name}.weight"] = _Entry(sub.kernel, **_LINEAR)
            last, last_name = module.layers[-1], names[-1]
        else:
            entries[f"{gate}.weight"] = _Entry(module.kernel, **_LINEAR)
            last, last_name = module, gate
        if has_bias:
            entries[f"{last_name}.bias"] = _Entry(last.bias, **_SAME)
    if layer.A_log is not None:
        if naming == "kimi_linear":
            entries["A_log"] = _Entry(layer.A_log, _a_log_from_kimi, _a_log_to_kimi)
        else:
            entries["A_log"] = _Entry(layer.A_log, **_SAME)
    entries["dt_bias"] = _Entry(layer.dt_bias, **_SAME)
    entries["o_norm.weight"] = _Entry(layer.o_norm, **_SAME)
    return entries


def state_dict_names(layer, naming: str = "fla") -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint in ``naming`` must hold for ``layer``: name -> shape (in the
    checkpoint's own layout, e.g. ``[out, in]`` for a linear weight)."""
    return {
        name: _checkpoint_shape(entry) for name, entry in sorted(_entries(layer, naming).items())
    }


def _checkpoint_shape(entry: _Entry) -> tuple[int, ...]:
    probe = np.zeros(entry.variable.get_value().shape, np.float32)
    return tuple(entry.to_checkpoint(probe).shape)


def export_state_dict(layer, naming: str = "fla") -> dict[str, np.ndarray]:
    """``layer``'s parameters as a checkpoint in ``naming`` (numpy arrays in the checkpoint's
    layouts): what :func:`load_state_dict` reads back into an equal layer."""
    return {
        name: np.ascontiguousarray(entry.to_checkpoint(np.asarray(entry.variable[...])))
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
      layer: a :class:`kda_lib.KimiDeltaAttention` whose config matches the checkpoint.
      state_dict: mapping of names (without ``prefix``) to arrays (numpy, torch, jax, nested
        lists of numbers).
      naming: ``"fla"`` or ``"kimi_linear"`` (module docstring).
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
        raise ValueError(
            f"{source} state_dict does not match this KDAConfig: "
            + (f"missing {[prefix + n for n in missing]}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (f"unexpected {[f'{prefix}{n}' for n in unexpected]}" if unexpected else "")
            + " (check num_heads, num_v_heads, forget_gate_rank, output_gate_rank, "
            "output_gate_bias, use_a_log, conv_size; conv biases are not supported)"
        )
    converted = {}
    for name, entry in entries.items():
        given = checkpoint_array(label(name), state_dict[name])
        try:
            value = entry.to_layer(given)
        except ValueError as error:
            raise ValueError(f"{label(name)}: {error}") from None
        expected = entry.variable[...]
        if value.shape != expected.shape:
            raise ValueError(
                f"{label(name)}: shape {given.shape} converts to {value.shape}, "
                f"but the layer expects {expected.shape} (a checkpoint of shape "
                f"{_checkpoint_shape(entry)})"
            )
        value = np.asarray(value, expected.dtype)
        if not np.isfinite(value).all():
            raise ValueError(f"{label(name)}: contains NaN or inf values (as {expected.dtype})")
        converted[name] = jnp.asarray(value)
    for name, entry in entries.items():  # nothing raises from here on
        entry.variable.set_value(converted[name])


def load_fla_state_dict(layer, state_dict) -> None:
    """:func:`load_state_dict` in fla's naming (see ``KimiDeltaAttention.from_fla_state_dict``)."""
    load_state_dict(layer, state_dict, "fla")


# ------------------------------------------------------------------ Kimi Linear safetensors
def kimi_linear_prefix(layer_index: int) -> str:
    """``model.layers.N.self_attn.``: where the Hugging Face Kimi Linear checkpoint keeps
    decoder layer ``N``'s (0-based) attention tensors."""
    layer_index = check_int("layer_index", layer_index, minimum=0)
    return f"model.layers.{layer_index}.self_attn."


# safetensors dtypes kda_lib reads (little-endian); any other (FP8, complex, bool, ...) is
# refused by name
SAFETENSORS_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(jnp.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
}
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit


def read_safetensors(paths, prefix: str = "") -> dict[str, np.ndarray]:
    """The tensors whose names start with ``prefix`` from one or several ``.safetensors``
    files (the shards of a checkpoint), with ``prefix`` cut off. Only those tensors are read
    (a shard of a 48B checkpoint is not loaded whole); bfloat16 stays ml_dtypes' bfloat16.

    Read with ordinary file reads, not memory-mapped: a file that shrinks while it is read is
    a ValueError, not a SIGBUS. A malformed file (header, offsets, sizes) or a tensor of a dtype
    outside :data:`SAFETENSORS_DTYPES` (FP8, ...) is a ValueError naming the file and the
    tensor; a path that is not a str or ``os.PathLike`` of str is a TypeError."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if isinstance(paths, (bytes, bytearray)) or not isinstance(paths, Sequence):
        raise TypeError(
            f"paths must be a file (str or os.PathLike) or a list of them, got {paths!r}"
        )
    if not paths:
        raise ValueError("paths must name at least one file, got an empty list")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    out: dict[str, np.ndarray] = {}
    for path in paths:
        if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
            raise TypeError(f"paths: each file must be a str or os.PathLike, got {path!r}")
        if not os.path.isfile(path):
            raise ValueError(f"no safetensors file at {os.fspath(path)!r}")
        for name, array in _read_safetensors_file(os.fspath(path), prefix).items():
            if name in out:
                raise ValueError(f"{prefix}{name} appears in more than one of the files {paths}")
            out[name] = array
    return out


def _read_safetensors_file(path: str, prefix: str) -> dict[str, np.ndarray]:
    """One file's tensors under ``prefix`` (cut off), every header entry checked first."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        header, data_start = _safetensors_header(handle, path, size)
        wanted = {key: entry for key, entry in header.items() if key.startswith(prefix)}
        out = {}
        for key, (dtype, shape, begin, end) in wanted.items():
            buffer = bytearray(end - begin)
            handle.seek(data_start + begin)
            if handle.readinto(buffer) != len(buffer):
                raise ValueError(
                    f"{path}: tensor {key} could not be read whole (the file is shorter than "
                    "its header says: truncated, or changed while reading)"
                )
            out[key[len(prefix) :]] = np.frombuffer(buffer, dtype).reshape(shape)
    return out


def _safetensors_header(handle, path: str, size: int):
    """``({name: (dtype, shape, begin, end)}, data_start)`` of an open safetensors file of
    ``size`` bytes, or a ValueError naming the file (and the tensor)."""
    if size < 8:
        raise ValueError(f"{path}: not a safetensors file ({size} bytes, no 8-byte header size)")
    length = int.from_bytes(handle.read(8), "little")
    if length > min(size - 8, MAX_HEADER_BYTES):
        raise ValueError(
            f"{path}: safetensors header size {length} exceeds the file ({size} bytes) or "
            f"the {MAX_HEADER_BYTES}-byte limit"
        )
    try:
        raw = json.loads(handle.read(length).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{path}: safetensors header is not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: safetensors header must be a JSON object")
    data_size = size - 8 - length
    entries = {
        key: _header_entry(path, key, entry, data_size)
        for key, entry in raw.items()
        if key != "__metadata__"
    }
    _check_tiling(path, entries, data_size)
    return entries, 8 + length


def _check_tiling(path: str, entries: dict, data_size: int) -> None:
    """The tensors' byte ranges must tile the data buffer exactly, as the format requires: a
    corrupted offset (an overlap or a gap) would otherwise read another tensor's bytes."""
    position = 0
    for key, (_, _, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if begin != position:
            raise ValueError(
                f"{path}: tensor {key} starts at data byte {begin}, expected {position} (the "
                "tensors must tile the data without gaps or overlaps)"
            )
        position = end
    if position != data_size:
        raise ValueError(
            f"{path}: the tensors cover {position} of the file's {data_size} data bytes"
        )


def _header_entry(path: str, key: str, entry, data_size: int):
    """One header entry as ``(dtype, shape, begin, end)``, checked against the data size."""
    where = f"{path}: tensor {key}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise ValueError(f"{where}: header entry must hold dtype, shape and data_offsets")
    name, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(name, str) or name not in SAFETENSORS_DTYPES:
        raise ValueError(
            f"{where}: dtype {name!r} is not supported (supported: "
            f"{', '.join(SAFETENSORS_DTYPES)}); convert the checkpoint first"
        )
    ints = lambda xs: isinstance(xs, list) and all(  # noqa: E731
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xs
    )
    if not ints(shape) or not ints(offsets) or len(offsets) != 2:
        raise ValueError(
            f"{where}: shape must be a list of ints >= 0 and data_offsets two ints >= 0, got "
            f"shape {shape!r}, data_offsets {offsets!r}"
        )
    begin, end = offsets
    dtype = SAFETENSORS_DTYPES[name]
    if not begin <= end <= data_size or end - begin != math.prod(shape) * dtype.itemsize:
        raise ValueError(
            f"{where}: data_offsets {offsets} do not fit a {name} tensor of shape {shape} in "
            f"the file's {data_size} data bytes"
        )
    return dtype, tuple(shape), begin, end


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
