"""The misuse suite of the models and the checkpoint loaders (issue 75): every public name of
``kda_lib.models`` (TinyLM, ModelConfig), of the published presets (``kda_lib.models.presets``,
``from_hf_config`` and ``kda_lib.models.hf_config``) and of the checkpoint readers
(``kda_lib.layers.checkpoints``), each with a table of hostile inputs and the refusal it must
give, as ``test_misuse_api.py`` does for ``kda_lib.__all__``: ValueError or TypeError whose
message names the argument (or the config field), before any work, eagerly and under
``jax.jit`` where the name is jittable; a row that would block (a FIFO) fails after
:data:`LIMIT_S` seconds instead of hanging. A new public name is not done until it has rows
(:func:`test_every_public_name_has_rows`)."""

import dataclasses
import functools
import inspect
import json
import os
import re
import signal
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import PYTHONS_OWN_REFUSAL
from flax import nnx
from safetensors.numpy import save_file

from kda_lib import KDAConfig, KimiDeltaAttention
from kda_lib.layers import checkpoints
from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention
from kda_lib.layers.checkpoints import (
    detect_kimi_linear_naming,
    export_state_dict,
    kimi_linear_prefix,
    load_state_dict,
    read_safetensors,
    state_dict_names,
)
from kda_lib.layers.mla import MLAConfig, MultiHeadLatentAttention
from kda_lib.models import hf_config, presets, tiny_lm
from kda_lib.models.hf_config import MAX_CONFIG_BYTES, preset_fields, read_config_json
from kda_lib.models.presets import (
    KIMI_LINEAR_48B,
    MLAShape,
    ModelPreset,
    build_kda_layer,
    build_mla_layer,
    load_kimi_linear_checkpoint,
)
from kda_lib.models.tiny_lm import ModelConfig, TinyLM, config_param_count, match_parameter_count

LIMIT_S = 20  # a row still running after this long has hung: it fails

# a tiny Kimi Linear config.json: layers 1 and 3 KDA, 2 MLA (1-based)
TINY = {
    "model_type": "kimi_linear", "hidden_size": 32, "num_hidden_layers": 3, "rms_norm_eps": 1e-5,
    "linear_attn_config": {"kda_layers": [1, 3], "full_attn_layers": [2], "num_heads": 2,
                           "head_dim": 8, "short_conv_kernel_size": 4},
    "num_attention_heads": 2, "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4, "v_head_dim": 8, "mla_use_nope": True,
}  # fmt: skip


def _tiny(**linear) -> dict:
    """TINY with ``linear`` changed in its linear_attn_config."""
    return {**TINY, "linear_attn_config": {**TINY["linear_attn_config"], **linear}}


@dataclass(frozen=True)
class Row:
    target: str  # the public name (or Class.method) the row exercises
    case: str
    call: object  # call(tmp, *arrays): the misuse; tmp an empty folder of the test's own
    arrays: tuple = ()  # traced under jit (everything else is closed over)
    match: str = ""  # regex on the argument's (or field's) name
    jit: bool = False


def _config_dir(tmp, config=TINY, shard=False):
    """``tmp`` with ``config`` as config.json (and a shard that holds no layer's tensor)."""
    (tmp / "config.json").write_text(json.dumps(config))
    if shard:
        save_file({"model.embed_tokens.weight": np.ones((5, 32), np.float32)},
                  str(tmp / "model.safetensors"))  # fmt: skip
    return tmp


def _config_json(tmp, make):
    """``tmp`` whose config.json is what ``make(path)`` puts there."""
    make(tmp / "config.json")
    return tmp


def _sparse(path, size=MAX_CONFIG_BYTES + 1):
    with open(path, "wb") as handle:
        handle.truncate(size)  # no blocks written: a hole of zeros


def _load(make_dir, **kw):
    return lambda tmp: load_kimi_linear_checkpoint(make_dir(tmp), **kw)


