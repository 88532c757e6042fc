"""Paired comparisons over seeds, from scipy.stats: the one statistics module of notebooks 08, 09.

Two models trained with the same seeds (the same initialisation seed and the same batches for
every mixer) give per-seed scores ``a[i]`` and ``b[i]`` that are *paired*: the comparison is
made on the differences ``d[i] = a[i] - b[i]``.

* :func:`compare` -- one pair of score lists: the test, the mean paired difference with its
  95% confidence interval, the p-value, and the smallest gap the design can detect.
* :func:`compare_family` -- every comparison a notebook makes, with Holm's correction over them
  and one verdict word per comparison.
* :func:`check_paired` -- refuses score lists whose seeds differ (they would not be paired).
* :func:`holm` -- Holm's step-down adjusted p-values (scipy has Bonferroni-free FDR control,
  :func:`scipy.stats.false_discovery_control`, but no Holm: it is written here, a few lines).
* :func:`detectable_gap` -- the smallest mean paired difference a two-sided paired t-test
  detects with the stated power (noncentral t, :data:`scipy.stats.nct`).
* :func:`sign_flip_power`, :func:`sign_flip_detectable` -- the same for the exact sign-flip
  (paired permutation) test of :func:`sign_flip_p`, whose p-values are exact and whose power at
  normal differences is drawn (Monte Carlo, a fixed seed: the same answer every call).

**The test.** The caller chooses it before looking at the scores (choosing it from a normality
pretest of the same scores changes the test's error rate, and a pretest has no power at 3-5
seeds): ``"t"`` (default), the paired t-test, :func:`scipy.stats.ttest_1samp` on the
differences (the same as :func:`scipy.stats.ttest_rel`), with its exact ``n - 1`` degrees of
freedom; ``"wilcoxon"``, the signed-rank test, :func:`scipy.stats.wilcoxon` (exact null
distribution for small ``n``), for differences whose normality is doubtful by construction
(scores piled at a ceiling, counts in coarse units). The signed-rank test cannot give a
two-sided p-value below ``2 / 2**n`` (0.25 at 3 seeds, 0.0625 at 5): with fewer than 6 seeds it
can never reach 0.05, and :func:`compare` says so in ``Comparison.note``.

**Differences with no spread.** Where every seed gives the same difference (up to the rounding
of the scores, e.g. step counts quantised at the evaluation interval), the t statistic is
infinite and the t-test undefined: :func:`compare` then uses the exact sign test
(:func:`scipy.stats.binomtest`; every difference has the same sign, so ``p = 2 / 2**n``, 0.0625
at 5 seeds, the same as the signed-rank test and the exact paired permutation test there),
reports ``test="sign"`` and says so in ``Comparison.note``; equal scores give ``p = 1``.

**What it guarantees.**

* p-values are scipy's; the interval is the paired t interval
  (``ttest_1samp(...).confidence_interval``), per comparison (not adjusted for the family).
* Holm's procedure controls the family-wise error rate at ``alpha`` over the family, for any
  dependence between the comparisons. A comparison is *ordered* (``">"`` or ``"<"``, the sign
  of the mean difference ``a - b``) only when its Holm-adjusted p-value is below ``alpha``;
  otherwise it is *level*, which means "not shown to differ", not "shown equal": read the
  interval.
* The power statement (``Comparison.detectable``) is the smallest ``|mean(d)|`` that a paired t
  at level ``alpha / m`` (the strictest step of Holm over ``m`` comparisons) detects with 80%
  probability if the differences were normal with the observed standard deviation. It is about
  the design, not the data's gap: a level verdict with a detectable gap larger than the
  interval's half-width says the seeds were too few to see a gap of that size.
* Inputs: 1-D sequences of real numbers (ints or floats; bools and strings refused), equal
  lengths (one score per seed for each side), at least 2 seeds, all finite. NaN is refused, not
  dropped: a NaN score is a failed run, and dropping it would unpair the seeds; the caller
  decides what a failed run scores. Scores up to float64's limit (1.7e308) are accepted: the
  statistics run on the differences divided by a power of two (exact), so nothing overflows in
  between; differences ``a - b`` that are themselves beyond float64's range are refused, and an
  interval bound or detectable gap beyond that range is reported as infinity.
* Bad arguments raise ``ValueError`` naming them before any computation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import optimize, stats

from kda_lib.checks import is_number

ALPHA = 0.05  # family-wise error rate of compare_family
CONFIDENCE = 0.95  # level of the intervals
POWER = 0.8  # of the power statement
TESTS = ("t", "wilcoxon")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One paired comparison of ``a`` against ``b`` (differences ``a - b``).

    Attributes:
      n: seeds (pairs).
      test: ``"t"`` or ``"wilcoxon"`` (the caller's choice), ``"sign"`` where the differences
        have no spread (see the module docstring).
      mean: mean paired difference ``mean(a - b)`` (the effect size, in score units).
      low, high: its 95% confidence interval (paired t).
      sd: sample standard deviation of the differences (``ddof=1``).
      p: two-sided p-value of the test, uncorrected.
      p_adjusted: Holm-adjusted p-value over the family (``p`` for a family of one).
      alpha: the family-wise level.
      verdict: ``">"``, ``"<"`` (ordered: ``p_adjusted < alpha``) or ``"level"``.
      detectable: the smallest ``|mean|`` detectable at 80% power (see the module docstring).
      above, below: the seeds with ``a > b`` and with ``a < b`` beyond the scores' rounding (the
        direction, level or not).
      note: why the test could not reach ``alpha`` whatever the scores (or "").
    """

    n: int
    test: str
    mean: float
    low: float
    high: float
    sd: float
    p: float
    p_adjusted: float
    alpha: float
    verdict: str
    detectable: float
    above: int = 0
    below: int = 0
    note: str = ""

    def describe(self, unit: str = "") -> str:
        """``"+0.012 [-0.004, +0.028]<unit> (+4/-1 seeds), paired t p = 0.09 (Holm 0.61): level"``:
        the mean with its interval, the seeds with ``a > b`` and ``a < b``, the test."""
        name = {"t": "paired t", "wilcoxon": "Wilcoxon", "sign": "sign test"}[self.test]
        return (
            f"{self.mean:+.3g} [{self.low:+.3g}, {self.high:+.3g}]{unit} (+{self.above}/-"
            f"{self.below} seeds), {name} p = {self.p:.2g} (Holm {self.p_adjusted:.2g}): "
            f"{self.verdict}"
        )


