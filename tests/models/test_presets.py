"""kda_lib.models.presets: the published models' KDA (and MLA) layers.

The expected counts are computed here from the published config fields (copied below from the
sources the presets cite) by formula, independently of the presets' own shape lists; a preset
the layer can express is built with ``nnx.eval_shape`` and its parameter count must match, one
it cannot express must refuse with NotImplementedError naming the missing option.
"""

import dataclasses

import pytest

from kda_lib.layers.params import parameter_count
from kda_lib.models import presets
from kda_lib.models.presets import (
    GLM_5_3_FLASH,
    KIMI_K3,
    KIMI_LINEAR_48B,
    build_kda_layer,
    build_mla_layer,
)
from kda_lib.ops.gating import GateForm

# published fields (see kda_lib/models/presets.py for repository, path and commit of each)
KIMI_LINEAR_CONFIG = {
    "hidden_size": 2304,
    "num_hidden_layers": 27,
    "linear_attn_config": {
        "num_heads": 32,
        "head_dim": 128,
        "short_conv_kernel_size": 4,
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
    },
    "num_attention_heads": 32,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
KIMI_K3_YML = {
    "base_emb_dim": 7168,
    "base_num_decoder_layers": 93,
    "base_num_query_heads": 96,
    "head_dim": 128,
    "kda_conv_kernel_size": 4,
    "kda_use_full_rank_gate": True,
    "kda_gate_lower_bound": -5.0,
    "full_attn_layers": [*range(4, 93, 4), 93],
}
GLM_YML = {
    "base_emb_dim": 4096,
    "base_num_decoder_layers": 45,
    "inhomogeneous_layer_cycle_interval": 4,
    "linear_conv_kernel_dim": 4,
    "linear_head_dim": 128,
    "linear_num_heads": 64,
    "linear_lower_bound": -5.0,
}


def kda_formula(d, h, k, w, forget_rank, output_rank, output_bias):
    """q, k, v projections + three depthwise convs (or one over their concatenation: the same
    count) + forget gate (low rank: d r + r H K) + A_log H + dt_bias H K + beta d H + output gate
    (low rank or full d H K, + H K with a bias) + o_norm K + o_proj H K d."""
    hk = h * k
    forget = d * hk if forget_rank is None else d * forget_rank + forget_rank * hk
    output = d * hk if output_rank is None else d * output_rank + output_rank * hk
    return (
        3 * d * hk + 3 * w * hk + forget + h + hk + d * h + output + output_bias * hk + k + hk * d
    )


def test_kimi_linear_kda_layer_builds_with_the_published_parameter_count():
    c, lin = KIMI_LINEAR_CONFIG, KIMI_LINEAR_CONFIG["linear_attn_config"]
    # gates of rank head_dim, no output-gate bias (modeling_kimi.py @ 6e163f3)
    expected = kda_formula(
        c["hidden_size"], lin["num_heads"], lin["head_dim"], lin["short_conv_kernel_size"],
        lin["head_dim"], lin["head_dim"], False,
    )  # fmt: skip
    assert expected == 39_514_272
    assert KIMI_LINEAR_48B.kda_parameter_count() == expected
    layer = build_kda_layer(KIMI_LINEAR_48B)
    assert parameter_count(layer) == expected
    # built from shapes only: nothing was allocated
    assert type(layer.q_proj.kernel.get_value()).__name__ == "ShapeDtypeStruct"
    assert layer.config.lower_bound is None and not layer.config.output_gate_bias


def test_kimi_linear_mla_layer_builds_with_the_published_parameter_count():
    c = KIMI_LINEAR_CONFIG
    d, h, r = c["hidden_size"], c["num_attention_heads"], c["kv_lora_rank"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    # q_proj (no q LoRA), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj
    expected = d * h * (nope + rope) + d * (r + rope) + r + r * h * (nope + v) + h * v * d
    assert expected == 29_114_880
    assert KIMI_LINEAR_48B.mla_parameter_count() == expected
    assert parameter_count(build_mla_layer(KIMI_LINEAR_48B)) == expected
    assert KIMI_LINEAR_48B.mla_config().shared_key_dim == rope  # NoPE: unrotated, shared
    assert KIMI_LINEAR_48B.mla_config().norm_eps == 1e-6


def test_layer_patterns_follow_the_published_layer_lists():
    lin = KIMI_LINEAR_CONFIG["linear_attn_config"]
    assert KIMI_LINEAR_48B.num_layers == KIMI_LINEAR_CONFIG["num_hidden_layers"]
    assert KIMI_LINEAR_48B.kda_layers == tuple(i - 1 for i in lin["kda_layers"])
    assert KIMI_LINEAR_48B.global_layers == tuple(i - 1 for i in lin["full_attn_layers"])
    assert (len(KIMI_LINEAR_48B.kda_layers), len(KIMI_LINEAR_48B.global_layers)) == (20, 7)
    assert KIMI_K3.num_layers == KIMI_K3_YML["base_num_decoder_layers"]
    assert KIMI_K3.global_layers == tuple(i - 1 for i in KIMI_K3_YML["full_attn_layers"])
    assert (len(KIMI_K3.kda_layers), len(KIMI_K3.global_layers)) == (69, 24)
    interval = GLM_YML["inhomogeneous_layer_cycle_interval"]
    assert GLM_5_3_FLASH.num_layers == GLM_YML["base_num_decoder_layers"]
    assert GLM_5_3_FLASH.global_layers == tuple(range(interval - 1, 45, interval))
    assert (len(GLM_5_3_FLASH.kda_layers), len(GLM_5_3_FLASH.global_layers)) == (34, 11)


def test_kimi_k3_builds_with_the_published_parameter_count():
    y = KIMI_K3_YML
    # forget gate low rank (head_dim), output gate full rank without bias (kda.py @ bf801f44)
    expected = kda_formula(
        y["base_emb_dim"], y["base_num_query_heads"], y["head_dim"], y["kda_conv_kernel_size"],
        y["head_dim"], None, False,
    )  # fmt: skip
    # by hand, d = 7168, H K = 96 * 128 = 12288: q/k/v 3 d HK = 264,241,152; convs 3 * 4 HK =
    # 147,456; forget gate d 128 + 128 HK = 2,490,368; A_log 96; dt_bias 12,288; b_proj d H =
    # 688,128; full-rank output gate d HK = 88,080,384; o_norm 128; o_proj HK d = 88,080,384
    assert expected == 443_740_384
    assert KIMI_K3.kda_parameter_count() == expected
    assert KIMI_K3.lower_bound == y["kda_gate_lower_bound"]
    layer = build_kda_layer(KIMI_K3)
    assert parameter_count(layer) == expected
    assert layer.config.gate_form == "safe_sigmoid" and layer.config.lower_bound == -5.0
    assert layer.config.output_gate_rank is None
    assert layer.config.forget_gate_rank == y["head_dim"]
    assert layer.g_proj.kernel.get_value().shape == (7168, 12288)
    with pytest.raises(NotImplementedError, match="mla_use_output_gate"):
        build_mla_layer(KIMI_K3)
    # MLA (attention_mla.py @ bf801f44): wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, out, and
    # the published full-rank output gate g_proj [H v, d] (mlxcel kimi_k3_tests.rs @ 1b37521e;
    # MaxText's bring-up has rank head_dim instead)
    d, h = y["base_emb_dim"], y["base_num_query_heads"]
    q_rank, r, nope, rope, v = 1536, 512, 128, 64, 128  # kimi-k3.yml's MLA fields
    mla = (
        d * q_rank + q_rank + q_rank * h * (nope + rope)
        + d * (r + rope) + r + r * h * (nope + v) + h * v * d
        + d * h * v
    )  # fmt: skip
    assert KIMI_K3.mla_parameter_count() == mla


def test_glm_builds_with_the_fused_conv_and_the_published_parameter_count():
    y = GLM_YML
    expected = kda_formula(
        y["base_emb_dim"], y["linear_num_heads"], y["linear_head_dim"],
        y["linear_conv_kernel_dim"], y["linear_head_dim"], y["linear_head_dim"], False,
    )  # fmt: skip
    # by hand, d = 4096, H K = 64 * 128 = 8192: q/k/v 3 d HK = 100,663,296; one conv over
    # 3 HK channels 4 * 24576 = 98,304; forget and output gates d 128 + 128 HK = 1,572,864
    # each; A_log 64; dt_bias 8,192; b_proj d H = 262,144; o_norm 128; o_proj HK d = 33,554,432
    assert expected == 137_732_288
    assert GLM_5_3_FLASH.kda_parameter_count() == expected
    assert GLM_5_3_FLASH.kda_parameter_shapes()["qkv_conv1d.kernel"] == (4, 3 * 64 * 128)
    layer = build_kda_layer(GLM_5_3_FLASH)
    assert parameter_count(layer) == expected
    assert layer.q_conv1d is None and layer.qkv_conv1d.kernel.get_value().shape == (4, 3 * 8192)
    assert layer.config.gate_form == "safe_sigmoid" and layer.config.lower_bound == -5.0
    with pytest.raises(NotImplementedError, match="no MLA widths"):
        GLM_5_3_FLASH.mla_parameter_count()
    # the fused layout is a layout: unfused, the same layer has the same count
    unfused = dataclasses.replace(GLM_5_3_FLASH, fused_qkv_conv=False)
    assert parameter_count(build_kda_layer(unfused)) == expected


def test_the_missing_option_is_named():
    preset = dataclasses.replace(KIMI_LINEAR_48B, use_a_log=False)
    with pytest.raises(NotImplementedError, match="the softplus gate without A_log"):
        build_kda_layer(preset)


@pytest.mark.parametrize("ranks", [(128, 64), (None, 64), (64, None), (None, None)])
def test_each_gate_rank_builds_with_the_preset_s_count(ranks):
    forget, output = ranks
    preset = dataclasses.replace(KIMI_LINEAR_48B, forget_gate_rank=forget, output_gate_rank=output)
    layer = build_kda_layer(preset)
    assert (layer.config.forget_gate_rank, layer.config.output_gate_rank) == ranks
    assert parameter_count(layer) == preset.kda_parameter_count()


def test_the_preset_and_the_config_share_their_names():
    from kda_lib.layers.kda_layer import KDAConfig
    from kda_lib.layers.mla import MLAConfig

    config = KIMI_K3.kda_config()
    kda_fields = [f.name for f in dataclasses.fields(KDAConfig)]
    shared = [f.name for f in dataclasses.fields(presets.ModelPreset) if f.name in kda_fields]
    assert len(shared) == 13 and shared == [n for n in kda_fields if n in shared]  # same order
    assert all(getattr(config, name) == getattr(KIMI_K3, name) for name in shared)
    mla_fields = {f.name for f in dataclasses.fields(MLAConfig)}
    assert {f.name for f in dataclasses.fields(presets.MLAShape)} - mla_fields == {
        "output_gate",
        "output_gate_rank",
    }


def test_preset_fields_are_checked():
    from kda_lib.ops.gating import GateForm

    with pytest.raises(ValueError, match=r"ModelPreset.gate_form must be one of \('softplus'"):
        dataclasses.replace(KIMI_LINEAR_48B, gate_form="sigmoid")
    with pytest.raises(ValueError, match="gate_form='softplus' does not fit lower_bound=-5.0"):
        dataclasses.replace(KIMI_LINEAR_48B, lower_bound=-5.0)
    bounded = dataclasses.replace(KIMI_LINEAR_48B, gate_form="safe_sigmoid", lower_bound=-5.0)
    assert bounded.gate_form is GateForm.SAFE_SIGMOID  # a string is stored as the enum
    with pytest.raises(ValueError, match="unknown kinds"):
        dataclasses.replace(KIMI_LINEAR_48B, layer_kinds=("kda", "attention"))


def test_presets_registry_and_sources_cite_commits():
    assert set(presets.PRESETS) == {"Kimi-Linear-48B-A3B", "Kimi-K3", "GLM-5.3-Flash"}
    for preset in presets.PRESETS.values():
        assert any(len(word.strip(",;()")) == 40 for word in preset.source.split()), preset.name


def test_output_gate_without_bias_runs_and_imports_without_the_bias():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from kda_lib.layers.checkpoints import state_dict_names
    from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention

    cfg = KDAConfig(hidden_size=16, num_heads=2, head_dim=8, forget_gate_rank=4, output_gate_rank=4)
    with_bias = KimiDeltaAttention(cfg, rngs=nnx.Rngs(0))
    layer = KimiDeltaAttention(dataclasses.replace(cfg, output_gate_bias=False), rngs=nnx.Rngs(0))
    assert parameter_count(with_bias) - parameter_count(layer) == 2 * 8
    names = set(state_dict_names(layer))
    assert "g_proj.1.bias" not in names and "g_proj.1.bias" in set(state_dict_names(with_bias))
    x = jax.random.normal(jax.random.key(0), (1, 5, 16))
    # with the other weights shared and the bias at zero, both compute the same function
    nnx.update(with_bias, nnx.state(layer, nnx.Param))
    with_bias.g_proj.layers[1].bias.set_value(jnp.zeros(16))
    np.testing.assert_allclose(np.asarray(layer(x)), np.asarray(with_bias(x)), rtol=1e-6)
    with_bias.g_proj.layers[1].bias.set_value(jnp.ones(16))
    assert np.abs(np.asarray(layer(x)) - np.asarray(with_bias(x))).max() > 1e-3
    with pytest.raises(ValueError, match="output_gate_bias must be a bool"):
        dataclasses.replace(cfg, output_gate_bias=1)


def test_grouped_value_heads_and_the_rate_free_safe_gate_build_from_a_preset():
    # Kimi Linear's layer with twice the value heads (fla's num_v_heads), and GLM's without A_log
    grouped = dataclasses.replace(KIMI_LINEAR_48B, num_v_heads=64)
    layer = build_kda_layer(grouped)
    assert parameter_count(layer) == grouped.kda_parameter_count()
    assert layer.v_proj.kernel.get_value().shape == (2304, 64 * 128)
    assert layer.A_log.get_value().shape == (64,) and layer.b_proj.kernel.get_value().shape[1] == 64
    rate_free = dataclasses.replace(GLM_5_3_FLASH, use_a_log=False)
    layer = build_kda_layer(rate_free)
    assert layer.A_log is None and not layer.config.use_a_log
    assert (
        parameter_count(layer)
        == rate_free.kda_parameter_count()
        == (GLM_5_3_FLASH.kda_parameter_count() - GLM_YML["linear_num_heads"])
    )


# ------------------------------------------------------------------ from a config.json
# moonshotai/Kimi-Linear-48B-A3B-Instruct config.json, the attention fields (the original is
# not in the stored sources; the stored copies agree field by field: the re-upload
# Firworks/Kimi-Linear-48B-A3B-Instruct-nvfp4 config.json cited in presets.py, and
# NVIDIA-NeMo/Megatron-Bridge tests/unit_tests/models/kimi/test_kimi_model_config_bridge.py
# @ ebd91e974d0b2caba82fc91c09b47e77e2dd53fc's "official architecture" fixture; the layer lists
# as in huggingface/transformers issue #47875's table "full at layers 4, 8, 12, 16, 20, 24, 27").
# MoE and vocabulary fields, which from_hf_config does not read, are kept as a sample.
KIMI_LINEAR_HF_CONFIG = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "hidden_size": 2304,
    "num_hidden_layers": 27,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 72,
    "rms_norm_eps": 1e-5,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "head_dim": 128,
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "num_heads": 32,
        "short_conv_kernel_size": 4,
    },
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": True,
    "num_experts": 256,
    "num_experts_per_token": 8,
    "moe_intermediate_size": 1024,
    "vocab_size": 163840,
}
# Kimi K3: no config.json is stored. NVIDIA-NeMo/Megatron-Bridge
# tests/unit_tests/models/kimi/test_kimi_k3_bridge.py @ caa6c44c7c129ad4674a2298f2ffc87a27c1e929
# holds "the official K3 architecture truncated to four language layers" (its text_config,
# attention fields; the wrapper's model_type is "kimi_k3"). Its linear_attn_config has no
# full_attn_layers and the config no mla_use_nope: the fixture as written is refused.
KIMI_K3_TEXT_CONFIG_4_LAYERS = {
    "hidden_size": 7168,
    "num_hidden_layers": 4,
    "linear_attn_config": {
        "gate_lower_bound": -5.0,
        "head_dim": 128,
        "kda_layers": [1, 2, 3],
        "num_heads": 96,
        "short_conv_kernel_size": 4,
    },
    "num_attention_heads": 96,
    "num_key_value_heads": 96,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "rms_norm_eps": 1e-5,
}


