"""kda_lib.lab.generate: generation with the per-layer caches, scoring text, decode cost."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from scipy import stats

from kda_lib.lab.corpus import TextBatch, copy_probe_windows
from kda_lib.lab.generate import (
    _as_if_seen,
    cache_bytes,
    copy_probe_scores,
    decode_cost,
    generate,
    generate_text,
    score_text,
    window_losses,
)
from kda_lib.layers.kda_layer import KDAConfig
from kda_lib.layers.mla import MLACache
from kda_lib.models.tiny_lm import ModelConfig, TinyLM

# byte-level (vocabulary 256): generate_text runs on the module's model and its compiled steps
CFG = ModelConfig(
    vocab_size=256,
    num_layers=2,
    layers=("kda", "attention"),
    rope=False,
    mixer_config=KDAConfig(hidden_size=16, num_heads=2, head_dim=8, implementation="recurrent"),
)


# the module's model and its compiled generation steps and forwards, built once on one worker
pytestmark = pytest.mark.xdist_group("generate_model")


@pytest.fixture(scope="module")
def model():
    return TinyLM(CFG, rngs=nnx.Rngs(0))


def test_greedy_generation_follows_the_full_forward(model):
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    out = generate(model, prompt, 6, temperature=0.0)
    assert out.shape == (2, 9) and out.dtype == np.int32
    np.testing.assert_array_equal(out[:, :3], prompt)
    # each generated token is the argmax of the full forward over everything before it
    logits = nnx.jit(lambda m, t: m(t))(model, jnp.asarray(out[:, :-1]))  # one compilation
    np.testing.assert_array_equal(np.asarray(logits.argmax(-1))[:, 2:], out[:, 3:])
    one = generate(model, np.array([1, 2, 3]), 6, temperature=0.0)
    np.testing.assert_array_equal(one, out[0])


def test_sampling_is_seeded(model):
    # the greedy test's shapes: its compiled steps (the temperature is an argument)
    prompt = np.array([[1, 2, 3]] * 2)
    a = generate(model, prompt, 6, temperature=1.0, seed=1)
    b = generate(model, prompt, 6, temperature=1.0, seed=1)
    c = generate(model, prompt, 6, temperature=1.0, seed=2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len({tuple(row) for row in a}) > 1  # rows sample independently
    assert a.min() >= 0 and a.max() < CFG.vocab_size


@pytest.mark.parametrize(
    "prompt, steps, temperature, message",
    [
        (np.zeros((1, 0), int), 2, 1.0, "prompt must be token ids"),
        (np.array([1.5]), 2, 1.0, "integer token ids"),
        (np.array([256]), 2, 1.0, r"must lie in \[0, 256\)"),
        (np.array([1]), 0, 1.0, "steps must be an int >= 1"),
        (np.array([1]), 2, -0.5, "temperature must be a finite number >= 0"),
        (np.array([1]), 2, "hot", "temperature must be a number"),
    ],
)
def test_generate_rejects_bad_arguments(model, prompt, steps, temperature, message):
    with pytest.raises(ValueError, match=message):
        generate(model, prompt, steps, temperature=temperature)


def test_generate_text_needs_bytes(model):
    small_config = dataclasses.replace(CFG, vocab_size=13)
    small = nnx.eval_shape(lambda: TinyLM(small_config, rngs=nnx.Rngs(0)))  # abstract: no work
    with pytest.raises(ValueError, match="byte-level model"):
        generate_text(small, "def", 3)
    # 3 bytes and 6 steps at one row: the greedy test's compiled steps for its single prompt
    text = generate_text(model, "def", 6, temperature=0.0)
    want = generate(model, np.frombuffer(b"def", np.uint8).astype(np.int32), 6, temperature=0.0)
    assert text == bytes(want.astype(np.uint8)).decode("utf-8", "replace")
    assert text.startswith("def") and len(text.encode("utf-8", "replace")) >= 6
    with pytest.raises(ValueError, match="non-empty str"):
        generate_text(model, "", 3)


def test_score_text_is_the_mean_cross_entropy(model):
    tokens = jax.random.randint(jax.random.key(4), (5, 9), 0, 13)
    windows = TextBatch(tokens[:, :-1], tokens[:, 1:], jnp.ones((5, 8), bool))
    # 5 windows: the last group padded (batch 4: the next test's compiled forward)
    scores = score_text(model, windows, batch_size=4)
    logits = nnx.jit(lambda m, t: m(t))(model, windows.inputs)  # one compilation
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, windows.targets)
    np.testing.assert_allclose(scores["loss"], float(losses.mean()), rtol=1e-5)
    np.testing.assert_allclose(scores["loss_by_position"], np.asarray(losses.mean(0)), rtol=1e-5)
    assert scores["bits_per_token"] == pytest.approx(scores["loss"] / math.log(2))
    with pytest.raises(ValueError, match="must both be"):
        score_text(model, TextBatch(tokens, tokens[:, :3], None))


def test_score_text_gives_bits_by_position_with_standard_errors_over_windows(model):
    """The standard errors are over windows: the sample standard deviation (n - 1) of the
    windows' mean bits (or of one position's bits) over sqrt(N), as scipy.stats.sem gives."""
    tokens = jax.random.randint(jax.random.key(5), (6, 9), 0, 13)
    windows = TextBatch(tokens[:, :-1], tokens[:, 1:], jnp.ones((6, 8), bool))
    scores = score_text(model, windows, batch_size=4)
    bits = window_losses(model, windows, batch_size=4) / math.log(2)  # [N, T]
    assert bits.shape == (6, 8)
    np.testing.assert_allclose(scores["bits_by_position"], bits.mean(0), rtol=1e-5)
    np.testing.assert_allclose(scores["bits_by_position_se"], stats.sem(bits, axis=0), rtol=1e-4)
    assert scores["bits_per_token_se"] == pytest.approx(stats.sem(bits.mean(1)), rel=1e-4)
    assert np.mean(scores["bits_by_position"]) == pytest.approx(scores["bits_per_token"])
    one = score_text(model, TextBatch(tokens[:1, :-1], tokens[:1, 1:], None), batch_size=4)
    assert math.isnan(one["bits_per_token_se"])  # no spread from a single window


def test_copy_probe_gains_nothing_for_a_model_blind_beyond_the_reach(model):
    """A conv-only model sees conv_reach tokens back: with the probe's reach at least that, the
    copy and the control score alike at every scored position; a model with attention sees
    the repeat. The gain is control minus copy, its error scipy's sem over the windows."""
    data = np.random.default_rng(1).integers(0, 13, 300).astype(np.uint8)
    conv_only = dataclasses.replace(CFG, layers=("conv", "conv"))
    blind = TinyLM(conv_only, rngs=nnx.Rngs(1))
    probe = copy_probe_windows(data, 16, 5, reach=conv_only.conv_reach)
    scores = copy_probe_scores(blind, probe, batch_size=4)
    assert scores["windows"] == 5 and scores["scored"] == [8 + conv_only.conv_reach, 16]
    np.testing.assert_allclose(scores["copy_bpb"], scores["control_bpb"], rtol=1e-6)
    assert abs(scores["gain_bpb"]) < 1e-5
    seeing = copy_probe_scores(model, probe, batch_size=4)
    start, stop = probe.scored
    bits = [window_losses(model, w, batch_size=4)[:, start:stop].mean(1) / math.log(2)
            for w in (probe.copy, probe.control)]  # fmt: skip
    assert seeing["gain_bpb"] == pytest.approx(float((bits[1] - bits[0]).mean()), rel=1e-5)
    assert seeing["gain_se"] == pytest.approx(stats.sem(bits[1] - bits[0]), rel=1e-4)
    assert abs(seeing["gain_bpb"]) > 1e-3  # attention reads the first half


