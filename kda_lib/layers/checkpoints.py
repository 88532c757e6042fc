"""Checkpoints of other code read into (and written from) a :class:`kda_lib.KimiDeltaAttention`.

One table, :func:`_entries`, says which tensor holds which parameter in which layout, in three
namings (DESIGN, "Checkpoint files"): ``"fla"``, ``"kimi_linear"`` (``modeling_kimi.py``) and
``"transformers"``; MLA layers have DeepSeek-V2's names. Loading is all or nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
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
    """One tensor: the layer parameters it holds and its layout: ``"same"``, ``"linear"``
    (transposed), ``"conv"`` (``[C, 1, W]``, kernels concatenated), or ``(shape, label)``."""

    variables: tuple
    layout: object = "same"


# gate projection names (g: "f" or "g"; gate: the transformers name): full rank, low-rank down, up
_GATE_NAMES = {
    "fla": ("{g}_proj", "{g}_proj.0", "{g}_proj.1"),
    "kimi_linear": ("{g}_proj", "{g}_a_proj", "{g}_b_proj"),
    "transformers": ("{gate}", "{gate}_down", "{gate}_up"),
}
_TRANSFORMERS_NAMES = {"f_proj": "forget_gate", "g_proj": "output_gate", "b_proj": "beta_proj"}


def _to_checkpoint(entry: _Entry, arrays) -> np.ndarray:
    arrays = [np.asarray(a) for a in arrays]
    if entry.layout == "linear":
        return arrays[0].T
    if entry.layout == "conv":  # [W, C] kernels, concatenated -> [C, 1, W]
        return np.concatenate(arrays, axis=1).T[:, None, :]
    return arrays[0].reshape(entry.layout[0]) if isinstance(entry.layout, tuple) else arrays[0]


def _to_layer(entry: _Entry, w: np.ndarray) -> list[np.ndarray]:
    if entry.layout == "linear":
        return [w.T]
    if entry.layout == "conv":
        widths = [v.get_value().shape[1] for v in entry.variables]
        return np.split(kernel_from_torch(w), np.cumsum(widths)[:-1], axis=1)
    if isinstance(entry.layout, tuple):
        template, label = entry.layout
        fits = all(t in (-1, s) for t, s in zip(template, w.shape, strict=False))
        if not fits or len(w.shape) != len(template):
            raise ValueError(f"expected {label}, got {w.shape}")
        return [w.reshape(-1)]
    return [w]


_KDA_LAYER = "kda_lib.layers.kda_layer.KimiDeltaAttention"  # named: kda_layer imports this module


def _is_kda_layer(layer) -> bool:
    """Whether ``layer`` is a :class:`kda_lib.KimiDeltaAttention` (or a subclass), told by its
    classes' qualified names: importing the class here would make an import cycle."""
    return any(f"{c.__module__}.{c.__qualname__}" == _KDA_LAYER for c in type(layer).__mro__)


def _entries(layer, naming: str) -> dict[str, _Entry]:
    """Checkpoint name -> :class:`_Entry` for ``layer`` in ``naming`` (the one table)."""
    if not (_is_kda_layer(layer) or isinstance(layer, MultiHeadLatentAttention)):
        raise TypeError(f"layer must be a KimiDeltaAttention or MultiHeadLatentAttention, got "
                        f"{type(layer).__name__}")  # fmt: skip
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {NAMINGS}, got {naming!r}")
    if isinstance(layer, MultiHeadLatentAttention):
        if naming == "fla":
            raise ValueError("naming 'fla' has no MLA layer: a MultiHeadLatentAttention is read "
                             "in the 'kimi_linear' or 'transformers' naming (DeepSeek-V2's "
                             "names)")  # fmt: skip
        return _mla_entries(layer)
    _check_kda_naming(layer.config, naming)
    return {
        **_projection_and_conv_entries(layer, naming),
        **_gate_entries(layer, naming),
        **_per_head_entries(layer, naming),
    }


