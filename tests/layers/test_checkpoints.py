"""kda_lib.layers.checkpoints: fla's and the Hugging Face Kimi Linear checkpoint's naming, one
table.

The Kimi Linear names and shapes below are those of ``KimiDeltaAttention.__init__`` in the
Hugging Face ``modeling_kimi.py`` (revision 6e163f3, as copied into axolotl-ai-cloud/axolotl
``src/axolotl/monkeypatch/models/kimi_linear/modeling_kimi.py`` @
1e4d015475e3f5d48e6fb5517484f0bfd08b96bd), written here by hand from that source.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import load_fla_layer_fixture
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from kda_lib import KDAConfig, KimiDeltaAttention
from kda_lib.layers import checkpoints
from kda_lib.layers.checkpoints import (
    detect_kimi_linear_naming,
    export_state_dict,
    kimi_linear_prefix,
    load_state_dict,
    read_safetensors,
    state_dict_names,
)
from kda_lib.layers.mla import MultiHeadLatentAttention
from kda_lib.models.presets import (
    KIMI_LINEAR_48B,
    ModelPreset,
    build_kda_layer,
    build_mla_layer,
    load_kimi_linear_checkpoint,
)
from kda_lib.testing import assert_close

# a small Kimi Linear KDA layer: gates of rank head_dim, no output-gate bias, softplus gate
SMALL = KDAConfig(
    hidden_size=32,
    num_heads=2,
    head_dim=8,
    forget_gate_rank=8,
    output_gate_rank=8,
    output_gate_bias=False,
)


def _layer(config=SMALL, seed=0):
    return KimiDeltaAttention(config, rngs=nnx.Rngs(seed))


def _x(hidden=32, seq_len=12):
    return jax.random.normal(jax.random.key(3), (2, seq_len, hidden))


def _write(path, tensors):
    save_file({name: np.ascontiguousarray(value) for name, value in tensors.items()}, path)
    return path


def load_kimi_linear_safetensors(layer, paths, layer_index):
    """Decoder layer ``layer_index``'s tensors of Kimi Linear safetensors file(s) into ``layer``."""
    prefix = kimi_linear_prefix(layer_index)
    load_state_dict(layer, read_safetensors(paths, prefix), "kimi_linear", prefix=prefix)


def _kimi_file(tmp_path, layer, layer_index=2, **changes):
    """A safetensors file in the published naming: ``layer``'s weights as decoder layer
    ``layer_index``, beside tensors of other layers and modules that the loader must skip."""
    prefix = kimi_linear_prefix(layer_index)
    tensors = {
        prefix + name: value for name, value in export_state_dict(layer, "kimi_linear").items()
    }
    tensors["model.embed_tokens.weight"] = np.ones((5, 32), np.float32)
    tensors[f"model.layers.{layer_index}.mlp.gate_proj.weight"] = np.ones((4, 32), np.float32)
    tensors[f"model.layers.{layer_index + 1}.self_attn.kv_a_proj_with_mqa.weight"] = np.ones(
        (6, 32), np.float32
    )
    tensors[f"model.layers.{layer_index}0.self_attn.A_log"] = np.ones((1, 1, 2, 1), np.float32)
    for name, value in changes.items():
        if value is None:
            del tensors[prefix + name]
        else:
            tensors[prefix + name] = value
    return _write(str(tmp_path / "model-00001-of-00002.safetensors"), tensors)


def _params(layer):
    return {n: np.asarray(v).copy() for n, v in export_state_dict(layer).items()}