def test_decode_cost_memory_grows_only_with_attention():
    contexts = [8, 40]
    kda = TinyLM(dataclasses.replace(CFG, layers=("kda",)), rngs=nnx.Rngs(0))
    hybrid = TinyLM(CFG, rngs=nnx.Rngs(0))  # one kda layer, one attention layer
    costs = {
        name: decode_cost(m, contexts, steps=2, repeats=1)
        for name, m in (("kda", kda), ("hybrid", hybrid))
    }
    for rows in costs.values():
        assert [r["context"] for r in rows] == contexts
        assert all(r["seconds_per_token"] > 0 and r["tokens_per_second"] > 0 for r in rows)
    kda_bytes = [r["cache_bytes"] for r in costs["kda"]]
    assert kda_bytes[0] == kda_bytes[1]  # two layers of [1, H, K, V] states + conv tails
    assert kda_bytes[0] == 2 * (2 * 8 * 8 * 4 + 3 * 3 * 16 * 4)
    # the hybrid's attention layer: keys and values of H * K float32 per token
    hybrid_grown = costs["hybrid"][1]["cache_bytes"] - costs["hybrid"][0]["cache_bytes"]
    assert hybrid_grown == (40 - 8) * 2 * (2 * 8) * 4
    assert cache_bytes(kda.init_cache(3)) == 3 * kda_bytes[0]
    with pytest.raises(ValueError, match="contexts must name"):
        decode_cost(kda, [])
    with pytest.raises(ValueError, match="every context must be an int >= 0"):
        decode_cost(kda, [-1])


