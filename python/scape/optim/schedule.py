"""Density schedule and the number of mask positions per piece, as the C++ core computes them
(core/schedule.cpp: density_at; optimizers/scape/mask_ownership.cpp: k_tensor_piece). Pure Python in
double precision, so every rank and the core agree on k exactly."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DensitySchedule:
    """rho_t for a target density rho = 1 - sparsity: a geometric warm-up from `start` over
    `warmup` steps, or a cool-down back to 1 over `cooldown` steps from the 0-based step
    `cooldown_start` (which replaces the warm-up, as in the authors' artifact)."""
    warmup: int = 0
    start: float = 1.0
    cooldown: int = 0
    cooldown_start: int = 0

    def density(self, rho: float, t: int) -> float:
        if rho >= 1.0:
            return 1.0
        tau = t - 1
        if self.cooldown > 0:
            if tau < self.cooldown_start:
                return rho
            progress = min(1.0, (tau - self.cooldown_start) / self.cooldown)
            return min(1.0, rho * math.pow(1.0 / rho, progress))
        if self.warmup > 0 and tau < self.warmup:
            return min(1.0, self.start * math.pow(rho / self.start, tau / self.warmup))
        return rho


def k_piece(rho: float, n: int) -> int:
    """k of one tensor piece of n elements: all n when rho >= 1, else max(1, floor(rho n)),
    the product taken as the integer it lies within 1e-9 (relative) of."""
    if n == 0:
        return 0
    if rho >= 1.0:
        return n
    x = rho * n
    nearest = float(round(x))
    k = nearest if abs(x - nearest) <= 1e-9 * max(1.0, x) else math.floor(x)
    return min(max(int(max(0.0, k)), 1), n)
