"""kda_lib.layers.mla: multi-head latent attention (NoPE) as a mixer, and its latent-only decode
cache.

The oracle is an independent float64 numpy forward written from the formulas (per-head keys and
values expanded from the latent, causal softmax); the mixer's uncached path forms per-head K/V,
its cached path works on the latents alone (absorbed form), so prefill + decode == full forward
checks that the two agree.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jitted_call
from flax import nnx

from kda_lib.layers.attention import AttentionCache
from kda_lib.layers.kda_layer import KDAConfig
from kda_lib.layers.mla import MLACache, MLAConfig, MultiHeadLatentAttention
from kda_lib.layers.params import weight_decay_mask
from kda_lib.models.tiny_lm import (
    MIXERS,
    ModelConfig,
    TinyLM,
)

CFG = MLAConfig(hidden_size=24, num_heads=3, head_dim=8, value_head_dim=6, kv_lora_rank=5)
SHARED = dataclasses.replace(CFG, shared_key_dim=4, q_lora_rank=7)


def _layer(cfg=CFG, seed=0):
    return MultiHeadLatentAttention(cfg, rngs=nnx.Rngs(seed))


def _x(batch=2, seq_len=11, hidden=24, seed=1):
    return jax.random.normal(jax.random.key(seed), (batch, seq_len, hidden), jnp.float32)


def _oracle(layer: MultiHeadLatentAttention, x) -> np.ndarray:
    """float64 numpy MLA forward, written from the formulas."""
    cfg = layer.config
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    x = f64(x)
    b, t, _ = x.shape
    h, d, dv, r, ds = (
        cfg.num_heads,
        cfg.head_dim,
        cfg.value_dim,
        cfg.kv_lora_rank,
        cfg.shared_key_dim,
    )

    def rms(a, w):
        return a / np.sqrt(np.mean(a * a, -1, keepdims=True) + cfg.norm_eps) * f64(w)

    if cfg.q_lora_rank is None:
        q = x @ f64(layer.q_proj.kernel[...])
    else:
        q = rms(x @ f64(layer.q_a_proj.kernel[...]), layer.q_a_layernorm.scale[...])
        q = q @ f64(layer.q_b_proj.kernel[...])
    q = q.reshape(b, t, h, d + ds)
    ckv = x @ f64(layer.kv_a_proj_with_mqa.kernel[...])
    c = rms(ckv[..., :r], layer.kv_a_layernorm.scale[...])
    kv = (c @ f64(layer.kv_b_proj.kernel[...])).reshape(b, t, h, d + dv)
    k = np.concatenate([kv[..., :d], np.broadcast_to(ckv[:, :, None, r:], (b, t, h, ds))], -1)
    v = kv[..., d:]
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d + ds)
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    o = np.einsum("bhts,bshv->bthv", w, v).reshape(b, t, h * dv)
    return o @ f64(layer.o_proj.kernel[...])


@pytest.mark.parametrize("cfg", [CFG, SHARED], ids=["plain", "shared_key+q_lora"])
def test_forward_matches_float64_oracle(cfg):
    layer = _layer(cfg)
    x = _x()
    got = np.asarray(jitted_call(layer, x))
    np.testing.assert_allclose(got, _oracle(layer, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg", [CFG, SHARED], ids=["plain", "shared_key+q_lora"])
@pytest.mark.parametrize("max_len", [None, 16], ids=["growing", "fixed"])
def test_prefill_then_token_by_token_decode_equals_full_forward(cfg, max_len):
    layer = _layer(cfg)
    x = _x(seq_len=11)
    full = np.asarray(jitted_call(layer, x))
    cache = layer.init_cache(2, max_len=max_len)
    y0, cache = jitted_call(layer, x[:, :8], cache=cache)
    outs = [np.asarray(y0)]
    for t in range(8, 11):  # (a growing cache has a new shape, so a new program, each step)
        yt, cache = jitted_call(layer, x[:, t : t + 1], cache=cache)
        outs.append(np.asarray(yt))
    np.testing.assert_allclose(np.concatenate(outs, 1), full, rtol=2e-5, atol=2e-6)
    assert int(cache.seen) == 11


def test_cache_holds_only_the_latents():
    """B x T x kv_lora_rank numbers (plus the shared key part when there is one), no per-head
    K/V: the cache of T tokens is exactly that size, in the compute dtype."""
    batch, seq_len = 2, 9
    for cfg in (CFG, SHARED):
        layer = _layer(cfg)
        _, cache = jitted_call(layer, _x(batch, seq_len), cache=layer.init_cache(batch))
        assert isinstance(cache, MLACache)
        assert cache.latents.shape == (batch, seq_len, cfg.kv_lora_rank)
        arrays = [a for a in (cache.latents, cache.shared_keys) if a is not None]
        numbers = sum(a.size for a in arrays)
        assert numbers == batch * seq_len * (cfg.kv_lora_rank + cfg.shared_key_dim)
        assert sum(a.nbytes for a in arrays) == numbers * jnp.dtype(cfg.dtype).itemsize
    per_head_kv = CFG.num_heads * (CFG.head_dim + CFG.value_dim)
    assert CFG.kv_lora_rank < per_head_kv  # the point of MLA: 5 numbers a token, not 42


def test_causal_future_tokens_do_not_change_past_outputs():
    layer = _layer(SHARED)
    x = _x(seq_len=10)
    changed = x.at[:, 6:].set(_x(seq_len=4, seed=7))
    y, y_changed = (np.asarray(jitted_call(layer, a)) for a in (x, changed))  # one program
    np.testing.assert_array_equal(y[:, :6], y_changed[:, :6])
    assert np.abs(y[:, 6:] - y_changed[:, 6:]).max() > 1e-3  # the future does change


def test_segments_packed_documents_equal_separate_runs_and_padding_is_zero():
    layer = _layer(SHARED)
    x = _x(batch=1, seq_len=10)
    ids = jnp.array([[1, 1, 1, 1, 2, 2, 2, 2, 0, 0]])
    y = np.asarray(jitted_call(layer, x, segment_ids=ids))
    first, second = (np.asarray(jitted_call(layer, x[:, a:b])) for a, b in ((0, 4), (4, 8)))
    np.testing.assert_allclose(y[:, :4], first, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y[:, 4:8], second, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(y[:, 8:], 0.0)
    # trailing padding without segment ids cannot reach earlier tokens either (causal), as
    # for the attention mixer: the first document's outputs are those of a run on it alone
    np.testing.assert_allclose(
        np.asarray(jitted_call(layer, x))[:, :4], first, rtol=1e-5, atol=1e-6
    )


def test_gradients_are_finite_and_reach_every_parameter():
    layer = _layer(SHARED)
    x = _x()
    graphdef, params = nnx.split(layer, nnx.Param)

    def loss(params):
        return jnp.sum(nnx.merge(graphdef, params)(x) ** 2)

    grads = jax.jit(jax.grad(loss))(params)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert np.isfinite(np.asarray(g)).all(), path
        assert np.abs(np.asarray(g)).max() > 0, f"no gradient reaches {path}"


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="kv_lora_rank"):
        MLAConfig(hidden_size=8, num_heads=2, head_dim=4, value_head_dim=4, kv_lora_rank=0)
    with pytest.raises(ValueError, match="shared_key_dim"):
        dataclasses.replace(CFG, shared_key_dim=-1)
    layer = _layer()
    with pytest.raises(ValueError, match="hidden_size=24"):
        layer(jnp.zeros((1, 3, 5)))
    with pytest.raises(ValueError, match="segment_ids cannot be combined with a cache"):
        layer(_x(1, 3), segment_ids=jnp.ones((1, 3), int), cache=layer.init_cache(1))
    with pytest.raises(ValueError, match="cache must be an MLACache"):
        layer(_x(1, 3), cache=AttentionCache(jnp.zeros(1), jnp.zeros(1)))
    with pytest.raises(ValueError, match="the MLA cache holds 4 tokens"):
        layer(_x(1, 5), cache=layer.init_cache(1, max_len=4))
    with pytest.raises(ValueError, match="max_len"):
        layer.init_cache(1, max_len=0)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ModelConfig(vocab_size=5, kv_lora_rank=0)


def test_registered_as_a_mixer_in_a_hybrid_that_decodes_exactly():
    assert "mla" in MIXERS
    cfg = ModelConfig(
        vocab_size=11,
        mixer_config=KDAConfig(hidden_size=16, num_heads=2, head_dim=8, implementation="recurrent"),
        kv_lora_rank=6,
        layers=("kda", "mla"),
        num_layers=2,
    )
    assert cfg.label == "kda-mla"
    model = TinyLM(cfg, rngs=nnx.Rngs(0))
    assert isinstance(model.blocks[1].mixer, MultiHeadLatentAttention)
    tokens = jax.random.randint(jax.random.key(2), (2, 9), 0, 11)
    full = np.asarray(jitted_call(model, tokens))
    cache = model.init_cache(2, max_len=9)
    assert cache[1].latents.shape == (2, 9, 6)
    logits, cache = jitted_call(model, tokens[:, :5], cache=cache)
    outs = [np.asarray(logits)]
    for t in range(5, 9):
        logits, cache = jitted_call(model, tokens[:, t : t + 1], cache=cache)
        outs.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(outs, 1), full, rtol=1e-4, atol=1e-5)
    # AdamW decays the matmul kernels, not the latent norm's weight (the project's policy)
    mask = weight_decay_mask(model.blocks[1].mixer)
    assert mask["kv_a_layernorm"]["scale"] is False
    assert mask["kv_b_proj"]["kernel"] is True
    # parameters: the formula's (q, kv down, latent norm, kv up, out), nothing else
    h, d, r, hidden = 2, 8, 6, 16
    formula = hidden * h * d + hidden * r + r + r * h * (d + d) + h * d * hidden
    mixer_params = nnx.state(model.blocks[1].mixer, nnx.Param)
    assert sum(a.size for a in jax.tree.leaves(mixer_params)) == formula


@pytest.mark.parametrize("mixer", ["mla", "attention"])
def test_mla_and_attention_check_caches_and_inputs_at_the_boundary(mixer):
    """A cache for another batch size, a cache without MLA's shared keys, init_cache(0) and
    init_cache(-1), and an input of the wrong hidden size: a ValueError naming it, before any
    work (they failed inside jax, or were accepted, before)."""
    from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention

    if mixer == "mla":
        layer = _layer(SHARED)
        no_shared = layer.init_cache(2)._replace(shared_keys=None)
        with pytest.raises(ValueError, match="cache.shared_keys"):
            layer(_x(2, 3), cache=no_shared)
    else:
        layer = CausalSelfAttention(AttentionConfig(hidden_size=24, num_heads=3, head_dim=8),
                                    rngs=nnx.Rngs(0))  # fmt: skip
    with pytest.raises(ValueError, match=r"cache\.\w+ (has|must have) shape.*(B=1|expected \(1, )"):
        layer(_x(1, 3), cache=layer.init_cache(2))
    for size in (0, -1):
        with pytest.raises(ValueError, match="batch_size"):
            layer.init_cache(size)
    with pytest.raises(ValueError, match="hidden_size=24"):
        layer(jnp.zeros((1, 3, 5)))