# ----------------------------------------------------------------------------- checks


def _scores(name: str, values) -> np.ndarray:
    """``values`` as a 1-D float64 array of finite real numbers, or ValueError naming ``name``."""
    if isinstance(values, (str, bytes)) or not (
        isinstance(values, Sequence) or hasattr(values, "__array__")
    ):
        raise ValueError(f"{name} must be a 1-D sequence of per-seed scores; got {values!r}")
    array = np.asarray(values) if hasattr(values, "__array__") else np.asarray(values, object)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one score per seed); got shape {array.shape}")
    if array.dtype.kind not in "iuf" and not all(is_number(v) for v in array.tolist()):
        bad = [v for v in array.tolist() if not is_number(v)][:3]
        raise ValueError(f"{name} must hold real numbers (no bools, strings); got {bad!r}")
    array = array.astype(np.float64)
    if array.size < 2:
        raise ValueError(f"{name} must hold at least two per-seed scores; got {array.size}")
    if not np.all(np.isfinite(array)):
        raise ValueError(
            f"{name} must be finite (a NaN is a failed run: score it explicitly); "
            f"got {array.tolist()}"
        )
    return array


def _level(name: str, value, low: float = 0.0, high: float = 1.0) -> float:
    if not (is_number(value) and low < value < high):
        raise ValueError(f"{name} must be a number in ({low:g}, {high:g}); got {value!r}")
    return float(value)


def _family_size(m) -> int:
    if not (isinstance(m, (int, np.integer)) and not isinstance(m, (bool, np.bool_)) and m >= 1):
        raise ValueError(f"family_size must be an int >= 1; got {m!r}")
    return int(m)


