"""Checkers of notebook 07: the cache that rolls back a draft (07.1), rolling the state back over
rejected tokens (07.2), the crossover of a verify call (07.3); inputs drawn at each call."""

from __future__ import annotations

import contextlib
import math
import os

import numpy as np

from kda_lib.teaching import exercises as ex


def _window_rows(conv_size: int, draft: int) -> int:
    """Conv rows giving the history after any prefix of a draft (none for ``conv_size`` < 2)."""
    return conv_size - 1 + draft if conv_size >= 2 else 0


def _cache_bytes(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size, conv_bytes, draft):
    """``draft + 1`` float32 states [B, HV, K, V], one window of conv rows (q, k: H K; v: HV V)."""
    conv = batch * _window_rows(conv_size, draft) * (2 * num_heads * key_dim
                                                     + num_v_heads * value_dim)
    return 4 * (draft + 1) * batch * num_v_heads * key_dim * value_dim + conv_bytes * conv


# per layer: (conv_size, num_v_heads / num_heads, conv bytes): HV = H once, conv_size 0 to 4
_LAYOUTS = ((0, 2, 2), (4, 1, 4), (4, 4, 2), (1, 2, 2), (2, 3, 2), (3, 4, 4))


def _layers(rng):
    """Six layers (B, H, HV, K, V, w, conv bytes, draft) of :data:`_LAYOUTS`, sizes drawn."""
    drawn = ((int(rng.integers(1, 5)), layout) for layout in _LAYOUTS)  # H first, then the rest
    return [(int(rng.integers(1, 6)), h, h * group, int(rng.choice([4, 8, 16, 32])),
             int(rng.choice([8, 12, 16, 32])), w, conv_bytes, int(rng.integers(1, 9)))
            for h, (w, group, conv_bytes) in drawn]


def _cache_hint(case, got: int) -> str:
    """Why ``got`` is not 07.1's bytes for ``case``: the named slips, else a question."""
    b, h, hv, k, v, w, cb, n = case
    conv, states = b * (2 * h * k + hv * v) * cb, 4 * b * hv * k * v
    if hv != h and got == states // hv * h * (n + 1) + conv * _window_rows(w, n):
        return "a state per key head: the states have one per value head, HV, not H"
    if got == states * (n + 1) + conv * max(w - 1, 0) * (n + 1):
        return "a conv history per prefix: the m + 1 histories overlap; one window holds them all"
    if got == states * n + conv * _window_rows(w, n):
        return "the m states after the draft tokens, but 0 tokens accepted is a prefix too"
    if got == states * (n + 1) + conv * max(w - 1 + n, 0):
        return f"conv_size = {w} keeps no history, before or after a draft"
    if got == states + conv * max(w - 1, 0):
        return "that is the cache of one state (no draft): which prefixes must it reach?"
    return "how many states, which tensors have H heads and which HV, how many conv rows?"


@ex.checker("07.1")
def draft_cache_bytes(answer, rng):
    """``answer(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size, conv_bytes, draft)
    -> int``: the bytes of the cache that rolls a KDA layer back to any prefix of a draft."""
    hint, miss = ex.first_miss(answer, _layers(rng), "draft_cache_bytes(B, H, HV, K, V, w, "
                               "conv_bytes, draft)", _cache_bytes, shape=(), integer=True,
                               what="the bytes")
    return f"wrong for {miss[0]}: " + _cache_hint(miss[0], int(miss[1])) if miss else hint


_INVERSES = ("numpy.linalg", "scipy.linalg", "scipy.sparse", "jax._src.numpy.linalg",
             "jax._src.lax.linalg", "jax._src.scipy", "torch")
# the functions of those modules that multiply, not solve (numpy 2's array-API spellings)
_PRODUCTS = ("norm", "vector_norm", "outer", "vecdot", "matmul", "matrix_transpose",
             "tensordot", "trace", "diagonal", "cross", "multi_dot")
_INVERSE_HINT = (
    "your answer runs a linear-algebra routine (an inverse, a solve, a factorization): undo "
    "each token with the inverse of its transition written out by hand, O(d_k d_v) a token")
HANG_S = 60.0  # the closed form takes milliseconds at the largest d_k
_SLOW = ("your function took over {:.0f} s at d_k = {}: the closed-form rollback is O(d_k d_v) "
         "a token; is yours O(d_k^2)?")
_DENSE = ("your function ran out of memory at d_k = {:,}: a d_k x d_k array takes {:,.0f} GB "
          "there in float32, {:,.0f} GB in float64. Undo each token in O(d_k d_v) memory")


