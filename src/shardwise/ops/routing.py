"""How routed tokens spread over experts and expert-parallel ranks, under uniform top-k routing.

A batch of T tokens, each picking k distinct experts out of E, touches on average E·(1 − (1 − k/E)^T)
experts: at T = 1 only k, by T ≈ 3E/k nearly all. Split over `ranks` EP ranks of E/ranks experts each, a
step waits for the busiest rank, so the cost is the expected maximum over ranks, not the mean:
- distinct experts a rank must read: Binomial(E/ranks, p) with p = 1 − (1 − k/E)^T per rank;
- token-expert pairs a rank must compute: Binomial(T·k, 1/ranks).
The expected maximum of `ranks` independent copies is Σ_x (1 − F(x)^ranks) over the binomial CDF F.
Real routers are skewed, which makes the busiest rank busier than this; EPLB's redundant experts
rebalance it, which this treats as bringing the busiest rank to the mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True, kw_only=True)
class RankLoad:
    """What the busiest EP rank handles in one MoE layer."""

    distinct_experts: float  # experts whose weights it reads
    assignments: float  # token-expert pairs it computes
    mean_distinct_experts: float  # the average over ranks, for the imbalance figure
    mean_assignments: float


def _binomial_cdf(n: int, p: float) -> np.ndarray:
    """CDF of Binomial(n, p) at 0..n, computed in log space so large n stays finite."""
    x = np.arange(n + 1, dtype=np.float64)
    if p <= 0.0:
        return np.ones(n + 1)
    if p >= 1.0:
        cdf = np.zeros(n + 1)
        cdf[-1] = 1.0
        return cdf
    log_choose = np.concatenate(([0.0], np.cumsum(np.log(n - x[1:] + 1) - np.log(x[1:]))))
    log_pmf = log_choose + x * math.log(p) + (n - x) * math.log1p(-p)
    pmf = np.exp(log_pmf - log_pmf.max())
    return np.minimum(np.cumsum(pmf / pmf.sum()), 1.0)


EXACT_UP_TO = 2048  # beyond this many trials the normal approximation is within 0.1 % and far cheaper


@lru_cache(maxsize=64)
def _expected_max_std_normal(copies: int) -> float:
    """E[max of `copies` standard normals] = ∫ x · copies · φ(x) · Φ(x)^(copies−1) dx, on a fine grid."""
    x = np.linspace(-8.0, 8.0, 4001)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = np.cumsum(pdf) * (x[1] - x[0])
    return float(np.sum(x * copies * pdf * cdf ** (copies - 1)) * (x[1] - x[0]))


def expected_max_binomial(n: int, p: float, copies: int) -> float:
    """E[max of `copies` independent Binomial(n, p)] = Σ_{x<n} (1 − F(x)^copies); for large n the normal
    approximation n·p + σ·E[max of `copies` standard normals]."""
    if copies == 1:
        return n * p
    if n > EXACT_UP_TO:
        return min(float(n), n * p + math.sqrt(n * p * (1 - p)) * _expected_max_std_normal(copies))
    cdf = _binomial_cdf(n, p)
    return float(np.sum(1.0 - cdf[:-1] ** copies))


@lru_cache(maxsize=4096)
def busiest_rank(*, tokens: int, num_experts: int, top_k: int, ranks: int, balanced: bool = False) -> RankLoad:
    """Load of the busiest of `ranks` EP ranks for a batch of `tokens` routed tokens."""
    per_rank = num_experts / ranks
    p_active = 1.0 - (1.0 - top_k / num_experts) ** tokens
    mean_distinct = per_rank * p_active
    mean_pairs = tokens * top_k / ranks
    if balanced or ranks == 1:
        return RankLoad(
            distinct_experts=mean_distinct,
            assignments=mean_pairs,
            mean_distinct_experts=mean_distinct,
            mean_assignments=mean_pairs,
        )
    return RankLoad(
        distinct_experts=expected_max_binomial(math.ceil(per_rank), p_active, ranks),
        assignments=expected_max_binomial(tokens * top_k, 1.0 / ranks, ranks),
        mean_distinct_experts=mean_distinct,
        mean_assignments=mean_pairs,
    )