def _differences(a, b) -> tuple[np.ndarray, int, float]:
    """``(d / 2**exponent, exponent, rounding / 2**exponent)``: the paired differences divided by
    the power of two that brings them below 1 in magnitude (exact, so no statistic overflows),
    and the scores' rounding: a spread of a few units in their last place, which ``0.7 - 0.5``
    and ``0.8 - 0.6`` have and no test should read."""
    a, b = _scores("a", a), _scores("b", b)
    if a.size != b.size:
        raise ValueError(
            f"a and b must hold one score per seed each (paired); got {a.size} and {b.size} scores"
        )
    with np.errstate(over="ignore"):
        d = a - b
    if not np.all(np.isfinite(d)):
        raise ValueError("the differences a - b exceed float64's range; rescale the scores")
    exponent = math.frexp(float(np.max(np.abs(d))))[1]  # |d| < 2**exponent
    rounding = 4 * np.finfo(np.float64).eps * max(np.max(np.abs(a)), np.max(np.abs(b)))
    return np.ldexp(d, -exponent), exponent, float(np.ldexp(rounding, -exponent))


def _unscale(value: float, exponent: int) -> float:
    """``value * 2**exponent``, infinity beyond float64's range."""
    with np.errstate(over="ignore"):
        return float(np.ldexp(np.float64(value), exponent))


# ----------------------------------------------------------------------------- the statistics


def holm(p_values, alpha: float = ALPHA) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the input's order.

    Sorted ascending, the i-th smallest (1-based) of ``m`` is multiplied by ``m - i + 1``; each
    adjusted value is the running maximum of those products, capped at 1. Rejecting where the
    adjusted value is below ``alpha`` is Holm's procedure (S. Holm, 1979), which controls the
    family-wise error rate at ``alpha``. ``alpha`` is only checked (the values do not depend on
    it); it is here so a caller states the level once.
    """
    _level("alpha", alpha)
    p = np.asarray(p_values, dtype=object)
    if p.ndim != 1 or p.size == 0 or not all(is_number(v) and 0 <= v <= 1 for v in p.tolist()):
        raise ValueError(
            f"p_values must be a non-empty 1-D sequence of numbers in [0, 1]; got {p_values!r}"
        )
    p = p.astype(np.float64)
    order = np.argsort(p, kind="stable")
    m = p.size
    stepped = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    adjusted = np.empty(m)
    adjusted[order] = stepped
    return adjusted


def t_power(gap: float, n: int, sd: float, alpha: float) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` with ``n`` pairs whose
    differences are normal with mean ``gap`` and standard deviation ``sd`` (noncentral t)."""
    df = n - 1
    critical = stats.t.ppf(1 - alpha / 2, df)
    noncentrality = gap * math.sqrt(n) / sd
    # P(T > c) + P(T < -c); the lower tail as the upper tail at -noncentrality (by symmetry),
    # since scipy's nct.cdf far in the tail can return NaN
    upper = stats.nct.sf(critical, df, noncentrality)
    lower = stats.nct.sf(critical, df, -noncentrality)
    return float(upper + lower)


