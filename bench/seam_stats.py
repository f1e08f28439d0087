"""Seed statistics of the seam benchmark's long run: a mean with its 95% interval over seeds, the
paired gap of an arm to rowgrove's (same seeds, so each seed's difference is one sample), and
the steps a run takes to reach a reward threshold.

Pure: numbers in, numbers out. The 95% interval is Student's t over seeds (few seeds: a normal
interval would be too narrow); the quantiles are tabulated so the bench needs no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# t_{0.975, df} for df = 1..30 (any statistics table, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"t975 needs at least 1 degree of freedom, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.960 + 2.4 / df  # within 0.002 of the exact value past 30


def mean_ci(values: Sequence[float]) -> dict[str, Any]:
    """{"mean", "lo", "hi", "half", "n"}: the mean over seeds and its 95% t interval (half-width
    `half`; None with a single seed, where no interval can be had)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
    n = int(x.size)
    if n == 0:
        return {"mean": None, "lo": None, "hi": None, "half": None, "n": 0}
    m = float(x.mean())
    if n == 1:
        return {"mean": m, "lo": None, "hi": None, "half": None, "n": 1}
    half = t975(n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return {"mean": m, "lo": m - half, "hi": m + half, "half": half, "n": n}


def paired_gap(arm: Mapping[str, float], ref: Mapping[str, float]) -> dict[str, Any]:
    """The arm's value minus rowgrove's, seed by seed (both keyed by seed), as mean_ci of the
    differences, plus `verdict`: "lower" / "higher" when the interval excludes 0, else "no
    difference measured"."""
    seeds = sorted(set(arm) & set(ref))
    gap = mean_ci([arm[s] - ref[s] for s in seeds])
    if gap["lo"] is None:
        gap["verdict"] = "no interval (one seed)"
    elif gap["hi"] < 0:
        gap["verdict"] = "lower"
    elif gap["lo"] > 0:
        gap["verdict"] = "higher"
    else:
        gap["verdict"] = "no difference measured"
    return gap


def steps_to(threshold: float, evals: Mapping[int, float]) -> int | None:
    """The first evaluated step whose eval reward is at or above `threshold` (step 0 is the
    warmed model before GRPO); None when no evaluation reaches it."""
    for step in sorted(evals):
        v = evals[step]
        if v is not None and v >= threshold:
            return int(step)
    return None