def _differing_fields(a, b, skip=("name", "source", "notes")):
    return [
        f.name
        for f in dataclasses.fields(a)
        if f.name not in skip and getattr(a, f.name) != getattr(b, f.name)
    ]


def test_from_hf_config_builds_the_published_kimi_linear_preset():
    preset = presets.ModelPreset.from_hf_config(KIMI_LINEAR_HF_CONFIG, name="Kimi-Linear-48B-A3B")
    assert preset.name == "Kimi-Linear-48B-A3B"
    assert _differing_fields(preset, KIMI_LINEAR_48B) == []  # every field, the MLA's too
    assert preset.mla == KIMI_LINEAR_48B.mla
    assert (len(preset.kda_layers), len(preset.global_layers)) == (20, 7)
    assert preset.layer_kinds[-1] == "mla"  # layer 27: the pattern is not "every fourth"
    every_fourth = tuple("mla" if (i + 1) % 4 == 0 else "kda" for i in range(27))
    assert preset.layer_kinds != every_fourth
    assert [
        i for i, (a, b) in enumerate(zip(preset.layer_kinds, every_fourth, strict=True)) if a != b
    ] == [26]
    assert parameter_count(build_kda_layer(preset)) == KIMI_LINEAR_48B.kda_parameter_count()
    assert parameter_count(build_mla_layer(preset)) == KIMI_LINEAR_48B.mla_parameter_count()
    # the default name comes from the config
    assert presets.ModelPreset.from_hf_config(KIMI_LINEAR_HF_CONFIG).name == "kimi_linear"
    named = {**KIMI_LINEAR_HF_CONFIG, "_name_or_path": "moonshotai/Kimi-Linear-48B-A3B-Instruct"}
    assert presets.ModelPreset.from_hf_config(named).name.startswith("moonshotai/")