@functools.cache
def _models():
    """Small built modules the method rows misuse (built when a row first needs them)."""
    kda = KimiDeltaAttention(KDAConfig(hidden_size=16, num_heads=2, head_dim=8),
                             rngs=nnx.Rngs(0))  # fmt: skip
    lm = TinyLM(ModelConfig(vocab_size=8, layers=("kda", "attention")), rngs=nnx.Rngs(0))
    return kda, lm


def _kda_layer():
    return _models()[0]


def _lm():
    return _models()[1]


def _preset(**changes):
    fields = {f.name: getattr(KIMI_LINEAR_48B, f.name) for f in dataclasses.fields(ModelPreset)}
    return lambda tmp: ModelPreset(**fields | changes)


TOKENS = jnp.zeros((2, 4), jnp.int32)

ROWS = [
    # -- load_kimi_linear_checkpoint: the folder, config.json, naming, overrides ---------------
    Row("load_kimi_linear_checkpoint", "directory an int",
        lambda tmp: load_kimi_linear_checkpoint(5), match="directory"),
    Row("load_kimi_linear_checkpoint", "directory a file",
        lambda tmp: load_kimi_linear_checkpoint(_config_dir(tmp) / "config.json"),
        match="directory"),
    Row("load_kimi_linear_checkpoint", "naming fla (no Kimi Linear checkpoint has it)",
        _load(_config_dir, naming="fla"), match="naming"),
    # issue 75.2: config.json is read only as a regular file of bounded size
    Row("load_kimi_linear_checkpoint", "config.json a FIFO (blocked forever)",
        _load(lambda tmp: _config_json(tmp, os.mkfifo)), match="config.json"),
    Row("load_kimi_linear_checkpoint", "config.json a link to /dev/zero (read until MemoryError)",
        _load(lambda tmp: _config_json(tmp, lambda p: p.symlink_to("/dev/zero"))),
        match="config.json"),
    Row("load_kimi_linear_checkpoint", "config.json a folder",
        _load(lambda tmp: _config_json(tmp, os.mkdir)), match="config.json"),
    Row("load_kimi_linear_checkpoint", "config.json past the size cap",
        _load(lambda tmp: _config_json(tmp, _sparse)), match=r"config\.json is larger"),
    # issue 75.3: overrides go to the config that has them; a name neither has is refused
    # first, and a value either refuses before any shard is read
    Row("load_kimi_linear_checkpoint", "an override neither config has",
        _load(_config_dir, bogus=1), match="bogus"),
    Row("load_kimi_linear_checkpoint", "chunk_size 3 (KDA's field), before any read",
        _load(_config_dir, chunk_size=3), match=r"KDAConfig\.chunk_size"),
    Row("load_kimi_linear_checkpoint", "kv_lora_rank 0 (MLA's field), before any read",
        _load(_config_dir, kv_lora_rank=0), match=r"MLAConfig\.kv_lora_rank"),
    Row("load_kimi_linear_checkpoint", "a shard with no layer's tensors",
        _load(functools.partial(_config_dir, shard=True)), match=r"model\.layers\.0\.self_attn"),
    # -- read_config_json, preset_fields, ModelPreset.from_hf_config ---------------------------
    Row("read_config_json", "directory None", lambda tmp: read_config_json(None),
        match="directory"),
    Row("read_config_json", "config.json a FIFO",
        lambda tmp: read_config_json(_config_json(tmp, os.mkfifo)), match="config.json"),
    Row("preset_fields", "config a list", lambda tmp: preset_fields([TINY]), match="config"),
    Row("ModelPreset.from_hf_config", "config a JSON string",
        lambda tmp: ModelPreset.from_hf_config(json.dumps(TINY)), match="config"),
    Row("ModelPreset.from_hf_config", "name an int",
        lambda tmp: ModelPreset.from_hf_config(TINY, name=5), match="name"),
    *[Row("ModelPreset.from_hf_config", f"gate_lower_bound {bound!r}",  # issue 75.5
          lambda tmp, b=bound: ModelPreset.from_hf_config(_tiny(gate_lower_bound=b)),
          match=r"config field linear_attn_config\.gate_lower_bound")
      for bound in (0, 1, -0.0, True, float("nan"))],
    Row("ModelPreset.from_hf_config", "GLM's linear_lower_bound 0",
        lambda tmp: ModelPreset.from_hf_config(
            {**TINY, "model_type": "glm5_next_text", "linear_lower_bound": 0,
             "linear_attn_config": {}}),
        match="config field linear_lower_bound"),  # fmt: skip
    Row("ModelPreset.from_hf_config", "num_hidden_layers 10**9",
        lambda tmp: ModelPreset.from_hf_config({**TINY, "num_hidden_layers": 10**9}),
        match="num_hidden_layers"),
    Row("ModelPreset.from_hf_config", "num_heads 0",
        lambda tmp: ModelPreset.from_hf_config(_tiny(num_heads=0)),
        match=r"linear_attn_config\.num_heads"),
    Row("ModelPreset.from_hf_config", "_name_or_path an int (review 78)",
        lambda tmp: ModelPreset.from_hf_config({**TINY, "_name_or_path": 5}),
        match="config field _name_or_path"),
    Row("ModelPreset.from_hf_config", "qk_nope_head_dim 0 (review 78)",
        lambda tmp: ModelPreset.from_hf_config({**TINY, "qk_nope_head_dim": 0}),
        match="config field qk_nope_head_dim"),
    Row("ModelPreset.from_hf_config", "rms_norm_eps a word",
        lambda tmp: ModelPreset.from_hf_config({**TINY, "rms_norm_eps": "1e-5"}),
        match="rms_norm_eps"),
    Row("ModelPreset.from_hf_config", "an unread linear_attn_config key",
        lambda tmp: ModelPreset.from_hf_config(_tiny(chunk_size=64)), match="chunk_size"),
    # -- ModelPreset, MLAShape and their methods -----------------------------------------------
    Row("ModelPreset", "name an int", _preset(name=5), match=r"ModelPreset\.name"),
    Row("ModelPreset", "lower_bound 0", _preset(gate_form="safe_sigmoid", lower_bound=0.0),
        match=r"ModelPreset\.lower_bound"),
    Row("ModelPreset", "layer_kinds a string", _preset(layer_kinds="kda"),
        match=r"ModelPreset\.layer_kinds"),
    Row("ModelPreset", "layer_kinds past MAX_LAYERS", _preset(layer_kinds=("kda",) * 100_001),
        match=r"ModelPreset\.layer_kinds"),
    Row("ModelPreset", "mla a dict", _preset(mla={}), match=r"ModelPreset\.mla"),
    Row("ModelPreset", "num_v_heads not a multiple", _preset(num_v_heads=33),
        match=r"ModelPreset\.num_v_heads"),
    Row("MLAShape", "num_heads 0",
        lambda tmp: MLAShape(num_heads=0, head_dim=8, value_head_dim=8, kv_lora_rank=4,
                             shared_key_dim=0), match=r"MLAShape\.num_heads"),  # fmt: skip
    Row("ModelPreset.kda_config", "an unknown override",
        lambda tmp: KIMI_LINEAR_48B.kda_config(bogus=1), match="bogus"),
    Row("ModelPreset.kda_config", "chunk_size 3",
        lambda tmp: KIMI_LINEAR_48B.kda_config(chunk_size=3), match=r"KDAConfig\.chunk_size"),
    Row("ModelPreset.mla_config", "an unknown override",
        lambda tmp: KIMI_LINEAR_48B.mla_config(chunk_size=64), match="chunk_size"),
    Row("build_kda_layer", "preset a dict", lambda tmp: build_kda_layer({}), match="preset"),
    Row("build_kda_layer", "num_heads 0", lambda tmp: build_kda_layer(KIMI_LINEAR_48B,
                                                                      num_heads=0),
        match=r"KDAConfig\.num_heads"),  # fmt: skip
    Row("build_mla_layer", "preset a name", lambda tmp: build_mla_layer("Kimi-Linear-48B-A3B"),
        match="preset"),
    # -- the checkpoint readers ------------------------------------------------------------------
    Row("state_dict_names", "layer not a layer", lambda tmp: state_dict_names(5), match="layer"),
    Row("state_dict_names", "naming unknown",
        lambda tmp: state_dict_names(_kda_layer(), "hf"), match="naming"),
    Row("export_state_dict", "layer a config",
        lambda tmp: export_state_dict(_kda_layer().config), match="layer"),
    Row("export_state_dict", "an MLA layer in the fla naming",
        lambda tmp: export_state_dict(
            nnx.eval_shape(lambda: MultiHeadLatentAttention(
                MLAConfig(hidden_size=16, num_heads=2, head_dim=8, kv_lora_rank=4),
                rngs=nnx.Rngs(0))), "fla"),
        match="naming"),  # fmt: skip
    Row("export_state_dict", "an attention layer",
        lambda tmp: export_state_dict(CausalSelfAttention(
            AttentionConfig(hidden_size=16, num_heads=2, head_dim=8), rngs=nnx.Rngs(0))),
        match="layer"),  # fmt: skip
    Row("load_state_dict", "state_dict a list", lambda tmp: load_state_dict(_kda_layer(), []),
        match="state_dict"),
    Row("load_state_dict", "prefix an int",
        lambda tmp: load_state_dict(_kda_layer(), export_state_dict(_kda_layer()), prefix=5),
        match="prefix"),
    Row("load_state_dict", "a tensor with NaN",
        lambda tmp: load_state_dict(_kda_layer(), {**export_state_dict(_kda_layer()),
                                                   "A_log": np.full(2, np.nan, np.float32)}),
        match="A_log"),  # fmt: skip
    Row("load_state_dict", "layer a dict", lambda tmp: load_state_dict({}, {}), match="layer"),
    Row("kimi_linear_prefix", "layer_index -1", lambda tmp: kimi_linear_prefix(-1),
        match="layer_index"),
    Row("kimi_linear_prefix", "layer_index a bool", lambda tmp: kimi_linear_prefix(True),
        match="layer_index"),
    Row("read_safetensors", "paths an int", lambda tmp: read_safetensors(5), match="paths"),
    Row("read_safetensors", "paths empty", lambda tmp: read_safetensors([]), match="paths"),
    Row("read_safetensors", "a FIFO", lambda tmp: (os.mkfifo(tmp / "a.safetensors"),
                                                   read_safetensors(tmp / "a.safetensors")),
        match="safetensors"),  # fmt: skip
    Row("read_safetensors", "a link to /dev/zero",
        lambda tmp: ((tmp / "z.safetensors").symlink_to("/dev/zero"),
                     read_safetensors(tmp / "z.safetensors")), match="safetensors"),  # fmt: skip
    Row("read_safetensors", "prefix bytes",
        lambda tmp: read_safetensors(_config_dir(tmp, shard=True) / "model.safetensors", b"m"),
        match="prefix"),
    Row("detect_kimi_linear_naming", "names an int", lambda tmp: detect_kimi_linear_naming(5),
        match="names"),
    Row("detect_kimi_linear_naming", "names of neither naming",
        lambda tmp: detect_kimi_linear_naming(["q_proj.weight"]), match="naming"),
    # -- ModelConfig -------------------------------------------------------------------------------
    Row("ModelConfig", "num_layers 10**7 (issue 75.1)",
        lambda tmp: ModelConfig(vocab_size=8, num_layers=10**7), match=r"ModelConfig\.num_layers"),
    Row("ModelConfig", "vocab_size 0", lambda tmp: ModelConfig(vocab_size=0),
        match=r"ModelConfig\.vocab_size"),
    Row("ModelConfig", "mixer unknown", lambda tmp: ModelConfig(vocab_size=8, mixer="rnn"),
        match=r"ModelConfig\.mixer"),
    Row("ModelConfig", "layers a string", lambda tmp: ModelConfig(vocab_size=8, layers="kda"),
        match=r"ModelConfig\.layers"),
    Row("ModelConfig", "num_layers not a multiple of layers",
        lambda tmp: ModelConfig(vocab_size=8, num_layers=3, layers=("kda", "attention")),
        match=r"ModelConfig\.num_layers"),
    Row("ModelConfig", "mixer_config a dict",
        lambda tmp: ModelConfig(vocab_size=8, mixer_config={}), match=r"ModelConfig\.mixer_config"),
    Row("ModelConfig", "mlp_ratio a float", lambda tmp: ModelConfig(vocab_size=8, mlp_ratio=2.0),
        match=r"ModelConfig\.mlp_ratio"),
    Row("ModelConfig.from_flat", "an unknown field",
        lambda tmp: ModelConfig.from_flat(vocab_size=8, widht=4), match="widht"),
    Row("ModelConfig.from_flat", "dtype an unknown word",
        lambda tmp: ModelConfig.from_flat(vocab_size=8, dtype="float33"), match="dtype"),
    # -- TinyLM, config_param_count, match_parameter_count ---------------------------------------
    Row("TinyLM", "config a dict", lambda tmp: TinyLM({}, rngs=nnx.Rngs(0)), match="config"),
    Row("TinyLM", "50,000 wide layers past memory (issue 75.1)",
        lambda tmp: TinyLM(ModelConfig(
            vocab_size=8, num_layers=50_000,
            mixer_config=KDAConfig(hidden_size=1024, num_heads=8, head_dim=128)),
            rngs=nnx.Rngs(0)), match=r"ModelConfig\.num_layers"),  # fmt: skip
    Row("TinyLM", "vocab_size past memory",
        lambda tmp: TinyLM(ModelConfig(vocab_size=2**40), rngs=nnx.Rngs(0)),
        match=r"ModelConfig\.vocab_size"),
    Row("TinyLM.__call__", "tokens float", lambda tmp, t: _lm()(t),
        (TOKENS.astype(jnp.float32),), "tokens", jit=True),
    Row("TinyLM.__call__", "tokens rank 3", lambda tmp, t: _lm()(t), (TOKENS[..., None],),
        "tokens", jit=True),
    Row("TinyLM.__call__", "tokens with no token", lambda tmp, t: _lm()(t), (TOKENS[:, :0],),
        "tokens", jit=True),
    Row("TinyLM.__call__", "tokens a list", lambda tmp: _lm()([[1, 2]]), match="tokens"),
    Row("TinyLM.__call__", "a token id past vocab_size",
        lambda tmp: _lm()(TOKENS.at[0, 1].set(8)), match="tokens"),
    Row("TinyLM.__call__", "cache of another length",
        lambda tmp: _lm()(TOKENS, cache=()), match="cache"),
    Row("TinyLM.__call__", "cache an int", lambda tmp: _lm()(TOKENS, cache=5), match="cache"),
    Row("TinyLM.__call__", "cache of Nones",
        lambda tmp: _lm()(TOKENS, cache=(None, None)), match="cache"),
    Row("TinyLM.__call__", "cache of another batch",
        lambda tmp: _lm()(TOKENS, cache=_lm().init_cache(3)), match="cache"),
    Row("TinyLM.init_cache", "batch_size 0", lambda tmp: _lm().init_cache(0), match="batch_size"),
    Row("TinyLM.init_cache", "max_len 0", lambda tmp: _lm().init_cache(1, max_len=0),
        match="max_len"),
    Row("TinyLM.init_cache", "max_len past memory (issue 75.5)",
        lambda tmp: _lm().init_cache(1, max_len=2**40), match=r"max_len=1099511627776"),
    Row("TinyLM.init_cache", "batch_size past memory",
        lambda tmp: _lm().init_cache(2**40), match=r"batch_size=1099511627776"),
    Row("config_param_count", "config a dict", lambda tmp: config_param_count({}),
        match="config"),
    Row("match_parameter_count", "target 0",
        lambda tmp: match_parameter_count(ModelConfig(vocab_size=8), 0), match="target"),
    Row("match_parameter_count", "target below a 1-unit MLP",
        lambda tmp: match_parameter_count(ModelConfig(vocab_size=8), 5), match="target"),
    Row("match_parameter_count", "config a dict",
        lambda tmp: match_parameter_count({}, 5000), match="config"),
]  # fmt: skip

