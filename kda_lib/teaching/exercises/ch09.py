"""Checkers of notebook 09's exercises (the hybrid's cache, where it outgrows pure KDA's, a
bigram baseline)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import again, checker, refuse_degenerate, seeded
from kda_lib.teaching.exercises._routes import call_own_work


def _hybrid_bytes(context, kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size,
                  decode_steps) -> int:
    """A hybrid's decode cache in bytes (KDA states and conv tails, MLA latents)."""
    kda_layer = 4 * (heads * key_dim * key_dim + 3 * max(conv_size - 1, 0) * heads * key_dim)
    mla_layer = 4 * (context + decode_steps + 1) * kv_lora_rank + 4
    return kda_layers * kda_layer + mla_layers * mla_layer


_SHAPES = [  # (kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size, decode_steps)
    (3, 1, 4, 32, 64, 4, 8),
    (2, 2, 2, 16, 8, 2, 0),
    (5, 1, 1, 8, 48, 1, 3),
]


@checker("09.1")
def hybrid_cache_bytes(answer, *, measured: dict, shape: dict):
    """``answer(context, kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size,
    decode_steps) -> int``: a hybrid's decode cache in bytes. Compared with the notebook's
    measurement (``measured``: context -> bytes, for the model ``shape``, a dict of those
    arguments), then tried on contexts nobody measured and on models of the checker's own, so a
    lookup or a fit of the measurements cannot pass. kda_lib may not be called."""
    names = ("kda_layers", "mla_layers", "heads", "key_dim", "kv_lora_rank", "conv_size",
             "decode_steps")
    own = tuple(int(shape[n]) for n in names)
    trials = [(int(c), own, int(b)) for c, b in measured.items()]
    unmeasured = [c for c in (3, 100, 777, 5000) if c not in measured]
    trials += [(c, own, _hybrid_bytes(c, *own)) for c in unmeasured]
    trials += [(c, sh, _hybrid_bytes(c, *sh)) for sh in _SHAPES for c in (10, 300)]
    for context, sh, want in trials:
        got, hint = call_own_work(
            answer, context, *sh, name="hybrid_cache_bytes(context, ...)"
        )
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what="the bytes")
        if hint:
            return hint
        if int(got) != want:
            where = "measured" if context in measured and sh == own else "expected"
            return (
                f"at context {context} for {dict(zip(names, sh, strict=True))} your count is "
                f"{'above' if got > want else 'below'} the {where} cache; "
                + _missing_term(int(got), context, *sh)
            )
    return None


def _missing_term(got, context, kda, mla, heads, key_dim, rank, conv, steps) -> str:
    """The hint naming the term of 09.1's count that ``got`` leaves out (or gets wrong)."""
    want = _hybrid_bytes(context, kda, mla, heads, key_dim, rank, conv, steps)
    tails = kda * 4 * 3 * max(conv - 1, 0) * heads * key_dim
    misses = {  # what the answer would be without each term -> the hint naming it
        "the MLA cache has room for more than the context: read decode_cost": want
        - mla * 4 * (steps + 1) * rank,
        "a KDA layer also keeps the last w - 1 inputs of its short convolutions": want - tails,
        "a KDA layer keeps q's, k's and v's convolution tails (three)": want - tails // 3 * 2,
        "each MLA cache also stores its length (an int32)": want - 4 * mla,
        "a KDA head's state is d_k x d_v, float32": want
        - kda * 4 * heads * key_dim * (key_dim - 1),
    }
    return next((text for text, value in misses.items() if value == got),
                "count, layer by layer, what decoding one more token needs (section 5)")