def test_kimi_linear_names_and_shapes_are_the_published_ones():
    """At full size, from shapes only: the tensors modeling_kimi.py's KimiDeltaAttention has."""
    d, h, k, w = 2304, 32, 128, 4
    expected = {
        "q_proj.weight": (h * k, d),
        "k_proj.weight": (h * k, d),
        "v_proj.weight": (h * k, d),
        "q_conv1d.weight": (h * k, 1, w),
        "k_conv1d.weight": (h * k, 1, w),
        "v_conv1d.weight": (h * k, 1, w),
        "A_log": (1, 1, h, 1),
        "f_a_proj.weight": (k, d),
        "f_b_proj.weight": (h * k, k),
        "dt_bias": (h * k,),
        "b_proj.weight": (h, d),
        "g_a_proj.weight": (k, d),
        "g_b_proj.weight": (h * k, k),
        "o_norm.weight": (k,),
        "o_proj.weight": (d, h * k),
    }
    assert state_dict_names(build_kda_layer(KIMI_LINEAR_48B), "kimi_linear") == expected
    assert kimi_linear_prefix(3) == "model.layers.3.self_attn."


def test_kimi_linear_layer_loads_from_safetensors(tmp_path):
    source, target = _layer(seed=0), _layer(seed=1)
    # the published checkpoint is bfloat16: one tensor stored so, widened exactly on reading
    bf16 = export_state_dict(source, "kimi_linear")["o_norm.weight"].astype(ml_dtypes.bfloat16)
    path = _kimi_file(tmp_path, source, **{"o_norm.weight": bf16})
    source.o_norm.set_value(jnp.asarray(bf16.astype(np.float32)))
    load_kimi_linear_safetensors(target, path, 2)
    want, got = _params(source), _params(target)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    x = _x()
    np.testing.assert_array_equal(np.asarray(target(x)), np.asarray(source(x)))
    # the other tensors in the file were not read
    assert set(read_safetensors(path, "model.layers.2.self_attn.")) == set(
        state_dict_names(source, "kimi_linear")
    )


def test_kimi_linear_layer_reads_across_shards(tmp_path):
    source, target = _layer(seed=0), _layer(seed=1)
    tensors = {
        kimi_linear_prefix(0) + n: v for n, v in export_state_dict(source, "kimi_linear").items()
    }
    names = sorted(tensors)
    first = _write(str(tmp_path / "a.safetensors"), {n: tensors[n] for n in names[:5]})
    second = _write(str(tmp_path / "b.safetensors"), {n: tensors[n] for n in names[5:]})
    load_kimi_linear_safetensors(target, [first, second], 0)
    x = _x()
    np.testing.assert_array_equal(np.asarray(target(x)), np.asarray(source(x)))
    with pytest.raises(ValueError, match=r"missing \['model.layers.0.self_attn."):
        load_kimi_linear_safetensors(target, [first], 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(dt_bias=None), r"missing \['model.layers.2.self_attn.dt_bias'\]"),
        (
            {"q_conv1d.bias": np.zeros(16, np.float32)},
            r"unexpected \['model.layers.2.self_attn.q_conv1d.bias'\]",
        ),
        (
            {"g_b_proj.bias": np.zeros(16, np.float32)},  # the published layer has no bias
            r"unexpected \['model.layers.2.self_attn.g_b_proj.bias'\]",
        ),
        (
            {"o_norm.weight": np.ones(7, np.float32)},
            r"model.layers.2.self_attn.o_norm.weight: shape \(7,\) converts to \(7,\), but the "
            r"layer expects \(8,\)",
        ),
        (
            {"A_log": np.zeros(2, np.float32)},  # fla's [H], not the published [1, 1, H, 1]
            r"self_attn.A_log: expected Kimi Linear's A_log layout \[1, 1, H, 1\], got \(2,\)",
        ),
        (
            {"f_b_proj.weight": np.zeros((8, 16), np.float32)},  # transposed
            r"f_b_proj.weight: shape \(8, 16\) converts to \(16, 8\), but the layer expects "
            r"\(8, 16\) \(a checkpoint of shape \(16, 8\)\)",
        ),
        (
            {"k_proj.weight": np.full((16, 32), np.inf, np.float32)},
            "model.layers.2.self_attn.k_proj.weight: contains NaN or inf",
        ),
    ],
    ids=[
        "missing",
        "extra-conv-bias",
        "extra-gate-bias",
        "shape",
        "a-log-layout",
        "transposed",
        "inf",
    ],
)
def test_a_bad_kimi_linear_checkpoint_is_refused_by_name_and_changes_nothing(
    tmp_path, change, message
):
    layer = _layer(seed=1)
    before = _params(layer)
    path = _kimi_file(tmp_path, _layer(seed=0), **change)
    with pytest.raises(ValueError, match=message):
        load_kimi_linear_safetensors(layer, path, 2)
    after = _params(layer)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_kimi_linear_reader_errors(tmp_path):
    layer = _layer()
    path = _kimi_file(tmp_path, _layer(), layer_index=2)
    with pytest.raises(ValueError, match=r"missing \['model.layers.5.self_attn.A_log'"):
        load_kimi_linear_safetensors(layer, path, 5)
    with pytest.raises(ValueError, match="no safetensors file at"):
        load_kimi_linear_safetensors(layer, str(tmp_path / "absent.safetensors"), 2)
    with pytest.raises(ValueError, match="layer_index must be an int >= 0"):
        kimi_linear_prefix(-1)
    with pytest.raises(ValueError, match="naming must be one of"):
        state_dict_names(layer, "hf")


