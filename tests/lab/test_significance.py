"""Paired comparisons over seeds (kda_lib.lab.significance), against known cases and properties."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kda_lib.lab import significance as sig

# Student's sleep data (Cushny and Peebles, as in "Student" 1908 and R's `sleep`): extra hours
# of sleep of 10 patients under two drugs, paired by patient.
DRUG_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_paired_t_gives_the_textbook_sleep_data_result():
    """R: t.test(extra ~ group, sleep, paired = TRUE): t = -4.0621, df = 9, p = 0.002833,
    95% CI (-2.4598858, -0.7001142), mean difference -1.58."""
    c = sig.compare(DRUG_1, DRUG_2)
    assert (c.n, c.test, c.verdict, c.above, c.below) == (10, "t", "<", 0, 9)  # one tie
    assert (
        c.describe(" h") == "-1.58 [-2.46, -0.7] h (+0/-9 seeds), paired t p = 0.0028 "
        "(Holm 0.0028): <"
    )
    assert c.mean == pytest.approx(-1.58)
    assert c.p == pytest.approx(0.002833, abs=5e-7)
    assert (c.low, c.high) == pytest.approx((-2.4598858, -0.7001142), abs=1e-7)
    # the interval recomputed by hand: mean -+ t_{0.975, 9} sd / sqrt(n)
    d = np.subtract(DRUG_1, DRUG_2)
    half = 2.262157 * d.std(ddof=1) / math.sqrt(10)
    assert (c.low, c.high) == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-6)


def test_wilcoxon_matches_its_exact_null_distribution_enumerated():
    """scipy.stats.wilcoxon's documented example (differences of 15 pairs, p = 0.0413 two-sided)
    recomputed independently: the signed-rank statistic over all 2^15 sign patterns."""
    d = np.array([6, 8, 14, 16, 23, 24, 28, 29, 41, -48, 49, 56, 60, -67, 75], float)
    c = sig.compare(d, np.zeros_like(d), test="wilcoxon")
    ranks = np.argsort(np.argsort(np.abs(d))) + 1  # no ties in |d|
    observed = ranks[d > 0].sum()
    null = np.array(
        [
            sum(r for r, s in zip(ranks, signs, strict=True) if s)
            for signs in itertools.product((0, 1), repeat=d.size)
        ]
    )
    centre = ranks.sum() / 2
    exact = np.mean(np.abs(null - centre) >= abs(observed - centre))
    assert c.p == pytest.approx(exact, rel=1e-12) and c.p == pytest.approx(0.041259765625)
    assert c.note == ""


def test_wilcoxon_says_when_too_few_seeds_can_reach_alpha():
    c = sig.compare([0.9, 0.8, 0.95], [0.1, 0.2, 0.15], test="wilcoxon")
    assert c.p == pytest.approx(0.25) and c.verdict == "level"  # 2 / 2^3: the smallest p
    assert "cannot reach" in c.note


def test_holm_on_the_textbook_four_hypotheses():
    """p = (0.01, 0.04, 0.03, 0.005), alpha 0.05: Holm rejects the first and the fourth only.
    By hand: sorted 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> max 0.06."""
    adjusted = sig.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert (adjusted < 0.05).tolist() == [True, False, False, True]
    assert sig.holm([0.3, 0.5]) == pytest.approx([0.6, 0.6])  # 0.5 x 1 < 0.6: the maximum
    assert sig.holm([0.7, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=30))
def test_holm_properties(p):
    p = np.array(p)
    q = sig.holm(p)
    assert np.all(q >= p - 1e-15) and np.all(q <= 1)
    assert np.all(np.diff(q[np.argsort(p, kind="stable")]) >= 0)  # the order of p is kept
    assert np.all(q <= np.minimum(1, p.size * p) + 1e-15)  # never stricter than Bonferroni
    if p.size == 1:
        assert q[0] == p[0]


def test_power_of_the_paired_t_is_the_textbook_value():
    """One-sample/paired t, n = 10, effect 1 sd, two-sided 0.05: power 0.8031 (G*Power; R
    power.t.test(n = 10, delta = 1, type = "one.sample"))."""
    assert sig.t_power(1.0, 10, 1.0, 0.05) == pytest.approx(0.80310, abs=5e-5)
    gap = sig.detectable_gap(10, 1.0)
    assert 0.99 < gap < 1.0 and sig.t_power(gap, 10, 1.0, 0.05) == pytest.approx(0.8)
    assert sig.detectable_gap(10, 2.5) == pytest.approx(2.5 * gap)  # in units of sd
    assert sig.detectable_gap(3, 1.0, alpha=0.05 / 21) > sig.detectable_gap(3, 1.0)


def test_detectable_gap_is_detected_80_percent_of_the_time_by_simulation():
    """Independent check of the noncentral t: simulate normal differences at the detectable
    gap and count how often the paired t rejects."""
    n, sd, alpha = 5, 0.02, 0.01
    gap = sig.detectable_gap(n, sd, alpha)
    d = np.random.default_rng(0).normal(gap, sd, size=(40_000, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    critical = 4.604095  # t_{0.995, 4}, from a printed table
    assert np.mean(np.abs(t) > critical) == pytest.approx(0.8, abs=0.01)


def test_family_verdicts_follow_the_holm_corrected_p():
    """Three comparisons that each pass alone at 0.05 are level when corrected together, unless
    the corrected p is still below alpha; the intervals and raw p do not change."""
    base = np.array([0.50, 0.61, 0.42, 0.55, 0.47])
    pairs = {
        "strong": (base + [0.30, 0.31, 0.29, 0.30, 0.31], base),
        "weak": (base + [0.02, 0.05, 0.01, 0.04, 0.03], base),
        "none": (base + [0.01, -0.01, 0.0, 0.02, -0.02], base),
    }
    alone = {k: sig.compare(a, b) for k, (a, b) in pairs.items()}
    family = sig.compare_family(pairs)
    assert list(family) == list(pairs)
    assert alone["weak"].verdict == ">" and 0.01 < alone["weak"].p < 0.05
    assert family["strong"].verdict == ">" and family["none"].verdict == "level"
    assert family["weak"].verdict == ("level" if family["weak"].p_adjusted >= 0.05 else ">")
    p = [alone[k].p for k in pairs]
    assert [c.p_adjusted for c in family.values()] == pytest.approx(sig.holm(p).tolist())
    for k, c in family.items():
        assert (c.mean, c.low, c.high, c.p) == (
            alone[k].mean,
            alone[k].low,
            alone[k].high,
            alone[k].p,
        )
        assert c.detectable == pytest.approx(sig.detectable_gap(5, c.sd, 0.05 / 3))
    reversed_pairs = sig.compare_family({k: (b, a) for k, (a, b) in pairs.items()})
    assert reversed_pairs["strong"].verdict == "<"


def test_no_spread_is_the_exact_sign_test_not_p_zero():
    """Issue 52: equal nonzero differences (steps to solve, quantised at 100) made the t-test's
    p 0 ("ordered" at any seed count); the exact sign test gives 2 / 2**n: level at 5 seeds,
    ordered at 6, in a Holm family as any other p. Equal up to the scores' rounding counts as
    equal (0.71 - 0.51 and 0.83 - 0.63 differ in the last bit: the t-test gave p = 4e-64)."""
    assert sig.compare([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]).verdict == "level"
    steps = np.array([900, 400, 700, 500, 600])
    c = sig.compare(steps, steps - 200)
    assert (c.test, c.low, c.high, c.p, c.verdict) == ("sign", 200, 200, 0.0625, "level")
    assert (
        c.note == "no spread (the t-test is undefined): the exact sign test with 5 pairs "
        "cannot reach p < 0.05"
    )
    assert "paired" not in c.describe() and "sign test p = 0.062" in c.describe()
    a = np.array([0.71, 0.83, 0.97, 0.61, 0.53, 0.66])
    b = np.array([0.51, 0.63, 0.77, 0.41, 0.33, 0.46])
    assert np.ptp(a - b) > 0  # not exactly equal in float64
    six = sig.compare(b, a)
    assert (six.test, six.p, six.verdict) == ("sign", 0.03125, "<") and "reach" not in six.note
    assert sig.compare(a[:5], b[:5], test="wilcoxon").p == 0.0625
    noise = sig.compare([0.1 + 0.2, 0.2 + 0.4, 0.7], [0.3, 0.6, 0.7])  # rounding around 0
    assert (noise.test, noise.p, noise.verdict, noise.above, noise.below) == ("t", 1, "level", 0, 0)
    family = sig.compare_family({"steps": (steps, steps - 200), "six": (a, b)})
    assert [c.p_adjusted for c in family.values()] == pytest.approx([0.0625, 0.0625])


# hypothesis draws nearly equal differences on purpose: scipy warns that their moments lose
# precision, and the property must hold for them all the same
@pytest.mark.filterwarnings("ignore:Precision loss occurred in moment calculation:RuntimeWarning")
@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-1, 1), st.floats(-1, 1)), min_size=2, max_size=8),
    st.integers(-1000, 1000),
)
def test_verdict_does_not_depend_on_the_unit(rows, power_of_two):
    """Scaling both sides by a power of two (exact) scales the effect and keeps p and verdict,
    up to float64's limit."""
    a, b = np.array(rows).T
    scale = 2.0**power_of_two
    # exact only where no value overflows or becomes subnormal: each must come back unchanged
    # (e.g. 6e-263 * 2**-204 is subnormal and rounds)
    assume(all(np.array_equal(x * scale / scale, x) for x in (a, b)))
    base, scaled = sig.compare(a, b), sig.compare(a * scale, b * scale)
    assume(min(base.sd, scaled.sd) >= 1e-300)
    assert scaled.verdict == base.verdict
    assert scaled.p == pytest.approx(base.p, rel=1e-9, abs=1e-300)
    assert scaled.mean == pytest.approx(base.mean * scale, rel=1e-9, abs=1e-300)


