"""kda_lib.models.hf_config: the published configs read as published (issue 55), and config
files that are hostile (a huge layer count, ill-typed layer_types, not UTF-8)."""

import dataclasses
import time

import pytest

from kda_lib.models import hf_config
from kda_lib.models.presets import GLM_5_3_FLASH, KIMI_K3, ModelPreset, load_kimi_linear_checkpoint
from kda_lib.ops.gating import GateForm

# Kimi K3: the text_config of the published config.json as lablup/mlxcel stores it,
# src/models/kimi_k3_tests.rs (PUBLISHED_CONFIG) @ 1b37521e5afafc982e4eda4d1f126dc29d57df95,
# its attention fields (MoE, vocabulary and vision fields left out).
KIMI_K3_PUBLISHED = {
    "model_type": "kimi_k3",
    "text_config": {
        "hidden_size": 7168,
        "kv_lora_rank": 512,
        "linear_attn_config": {
            "full_attn_layers": [*range(4, 93, 4), 93],
            "gate_lower_bound": -5.0,
            "head_dim": 128,
            "kda_layers": [n for n in range(1, 92) if n % 4],
            "num_heads": 96,
            "short_conv_kernel_size": 4,
            "use_full_rank_gate": True,
        },
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "model_type": "kimi_linear",
        "num_attention_heads": 96,
        "num_hidden_layers": 93,
        "num_key_value_heads": 96,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-05,
        "v_head_dim": 128,
    },
}
# GLM-5.3-Flash: no config.json is stored; these are the KDA fields of huggingface/transformers
# src/transformers/models/glm5_next/configuration_glm5_next.py @
# 02106f7d89617f572b33cbd27dc3e3fed63866e9 (Glm5NextTextConfig's defaults, and layer_types as
# its __post_init__ derives them: KDA unless idx % 4 == 3, 0-based).
GLM_TEXT = {
    "model_type": "glm5_next_text",
    "hidden_size": 4096,
    "num_hidden_layers": 45,
    "rms_norm_eps": 1e-5,
    "linear_head_dim": 128,
    "linear_num_heads": 64,
    "linear_conv_kernel_dim": 4,
    "linear_lower_bound": -5.0,
    "layer_types": [
        "deepseek_sparse_attention" if i % 4 == 3 else "linear_attention" for i in range(45)
    ],
}
GLM_KDA_0_BASED = [i for i in range(45) if i % 4 != 3]


def _differing(a, b, skip=("name", "source", "notes")):
    names = [f.name for f in dataclasses.fields(a) if f.name not in skip]
    return [name for name in names if getattr(a, name) != getattr(b, name)]


def test_the_published_kimi_k3_config_gives_the_kimi_k3_preset():
    preset = ModelPreset.from_hf_config(KIMI_K3_PUBLISHED)
    assert _differing(preset, KIMI_K3) == []
    assert (len(preset.kda_layers), len(preset.global_layers)) == (69, 24)
    assert preset.layer_kinds[91:] == ("mla", "mla")  # layers 92 and 93 (1-based)
    assert preset.gate_form is GateForm.SAFE_SIGMOID and preset.lower_bound == -5.0
    assert (preset.num_heads, preset.head_dim, preset.output_gate_rank) == (96, 128, None)


def test_glm_5_3_flash_config_gives_the_glm_preset_from_0_based_layers():
    from_types = ModelPreset.from_hf_config({"model_type": "glm5_next", "text_config": GLM_TEXT})
    assert _differing(from_types, GLM_5_3_FLASH) == []
    assert from_types.layer_kinds[3] == "mla" and from_types.layer_kinds[0] == "kda"
    defaults = {k: v for k, v in GLM_TEXT.items() if k != "layer_types"}
    assert ModelPreset.from_hf_config(defaults).layer_kinds == GLM_5_3_FLASH.layer_kinds
    listed = {**defaults, "linear_attn_config": {"kda_layers": GLM_KDA_0_BASED, "num_heads": 64}}
    assert _differing(ModelPreset.from_hf_config(listed), GLM_5_3_FLASH) == []
    # the same list can not be taken as 1-based, nor the Kimi lists as 0-based
    lists = {"kda_layers": GLM_KDA_0_BASED, "kda_layer_index_base": 1}
    one_based = {**listed, "linear_attn_config": lists}
    with pytest.raises(ValueError, match=r"kda_layer_index_base must be 0 for model_type 'glm5"):
        ModelPreset.from_hf_config(one_based)
    off_by_one = {**listed, "linear_attn_config": {"kda_layers": [45]}}
    with pytest.raises(ValueError, match=r"kda_layers lists layer 45, beyond .* 0-based"):
        ModelPreset.from_hf_config(off_by_one)
    with pytest.raises(ValueError, match=r"layer_types disagrees with linear_attn_config"):
        ModelPreset.from_hf_config({**listed, "layer_types": ["linear_attention"] * 45})
    unbounded = ModelPreset.from_hf_config({**defaults, "linear_lower_bound": None})
    assert unbounded.gate_form is GateForm.SOFTPLUS and unbounded.lower_bound is None