@contextlib.contextmanager
def _address_space_capped(headroom: int = 2**35):
    """Cap the address space (Linux) at its size plus ``headroom`` while the block runs."""
    try:
        import resource

        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        yield
        return
    cap = min(x for x in (size + headroom, soft, hard) if x != resource.RLIM_INFINITY)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _draft(rng, tokens: int, key_dim: int, value_dim: int):
    """State, unit keys, values, g in [-0.4, 0], beta in [0.1, 0.6] (last, every third 1.2-1.8)."""
    k = rng.standard_normal((tokens, key_dim))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    beta = rng.uniform(0.1, 0.6, tokens)
    beta[::3] = rng.uniform(1.2, 1.8, len(beta[::3]))
    beta[-1] = rng.uniform(1.2, 1.8)  # rejected in every draft but one: a series diverges
    return (rng.standard_normal((key_dim, value_dim)), k,
            rng.standard_normal((tokens, value_dim)), -0.4 * rng.random((tokens, key_dim)), beta)


def draft_states(state, k, v, g, beta):
    """The state after each draft token, ``[m + 1, K, V]`` (the first: ``state``), float64."""
    out = [np.asarray(state, np.float64)]
    for k_t, v_t, g_t, b_t in zip(k, v, g, beta, strict=True):
        s = np.exp(g_t)[:, None] * out[-1]
        out.append(s + b_t * np.outer(k_t, v_t - k_t @ s))
    return np.stack(out)


_DRAFTS = ((220_013, 1, 2, 1), (230_017, 2, 3, 0), (210_011, 2, 4, 4),  # (K, V, m, rejected)
           (200_003, 3, 5, 2), (500_009, 1, 2, 1))  # odd d_k; the last's K x K fits nowhere


@ex.checker("07.2")
def roll_back(answer, rng):
    """``answer(state, k, v, g, beta, rejected) -> [K, V]``: one head's state before the last
    ``rejected`` of ``m`` draft tokens, from the state after all, unit keys ``k [m, K]``, values
    ``v [m, V]``, log decays ``g [m, K]``, ``beta [m]`` (some in (1.2, 1.8)); d_k 200,003 to
    500,009: no solver or inverse (products pass), no d_k x d_k array (address space capped)."""
    for key_dim, value_dim, tokens, rejected in _DRAFTS:
        s0, k, v, g, beta = _draft(rng, tokens, key_dim, value_dim)
        states = draft_states(s0, k, v, g, beta)
        where, echo = f"for m = {tokens}, rejected = {rejected}", (states[-1],)[:rejected]
        with _address_space_capped():  # copies: an answer may update its arguments in place
            got, hint = ex.call_answer(
                answer, *(x.copy() for x in (states[-1], k, v, g, beta)), rejected,
                name="roll_back(state, k, v, g, beta, rejected)", allowed=_PRODUCTS,
                refused=dict.fromkeys(_INVERSES, _INVERSE_HINT), limit_s=HANG_S,
                slow=_SLOW.format(HANG_S, key_dim),
                refuse=dict(shape=s0.shape, inputs=echo, what=f"the state {where}"))
        if hint:  # a d_k x d_k array: out of memory
            return _DENSE.format(key_dim, 4 * key_dim**2 / 1e9, 8 * key_dim**2 / 1e9) if (
                "MemoryError" in hint or "RESOURCE_EXHAUSTED" in hint) else hint
        got, want = np.asarray(got, np.float64), states[-1 - rejected]
        if np.linalg.norm(got - want) > 1e-4 * np.linalg.norm(want):
            return _roll_back_hint(got, states, k, v, g, beta, rejected, where)


def _roll_back_hint(got, states, k, v, g, beta, rejected, where) -> str:
    """A wrong roll-back's hint: one token off, none rejected, D_t left in place or undone first,
    one token undone with a truncated series' rate, else a question."""
    near = lambda x: np.linalg.norm(got - x) <= 1e-4 * np.linalg.norm(x)
    undo = lambda s, t: s + beta[t] / (1 - beta[t]) * np.outer(k[t], k[t] @ s)  # (I - b k k^T)^-1
    kept = first = states[-1]  # D_t never undone; D_t undone before I - beta k k^T
    for t in range(len(beta) - 1, len(beta) - 1 - rejected, -1):
        kept = undo(kept - beta[t] * np.outer(k[t], v[t]), t)
        first = undo(np.exp(-g[t])[:, None] * (first - beta[t] * np.outer(k[t], v[t])), t)
    w_t = states[-1] - beta[-1] * np.outer(k[-1], v[-1])  # (I - b k k^T) D S_(t-1), last token
    u, d_t = k[-1] @ w_t, np.exp(g[-1])[:, None]  # then S_(t-1) = D^-1 (w_t + rate k u^T)
    rate = (k[-1] @ (d_t * got)) @ u / (u @ u) - 1  # got's, were it undone so
    sums = np.cumsum(beta[-1] ** np.arange(1.0, 1200.0))[1:]  # I + b k k^T + ... (2+ terms)
    series = rejected == 1 and np.isclose(sums, rate, rtol=1e-4).any() and near(
        (w_t + rate * np.outer(k[-1], u)) / d_t)
    return (f"off by one token {where}: undo exactly the last `rejected` tokens" if any(
        near(states[-1 - r]) for r in (rejected - 1, rejected + 1) if 0 <= r < len(states))
        else f"wrong {where}" + (
            ": which tokens does your loop undo when none is rejected? (x[-0:] is all of x)"
            if not rejected else ": the write and I - beta k k^T are undone, but M_t = "
            "(I - beta k k^T) D_t: what undoes D_t?" if near(kept) else ": M_t = (I - beta k "
            "k^T) D_t, D_t applied first: undo the left factor, I - beta k k^T, first and D_t last"
            if near(first) else (" (some beta > 1 here: a series in beta k k^T diverges)"
                                 if series else "") + ": write S_(t-1) from S_t = M_t S_(t-1) "
            "+ E_t; what undoes I - beta k k^T exactly, for a unit k?"))