# fla's names -> the published checkpoint's, where they differ (the rest are the same)
FLA_TO_KIMI = {
    "f_proj.0.weight": "f_a_proj.weight",
    "f_proj.1.weight": "f_b_proj.weight",
    "g_proj.0.weight": "g_a_proj.weight",
    "g_proj.1.weight": "g_b_proj.weight",
    "g_proj.1.bias": "g_b_proj.bias",
}


def _as_kimi(state_dict):
    out = {FLA_TO_KIMI.get(name, name): value for name, value in state_dict.items()}
    out["A_log"] = out["A_log"].reshape(1, 1, -1, 1)
    return out


@pytest.mark.parametrize("case", ["default", "safe_gate"])
def test_the_fla_fixture_weights_in_the_published_naming_give_fla_s_output(tmp_path, case):
    """fla's layer (data/fixtures) has an output-gate bias, which the published layer lacks:
    with the bias, renamed into the published naming, the loaded layer gives fla's recorded
    output; without it (zeroed), the two loaders build the same layer."""
    config, state_dict, x, y = load_fla_layer_fixture(case)
    path = _write(
        str(tmp_path / "kimi.safetensors"),
        {kimi_linear_prefix(0) + n: v for n, v in _as_kimi(state_dict).items()},
    )
    layer = KimiDeltaAttention(config, rngs=nnx.Rngs(0))
    load_kimi_linear_safetensors(layer, path, 0)
    err = assert_close(nnx.jit(lambda m, x: m(x))(layer, x), y, atol=5e-6, rtol=1e-5, name=case)
    print(f"{case}: published naming vs fla's recorded output, max abs err {err:.1e}")

    no_bias = dataclasses.replace(config, output_gate_bias=False)
    via_fla = KimiDeltaAttention(config, rngs=nnx.Rngs(1))
    load_state_dict(via_fla, {**state_dict, "g_proj.1.bias": np.zeros(32, np.float32)})
    kimi = {n: v for n, v in _as_kimi(state_dict).items() if n != "g_b_proj.bias"}
    via_kimi = KimiDeltaAttention(no_bias, rngs=nnx.Rngs(2))
    load_state_dict(via_kimi, kimi, "kimi_linear")
    run = nnx.jit(lambda m, x: m(x))
    np.testing.assert_array_equal(np.asarray(run(via_kimi, x)), np.asarray(run(via_fla, x)))


