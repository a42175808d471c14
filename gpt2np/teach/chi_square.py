"""Pearson's chi-square goodness-of-fit test, from scratch: the classroom needs no scipy at runtime.

Question: do n observed outcomes look like n independent draws from a KNOWN distribution P?
Pearson (1900): put the outcomes into bins, compare each bin's observed count O with its
expected count E = n P(bin), and add up

    X^2 = sum over bins of (O - E)^2 / E.

If the draws really come from P, X^2 approximately follows a chi-square distribution with
df = (number of bins - 1) degrees of freedom (the counts must add up to n, hence the -1). The
p-value is the chance of an X^2 at least this large when P is right: P(chi2_df >= X^2).
A small p-value (say below alpha = 0.001) means "these samples did not come from P"; a correct
sampler still gets one in about one run out of 1000, by bad luck: that is the false-alarm rate.
"About", because chi2_df is an approximation, and it is at its weakest far in the tail, where a
test at 0.001 looks: a bin expected 5-10 times has a heavier upper tail than the chi-square.

The approximation needs every expected count to be reasonably large. Our rule, fixed BEFORE
looking at the observed counts (pooling by what was observed would bias the test):
  * a bin with expected count >= MIN_EXPECTED = 20 stands alone. The textbook's 5 is fine at
    alpha = 0.05, but at 0.001 it rejected correct samplers 1.15 to 1.6 times per 1000 runs on
    the classroom's settings; with 20, 1.0 to 1.15 (at 0.05 and 0.01: 4.9-5.05% and 0.96-1.05%;
    simulated, a million runs each, 0.03 per 1000 of noise). Exactly, by enumerating every count
    vector of small multinomials: 0.7 to 1.15 per 1000 (tests/teach/test_distribution_statistical.py);
    the worst we found is 1.3 per 1000: 3 bins, two of them expected only 28 and 34 times (the
    classroom with --n_vocab 8 --n_tokens 4, n = 2000);
  * every bin with 0 < expected count < MIN_EXPECTED goes into one pooled bin, "other";
  * if "other" is itself still below MIN_EXPECTED, it is merged into the standalone bin with the
    smallest expected count (so no bin of the test is below MIN_EXPECTED, if n allows it);
  * if everything ends up in ONE bin, there is no test: its count is always n, p_value is None;
  * an outcome with probability exactly 0 that is observed even once is impossible under P:
    X^2 = inf and the p-value is 0, whatever the other counts say.

The p-value P(chi2_df >= x) is Q(df/2, x/2), where Q is the regularized upper incomplete gamma
function; we compute it as in Press et al., Numerical Recipes (3rd ed., section 6.2): a power
series when x < a + 1, Lentz's continued fraction otherwise. The checks against scipy.stats
(a development dependency only) are in tests/teach/test_distribution_statistical.py.

>>> result = chi_square_test({"heads": 60, "tails": 40}, {"heads": 0.5, "tails": 0.5})
>>> round(result.statistic, 3), result.df, round(result.p_value, 4)
(4.0, 1, 0.0455)
>>> chi_square_test({"heads": 6, "tails": 4}, {"heads": 0.5, "tails": 0.5}).p_value is None  # 10 draws: no test
True
"""
import math
from dataclasses import dataclass

MIN_EXPECTED = 20.0  # expected count a bin needs to stand alone (module docstring: the false-alarm rate)
EPSILON = 1e-15      # stop when a step changes the result by less than this (float64: 2.2e-16 per ulp)
MAX_ITERATIONS = 100_000  # both expansions need about sqrt(a) terms near x = a; far fewer elsewhere
TINY = 1e-300        # Lentz's guard against dividing by an exact zero


def log_gamma_prefactor(a, x):
    """log(x^a e^(-x) / Gamma(a)): the factor in front of both expansions, in logs to avoid overflow."""
    return a * math.log(x) - x - math.lgamma(a)