def _check_kda_naming(cfg, naming: str) -> None:
    """Refuse a KDA layer of config ``cfg`` that ``naming`` has no tensors for (ValueError)."""
    hf = naming == "transformers"
    if cfg.fused_qkv_conv and not hf:
        raise ValueError(f"the {naming!r} naming has separate q_conv1d/k_conv1d/v_conv1d "
                         "weights; this layer has one fused qkv_conv1d (KDAConfig.fused_qkv_conv"
                         "=True): build it with fused_qkv_conv=False to read this "
                         "checkpoint")  # fmt: skip
    lacking = [what for what, absent in (  # the transformers layer has them all
        ("a full-rank forget gate (forget_gate_rank=None)", cfg.forget_gate_rank is None),
        ("no A_log (use_a_log=False)", not cfg.use_a_log),
        ("an output-gate bias (output_gate_bias=True)", cfg.output_gate_bias),
    ) if absent]  # fmt: skip
    if hf and lacking:
        raise ValueError("the 'transformers' naming (KimiLinearDeltaAttention of the transformers "
                         "library) has no tensors for " + "; ".join(lacking))  # fmt: skip


def _projection_and_conv_entries(layer, naming: str) -> dict[str, _Entry]:
    """A KDA layer's q/k/v/beta/output projections and short-conv kernels (the transformers
    naming concatenates the kernels into one ``conv1d.weight``)."""
    hf = naming == "transformers"
    names = _TRANSFORMERS_NAMES if hf else {}
    entries = {
        f"{names.get(p, p)}.weight": _Entry((getattr(layer, p).kernel,), "linear")
        for p in ("q_proj", "k_proj", "v_proj", "b_proj", "o_proj")
    }
    convs = {c: conv.kernel for c in ("qkv_conv1d", "q_conv1d", "k_conv1d", "v_conv1d")
             if (conv := getattr(layer, c)) is not None}  # fmt: skip
    if hf:
        entries["conv1d.weight"] = _Entry(tuple(convs.values()), "conv")
    else:
        entries.update({f"{c}.weight": _Entry((kernel,), "conv") for c, kernel in convs.items()})
    return entries


def _gate_entries(layer, naming: str) -> dict[str, _Entry]:
    """A KDA layer's forget and output gate projections (full rank, or low-rank down and up),
    with the output gate's bias when it has one."""
    names = _TRANSFORMERS_NAMES if naming == "transformers" else {}
    entries = {}
    for gate, has_bias in (("f_proj", False), ("g_proj", layer.config.output_gate_bias)):
        module = getattr(layer, gate)
        full, *low = (n.format(g=gate[0], gate=names.get(gate)) for n in _GATE_NAMES[naming])
        sequential = isinstance(module, nnx.Sequential)
        parts = list(zip(low, module.layers, strict=True)) if sequential else [(full, module)]
        entries.update({f"{name}.weight": _Entry((sub.kernel,), "linear") for name, sub in parts})
        if has_bias:
            entries[f"{parts[-1][0]}.bias"] = _Entry((parts[-1][1].bias,))
    return entries


def _per_head_entries(layer, naming: str) -> dict[str, _Entry]:
    """A KDA layer's ``A_log`` (when it has one), ``dt_bias`` and ``o_norm`` weight, in the
    layouts of ``naming``."""
    entries = {}
    if layer.A_log is not None:
        layout = {"kimi_linear": ((1, 1, -1, 1), "Kimi Linear's A_log layout [1, 1, H, 1]"),
                  "transformers": ((-1, 1), "the transformers A_log layout [HV, 1]")}  # fmt: skip
        entries["A_log"] = _Entry((layer.A_log,), layout.get(naming, "same"))
    heads = layer.config.value_heads
    per_head = ((heads, -1), f"the transformers layout [HV={heads}, channels]")
    entries["dt_bias"] = _Entry((layer.dt_bias,), per_head if naming == "transformers" else "same")
    entries["o_norm.weight"] = _Entry((layer.o_norm,))
    return entries