def detectable_gap(n: int, sd: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest ``|mean paired difference|`` a two-sided paired t at level ``alpha`` with
    ``n`` pairs detects with probability ``power``, for normal differences of standard deviation
    ``sd`` (0 when ``sd`` is 0). Solved with :func:`scipy.optimize.brentq` on :func:`t_power`."""
    if not (isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_)) and n >= 2):
        raise ValueError(f"n must be an int >= 2 (pairs); got {n!r}")
    if not (is_number(sd) and math.isfinite(sd) and sd >= 0):
        raise ValueError(f"sd must be a finite number >= 0; got {sd!r}")
    alpha, power = _level("alpha", alpha), _level("power", power)
    if power <= alpha:
        raise ValueError(f"power must exceed alpha; got power {power}, alpha {alpha}")
    if sd == 0:
        return 0.0
    high = 1.0  # in units of sd: grow until the power is reached
    while t_power(high, int(n), 1.0, alpha) < power:
        high *= 2.0
    effect = optimize.brentq(
        lambda x: t_power(x, int(n), 1.0, alpha) - power, 0.0, high, xtol=1e-12, rtol=1e-12
    )
    with np.errstate(over="ignore"):
        return float(np.float64(effect) * sd)


def _sign_patterns(n: int) -> np.ndarray:
    """All ``2^n`` sign vectors ``[2^n, n]`` of +-1."""
    bits = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
    return 1.0 - 2.0 * bits


def sign_flip_power(
    effect: float, n: int, alpha: float, *, draws: int = 20000, seed: int = 0
) -> float:
    """Probability that the exact two-sided sign-flip test (:func:`sign_flip_p`) at level
    ``alpha`` finds ``a > b`` (p <= ``alpha`` and a positive mean difference) from ``n`` paired
    differences drawn normal with mean ``effect`` and standard deviation 1 (``effect`` is in
    units of the differences' standard deviation). Exact p-values (all ``2^n`` sign patterns,
    ``n`` <= 16) of ``draws`` samples from ``numpy.random.default_rng(seed)``.

    Where ``alpha < 4 / 2^n`` only the all-positive pattern passes, and the power is
    ``Phi(effect) ** n`` (the test checks it).
    """
    if not (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 2 <= n <= 16):
        raise ValueError(f"n must be an int in [2, 16] (pairs); got {n!r}")
    if not (is_number(effect) and math.isfinite(effect)):
        raise ValueError(f"effect must be a finite number; got {effect!r}")
    alpha = _level("alpha", alpha)
    differences = effect + np.random.default_rng(seed).standard_normal((draws, int(n)))
    p = sign_flip_p_rows(differences)
    return float(np.mean((p <= alpha) & (differences.mean(axis=1) > 0)))


def sign_flip_p_rows(differences) -> np.ndarray:
    """:func:`sign_flip_p` of each row of ``differences [rows, n]`` (paired differences
    ``a - b``, ``n`` <= 16), vectorised: the share of the ``2^n`` sign patterns whose mean is at
    least as far out, in the observed direction, doubled and capped at 1."""
    differences = np.asarray(differences, np.float64)
    n = differences.shape[1]
    observed = differences.mean(axis=1)
    null = differences @ _sign_patterns(n).T / n  # [rows, 2^n]: every sign pattern's mean
    tolerance = 1e-12 * np.maximum(np.abs(observed), 1.0)
    greater = (null >= (observed - tolerance)[:, None]).mean(axis=1)
    less = (null <= (observed + tolerance)[:, None]).mean(axis=1)
    return np.minimum(1.0, 2.0 * np.minimum(greater, less))


def sign_flip_detectable(n: int, alpha: float, power: float = POWER, **draws) -> float:
    """The smallest ``effect`` (mean paired difference over its standard deviation) at which
    :func:`sign_flip_power` reaches ``power`` (bisection to 0.001, the same draws at every
    ``effect``); ``draws``: ``draws`` and ``seed`` as :func:`sign_flip_power` takes them.
    Infinity when even an effect of 50 does not reach it (``alpha`` below ``2 / 2^n``: no
    pattern of ``n`` signs can pass)."""
    power = _level("power", power)
    if sign_flip_power(50.0, n, alpha, **draws) < power:
        return math.inf
    low, high = 0.0, 50.0
    while high - low > 1e-3:
        middle = (low + high) / 2
        low, high = (low, middle) if sign_flip_power(middle, n, alpha, **draws) >= power else (
            middle, high)  # fmt: skip
    return high


def compare(a, b, *, test: str = "t", alpha: float = ALPHA, family_size: int = 1) -> Comparison:
    """Paired comparison of per-seed scores ``a`` and ``b`` (``a[i]``, ``b[i]``: seed ``i``).

    ``family_size`` is the number of comparisons the caller makes (for the power statement's
    level ``alpha / family_size``); ``p_adjusted`` here is ``p`` (one comparison): use
    :func:`compare_family` for Holm's correction. Whether higher is better (accuracy) or lower
    (bits per byte) is the caller's to say: the verdict is the sign of ``mean(a - b)``.
    """
    if test not in TESTS:
        raise ValueError(f"test must be one of {TESTS}; got {test!r}")
    alpha, family_size = _level("alpha", alpha), _family_size(family_size)
    d, exponent, rounding = _differences(a, b)
    n = d.size
    sd = float(d.std(ddof=1))
    mean = float(d.mean())
    if np.ptp(d) <= rounding:  # every seed gives the same difference: a one-point interval
        low = high = mean
        p = 1.0  # equal scores; else every difference has the sign of the mean: the sign test
        if np.max(np.abs(d)) > rounding:
            test, p = "sign", float(stats.binomtest(n, n).pvalue)
    else:
        result = stats.ttest_1samp(d, 0.0)
        interval = result.confidence_interval(CONFIDENCE)
        low, high, p = float(interval.low), float(interval.high), float(result.pvalue)
        if test == "wilcoxon":
            p = float(stats.wilcoxon(d).pvalue)
    note = "no spread (the t-test is undefined): the exact sign test" if test == "sign" else ""
    if test != "t" and 2.0 / 2**n >= alpha / family_size:  # the smallest p of either test
        note = f"{note or 'Wilcoxon'} with {n} pairs cannot reach p < {alpha / family_size:.2g}"
    verdict = "level" if p >= alpha else ">" if mean > 0 else "<"
    return Comparison(
        n=n,
        test=test,
        mean=_unscale(mean, exponent),
        low=_unscale(low, exponent),
        high=_unscale(high, exponent),
        sd=_unscale(sd, exponent),
        p=p,
        p_adjusted=p,
        alpha=alpha,
        verdict=verdict,
        detectable=_unscale(detectable_gap(n, sd, alpha / family_size), exponent),
        above=int(np.sum(d > rounding)),
        below=int(np.sum(d < -rounding)),
        note=note,
    )


def sign_flip_p(a, b) -> float:
    """The exact two-sided sign-flip p of the paired differences ``a - b`` (all ``2^n`` sign
    patterns; no normality assumed): never below ``2 / 2^n``."""
    d = _differences(a, b)[0]
    return float(stats.permutation_test((d,), np.mean, permutation_type="samples",
                                        n_resamples=np.inf).pvalue)  # fmt: skip


def check_paired(seeds: Mapping) -> None:
    """Raise ValueError unless every entry of ``seeds`` (``{name: [seed, ...]}``, one list per
    model or mixer, in the order of its scores) lists the same seeds in the same order: scores of
    different seeds, or of the same seeds in another order, are not paired."""
    if not isinstance(seeds, Mapping) or not seeds:
        raise ValueError(f"seeds must be a non-empty mapping {{name: [seed, ...]}}; got {seeds!r}")
    if len({tuple(s) for s in seeds.values()}) > 1:
        raise ValueError(f"the seeds differ, so the scores are not paired: {dict(seeds)}")


def compare_family(pairs: Mapping, *, test: str = "t", alpha: float = ALPHA) -> dict:
    """Every comparison of a family, Holm-corrected together.

    Args:
      pairs: ``{label: (a, b)}``, each a pair of per-seed score lists (see :func:`compare`).
      test: ``"t"`` or ``"wilcoxon"``, for every comparison (see the module docstring).
      alpha: the family-wise error rate.

    Returns:
      ``{label: Comparison}`` in ``pairs``' order, ``p_adjusted`` and ``verdict`` from Holm's
      procedure over the family, ``detectable`` at level ``alpha / len(pairs)``.
    """
    if not isinstance(pairs, Mapping) or not pairs:
        raise ValueError(f"pairs must be a non-empty mapping {{label: (a, b)}}; got {pairs!r}")
    for label, pair in pairs.items():
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(
                f"pairs[{label!r}] must be a tuple (a, b) of score lists; got {pair!r}"
            )
    single = {}
    for label, (a, b) in pairs.items():
        try:
            single[label] = compare(a, b, test=test, alpha=alpha, family_size=len(pairs))
        except ValueError as error:
            raise ValueError(f"pairs[{label!r}]: {error}") from None
    adjusted = holm([c.p for c in single.values()], alpha)
    return {
        label: dataclasses.replace(
            c, p_adjusted=float(q), verdict="level" if q >= alpha else ">" if c.mean > 0 else "<"
        )
        for (label, c), q in zip(single.items(), adjusted, strict=True)
    }