# Public names without rows, each with its reason.
EXEMPT = {
    "tiny_lm.MLP": "a building block of TinyLM, built from a checked ModelConfig only",
    "tiny_lm.Block": "a building block of TinyLM, built from a checked ModelConfig only",
    "presets.KimiLinearCheckpoint": "the loader's result (a namedtuple), not an entry point",
}

# the modules whose public names (and public methods taking arguments) need rows
MODULES = {"tiny_lm": tiny_lm, "presets": presets, "hf_config": hf_config,
           "checkpoints": checkpoints}  # fmt: skip


def _public_names() -> set[str]:
    """``module.name`` of every public class and function the modules define, and
    ``module.Class.method`` of each public method (``__call__`` too) that takes arguments."""
    names = set()
    for label, module in MODULES.items():
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if not callable(obj):
                continue
            names.add(f"{label}.{name}")
            if not inspect.isclass(obj) or issubclass(obj, tuple):
                continue
            for method, function in vars(obj).items():
                if method != "__call__" and method.startswith("_"):
                    continue
                function = getattr(function, "__func__", function)  # a classmethod's
                if not inspect.isfunction(function):
                    continue  # properties, fields
                if len(inspect.signature(function).parameters) > 1:  # more than self / cls
                    names.add(f"{label}.{name}.{method}")
    return names