def _mla_entries(layer) -> dict[str, _Entry]:
    """:class:`~kda_lib.layers.mla.MultiHeadLatentAttention`'s tensors (DeepSeek-V2's names)."""
    low_rank_q = layer.config.q_lora_rank is not None
    queries = ["q_a_proj", "q_b_proj"] if low_rank_q else ["q_proj"]
    entries = {f"{p}.weight": _Entry((getattr(layer, p).kernel,), "linear")
               for p in ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj", *queries]}  # fmt: skip
    for norm in ["kv_a_layernorm"] + ["q_a_layernorm"] * low_rank_q:
        entries[f"{norm}.weight"] = _Entry((getattr(layer, norm).scale,))
    return entries


def _checkpoint_shape(entry: _Entry) -> tuple[int, ...]:
    probes = [np.zeros(v.get_value().shape, np.float32) for v in entry.variables]
    return tuple(_to_checkpoint(entry, probes).shape)


def state_dict_names(layer, naming: str = "fla") -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint in ``naming`` holds for ``layer``: name -> shape (its layout)."""
    return {name: _checkpoint_shape(e) for name, e in sorted(_entries(layer, naming).items())}


def export_state_dict(layer, naming: str = "fla") -> dict[str, np.ndarray]:
    """``layer``'s parameters as a checkpoint in ``naming`` (numpy, the checkpoint's layouts)."""
    return {
        name: np.ascontiguousarray(_to_checkpoint(entry, [v[...] for v in entry.variables]))
        for name, entry in _entries(layer, naming).items()
    }


def load_state_dict(layer, state_dict, naming: str = "fla", *, prefix: str = "") -> None:
    """Copy ``state_dict`` (names without ``prefix`` -> arrays) in ``naming`` into ``layer`` (a
    :class:`kda_lib.KimiDeltaAttention` or, in the Kimi Linear namings, an MLA layer) in place,
    all or nothing: a ValueError names every missing or unexpected name, or the first tensor of
    a wrong shape or with a non-finite or non-real value. ``prefix`` is printed in errors."""
    source = "fla" if naming == "fla" else "checkpoint"
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not isinstance(state_dict, Mapping):
        raise ValueError(f"state_dict must be a mapping of {source} names to arrays, got "
                         f"{type(state_dict).__name__}")  # fmt: skip
    entries = _entries(layer, naming)
    missing = sorted(set(entries) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(entries), key=str)
    if missing or unexpected:
        kind = type(layer.config).__name__
        wrong = [f"{what} {[f'{prefix}{n}' for n in names]}" for what, names in
                 (("missing", missing), ("unexpected", unexpected)) if names]  # fmt: skip
        hint = ("num_heads, num_v_heads, forget_gate_rank, output_gate_rank, output_gate_bias, "
                "use_a_log, conv_size; conv biases are not supported")  # fmt: skip
        raise ValueError(f"{source} state_dict does not match this {kind}: {'; '.join(wrong)} "
                         f"(check {hint if kind == 'KDAConfig' else 'q_lora_rank'})")  # fmt: skip
    label = "fla " if naming == "fla" and not prefix else prefix
    converted = [pair for name, entry in entries.items()
                 for pair in _converted(label + name, entry, state_dict[name])]  # fmt: skip
    for variable, value in converted:  # nothing raises from here on
        variable.set_value(value)


def _converted(label: str, entry: _Entry, value) -> list:
    """``(variable, value)`` for each parameter ``entry`` holds, checked."""
    try:
        given = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{label}: not convertible to an array ({error})") from None
    if given.dtype == jnp.bfloat16:  # ml_dtypes' bfloat16 (safetensors, jax): not np.floating
        given = given.astype(np.float32)
    if not (np.issubdtype(given.dtype, np.floating) or np.issubdtype(given.dtype, np.integer)):
        raise ValueError(  # object arrays ([None, None]), strings, bools, complex numbers
            f"{label}: expected an array of real numbers, got dtype {given.dtype} "
            f"({type(value).__name__} {value!r:.80})"
        )
    try:
        values = _to_layer(entry, given)
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from None
    out = []
    for variable, value in zip(entry.variables, values, strict=True):
        expected = variable.get_value()  # an array or, from nnx.eval_shape, its shape
        if value.shape != expected.shape:
            raise ValueError(
                f"{label}: shape {given.shape} converts to {value.shape}, but the layer "
                f"expects {expected.shape} (a checkpoint of shape {_checkpoint_shape(entry)})"
            )
        value = np.asarray(value, expected.dtype)
        if not np.isfinite(value).all():
            raise ValueError(f"{label}: contains NaN or inf values (as {expected.dtype})")
        out.append((variable, jnp.asarray(value)))
    return out


# ------------------------------------------------------------------ Kimi Linear safetensors
def kimi_linear_prefix(layer_index: int) -> str:
    """``model.layers.N.self_attn.``: decoder layer ``N``'s (0-based) attention tensors."""
    return f"model.layers.{check_int('layer_index', layer_index, minimum=0)}.self_attn."


# safetensors dtypes read (little-endian); any other (FP8, complex, bool, ...) is refused by name
SAFETENSORS_DTYPES = {name: np.dtype(dtype) for name, dtype in dict(
    F64="<f8", F32="<f4", F16="<f2", BF16=jnp.bfloat16, I64="<i8", I32="<i4", I16="<i2",
    I8="i1", U8="u1").items()}  # fmt: skip