def test_from_hf_config_reads_kimi_k3_s_fields_and_names_what_the_fixture_lacks():
    wrapper = {"model_type": "kimi_k3", "text_config": dict(KIMI_K3_TEXT_CONFIG_4_LAYERS)}
    with pytest.raises(ValueError, match="model_type must be one of .* got None"):
        presets.ModelPreset.from_hf_config(wrapper)
    wrapper["text_config"]["model_type"] = "kimi_linear"
    with pytest.raises(ValueError, match=r"linear_attn_config\.full_attn_layers is missing"):
        presets.ModelPreset.from_hf_config(wrapper)
    text = wrapper["text_config"]
    text["linear_attn_config"] = {**text["linear_attn_config"], "full_attn_layers": [4]}
    with pytest.raises(ValueError, match="mla_use_nope must be true"):
        presets.ModelPreset.from_hf_config(wrapper)
    text["mla_use_nope"] = True  # as every Kimi Linear/K3 config the stored sources quote
    preset = presets.ModelPreset.from_hf_config(wrapper, name="K3, 4 layers")
    assert preset.layer_kinds == ("kda", "kda", "kda", "mla")
    # the KDA and MLA widths agree with the MaxText-based preset
    for field in ("hidden_size", "num_heads", "head_dim", "conv_size", "lower_bound", "norm_eps"):
        assert getattr(preset, field) == getattr(KIMI_K3, field), field
    assert preset.forget_gate_rank == KIMI_K3.forget_gate_rank == 128
    widths = ("num_heads", "head_dim", "value_head_dim", "kv_lora_rank", "q_lora_rank")
    assert all(
        getattr(preset.mla, f) == getattr(KIMI_K3.mla, f) for f in widths + ("shared_key_dim",)
    )
    # the remote code reads gate_lower_bound as fla's safe gate, and so does the preset
    assert preset.gate_form is KIMI_K3.gate_form is GateForm.SAFE_SIGMOID
    # use_full_rank_gate (absent from the fixture) selects the full-rank output gate
    text["linear_attn_config"]["use_full_rank_gate"] = True
    text["mla_use_output_gate"] = True
    preset = presets.ModelPreset.from_hf_config(wrapper)
    assert preset.output_gate_rank is None and preset.mla.output_gate
    assert parameter_count(build_kda_layer(preset)) == kda_formula(
        7168, 96, 128, 4, 128, None, False
    )