ROUND_TRIP = {
    "published": {},
    # fla's grouped value heads with its safe gate without A_log (no A_log tensor at all)
    "grouped_no_a_log": dict(
        num_v_heads=4, gate_form="safe_sigmoid", lower_bound=-5.0, use_a_log=False
    ),
    "full_rank_output_gate_with_bias": dict(output_gate_rank=None, output_gate_bias=True),
    "full_rank_forget_gate": dict(forget_gate_rank=None),
}


@pytest.mark.parametrize("case", sorted(ROUND_TRIP))
@pytest.mark.parametrize("naming", ["fla", "kimi_linear", "transformers"])
def test_export_and_load_round_trip(naming, case):
    config = dataclasses.replace(SMALL, **ROUND_TRIP[case])
    if naming == "transformers" and case != "published":
        # the transformers layer has an A_log, a low-rank forget gate and no output bias
        with pytest.raises(ValueError, match="'transformers' naming .* has no tensors for"):
            state_dict_names(_layer(config), naming)
        return
    source, target = _layer(config, seed=0), _layer(config, seed=5)
    state_dict = export_state_dict(source, naming)
    assert ("A_log" in state_dict) == config.use_a_log
    load_state_dict(target, state_dict, naming)
    for name, value in _params(source).items():
        np.testing.assert_array_equal(_params(target)[name], value, err_msg=name)
    x = _x()
    np.testing.assert_array_equal(np.asarray(target(x)), np.asarray(source(x)))


def test_grouped_value_heads_use_fla_s_names_with_value_head_shapes():
    layer = _layer(dataclasses.replace(SMALL, num_v_heads=4, value_head_dim=4))
    names = state_dict_names(layer)
    assert names["q_proj.weight"] == (2 * 8, 32) and names["q_conv1d.weight"] == (16, 1, 4)
    assert names["v_proj.weight"] == (4 * 4, 32) and names["v_conv1d.weight"] == (16, 1, 4)
    assert names["f_proj.1.weight"] == (4 * 8, 8) and names["dt_bias"] == (4 * 8,)
    assert names["b_proj.weight"] == (4, 32) and names["A_log"] == (4,)
    assert names["g_proj.1.weight"] == (4 * 4, 8) and names["o_proj.weight"] == (32, 4 * 4)
    assert state_dict_names(layer, "kimi_linear")["A_log"] == (1, 1, 4, 1)


def test_layouts_without_a_checkpoint_name_are_refused():
    fused = _layer(dataclasses.replace(SMALL, fused_qkv_conv=True))
    for naming in ("fla", "kimi_linear"):  # the transformers naming has only the fused conv
        with pytest.raises(ValueError, match="one fused qkv_conv1d"):
            state_dict_names(fused, naming)
    full = _layer(dataclasses.replace(SMALL, output_gate_rank=None))
    names = state_dict_names(full, "kimi_linear")
    assert names["g_proj.weight"] == (16, 32) and "g_a_proj.weight" not in names


# ------------------------------------------------------------- malformed safetensors files
def _layer_values(layer):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(layer))]


def _small_file(tmp_path):
    """A valid two-tensor file's bytes: ``(path, bytes)``."""
    path = str(tmp_path / "small.safetensors")
    _write(
        path,
        {
            "model.layers.0.self_attn.a": np.arange(6, dtype=np.float32).reshape(2, 3),
            "model.layers.0.self_attn.b": np.ones((4,), np.float16),
        },
    )
    with open(path, "rb") as handle:
        return path, handle.read()


