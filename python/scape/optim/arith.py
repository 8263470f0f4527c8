"""The C++ core's step arithmetic in torch ops, one fp32 operation at a time in the kernels'
order (kernels/cpu/adam.cpp, kernels/cpu/scape_ops.cpp), never fused into an FMA: torch's
`add(x, y, alpha=a)` may compute x + a·y as one fused operation, so products are formed first
and added after. Scalars are computed in double and rounded to fp32 once, as AdamFloats does."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch


def f32(x: float) -> float:
    """x rounded to the nearest float32, as a Python float."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass(frozen=True)
class AdamScalars:
    lr: float
    beta1: float
    beta2: float
    one_minus_b1: float
    one_minus_b2: float
    eps: float
    inv_bc1: float
    inv_sqrt_bc2: float
    step_size: float  # lr / c1, AdamW's

    @staticmethod
    def at(lr: float, beta1: float, beta2: float, eps: float, t: int, bias_correction: bool = True) -> "AdamScalars":
        bc1 = 1.0 - math.pow(beta1, t) if bias_correction else 1.0
        bc2 = 1.0 - math.pow(beta2, t) if bias_correction else 1.0
        return AdamScalars(f32(lr), f32(beta1), f32(beta2), f32(1.0 - beta1), f32(1.0 - beta2), f32(eps),
                           f32(1.0 / bc1), f32(1.0 / math.sqrt(bc2)), f32(lr / bc1))


def decay_factor(lr: float, weight_decay: float) -> float:
    """Decoupled weight decay's fp32 factor 1 - eta·lambda (core/adam_step.cpp)."""
    return f32(1.0 - lr * weight_decay)


def adams_update(theta: torch.Tensor, m_prev: torch.Tensor, m_new: torch.Tensor, g: torch.Tensor,
                 s: AdamScalars) -> torch.Tensor:
    """AdamS in the artifact's form (docs/algorithms.md, "Update rules"):
    v = b2 m_prev² + (1-b2) g², theta -= lr (m_new/c1) / (sqrt(v)/sqrt(c2) + eps).
    Returns the new theta values (the caller writes them back)."""
    v = torch.mul(m_prev, s.beta2).mul_(m_prev)
    v.add_(torch.mul(g, s.one_minus_b2).mul_(g))
    den = v.sqrt_().mul_(s.inv_sqrt_bc2).add_(s.eps)
    step = torch.mul(m_new, s.inv_bc1).mul_(s.lr).div_(den)
    return theta - step


def adamw_update(theta: torch.Tensor, m: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 s: AdamScalars) -> torch.Tensor:
    """AdamW (kernels/cpu/adam.cpp, adamw_range): m and v are updated in place,
    m = b1 m + (1-b1) g, v = b2 v + ((1-b2) g) g, and the new theta values are returned:
    theta - (lr/c1) m / (sqrt(v)/sqrt(c2) + eps) (theta already decayed by the caller)."""
    m.copy_(momentum(m, g, s.beta1, s.one_minus_b1))
    v.mul_(s.beta2).add_(torch.mul(g, s.one_minus_b2).mul_(g))
    den = v.sqrt().mul_(s.inv_sqrt_bc2).add_(s.eps)
    return theta - torch.mul(m, s.step_size).div_(den)


def momentum(m_prev: torch.Tensor, g: torch.Tensor, beta1: float, one_minus_b1: float) -> torch.Tensor:
    """b1 m_prev + (1-b1) g, the products rounded before the sum."""
    return torch.mul(m_prev, beta1).add_(torch.mul(g, one_minus_b1))