def _context_at(factor, kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size,
                decode_steps, kda_bytes=None) -> int:
    """The smallest whole context at which the hybrid's cache is ``factor`` times a pure-KDA
    model's of the same depth (``kda_bytes``, or counted), in integers."""
    rest = (heads, key_dim, kv_lora_rank, conv_size, decode_steps)
    pure = (kda_layers + mla_layers) * _hybrid_bytes(0, 1, 0, *rest)
    pure = pure if kda_bytes is None else kda_bytes
    fixed = _hybrid_bytes(0, kda_layers, mla_layers, *rest)
    return max(0, -(-(factor * pure - fixed) // (4 * mla_layers * kv_lora_rank)))


@checker("09.2")
def context_at_factor(answer, *, shape: dict, kda_bytes: int):
    """``answer(factor, kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size,
    decode_steps) -> int``: the smallest whole context at which the hybrid's decode cache is at
    least ``factor`` times that of a pure-KDA model of the same depth. Tried on the notebook's
    hybrid (``shape``; ``kda_bytes``: its pure-KDA twin's measured cache) and on models and
    factors of the checker's own. kda_lib may not be called."""
    names = ("kda_layers", "mla_layers", "heads", "key_dim", "kv_lora_rank", "conv_size",
             "decode_steps")
    own = tuple(int(shape[n]) for n in names)
    trials = [(f, own, _context_at(f, *own, kda_bytes=int(kda_bytes))) for f in (10, 3, 40)]
    trials += [(f, sh, _context_at(f, *sh)) for sh in _SHAPES for f in (10, 2)]
    for factor, sh, want in trials:
        got, hint = call_own_work(answer, factor, *sh, name="context_at(factor, ...)")
        hint = hint or refuse_degenerate(
            got, shape=(), integer=True, allow_zeros=want == 0, what="the context"
        )
        if hint:
            return hint
        if int(got) in (want - 1, want + 1):
            return "off by one: the smallest whole context where the cache reaches the factor"
        if int(got) != want:
            return (
                f"wrong for factor {factor} and shape {dict(zip(names, sh, strict=True))}: the "
                "hybrid's cache grows with context (09.1's count); a pure-KDA model of the same "
                "depth has kda_layers + mla_layers KDA layers and a fixed cache"
            )
    return None


def _bigram_bpb(train, validation, smoothing=1.0, log=np.log2) -> float:
    """Bits per byte of validation[1:] given the byte before, pair counts from ``train``."""
    train, validation = np.asarray(train, np.int64), np.asarray(validation, np.int64)
    counts = np.full((256, 256), smoothing)
    np.add.at(counts, (train[:-1], train[1:]), 1)
    with np.errstate(divide="ignore", invalid="ignore"):  # smoothing 0: rows never seen
        p = counts / counts.sum(1, keepdims=True)
        return float(-log(p[validation[:-1], validation[1:]]).mean())


def _unigram_bpb(train, validation) -> float:
    """Bits per byte of ``validation`` under add-one byte counts of ``train``."""
    counts = np.bincount(np.asarray(train, np.int64), minlength=256) + 1.0
    return float(-np.log2(counts / counts.sum())[np.asarray(validation, np.int64)].mean())


def _bigram_trials(rng):
    """(train, validation) uint8 byte strings of the checker's own: a hand case, a Markov chain
    over 12 bytes (validation may hold pairs train never saw) and a text of the corpus' kind, the
    last two drawn from ``rng`` (lengths and split points too)."""
    hand = (np.frombuffer(b"abababbbab", np.uint8), np.frombuffer(b"abba", np.uint8))
    symbols = rng.choice(256, 12, replace=False)
    steps = rng.dirichlet(np.full(12, 0.3), size=12)
    state, chain = 0, []
    for _ in range(int(rng.integers(2000, 3000))):
        state = rng.choice(12, p=steps[state])
        chain.append(symbols[state])
    chain, split = np.asarray(chain, np.uint8), int(rng.integers(1500, 1900))
    text = np.frombuffer(b"def f(x):\n    return x + 1\n" * 40 + bytes(range(200, 256)), np.uint8)
    cut = int(rng.integers(700, 1000))
    return [hand, (chain[:split], chain[split:]), (text[:cut], text[cut:])]


@checker("09.3")
def bigram_baseline(answer, *, seed=None):
    """``answer(train, validation) -> float``: the bits per byte of ``validation[1:]`` under
    the model that predicts a byte from the byte before, from the pair counts of ``train`` with
    one added to each of the 256 x 256 counts (add-one, as section 2's unigram). Tried on
    byte strings of the checker's own (uint8, as the corpus), drawn at each call (``seed``
    repeats a draw); kda_lib may not be called."""
    seed, rng = seeded(seed)
    hint = _bigram_hint(answer, _bigram_trials(rng))
    return hint and hint + again(seed)


def _bigram_hint(answer, trials) -> str | None:
    """``None`` when ``answer`` gives the bigram bits per byte of every (train, validation)."""
    for train, validation in trials:
        got, hint = call_own_work(answer, train.copy(), validation.copy(),
                                  name="bigram_bpb(train, validation)")
        hint = hint or refuse_degenerate(got, shape=(), what="the bits per byte")
        if hint:
            return hint
        want = _bigram_bpb(train, validation)
        got = float(got)
        if np.isclose(got, want, rtol=1e-6):
            continue
        if np.isclose(got, _unigram_bpb(train, validation), rtol=1e-6):
            return "that ignores the byte before: count pairs (previous byte, next byte)"
        if np.isclose(got, want * np.log(2), rtol=1e-6):
            return "bits, not nats: log base 2"
        if np.isclose(got, _bigram_bpb(train, validation, smoothing=0.0), rtol=1e-6):
            return "add one to every one of the 256 x 256 pair counts, as the unigram cell does"
        return (
            f"on a {train.size}-byte training string your bits per byte are "
            f"{'above' if got > want else 'below'} the bigram model's: count (previous, next) "
            "pairs in train, add one to each, normalise each row, average -log2 p(next | "
            "previous) over validation's bytes after its first (mind uint8 overflow)"
        )
    return None