def _k3_text(**changes):
    text = dict(KIMI_K3_PUBLISHED["text_config"])
    text.update(changes)
    return text


def test_a_huge_layer_count_is_refused_by_field_fast_and_briefly():
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"config field num_hidden_layers must be <= 1024"):
        ModelPreset.from_hf_config(_k3_text(num_hidden_layers=10**8))
    with pytest.raises(ValueError) as error:  # within the bound: the message stays short
        ModelPreset.from_hf_config(_k3_text(num_hidden_layers=1000))
    assert "leave 907 layers in no list: [94, 95, 96" in str(error.value)
    assert len(str(error.value)) < 300
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("layer_types", [[1] * 93, "linear_attention", [None] * 93, {"a": 1}])
def test_layer_types_not_a_list_of_strings_is_refused_by_field(layer_types):
    with pytest.raises(ValueError, match="config field layer_types must be a list of strings"):
        ModelPreset.from_hf_config(_k3_text(layer_types=layer_types))
    with pytest.raises(ValueError, match="config field layer_types: unknown types"):
        ModelPreset.from_hf_config(_k3_text(layer_types=["mamba"] * 93))


def test_a_config_json_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"model_type": "kimi_\xff"}')
    with pytest.raises(ValueError, match=r"config\.json: not UTF-8 text"):
        hf_config.read_config_json(str(tmp_path))
    with pytest.raises(ValueError, match=r"config\.json: not UTF-8 text"):
        load_kimi_linear_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"num_hidden_layers": 10**8}, r"config field num_hidden_layers must be <= 1024"),
        ({"layer_types": "linear_attention"}, r"config field layer_types must be a list of str"),
        ({"layer_types": ["linear_attention"] * 44}, r"layer_types has 44 entries"),
        ({"linear_attn_config": {"kda_layers": 3}}, r"kda_layers must be a list of layer numbers"),
        ({"linear_attn_config": {"kda_layers": [-1]}}, r"kda_layers entry must be an int >= 0"),
        ({"linear_attn_config": {"use_full_rank_gate": True}}, r"keys \['use_full_rank_gate'\]"),
        ({"linear_head_dim": 2.0}, r"config field linear_head_dim must be a positive int"),
        ({"linear_attn_config": {"head_dim": 0}}, r"linear_attn_config\.head_dim must be a pos"),
        ({"linear_lower_bound": "low"}, r"config field linear_lower_bound"),
    ],
)
def test_the_glm_reader_refuses_hostile_fields_by_name(changes, match):
    """The 0-based family's own paths (flat widths, layer_types, a partial kda_layers list)."""
    with pytest.raises(ValueError, match=match):
        ModelPreset.from_hf_config({**GLM_TEXT, **changes})


def test_the_glm_safe_gate_switch_is_read_by_name():
    """``safe_gate: false`` is the softplus gate (the flat default bound does not switch the safe
    gate on); with an explicit bound it is refused naming both fields; true keeps the bound."""
    default_bound = {k: v for k, v in GLM_TEXT.items() if k != "linear_lower_bound"}
    off = ModelPreset.from_hf_config({**default_bound, "linear_attn_config": {"safe_gate": False}})
    assert off.gate_form is GateForm.SOFTPLUS and off.lower_bound is None
    on = ModelPreset.from_hf_config({**default_bound, "linear_attn_config": {"safe_gate": True}})
    assert on.gate_form is GateForm.SAFE_SIGMOID and on.lower_bound == -5.0
    with pytest.raises(ValueError, match=r"safe_gate \(false\) and linear_lower_bound"):
        ModelPreset.from_hf_config({**GLM_TEXT, "linear_attn_config": {"safe_gate": False}})