def _header_file(tmp_path, header: dict, data: bytes = b"") -> str:
    import json

    raw = json.dumps(header).encode()
    path = str(tmp_path / "handmade.safetensors")
    with open(path, "wb") as handle:
        handle.write(len(raw).to_bytes(8, "little") + raw + data)
    return path


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_malformed_safetensors_raise_value_error_naming_the_file(tmp_path_factory, data):
    """Truncated files, corrupted header bytes and wrong header sizes: read_safetensors returns
    the tensors exactly or raises a ValueError naming the file, never another error."""
    tmp_path = tmp_path_factory.mktemp("malformed")
    path, raw = _small_file(tmp_path)
    header_end = 8 + int.from_bytes(raw[:8], "little")
    kind = data.draw(st.sampled_from(["truncate", "flip", "size"]))
    if kind == "truncate":
        broken = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif kind == "flip":
        at = data.draw(st.integers(0, header_end - 1))
        broken = raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1 :]
    else:
        size = data.draw(st.sampled_from([0, 1, header_end - 9, header_end, 2**40, 2**64 - 1]))
        broken = size.to_bytes(8, "little") + raw[8:]
    with open(path, "wb") as handle:
        handle.write(broken)
    try:
        got = read_safetensors(path)
    except ValueError as error:
        assert path in str(error)
    else:  # a change that leaves a valid file (a space in the JSON, another letter in a name):
        # at most the two tensors, each exactly one of the originals
        originals = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((4,), np.float16)]
        assert len(got) <= 2
        for value in got.values():
            assert any(
                value.dtype == o.dtype and value.shape == o.shape and np.array_equal(value, o)
                for o in originals
            ), value


_HEADER_ERROR = "not a valid safetensors file"