def regularized_gamma_p_series(a, x):
    """P(a, x) = x^a e^(-x) / Gamma(a) * sum_{n>=0} x^n / (a (a+1) ... (a+n)); good for x < a + 1.

    Every term is positive and, once n > x - a, each is smaller than the one before by x/(a+n) < 1,
    so the sum converges and stopping at a relatively negligible term is safe.
    """
    term = total = 1.0 / a  # n = 0
    denominator = a
    for _ in range(MAX_ITERATIONS):
        denominator += 1.0
        term *= x / denominator  # x^n / (a (a+1) ... (a+n))
        total += term
        if term < total * EPSILON:
            return total * math.exp(log_gamma_prefactor(a, x))
    raise ArithmeticError(f"series for P({a}, {x}) did not converge")  # never seen: a bug if raised


def regularized_gamma_q_continued_fraction(a, x):
    """Q(a, x) = x^a e^(-x) / Gamma(a) * 1/(x+1-a - 1(1-a)/(x+3-a - 2(2-a)/(x+5-a - ...)));
    good for x >= a + 1, where it converges fast and keeps full RELATIVE accuracy even when Q is
    1e-200 (computing 1 - P there would give 0).

    Evaluated with the modified Lentz method: the fraction b_0 + a_1/(b_1 + a_2/(b_2 + ...)) is
    built front to back as a product of ratios C_i / D_i, with zeros replaced by TINY.
    """
    b = x + 1.0 - a  # b_1; the n-th partial numerator is -n (n - a), b grows by 2 each step
    c = 1.0 / TINY
    d = 1.0 / b
    fraction = d
    for n in range(1, MAX_ITERATIONS):
        numerator = -n * (n - a)
        b += 2.0
        d = numerator * d + b
        d = 1.0 / (d if abs(d) > TINY else TINY)
        c = b + numerator / c
        c = c if abs(c) > TINY else TINY
        fraction *= d * c
        if abs(d * c - 1.0) < EPSILON:
            return fraction * math.exp(log_gamma_prefactor(a, x))
    raise ArithmeticError(f"continued fraction for Q({a}, {x}) did not converge")


def regularized_gamma_q(a, x):
    """Q(a, x) = Gamma(a, x) / Gamma(a), the regularized upper incomplete gamma function (a > 0, x >= 0).

    >>> round(regularized_gamma_q(1.0, 2.0), 6)  # Q(1, x) = e^(-x)
    0.135335
    """
    if not (a > 0 and x >= 0):
        raise ValueError(f"regularized_gamma_q needs a > 0 and x >= 0, got a={a}, x={x}")
    if x == 0:
        return 1.0
    if math.isinf(x):
        return 0.0
    if x < a + 1.0:
        return 1.0 - regularized_gamma_p_series(a, x)  # here Q is not tiny: 1 - P loses nothing
    return regularized_gamma_q_continued_fraction(a, x)


def chi_square_sf(statistic, df):
    """P(chi2_df >= statistic): the p-value of a chi-square statistic with df degrees of freedom.

    >>> round(chi_square_sf(3.841459, df=1), 6)  # the textbook 5% critical value
    0.05
    """
    if df < 1:
        raise ValueError(f"a chi-square distribution needs df >= 1, got {df}")
    return regularized_gamma_q(df / 2.0, max(statistic, 0.0) / 2.0)


def critical_value(alpha, df):
    """The X^2 at which the test starts rejecting: chi_square_sf(x, df) = alpha, solved by bisection
    (the tail probability falls as x grows, so halving the bracket 100 times pins x to ~1e-12).

    >>> round(critical_value(0.05, df=1), 4), round(critical_value(0.001, df=8), 2)
    (3.8415, 26.12)
    """
    low, high = 0.0, df + 10.0
    while chi_square_sf(high, df) > alpha:
        low, high = high, 2.0 * high
    for _ in range(100):
        middle = (low + high) / 2.0
        low, high = (middle, high) if chi_square_sf(middle, df) > alpha else (low, middle)
    return high


