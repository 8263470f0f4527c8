"""scape.torch.SCAPE's arguments: their checks (each bad value raises ValueError naming the
argument, before anything is built), and the run config section they amount to."""
from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

from .params import check_betas

FORMULATIONS = ("paper",)


def _check_switch(value, name: str, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, allowed))}, got {value!r}")


def check_arguments(*, formulation, mask_lag, residual, wire_dtype, sharded, overlap_backward, betas, eps,
                    residual_decay, clip_grad, density_start, density_warmup, density_cooldown,
                    density_cooldown_start, total_steps, bucket_bytes, compile=False,
                    parameters_as_views=False) -> Tuple[float, float]:
    """Raises on the first bad argument; returns the betas as floats."""
    _check_switch(formulation, "formulation", FORMULATIONS)
    _check_switch(mask_lag, "mask_lag", (0, 1))
    _check_switch(bool(residual), "residual", (True, False))
    _check_switch(compile, "compile", (True, False))
    _check_switch(parameters_as_views, "parameters_as_views", (True, False))
    _check_switch(wire_dtype, "wire_dtype", ("fp32", "fp8_e5m2"))
    if wire_dtype == "fp8_e5m2" and (sharded or overlap_backward):
        raise ValueError("wire_dtype: fp8_e5m2 needs sharded=False and overlap_backward=False (the core's fp8 "
                         "payload is replicated state's)")
    beta1, beta2 = check_betas(betas)
    if not eps > 0:
        raise ValueError(f"eps: must be > 0, got {eps}")
    if not 0.0 <= residual_decay <= 1.0:
        raise ValueError(f"residual_decay: must lie in [0, 1], got {residual_decay}")
    if not clip_grad >= 0:
        raise ValueError(f"clip_grad: must be >= 0 (0 = off), got {clip_grad}")
    if not 0.0 < density_start <= 1.0:
        raise ValueError(f"density_start: must lie in (0, 1], got {density_start}")
    for name, value in (("density_warmup", density_warmup), ("density_cooldown", density_cooldown),
                        ("density_cooldown_start", density_cooldown_start)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: must be an integer >= 0, got {value!r}")
    if density_warmup > 0 and density_cooldown > 0:
        raise ValueError("density_warmup, density_cooldown: a cool-down replaces the warm-up; set one")
    if overlap_backward and mask_lag != 1:
        raise ValueError("overlap_backward: needs mask_lag = 1 (the mask must be known before backward)")
    if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                    or total_steps < 1):
        raise ValueError(f"total_steps: a positive integer or None, got {total_steps!r}")
    if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes: must be a positive integer, got {bucket_bytes!r}")
    return beta1, beta2


def run_config(opt) -> Dict[str, Any]:
    """The optimizer section of a run config (docs/configuration.md) for what this optimizer
    computes: the run file records it, and `analysis report` groups runs by it. Per-group
    values are the first sparse group's."""
    sparse = [g for g in opt.param_groups if g["sparsity"] > 0] or opt.param_groups
    out = {"type": "scape", "formulation": "paper", "inner": "adams", "lr": float(opt.defaults["lr"]),
           "sparsity": float(sparse[0]["sparsity"]), "weight_decay": float(sparse[0]["weight_decay"]),
           "betas": [opt.beta1, opt.beta2], "eps": opt.eps, "sharded": opt.sharded,
           "mask_lag": opt.mask_lag, "residual": opt.residual, "mask_encoding": "bitmap",
           "wire_dtype": "fp8_e5m2" if opt.fp8 is not None else "fp32"}
    if opt.residual_decay != 1.0:
        out["residual_decay"] = opt.residual_decay
    if opt.clip_grad > 0:
        out["clip_grad"] = opt.clip_grad
    if opt.density.warmup:
        out.update(density_warmup=opt.density.warmup, density_start=opt.density.start)
    if opt.density.cooldown:
        out.update(density_cooldown=opt.density.cooldown, density_cooldown_start=opt.density.cooldown_start)
    return out