def test_decode_cost_fills_mla_latent_caches():
    """decode_cost marks MLA's fixed latent cache as holding ``context`` tokens (as it does the
    attention cache), and the memory grows by one latent of kv_lora_rank floats per token."""
    contexts, r = [8, 40], 4
    mla = TinyLM(dataclasses.replace(CFG, layers=("kda", "mla"), kv_lora_rank=r), rngs=nnx.Rngs(0))
    cache = _as_if_seen(mla.init_cache(1, max_len=50), 8, jax.random.key(0))
    assert isinstance(cache[1], MLACache) and int(cache[1].length) == 8
    assert np.abs(np.asarray(cache[1].latents)).min() > 0  # filled with random latents
    costs = decode_cost(mla, contexts, steps=2, repeats=1)
    grown = costs[1]["cache_bytes"] - costs[0]["cache_bytes"]
    assert grown == (40 - 8) * r * 4  # one MLA layer: r float32 per token
    # (the same model with attention instead grows by 2 H K floats per token: the hybrid of
    # test_decode_cost_memory_grows_only_with_attention)
    # the next decode step writes its latent at position `context` and attends to all of them
    step = nnx.jit(lambda m, t, c: m(t, cache=c))  # one program, not op by op
    _, stepped = step(mla, jnp.zeros((1, 1), jnp.int32), cache)
    assert int(stepped[1].length) == 9
    changed = np.any(np.asarray(stepped[1].latents != cache[1].latents)[0], axis=-1)
    assert changed.tolist() == [i == 8 for i in range(50)]
    with pytest.raises(ValueError, match="fixed-capacity"):
        _as_if_seen(mla.init_cache(1), 8, jax.random.key(0))


def test_generation_with_the_published_models_kda_options():
    """A KDA layer with grouped value heads, the safe gate without A_log, a full-rank output
    gate beside a low-rank forget gate and the fused q/k/v conv (issue 27), as a mixer of the
    model: its [B, HV, K, V] state and split conv history decode as the full forward computes."""
    options = dict(num_v_heads=4, gate_form="safe_sigmoid", lower_bound=-5.0, use_a_log=False)
    options.update(forget_gate_rank=4, output_gate_rank=None, fused_qkv_conv=True)
    mixer_config = dataclasses.replace(CFG.mixer_config, **options)
    model = TinyLM(dataclasses.replace(CFG, mixer_config=mixer_config), rngs=nnx.Rngs(0))
    assert model.init_cache(2)[0].state.shape == (2, 4, 8, 8)
    tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, 13)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    # the logits, prefill of 3 then one token at a time (as generate decodes), against the full
    # forward (generate's own greedy tokens against it: test_greedy_generation_follows_...)
    step = nnx.jit(lambda m, t, c: m(t, cache=c))
    got, cache = step(model, tokens[:, :3], model.init_cache(2, max_len=9))
    pieces = [got]
    for t in range(3, 9):
        got, cache = step(model, tokens[:, t : t + 1], cache)
        pieces.append(got)
    np.testing.assert_allclose(np.concatenate(pieces, 1), full, atol=1e-5, rtol=1e-5)
