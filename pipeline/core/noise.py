"""How sure a latency median is: a distribution-free confidence interval of the median.

The interval is the pair of order statistics (sorted samples ``x[j]``, ``x[k]``) whose ranks
the binomial(n, 1/2) distribution puts around the middle with at least the requested
coverage; it needs no assumption about the timing distribution (which is skewed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """``(low, high)`` of the median of ``samples``; the full range when there are too few samples
    for the requested coverage (fewer than 6 for 95%)."""
    if not samples:
        raise ValueError("median_ci needs at least one sample")
    ordered = sorted(samples)
    n = len(ordered)
    # [x[j], x[n-1-j]] (0-based) holds the median unless B <= j or B >= n - j, B ~ binomial(n, 1/2)
    # the number of samples below it: coverage 1 - 2 P(B <= j). The largest j with enough coverage:
    cdf = 0.0
    j = 0
    for i in range(n // 2 + 1):
        cdf += math.comb(n, i) / 2**n  # P(B <= i)
        if 1.0 - 2.0 * cdf < confidence:
            j = max(i - 1, 0)
            break
    return ordered[j], ordered[n - 1 - j]


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """True when two intervals share a point (a tie: neither is faster with confidence)."""
    return a[0] <= b[1] and b[0] <= a[1]