def _kda_verify_bytes(heads, key_dim, value_dim, conv_size, state_bytes, draft):
    """Bytes of a KDA verify call: state read, every token's state written, conv rows in and out."""
    return state_bytes * heads * ((1 + draft) * key_dim * value_dim
                                  + _window_rows(conv_size, draft) * (2 * key_dim + value_dim))


def _t_star(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, kv_bytes, draft):
    kda = _kda_verify_bytes(heads, key_dim, value_dim, conv_size, state_bytes, draft)
    return max(1, math.ceil(kda / (kv_numbers * kv_bytes)) - 2 * draft)


def _cases(rng):
    """Drawn (heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, kv_bytes, draft):
    seven, one whose count gives T <= 0 (T* = 1), one whose quotient is whole (equality)."""
    out = [(int(rng.choice([8, 16, 32])), int(rng.choice([64, 128])), int(rng.choice([64, 128])),
            w, int(rng.integers(96, 4097)), int(rng.choice([2, 4])), int(rng.choice([2, 4])),
            int(rng.integers(1, 9))) for w in (4, 4, 4, 0, 1, 2, 3, int(rng.integers(0, 5)))]
    *head, n, bs, bc, d = out.pop()
    whole = _kda_verify_bytes(*head, bs, d) // bc  # a multiple of 256: divisors in [96, 4096]
    n = int(rng.choice([m for m in range(96, 4097) if whole % m == 0]))
    return out + [(1, 8, 8, int(rng.integers(0, 5)), int(rng.integers(2048, 4097)),
                   int(rng.choice([2, 4])), int(rng.choice([2, 4])), int(rng.integers(4, 17))),
                  (*head, n, bs, bc, d)]


def _t_star_hint(case, got: int) -> str:
    """Why ``got`` is not 07.3's T* for ``case``: the named slips, else a question."""
    h, k, v, w, n, bs, bc, d = case
    kda = _kda_verify_bytes(h, k, v, w, bs, d)
    raw = math.ceil(kda / (n * bc)) - 2 * d
    if raw < 1 and got < 1:
        return "attention moves more bytes here at every context: T counts tokens, at least 1"
    if raw >= 1 and got == raw + 1 and kda % (n * bc) == 0:
        return (f"at T = {raw} attention moves exactly the KDA call's bytes: 'no fewer' "
                "includes equality (the quotient is a whole number here)")
    if h > 1 and got == max(1, math.ceil(kda / (h * n * bc)) - 2 * d):
        return "kv_numbers counts the whole layer's numbers a token, all heads (576 for MLA)"
    if got == _t_star(h, k, v, w, n, bs, bc, 1) and d > 1:
        return f"that is a draft of one token; this one has {d}"
    if got == math.ceil(2 * h * k * v * bs / (n * bc)):
        return "that is one decode step's T*_step: count the verify call's states, conv rows"
    one_state = kda - (d - 1) * h * k * v * bs
    if d > 1 and got == max(1, math.ceil(one_state / (n * bc)) - 2 * d):
        return "one state written: the call keeps the state after every draft token (exercise 1)"
    return "count both calls' bytes; is it the smallest whole T >= 1?"


@ex.checker("07.3")
def decode_crossover(answer, rng):
    """``answer(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, kv_bytes, draft)``:
    the least whole T >= 1 where attention verifying a draft (its entries written, all T + draft
    read) moves at least a KDA verify call's bytes (state read, each token's state written, conv
    rows read and written); shapes drawn at each call, one where the count gives T <= 0."""
    hint, miss = ex.first_miss(answer, _cases(rng), "t_star(...)", _t_star, shape=(), integer=True,
                               allow_zeros=True, what="T")
    return f"wrong for {miss[0]}: " + _t_star_hint(miss[0], int(miss[1])) if miss else hint
