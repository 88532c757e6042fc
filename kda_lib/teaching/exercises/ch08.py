"""Checkers of notebook 08's exercises (chance, the Holm column, the sign-flip column, time
scales): the notebook's family and families drawn at each call (``seed`` repeats them)."""

from __future__ import annotations

import numpy as np
import scipy.special

from kda_lib.teaching import exercises as ex


@ex.checker("08.1")
def mqar_chance(answer, rng, **_):
    """``answer(vocab_size) -> float``: uniform guessing among MQAR's value tokens, on
    vocabularies odd and even, two drawn between 10^5 and 10^6 (1e-7 relative)."""
    drawn = 2 * int(rng.integers(5 * 10**4, 5 * 10**5))
    sizes = [(v,) for v in (8, 9, 17, 32, 101, drawn, drawn + 1)]
    hint, miss = ex.first_miss(  # MQAR draws its values from v - 1 - (v - 1) // 2 tokens
        answer, sizes, "mqar_chance(vocab_size)", lambda v: 1 / (v - 1 - (v - 1) // 2),
        lambda got, want: ex.close(got, want, 1e-7), shape=(), what="accuracy")
    if miss:
        hint = (f"wrong at V = {miss[0][0]}: draw MQAR sequences at this V and at its neighbours "
                "(make_task('mqar', vocab_size=V, num_pairs=...)) and count the ids that ever "
                "appear as values")
    return hint


_TESTS = ("scipy.stats", "jax.scipy.stats")  # the tests themselves, refused in 08.3
# 08.2 is numpy only: all of scipy and jax.scipy, and JAX's t and beta tails (lax.betainc, igamma)
_TAILS = (*ex.SCIPY, "jax._src.lax.special")


def _rows(family: dict) -> dict:
    """The family as ``{row: (kda scores, other scores)}``, lists of floats (a copy)."""
    return {row: tuple([float(x) for x in side] for side in pair) for row, pair in family.items()}


def _t_p(d, ddof: int = 1) -> float:
    """The two-sided p of the paired t of the differences ``d`` (n - 1 degrees of freedom)."""
    d = np.asarray(d, np.float64)
    t = d.mean() / (d.std(ddof=ddof) / np.sqrt(d.size))
    return float(2 * scipy.special.stdtr(d.size - 1, -abs(t)))


def _holm(p, running: bool = True, cap: bool = True) -> np.ndarray:
    """Holm's adjusted ``p``, input order: i-th smallest x (m - i + 1), ``running`` max, ``cap``."""
    p = np.asarray(p, np.float64)
    order, m = np.argsort(p, kind="stable"), p.size
    stepped = (m - np.arange(m)) * p[order]
    stepped = np.maximum.accumulate(stepped) if running else stepped
    out = np.empty(m)
    out[order] = np.minimum(stepped, 1.0) if cap else stepped
    return out


def _family_p(family: dict, how: str) -> np.ndarray:
    """Each row's p of ``family`` ({row: (a, b)}), worked out ``how`` (right or one mistake)."""
    d = [np.subtract(*map(np.asarray, pair)) for pair in family.values()]
    p = np.array([_t_p(x, ddof=0 if how == "sd over n" else 1) for x in d])
    if how == "one-sided":
        p = np.where([x.mean() > 0 for x in d], p / 2, 1 - p / 2)
    return {"unadjusted": p, "Bonferroni": np.minimum(p * p.size, 1.0),
            "no running maximum": _holm(p, running=False)}.get(how, _holm(p))


_HOLM_HINTS = {"unadjusted": "these are each row's own p: Holm adjusts them over the family",
    "Bonferroni": "that is Bonferroni (every p times m): Holm multiplies the i-th smallest of m "
    "by m - i + 1",
    "no running maximum": "Holm's adjusted values never fall in the sorted order: after the "
    "products, take the running maximum",
    "sd over n": "the sd of the differences divides by n - 1 (the t statistic's)",
    "one-sided": "the test is two-sided: KDA behind counts as much as KDA ahead",}


def _holm_families(rng) -> list:
    """Families of 5 seeds, 3-9 rows, p 0.001-0.99, one negative, Holm's max and cap at work."""
    out = []
    while len(out) < 3:
        m = int(rng.integers(3, 10))
        gaps = rng.uniform(-0.2, 1.5, m) * rng.choice([1, 1, -1], m) * 0.05
        fam = {f"row {i}": ((b + g + 0.05 * rng.standard_normal(5)).round(4).tolist(), b.tolist())
               for i, (g, b) in enumerate(zip(gaps, rng.uniform(0.3, 0.7, (m, 5)), strict=True))}
        p = _family_p(fam, "unadjusted")
        if p.min() > 1e-3 and (_holm(p) > _holm(p, running=False)).any() and (
                _holm(p, cap=False) > 1).any() and (_holm(p) < 0.5).sum() >= 2:
            out.append(fam)
    return out


def _column(got, family: dict, what: str) -> tuple[np.ndarray | None, str | None]:
    """The answer's values in ``family``'s row order, or a hint on their form."""
    if not isinstance(got, dict) or set(got) != set(family):
        return None, f"return a dict {{row: {what}}} with the family's rows as keys"
    values = [got[row] for row in family]
    if hint := ex.refuse_degenerate(values, shape=(len(family),), what=f"the {what}s",
                                    allow_zeros=True):
        return None, hint
    values = np.asarray(values, np.float64)
    if ((values < 0) | (values > 1)).any():
        return None, f"a {what} lies in [0, 1]"
    return values, None


def _own_call(answer, family: dict, name: str, refused: tuple = _TESTS):
    """``answer(copy of family)``: no kda_lib, no module of ``refused`` (_TAILS: none held)."""
    if holding := (ex.holds_scipy(answer) if refused == _TAILS else None):
        return None, f"{name} uses {holding}: numpy only here, derive the t tail yourself"
    hint = (f"{name} calls {{}}, which does the test: derive it yourself" if refused == _TESTS
            else f"{name} calls {{}}: numpy only here, derive the t tail yourself")
    return ex.call_answer(answer, _rows(family), name=name,
                          refused={p: hint.format(p) for p in refused})


@ex.checker("08.2")
def holm_column(answer, rng, *, family: dict):
    """``answer(family) -> {row: Holm p}``: each row's paired two-sided t-test over 5 seeds ({row:
    (KDA's, other's)}), Holm-adjusted. Numpy only: scipy, jax.scipy, lax.betainc, igamma refused."""
    for fam in [family, *_holm_families(rng)]:
        got, hint = _own_call(answer, fam, "holm_column(family)", _TAILS)
        got, hint = (None, hint) if hint else _column(got, fam, "Holm-adjusted p")
        if hint:
            return hint
        if np.allclose(got, _family_p(fam, "right"), rtol=1e-4, atol=1e-6):
            continue
        for how, text in _HOLM_HINTS.items():
            if np.allclose(got, _family_p(fam, how), rtol=1e-4, atol=1e-6):
                return text
        return ("some rows are off: t = mean(d) / (sd(d) / sqrt(n)), d the per-seed differences "
                "KDA minus other; p its two-sided tail at n - 1 degrees of freedom; then Holm")


def _tie_tolerance(d) -> float:
    """Sums within this of each other tie: 1e-9 of the differences' scale, sum |d|."""
    return 1e-9 * max(float(np.abs(d).sum()), 1e-300)


def _sign_flip(d, strict=False, one_sided=False) -> float:
    """The two-sided sign-flip p of ``d``: the share of the 2^n sign patterns whose |sum| reaches
    the observed (slips: ties left out, one tail)."""
    d = np.asarray(d, np.float64)
    signs = 1 - 2 * ((np.arange(2**d.size)[:, None] >> np.arange(d.size)) & 1)
    sums, observed, tol = signs @ d, d.sum(), _tie_tolerance(d)
    if one_sided:
        return float(np.mean(sums >= observed - tol if observed >= 0 else sums <= observed + tol))
    if strict:
        return float(np.mean(np.abs(sums) > abs(observed) + tol))
    return float(np.mean(np.abs(sums) >= abs(observed) - tol))


def _flip_families(rng) -> list:
    """Families of rows of 3 to 10 seeds, continuous scores or eighths with a zero difference;
    the first also holds a row whose tying sums differ in their last bits, one summing to 0."""
    out = []
    for _ in range(3):
        fam = {}
        for i in range(int(rng.integers(3, 7))):
            n = int(rng.integers(3, 11))
            b = rng.uniform(0, 1, n).round(3)
            d = (np.append(0.0, rng.integers(-2, 6, n - 1) / 8) if i % 2  # a zero, eighths
                 else rng.normal(rng.uniform(0, 0.1), 0.05, n))
            fam[f"row {i}"] = ((b + d).tolist(), b.tolist())
        out.append(fam)
    # sums that tie exactly, apart in the last bits (-0.4 - 0.5 + 0.3 + 0.1 against 0.4 + 0.5 ...)
    out[0]["ties"] = ([-0.4, -0.5, 0.3, 0.1], [0.0] * 4)
    # decimal ties that some pattern misses in floats summed left to right or reversed, by numpy's
    # matmul or sum, math.fsum or exact Fractions of the floats (p 28/32; any of those gives 26)
    out[0]["ties, any sum"] = ([0.7, -0.9, -0.2, 0.1, 0.1], [0.0] * 5)
    # differences that sum to 0 exactly (p = 1: every pattern's |sum| reaches 0); in floats 5.6e-17
    # by np.sum, 2.8e-17 correctly rounded: a tie relative to the observed sum misses patterns
    out[0]["zero sum"] = ([0.1, 0.2, 0.0, 0.0], [0.0, 0.0, 0.3, 0.0])
    return out


_FLIP_HINTS = {
    "strict": "a pattern whose |sum| equals the observed one counts (the observed pattern "
              "itself and its mirror do)",
    "one_sided": "the test is two-sided: a pattern as far out on the other side counts too"}
_TIE_HINT = ("only rows whose sums tie in decimals are off: 0.7 - 0.5 is not 0.8 - 0.6 in floats "
             "nor in exact fractions of them; compare with a tolerance on the scale sum |d|")
_ZERO_SUM_HINT = ("a row's differences sum to 0: every sign pattern's |sum| reaches 0, so its p "
                  "is 1; compare ties on the differences' scale (sum |d|), not relative to the "
                  "observed sum")


@ex.checker("08.3")
def sign_flip_column(answer, rng, *, family: dict):
    """``answer(family) -> {row: p}``: each row's exact two-sided sign-flip p (every sign
    pattern of its paired differences), families of 3 to 10 seeds; scipy.stats refused."""
    for fam in [family, *_flip_families(rng)]:
        got, hint = _own_call(answer, fam, "sign_flip_column(family)")
        got, hint = (None, hint) if hint else _column(got, fam, "sign-flip p")
        if hint:
            return hint
        d = [np.subtract(*map(np.asarray, pair)) for pair in _rows(fam).values()]
        wrong = ~np.isclose(got, [_sign_flip(x) for x in d], rtol=0, atol=1e-9)
        if not wrong.any():
            continue
        zero_sums = np.array([abs(x.sum()) <= _tie_tolerance(x) for x in d])  # p = 1 exactly
        if (zero_sums | ~wrong).all():  # only rows that sum to 0 are off
            return _ZERO_SUM_HINT
        for how, text in _FLIP_HINTS.items():
            if np.allclose(got, [_sign_flip(x, **{how: True}) for x in d], rtol=0, atol=1e-9):
                return text
        if all(_sign_flip(x, strict=True) - 1e-9 <= g < _sign_flip(x)  # wrong rows: some ties
               for x, g, w in zip(d, got, wrong, strict=True) if w):  # missed (no tolerance)
            return _TIE_HINT
        return ("some rows are off: under no difference each seed's difference is as likely "
                "negative as positive; count every pattern of signs, exactly (not a sample)")


def head_filter(p, length: int) -> np.ndarray:
    """beta q^T A^tau k, tau < length, A = (I - beta k k^T) D; p = (decays of D, beta, k, q)."""
    decays, beta, k, q = p[:3], p[3], p[4:7], p[7:]
    a = (np.eye(3) - beta * np.outer(k, k)) @ np.diag(decays)
    out, vec = [], beta * k
    for _ in range(length):
        out.append(q @ vec)
        vec = a @ vec
    return np.asarray(out)


@ex.checker("08.4")
def three_time_scales(answer, rng, *, half_lives, length: int):
    """``answer(half_lives) -> dict(decays, beta, k, q)``: a head filtering by the mean of three
    exponentials of those half-lives; the page's, and three drawn (1-3, 5-20, 30-120 tokens)."""
    drawn = tuple(round(float(rng.uniform(*b)), 2) for b in ((1, 3), (5, 20), (30, 120)))
    for lives in (tuple(half_lives), drawn):
        head, hint = ex.call_answer(answer, lives, name="three_time_scales(half_lives)")
        if hint or (hint := _head_problem(head, lives, length)):
            return f"{hint} (half-lives {lives})"


def _head_problem(answer, half_lives, length: int) -> str | None:
    if not isinstance(answer, dict) or set(answer) != {"decays", "beta", "k", "q"}:
        return "return a dict with the keys decays, beta, k, q"
    for name, shape in (("decays", (3,)), ("k", (3,)), ("q", (3,)), ("beta", ())):
        if hint := ex.refuse_degenerate(answer[name], shape=shape, what=name):
            return hint + (f" ({name} needs 3 entries, one per channel)" if shape else "")
    decays, beta, k, q = (np.asarray(answer[n], float) for n in ("decays", "beta", "k", "q"))
    if not ((decays > 0).all() and (decays <= 1).all() and 0.05 <= beta <= 1):
        return "a decay must lie in (0, 1] and beta in [0.05, 1] (a real delta-rule write)"
    if np.linalg.norm(q) > 100:
        return "keep |q| <= 100: a query that large only hides a tiny beta"
    if not np.isclose(np.linalg.norm(k), 1.0):
        return "the key must have unit norm (the layer L2-normalises it)"
    want = np.mean([(0.5 ** (1 / h)) ** np.arange(length) for h in half_lives], axis=0)
    p, scale = np.concatenate([decays, [beta], k, q]), np.linalg.norm(want)
    # float32's slack: each of the 10 numbers off by 4 float32 eps of itself (2^-21; rounding is
    # 2^-24), each its worst way: sum_i |p_i| ||d filter / d p_i|| 2^-21 (central differences)
    slack = max(1e-6, 2.0**-21 * sum(np.linalg.norm(head_filter(p + s, length) - head_filter(
        p - s, length)) / 2e-6 for s in 1e-6 * np.diag(np.abs(p))) / scale)
    error = np.linalg.norm(head_filter(p, length) - want) / scale
    return None if error <= slack else (
        f"the head's filter is {error:.2g} off (relative L2), more than float32 rounding of its "
        f"parameters explains ({slack:.2g}); are A's eigenvalues the three per-token ratios "
        "2^(-1/h), h the half-lives?")
