"""Explanatory maths of the notebooks: what one KDA head does, in matrices and norms.

These are for teaching and figures, not for speed: each is computed from the oracle recurrence
(:mod:`kda_lib.ops.reference`) or its closed form, one head at a time.

* :func:`kda_mixing_matrix` -- the implicit ``T x T`` attention matrix of one KDA head, read off
  the recurrence with one-hot values; :func:`mixing_matrix_by_products` -- the same matrix from
  its closed form (products of transitions), in float64 NumPy.
* :func:`softmax_attention_matrix` -- causal softmax attention weights, for comparison.
* :func:`state_norms` -- ``||S_t||_F`` after every token of one head (the state's size over time).
* :func:`transition_norms` -- the same with every transition's ``||M_t||_2`` and the write bound;
  :func:`growth` and :func:`ablation` -- notebook 04's ablation, one head and every drawn head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.ops.api import kda_recurrent
from kda_lib.ops.reference import kda_step


def kda_mixing_matrix(q, k, g, beta, *, scale: float | None = None) -> jax.Array:
    """The implicit ``[T, T]`` mixing matrix ``Omega`` (docs/NOTATION.md's Omega) of one KDA
    head: ``o = Omega @ v``.

    For fixed ``q, k, g, beta`` the output is linear in ``v`` and every value channel goes
    through the same map, so feeding one-hot values (``v = I_T``, one channel per token) reads
    ``Omega`` off the outputs: ``Omega[t, s]`` is how much ``v_s`` contributes to ``o_t``. It is
    lower triangular (causal) and, unlike softmax attention, can be negative (the delta rule
    subtracts).

    Args:
      q, k, g: ``[T, K]`` for one head; beta: ``[T]``.
    Returns:
      ``Omega`` ``[T, T]`` in the accumulation dtype (float32, or float64 under x64).
    """
    # as jax arrays first: a float64 NumPy input is float32 unless x64 is on (asking
    # jnp.result_type for float64 itself would warn that it is truncated)
    q, k, g, beta = (jnp.asarray(x) for x in (q, k, g, beta))
    seq_len = q.shape[0]
    eye = jnp.eye(seq_len, dtype=jnp.result_type(q.dtype, jnp.float32))
    o, _ = kda_recurrent(
        q[None, :, None],
        k[None, :, None],
        eye[None, :, None],
        g[None, :, None],
        beta[None, :, None],
        scale=scale,
    )
    return o[0, :, 0, :]


def mixing_matrix_by_products(q, k, g, beta, *, scale: float = 1.0) -> np.ndarray:
    """The mixing matrix ``Omega`` of one KDA head from its closed form, in float64 NumPy:
    ``Omega[t, s] = scale * beta_s * q_t^T M_t M_{t-1} ... M_{s+1} k_s`` for ``s <= t``, with
    the transition ``M_u = (I - beta_u k_u k_u^T) diag(exp(g_u))`` (the notebook notes,
    notebook 02).

    Args:
      q, k, g: ``[T, K]`` for one head; beta: ``[T]``.
    Returns:
      ``Omega`` ``[T, T]`` float64, lower triangular; equals :func:`kda_mixing_matrix`.
    """
    q, k, g, beta = (np.asarray(x, np.float64) for x in (q, k, g, beta))
    seq_len = q.shape[0]
    written = np.zeros((k.shape[1], seq_len))  # column s: where v_s sits in the state, [K, T]
    mixing = np.zeros((seq_len, seq_len))
    for t in range(seq_len):
        written = np.exp(g[t])[:, None] * written  # D_t on every earlier column
        written -= beta[t] * np.outer(k[t], k[t] @ written)  # then I - beta_t k_t k_t^T
        written[:, t] = beta[t] * k[t]  # token t's own write
        mixing[t, : t + 1] = scale * q[t] @ written[:, : t + 1]
    return mixing


def softmax_attention_matrix(q, k, *, scale: float | None = None) -> jax.Array:
    """Causal softmax attention weights ``[T, T]`` for one head (q, k ``[T, K]``)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = scale * q @ k.T
    causal = jnp.tril(jnp.ones(scores.shape, bool))
    return jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)


@jax.jit
def state_norms(k, v, g, beta) -> jax.Array:
    """``||S_t||_F`` after every token of one head, by the token-by-token recurrence from zero.

    Args:
      k, g: ``[T, K]``; v: ``[T, V]``; beta: ``[T]`` (one head, the query does not matter).
    Returns:
      ``[T]`` Frobenius norms of the state after each token.
    """

    def step(state, x):
        k_t, v_t, g_t, b_t = (y[None, None] for y in x)  # add B = H = 1
        state, _ = kda_step(state, k_t, k_t, v_t, g_t, b_t)
        return state, jnp.linalg.norm(state)

    state0 = jnp.zeros((1, 1, k.shape[-1], v.shape[-1]), jnp.result_type(v.dtype, jnp.float32))
    return jax.lax.scan(step, state0, (k, v, g, beta))[1]