def pool_small_bins(expected_counts, min_expected=MIN_EXPECTED):
    """Group bin indices so that small expected counts are pooled (the rule in the module docstring).

    Bins with expected count 0 are left out: they are handled as "impossible" by chi_square_test.
    Returns a list of groups (lists of indices), standalone bins first in their original order.

    >>> pool_small_bins([40.0, 12.0, 4.0, 24.0, 0.0])  # 12 + 4 = 16 < 20: "other" joins the 24
    [[0], [3, 1, 2]]
    """
    standalone = [[i] for i, e in enumerate(expected_counts) if e >= min_expected]
    small = [i for i, e in enumerate(expected_counts) if 0 < e < min_expected]
    if not small:
        return standalone
    if sum(expected_counts[i] for i in small) >= min_expected or not standalone:
        return standalone + [small]
    smallest = min(range(len(standalone)), key=lambda g: expected_counts[standalone[g][0]])
    standalone[smallest] = standalone[smallest] + small
    return standalone


@dataclass(frozen=True)
class ChiSquareResult:
    statistic: float   # X^2 = sum (O - E)^2 / E over the pooled bins; inf if an impossible outcome occurred
    df: int            # pooled bins - 1 (0 if everything fell into one bin: then there is no test)
    p_value: float | None  # P(chi2_df >= X^2): small means "not drawn from P"; None: no test possible
    n_samples: int     # n: total observed count
    bins: list         # one (outcomes, observed, expected count) per pooled bin
    impossible: int    # observations of outcomes whose expected probability is exactly 0

    @property
    def tested(self):
        """False when every outcome fell into one bin and none was impossible: nothing was tested."""
        return self.p_value is not None


def chi_square_test(observed, expected_probs, min_expected=MIN_EXPECTED):
    """Pearson's goodness-of-fit test of observed counts {outcome: count} against {outcome: probability}.

    Outcomes missing from expected_probs have probability 0. The probabilities must sum to 1
    (within 1e-6; they are renormalised to remove rounding). p_value is None when the pooled
    bins leave nothing to test (df = 0): not 1, which would read as "a perfect fit".

    >>> chi_square_test({"a": 9, "b": 1}, {"a": 1.0}).p_value  # "b" is impossible: rejected outright
    0.0
    """
    total_probability = sum(expected_probs.values())
    if abs(total_probability - 1.0) > 1e-6 or min(expected_probs.values()) < 0:
        raise ValueError(f"expected probabilities must be >= 0 and sum to 1, got sum {total_probability}")
    n = sum(observed.values())
    if n < 1:
        raise ValueError("chi_square_test needs at least one observation")
    possible = [x for x, prob in expected_probs.items() if prob > 0]
    impossible = sum(count for x, count in observed.items() if expected_probs.get(x, 0.0) == 0)
    expected = [n * expected_probs[x] / total_probability for x in possible]
    bins = [([possible[i] for i in group],
             sum(observed.get(possible[i], 0) for i in group),
             sum(expected[i] for i in group))
            for group in pool_small_bins(expected, min_expected)]
    df = len(bins) - 1
    if impossible:
        return ChiSquareResult(math.inf, df, 0.0, n, bins, impossible)
    statistic = sum((o - e) ** 2 / e for _, o, e in bins)
    p_value = chi_square_sf(statistic, df) if df >= 1 else None  # one bin: O = E = n, nothing to test
    return ChiSquareResult(statistic, df, p_value, n, bins, impossible)


def expected_statistic(expected_probs, true_probs, n, min_expected=MIN_EXPECTED):
    """Mean of X^2 when the n draws really come from true_probs, not expected_probs: about
    df + n * sum over pooled bins of (B - P)^2 / P (the noncentral chi-square's mean), or inf
    when true_probs gives mass to an outcome expected_probs calls impossible. Compared with
    critical_value, it says whether n draws can be expected to show the difference at all.

    >>> round(expected_statistic({"h": 0.5, "t": 0.5}, {"h": 0.6, "t": 0.4}, n=100), 2)  # 1 + 100 * 0.04
    5.0
    """
    if any(prob > 0 and expected_probs.get(x, 0.0) == 0 for x, prob in true_probs.items()):
        return math.inf
    possible = [x for x, prob in expected_probs.items() if prob > 0]
    groups = pool_small_bins([n * expected_probs[x] for x in possible], min_expected)
    P = [sum(expected_probs[possible[i]] for i in group) for group in groups]
    B = [sum(true_probs.get(possible[i], 0.0) for i in group) for group in groups]
    return len(groups) - 1 + n * sum((b - p) ** 2 / p for b, p in zip(B, P))