def _check_unchanged(versions: dict[str, tuple]) -> None:
    """Refuse, naming it, a file of ``versions`` (path -> (inode, size, mtime)) since changed."""
    for path, version in versions.items():
        stat = os.stat(path) if os.path.exists(path) else None
        if stat is None or (stat.st_ino, stat.st_size, stat.st_mtime_ns) != version:
            raise ValueError(f"{path}: the file changed while the checkpoint was read (replaced "
                             "or rewritten): its tensors may be of two versions; read it "
                             "again")  # fmt: skip


def read_safetensors(paths, prefix: str = "", *, versions: dict | None = None,
                     headers: dict | None = None) -> dict:  # fmt: skip
    """The tensors ``prefix...`` of the ``.safetensors`` file(s) ``paths``, ``prefix`` cut off,
    as numpy arrays, read without a memory map. ``versions`` and ``headers`` (path -> first
    version, checked header) are shared by one load's reads. A bad or changed file: ValueError."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else paths
    if isinstance(paths, (bytes, bytearray)) or not isinstance(paths, Sequence) or not all(
        isinstance(p, (str, os.PathLike)) and isinstance(os.fspath(p), str) for p in paths
    ):  # fmt: skip
        raise TypeError(f"paths must be a file (str or os.PathLike) or a list of them: {paths!r}")
    if not paths:
        raise ValueError("paths must name at least one file, got an empty list")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    versions, headers = ({} if d is None else d for d in (versions, headers))
    out: dict[str, np.ndarray] = {}
    for path in map(os.fspath, paths):
        if not os.path.isfile(path):
            raise ValueError(f"no safetensors file at {path!r}")
        tensors = _read_file(path, prefix, versions, headers)
        if twice := sorted(tensors.keys() & out.keys()):
            raise ValueError(f"{prefix}{twice[0]} appears in more than one of the files {paths}")
        out.update(tensors)
    _check_unchanged(versions)
    return out


def _read_file(path: str, prefix: str, versions: dict, headers: dict) -> dict[str, np.ndarray]:
    """One file's tensors under ``prefix`` (cut off), noting ``versions`` and ``headers``."""
    with open(path, "rb") as handle:
        stat = os.fstat(handle.fileno())
        versions.setdefault(path, (stat.st_ino, stat.st_size, stat.st_mtime_ns))
        if path not in headers:
            try:
                with safetensors.safe_open(path, framework="numpy") as checked:
                    names = list(checked.keys())
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
            except Exception as error:  # safetensors' SafetensorError and what it lets through
                raise ValueError(f"{path}: not a valid safetensors file ({error})") from None
            headers[path] = (names, header, handle.tell())
        _check_unchanged({path: versions[path]})  # the file checked is the file open
        names, header, start = headers[path]
        out = {}
        for name in (n for n in names if n.startswith(prefix)):
            where, entry = f"{path}: tensor {name}", header[name]
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            if dtype not in SAFETENSORS_DTYPES:
                raise ValueError(f"{where}: dtype {dtype!r} is not supported (supported: "
                                 f"{', '.join(SAFETENSORS_DTYPES)}); convert the checkpoint "
                                 "first")  # fmt: skip
            if len(shape) > 64:
                raise ValueError(f"{where}: {len(shape)} dimensions (numpy holds at most 64)")
            buffer = bytearray(end - begin)
            handle.seek(start + begin)
            if handle.readinto(buffer) != len(buffer):
                raise ValueError(f"{where}: the file is shorter than its header says")
            array = np.frombuffer(buffer, SAFETENSORS_DTYPES[dtype])
            out[name[len(prefix) :]] = array.reshape(shape)
    return out


def detect_kimi_linear_naming(names) -> str:
    """``"kimi_linear"`` or ``"transformers"``, told by one KDA layer's beta projection's name."""
    markers = {"kimi_linear": "b_proj.weight", "transformers": "beta_proj.weight"}
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise TypeError(f"names must be a layer's tensor names (a list, or a dict by name), got "
                        f"{type(names).__name__}")  # fmt: skip
    if len(found := [n for n, marker in markers.items() if marker in set(names)]) != 1:
        raise ValueError(f"cannot tell the naming of a KDA layer with tensors {sorted(names)}: "
                         f"expected one of {list(markers.values())} (remote code, "
                         "transformers)")  # fmt: skip
    return found[0]