def growth(k, v, g, beta, S_0) -> tuple[np.ndarray, np.ndarray]:
    """Notebook 04's ablation for one head: every ``||M_t||_2`` (:func:`transition_norms`) and
    ``||S_t||_F / ||S_0||_F`` for ``S_0`` carried through ``I - beta_t k_t k_t^T`` alone (no write,
    no decay: only an eigenvalue outside [-1, 1] can make it grow), each ``[T]``."""
    S, kept = S_0, []
    for k_t, b_t in zip(k, beta, strict=True):
        S = S - b_t * np.outer(k_t, k_t @ S)
        kept.append(np.linalg.norm(S) / np.linalg.norm(S_0))
    return transition_norms(k, v, g, beta)[1], np.array(kept)


def ablation(ways: dict, config, x, layer_seed: int, *, draws: int, seed: int, widths) -> tuple:
    """Notebook 04's ablation on every head of ``draws`` layers at initialisation: draw 0 is the
    page's layer (``nnx.Rngs(layer_seed)``) on its ``x``; each further draw takes a layer seed and
    a standard-normal input like ``x`` from ``jax.random.fold_in(jax.random.key(seed), 4)``. Each
    draw builds the layer at ``config`` with every ``head_dim`` in ``widths``. ``ways``: ``{way:
    (part, d_k)}``, ``part(layer, x, head)`` returning that head's ``k, v, g, beta`` as the way
    makes them. Each head of each draw gets one random ``S_0`` per width the ways use (NumPy seeds
    ``seed``, ``seed + 1``, ... in the order the ways name them), carried by :func:`growth`.

    Returns ``(runs, layers, inputs)``: ``runs``, one ``{way: growth(...)}`` per head of every
    draw (draw-major); ``layers[i][d_k]``, the draws' layers; ``inputs[i]``, their inputs.
    """
    import dataclasses

    from flax import nnx

    from kda_lib.layers import KimiDeltaAttention

    keys = jax.random.split(jax.random.fold_in(jax.random.key(seed), 4), draws - 1)
    seeds = [layer_seed] + [int(jax.random.randint(jax.random.split(key)[0], (), 0, 2**31 - 1))
                            for key in keys]
    inputs = [x] + [jax.random.normal(jax.random.split(key)[1], x.shape) for key in keys]
    layers = [{n: KimiDeltaAttention(dataclasses.replace(config, head_dim=n), rngs=nnx.Rngs(s))
               for n in widths} for s in seeds]
    heads, used = config.num_heads, dict.fromkeys(n for _, n in ways.values())
    S_0 = {n: np.random.default_rng(seed + i).normal(size=(draws, heads, n, n))
           for i, n in enumerate(used)}
    runs = [{way: growth(*part(layers[i][n], inputs[i], h), S_0[n][i, h])
             for way, (part, n) in ways.items()} for i in range(draws) for h in range(heads)]
    return runs, layers, inputs


def transition_norms(k, v, g, beta) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One head's ``||S_t||_F`` (:func:`state_norms`, float32), ``||M_t||_2`` of every transition
    ``M_t = (I - beta_t k_t k_t^T) D_t`` and the write bound ``sum_{s <= t} |beta_s| ||k_s||
    ||v_s||`` (float64), each ``[T]``: while every ``||M_t||_2 <= 1``, ``||S_t||_F`` stays under
    the write bound (the triangle inequality), so a state above it had some transition expand it.
    Any ``k`` and ``beta`` (unnormalised keys, a ``beta`` outside ``[0, 1]``).

    Args:
      k, g: ``[T, K]``; v: ``[T, V]``; beta: ``[T]``.
    """
    k, v, g, beta = (np.asarray(a, np.float64) for a in (k, v, g, beta))
    eye = np.eye(k.shape[-1])
    m = [np.linalg.norm((eye - b * np.outer(kk, kk)) * np.exp(gg), 2)
         for kk, b, gg in zip(k, beta, g, strict=True)]
    writes = np.abs(beta) * np.linalg.norm(k, axis=-1) * np.linalg.norm(v, axis=-1)
    norms = state_norms(*(jnp.asarray(a, jnp.float32) for a in (k, v, g, beta)))
    return np.asarray(norms), np.array(m), np.cumsum(writes)