def test_scores_near_the_float64_limit_do_not_overflow():
    top = np.finfo(np.float64).max  # 1.797e308
    a = np.array([top, 0.99 * top, 0.98 * top, 0.97 * top])
    b = np.array([0.5 * top, 0.6 * top, 0.4 * top, 0.45 * top])
    c = sig.compare(a, b)
    assert all(math.isfinite(x) for x in (c.mean, c.low, c.high, c.sd, c.p, c.detectable))
    assert c.verdict == ">" and c.mean == pytest.approx(np.mean(a / 4 - b / 4) * 4)
    with pytest.raises(ValueError, match="exceed float64's range"):
        sig.compare([top, top], [-top, -0.5 * top])


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        ([0.5, float("nan")], [0.1, 0.2], "a must be finite"),
        ([0.5, 0.6], [0.1, float("inf")], "b must be finite"),
        ("0.5", [0.1, 0.2], "a must be a 1-D sequence"),
        (["0.5", "0.6"], [0.1, 0.2], "a must hold real numbers"),
        ([True, False], [0.1, 0.2], "a must hold real numbers"),
        (np.array([True, False]), [0.1, 0.2], "a must hold real numbers"),
        ([0.5], [0.1], "a must hold at least two"),
        ([[0.5, 0.5]], [0.1, 0.2], "a must be 1-D"),
        ([0.5, 0.6, 0.7], [0.1, 0.2], "one score per seed"),
        (None, [0.1, 0.2], "a must be a 1-D sequence"),
    ],
)
def test_bad_scores_are_refused(a, b, match):
    with pytest.raises(ValueError, match=match):
        sig.compare(a, b)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: sig.compare([1, 2], [0, 1], test="welch"), "test must be one of"),
        (lambda: sig.compare([1, 2], [0, 1], alpha=0), "alpha must be"),
        (lambda: sig.compare([1, 2], [0, 1], alpha=True), "alpha must be"),
        (lambda: sig.compare([1, 2], [0, 1], family_size=0), "family_size must be"),
        (lambda: sig.compare_family({}), "pairs must be a non-empty mapping"),
        (lambda: sig.compare_family({"x": [1, 2]}), r"pairs\['x'\] must be a tuple"),
        (lambda: sig.compare_family({"x": ([1, 2], [1, 2, 3])}), r"pairs\['x'\]: a and b"),
        (lambda: sig.holm([0.1, 1.5]), "p_values must be"),
        (lambda: sig.holm([]), "p_values must be"),
        (lambda: sig.detectable_gap(1, 0.1), "n must be an int >= 2"),
        (lambda: sig.detectable_gap(3, float("nan")), "sd must be"),
        (lambda: sig.detectable_gap(3, 0.1, power=0.01), "power must exceed alpha"),
    ],
)
def test_bad_arguments_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_check_paired_accepts_the_same_seeds_and_refuses_others_in_any_way():
    sig.check_paired({"kda": [3, 1, 2], "gdn": [3, 1, 2], "conv": (3, 1, 2)})
    for other in ([1, 2, 3], [3, 1], [3, 1, 2, 4], [3, 1, 5]):  # reordered, short, long, other
        with pytest.raises(ValueError, match=r"not paired: \{'kda': \[3, 1, 2\], 'gdn'"):
            sig.check_paired({"kda": [3, 1, 2], "gdn": other})
    with pytest.raises(ValueError, match="seeds must be a non-empty mapping"):
        sig.check_paired({})