def _config(**changes):
    config = {
        **KIMI_LINEAR_HF_CONFIG,
        "linear_attn_config": dict(KIMI_LINEAR_HF_CONFIG["linear_attn_config"]),
    }
    for key, value in changes.items():
        target, key = (
            (config["linear_attn_config"], key[4:]) if key.startswith("lin_") else (config, key)
        )
        if value is _DROP:
            del target[key]
        else:
            target[key] = value
    return config


_DROP = object()
_KDA = KIMI_LINEAR_HF_CONFIG["linear_attn_config"]["kda_layers"]


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"model_type": "deepseek_v3"}, "model_type must be one of"),
        ({"hidden_size": _DROP}, "config field hidden_size is missing"),
        ({"hidden_size": True}, "config field hidden_size must be a positive int"),
        ({"linear_attn_config": _DROP}, "config field linear_attn_config is missing"),
        ({"lin_num_heads": _DROP}, r"linear_attn_config\.num_heads is missing"),
        ({"lin_kda_layers": _DROP}, r"linear_attn_config\.kda_layers is missing"),
        ({"lin_kda_layers": [*_KDA, 1]}, r"kda_layers lists layer 1 twice"),
        (
            {"lin_kda_layers": [*_KDA, 4]},
            r"full_attn_layers lists layer 4 also in linear_attn_config\.kda_layers",
        ),
        ({"lin_kda_layers": _KDA[:-1]}, r"leave 1 layers in no list: \[26\]"),
        ({"lin_full_attn_layers": [4, 8, 12, 16, 20, 24, 28]}, "lists layer 28, beyond"),
        ({"lin_full_attn_layers": [0, 4, 8]}, r"full_attn_layers entry must be a positive int"),
        ({"lin_kda_layer_index_base": 0}, r"kda_layer_index_base must be 1 for model_type 'kimi"),
        ({"lin_kda_layer_index_base": True}, r"kda_layer_index_base must be 1"),
        ({"lin_safe_gate": True}, r"keys \['safe_gate'\]"),
        ({"lin_gate_lower_bound": "low"}, r"gate_lower_bound"),
        ({"mla_use_nope": False}, "mla_use_nope must be true"),
        ({"rms_norm_eps": _DROP}, "config field rms_norm_eps is missing"),
        ({"layer_types": ["linear_attention"] * 27}, "layer_types disagrees"),
    ],
)
def test_from_hf_config_refuses_what_it_cannot_represent_by_field(changes, match):
    with pytest.raises(ValueError, match=match):
        presets.ModelPreset.from_hf_config(_config(**changes))


def test_from_hf_config_accepts_agreeing_layer_types_and_a_nope_mla_without_the_flag():
    kinds = KIMI_LINEAR_48B.layer_kinds
    types = ["full_attention" if k == "mla" else "linear_attention" for k in kinds]
    assert presets.ModelPreset.from_hf_config(_config(layer_types=types)).layer_kinds == kinds
    preset = presets.ModelPreset.from_hf_config(_config(mla_use_nope=_DROP, qk_rope_head_dim=0))
    assert preset.mla.shared_key_dim == 0
    bounded = presets.ModelPreset.from_hf_config(_config(lin_gate_lower_bound=-5.0))
    assert bounded.gate_form is GateForm.SAFE_SIGMOID and bounded.lower_bound == -5.0
    assert build_kda_layer(bounded).config.gate_form == "safe_sigmoid"