def _covered() -> set[str]:
    owners = {}
    for label, module in MODULES.items():
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) == module.__name__:
                owners.setdefault(name, label)
    covered = set()
    for row in ROWS:
        head, *method = row.target.split(".")
        covered.add(f"{owners[head]}.{head}")
        if method:
            covered.add(f"{owners[head]}.{head}.{method[0]}")
    return covered


def test_every_public_name_has_rows():
    exempt = lambda name: any(name == e or name.startswith(f"{e}.") for e in EXEMPT)
    missing = sorted(n for n in _public_names() - _covered() if not exempt(n))
    assert not missing, f"public names with no misuse rows: {missing}"


def _params():
    return [pytest.param(row, mode, id=f"{row.target}[{row.case}]-{mode}")
            for row in ROWS for mode in (("eager", "jit") if row.jit else ("eager",))]  # fmt: skip


def _timeout(signum, frame):
    raise TimeoutError(f"still running after {LIMIT_S} s: hung")


@pytest.mark.parametrize(("row", "mode"), _params())
def test_misuse_refused_naming_the_argument(row, mode, tmp_path):
    call = functools.partial(row.call, tmp_path)
    if mode == "jit":  # the shared modules built eagerly first: built inside a trace, their
        _models()  # cached weights would be tracers that leak into the eager rows after it
        call = jax.jit(call)
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(LIMIT_S)
    try:
        with pytest.raises((ValueError, TypeError)) as info:
            jax.block_until_ready(call(*row.arrays))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert re.search(rf"\b({row.match})\b", str(info.value)), (
        f"message does not name {row.match!r}: {info.value}"
    )
    assert not PYTHONS_OWN_REFUSAL.search(str(info.value)), f"Python's refusal: {info.value}"