def test_sign_flip_p_is_exact_over_all_sign_patterns():
    # five differences all positive: only the all-plus and all-minus patterns are as extreme
    assert sig.sign_flip_p([1.3, 2.0, 1.1, 1.7, 1.2], [1.0, 1.0, 1.0, 1.0, 1.0]) == 2 / 2**5
    # one difference of the opposite sign: 4 patterns of 32 are at least as extreme each way
    a, b = np.array([3.0, 3.0, 3.0, 3.0, 0.5]), np.zeros(5)
    d = a - b
    signs = np.array(np.meshgrid(*[[-1, 1]] * 5)).reshape(5, -1).T
    want = np.mean(np.abs((signs * d).mean(1)) >= abs(d.mean()) - 1e-12)
    assert sig.sign_flip_p(a, b) == pytest.approx(want)
    with pytest.raises(ValueError, match="one score per seed"):
        sig.sign_flip_p([1.0, 2.0], [1.0, 2.0, 3.0])


def test_sign_flip_p_rows_equals_sign_flip_p_row_by_row():
    """The vectorised exact p (the power's) equals scipy's permutation test, ties and zeros
    included."""
    from kda_lib.lab.significance import sign_flip_p, sign_flip_p_rows

    rng = np.random.default_rng(1)
    d = rng.normal(0.5, 1, size=(60, 9))
    d[0], d[1], d[2, :4] = 0.0, np.round(d[1], 1), 0.0
    want = [sign_flip_p(row, np.zeros(9)) for row in d]
    np.testing.assert_allclose(sign_flip_p_rows(d), want, rtol=0, atol=1e-15)


def test_sign_flip_power_has_the_closed_form_where_only_all_signs_pass():
    """Issue 73: at 9 seeds and Holm's first step over 9 rows (0.05 / 9 < 4 / 2^9) only the
    all-positive pattern passes, so the power is Phi(d)^9 and 80% needs d = 1.97 standard
    deviations of the differences; 5 seeds can pass no step of 9 rows (2 / 2^5 > 0.05 / 9)."""
    from scipy import stats

    from kda_lib.lab.significance import sign_flip_detectable, sign_flip_power

    for effect in (0.5, 1.5, 2.5):
        want = stats.norm.cdf(effect) ** 9
        assert abs(sign_flip_power(effect, 9, 0.05 / 9) - want) < 4 * np.sqrt(want / 20000) + 1e-3
    closed = stats.norm.ppf(0.8 ** (1 / 9))
    assert abs(sign_flip_detectable(9, 0.05 / 9) - closed) < 0.02
    assert sign_flip_detectable(5, 0.05 / 9) == float("inf")
    assert sign_flip_detectable(9, 0.05) < closed  # later steps of Holm pass more patterns