@pytest.mark.parametrize(
    "entry,size,match",
    [
        ({"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}, 2, "A_log: dtype 'F8_E4M3'"),
        ({"dtype": "F8_E5M2", "shape": [2], "data_offsets": [0, 2]}, 2, "A_log: dtype 'F8_E5M2'"),
        ({"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}, 8, "A_log: dtype 'C64'"),
        ({"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}, 4, "A_log: 65 dimensions"),
        ({"dtype": "F32", "shape": [2**70, 0], "data_offsets": [0, 0]}, 0, _HEADER_ERROR),
        ({"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 0]}, 0, _HEADER_ERROR),
        ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, 8, _HEADER_ERROR),
        ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}, 8, _HEADER_ERROR),
        ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, 8, _HEADER_ERROR),
        ({"dtype": "F32", "shape": [2]}, 8, _HEADER_ERROR),
        ([1, 2], 8, _HEADER_ERROR),
    ],
)
def test_unsupported_or_inconsistent_safetensors_entries_are_refused_by_name(
    tmp_path, entry, size, match
):
    """FP8 and other dtypes outside SAFETENSORS_DTYPES, more than 64 dimensions, and entries
    whose shape or offsets do not fit: a ValueError naming the file (and the tensor, where the
    entry is valid safetensors); the layer unchanged."""
    path = _header_file(tmp_path, {"model.layers.0.self_attn.A_log": entry}, bytes(size))
    with pytest.raises(ValueError, match=match) as error:
        read_safetensors(path)
    assert str(error.value).startswith(path)
    layer = _layer()
    before = _layer_values(layer)
    with pytest.raises(ValueError, match=match):
        load_kimi_linear_safetensors(layer, path, 0)
    for a, b in zip(before, _layer_values(layer), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_shard_replaced_during_a_load_is_refused_naming_it(tmp_path, monkeypatch):
    """Layers of two versions of a checkpoint are refused: a shard replaced between the reads
    of two layers (load_kimi_linear_checkpoint) or of two files (read_safetensors)."""
    directory = _write_checkpoint(tmp_path / "c", _tiny_layers(), "kimi_linear")
    shard = str(directory / "model.safetensors")
    tensors = read_safetensors(shard)
    real = checkpoints._read_file
    calls = []

    def replacing(path, *args):  # after the first layer's read, a new version of the shard
        out = real(path, *args)
        if not calls:
            _write(shard + ".new", {k: v + 1 for k, v in tensors.items()})
            os.replace(shard + ".new", shard)
        calls.append(path)
        return out

    monkeypatch.setattr(checkpoints, "_read_file", replacing)
    with pytest.raises(ValueError, match="model.safetensors: the file changed while"):
        load_kimi_linear_checkpoint(directory)
    calls.clear()
    other = str(tmp_path / "other.safetensors")
    _write(other, {"x": np.ones(2, np.float32)})
    with pytest.raises(ValueError, match="model.safetensors: the file changed while"):
        read_safetensors([shard, other])


@pytest.mark.parametrize("paths", [b"model.safetensors", 3, [b"a.safetensors"], [None]])
def test_safetensors_paths_of_a_wrong_type_raise_type_error_naming_paths(paths):
    with pytest.raises(TypeError, match="paths"):
        read_safetensors(paths)


def test_a_safetensors_file_that_shrinks_while_read_cannot_crash_the_process(tmp_path):
    """The file is cut to its header right after it is opened (a shard being rewritten): a
    memory-mapped read dies of SIGBUS; kda_lib reads with ordinary reads and raises a
    ValueError naming the file. In a subprocess, so a crash fails the test instead of the run."""
    import subprocess
    import sys
    import textwrap

    path, raw = _small_file(tmp_path)
    header_end = 8 + int.from_bytes(raw[:8], "little")
    script = textwrap.dedent(
        f"""
        import builtins, os, safetensors
        import kda_lib.layers.checkpoints as checkpoints
        PATH, CUT = {path!r}, {header_end}
        real_safe_open = safetensors.safe_open

        class Shrinking:  # the safetensors reader (memory-mapped), cut after opening
            def __init__(self, *args, **kwargs):
                self.handle = real_safe_open(*args, **kwargs)
            def __enter__(self):
                self.inner = self.handle.__enter__()
                os.truncate(PATH, CUT)
                return self.inner
            def __exit__(self, *exc):
                return self.handle.__exit__(*exc)

        def shrinking_open(file, *args, **kwargs):  # kda_lib's own reader, cut after opening
            handle = builtins.open(file, *args, **kwargs)
            os.truncate(PATH, CUT)
            return handle

        safetensors.safe_open = Shrinking
        checkpoints.open = shrinking_open
        try:
            checkpoints.read_safetensors(PATH)
        except ValueError as error:
            assert PATH in str(error), error
            print("refused")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0 and "refused" in result.stdout, (result.returncode, result.stderr)


# ------------------------------------------------ the transformers library's naming; whole files
def test_transformers_names_and_shapes_are_the_library_s():
    """At full size, from shapes only: the tensors of KimiLinearDeltaAttention in
    huggingface/transformers src/transformers/models/kimi_linear/modeling_kimi_linear.py @
    c1a44bc9cde33bee2282b77e2b9638550a8d4c80 (nn.Linear weights [out, in]; one nn.Conv1d over
    concat(q, k, v) of groups = channels, [C, 1, W]; A_log [HV, 1]; dt_bias [HV, V])."""
    d, h, k, w = 2304, 32, 128, 4
    expected = {
        "q_proj.weight": (h * k, d),
        "k_proj.weight": (h * k, d),
        "v_proj.weight": (h * k, d),
        "conv1d.weight": (3 * h * k, 1, w),
        "forget_gate_down.weight": (k, d),
        "forget_gate_up.weight": (h * k, k),
        "beta_proj.weight": (h, d),
        "A_log": (h, 1),
        "dt_bias": (h, k),
        "output_gate_down.weight": (k, d),
        "output_gate_up.weight": (h * k, k),
        "o_norm.weight": (k,),
        "o_proj.weight": (d, h * k),
    }
    layer = build_kda_layer(KIMI_LINEAR_48B)
    assert state_dict_names(layer, "transformers") == expected
    # the MLA layer: DeepSeek-V2's names in both namings (KimiLinearAttention, same file)
    assert state_dict_names(build_mla_layer(KIMI_LINEAR_48B), "transformers") == {
        "kv_a_layernorm.weight": (512,),
        "kv_a_proj_with_mqa.weight": (512 + 64, d),
        "kv_b_proj.weight": (32 * (128 + 128), 512),
        "o_proj.weight": (d, 32 * 128),
        "q_proj.weight": (32 * (128 + 64), d),
    }


# a tiny Kimi Linear config.json: layers 1 and 3 KDA, 2 MLA (1-based), the published layout
TINY_CONFIG = {
    "model_type": "kimi_linear",
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "rms_norm_eps": 1e-5,
    "linear_attn_config": {
        "kda_layers": [1, 3],
        "full_attn_layers": [2],
        "num_heads": 2,
        "head_dim": 8,
        "short_conv_kernel_size": 4,
    },
    "num_attention_heads": 2,
    "q_lora_rank": None,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
    "mla_use_nope": True,
}


def _tiny_layers(seed=1):
    preset = ModelPreset.from_hf_config(TINY_CONFIG)
    rngs = nnx.Rngs(seed)
    return [
        KimiDeltaAttention(preset.kda_config(), rngs=rngs)
        if kind == "kda"
        else MultiHeadLatentAttention(preset.mla_config(), rngs=rngs)
        for kind in preset.layer_kinds
    ]


def _to_transformers(tensors, heads):
    """The remote code's KDA tensors in the transformers library's names and layouts, written
    out here from modeling_kimi_linear.py @ c1a44bc9 (not with kda_lib's own table): renamed
    projections, one conv over the concatenated q, k, v channels, A_log [H, 1], dt_bias
    [H, K]."""
    renames = {
        "f_a_proj.weight": "forget_gate_down.weight",
        "f_b_proj.weight": "forget_gate_up.weight",
        "g_a_proj.weight": "output_gate_down.weight",
        "g_b_proj.weight": "output_gate_up.weight",
        "b_proj.weight": "beta_proj.weight",
    }
    out = {renames.get(n, n): v for n, v in tensors.items() if "conv1d" not in n}
    out["conv1d.weight"] = np.concatenate([tensors[f"{p}_conv1d.weight"] for p in "qkv"], axis=0)
    out["A_log"] = tensors["A_log"].reshape(heads, 1)
    out["dt_bias"] = tensors["dt_bias"].reshape(heads, -1)
    return out


def _write_checkpoint(directory, layers, naming):
    """config.json and model.safetensors of ``layers`` in ``naming``, beside tensors of other
    modules that the loader skips."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    tensors = {"model.embed_tokens.weight": np.ones((5, 32), np.float32)}
    for index, layer in enumerate(layers):
        state = export_state_dict(layer, "kimi_linear")
        if naming == "transformers" and isinstance(layer, KimiDeltaAttention):
            state = _to_transformers(state, layer.config.num_heads)
        prefix = kimi_linear_prefix(index)
        tensors.update({prefix + name: value for name, value in state.items()})
        tensors[f"model.layers.{index}.input_layernorm.weight"] = np.ones(32, np.float32)
    _write(str(directory / "model.safetensors"), tensors)
    return directory


@pytest.mark.parametrize("naming", ["kimi_linear", "transformers"])
def test_a_tiny_checkpoint_in_each_naming_loads_end_to_end(tmp_path, naming):
    source = _tiny_layers(seed=1)
    directory = _write_checkpoint(tmp_path / naming, source, naming)
    assert (directory / "model.safetensors").stat().st_size < 64 * 1024  # a few kilobytes
    loaded = load_kimi_linear_checkpoint(directory)
    assert loaded.naming == naming  # told from the names
    assert loaded.preset.layer_kinds == ("kda", "mla", "kda")
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in source]
    x = _x()
    for want, got in zip(source, loaded.layers, strict=True):
        np.testing.assert_array_equal(np.asarray(got(x)), np.asarray(want(x)))
        for a, b in zip(_layer_values(want), _layer_values(got), strict=True):
            np.testing.assert_array_equal(a, b)
    # the naming can be given, and a wrong one is refused by the tensors' names
    other = "transformers" if naming == "kimi_linear" else "kimi_linear"
    with pytest.raises(ValueError, match=r"missing \['model\.layers\.0\.self_attn\."):
        load_kimi_linear_checkpoint(directory, naming=other)


def test_the_two_namings_of_one_checkpoint_load_the_same_layers_and_the_fused_conv(tmp_path):
    source = _tiny_layers(seed=2)
    kimi = load_kimi_linear_checkpoint(_write_checkpoint(tmp_path / "a", source, "kimi_linear"))
    hf_dir = _write_checkpoint(tmp_path / "b", source, "transformers")
    hf = load_kimi_linear_checkpoint(hf_dir, naming="transformers")
    for a, b in zip(kimi.layers, hf.layers, strict=True):
        for x, y in zip(_layer_values(a), _layer_values(b), strict=True):
            np.testing.assert_array_equal(x, y)
    # the transformers file's one conv loads as it is into a layer with one fused conv
    tensors = read_safetensors(str(hf_dir / "model.safetensors"), kimi_linear_prefix(0))
    fused = _layer(dataclasses.replace(kimi.layers[0].config, fused_qkv_conv=True), seed=7)
    load_state_dict(fused, tensors, "transformers")
    x = _x()
    np.testing.assert_allclose(
        np.asarray(fused(x)), np.asarray(kimi.layers[0](x)), rtol=1e-6, atol=1e-6
    )
    assert export_state_dict(fused, "transformers")["conv1d.weight"].shape == (48, 1, 4)


def test_a_kimi_linear_checkpoint_that_does_not_fit_is_refused_by_name(tmp_path):
    directory = _write_checkpoint(tmp_path / "c", _tiny_layers(), "transformers")
    tensors = read_safetensors(str(directory / "model.safetensors"))
    prefix = kimi_linear_prefix(2)
    bad = {**tensors, prefix + "conv1d.weight": tensors[prefix + "conv1d.weight"][:-1]}
    _write(str(directory / "model.safetensors"), bad)
    with pytest.raises(ValueError, match=r"model\.layers\.2\.self_attn\.conv1d\.weight: shape"):
        load_kimi_linear_checkpoint(directory)
    bad = {**tensors, prefix + "A_log": tensors[prefix + "A_log"].reshape(1, 1, 2, 1)}
    _write(str(directory / "model.safetensors"), bad)
    with pytest.raises(ValueError, match=r"self_attn\.A_log: expected the transformers A_log"):
        load_kimi_linear_checkpoint(directory)
    with pytest.raises(ValueError, match="cannot tell the naming"):
        detect_kimi_linear_naming(["q_conv1d.weight", "conv1d.weight"])
    (directory / "config.json").write_text(json.dumps({**TINY_CONFIG, "model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type must be one of"):
        load_kimi_linear_checkpoint(directory)
    with pytest.raises(ValueError, match="no config.json"):
        load_kimi_linear_checkpoint(tmp_path)


def test_each_override_goes_to_the_config_that_has_it(tmp_path):
    """Issue 75.3: a KDA field (chunk_size, implementation) reaches the KDA layers only, an MLA
    field (kv_lora_rank) the MLA layer only, a field both have (norm_eps) both; it ended in
    MLAConfig's raw TypeError, every override going to both configs."""
    directory = _write_checkpoint(tmp_path / "o", _tiny_layers(), "kimi_linear")
    loaded = load_kimi_linear_checkpoint(directory, chunk_size=16, implementation="recurrent",
                                         kv_lora_rank=16, norm_eps=1e-6)  # fmt: skip
    kda_layers = [loaded.layers[i].config for i in loaded.preset.kda_layers]
    (mla,) = [loaded.layers[i].config for i in loaded.preset.global_layers]
    assert {(c.chunk_size, c.implementation, c.norm_eps) for c in kda_layers} == {
        (16, "recurrent", 1e-6)
    }
    assert (mla.kv_lora_rank, mla.norm_eps) == (16, 1e-6)
