"""state_dict and load_state_dict of scape.torch.SCAPE. The state is this rank's own (its
residual is its own even when replicated), so every rank saves and loads its own file, as with
ZeRO or FSDP's sharded checkpoints. A resume at step k from it ends bit-identical to a run
never stopped (python/tests/test_torch_scape.py). Nothing in the paper formulation is random,
so there is no RNG state to keep."""
from __future__ import annotations

from typing import Any, Dict

import torch

from .params import load_groups, saved_groups

FORMAT = 1
_GROUP_KEYS = ("lr", "weight_decay", "sparsity")


def _cpu(t):
    return None if t is None else t.detach().to("cpu", copy=True)


def save(opt) -> Dict[str, Any]:
    opt._wait_next_mask()  # the lagged all-gather lands in the checkpoint, not after it
    groups = saved_groups(opt.param_groups)
    masters = [view for _, view in opt._low_precision]
    return {
        "state": {},
        "param_groups": groups,
        "scape": {
            "format": FORMAT, "step": opt._t, "skipped_steps": opt.skipped_steps,
            "rank": opt.comm.rank, "world_size": opt.comm.size, "sharded": opt.sharded, "n": opt.layout.n,
            "mask_lag": opt.mask_lag,
            "exp_avg": _cpu(opt._m), "residual": _cpu(opt._e), "carried_momentum": _cpu(opt._q),
            "masters": [_cpu(v) for v in masters],
            "mask": _cpu(opt._mask), "mask_rho": opt._mask_rho,
            "previous_mask": _cpu(opt._previous_mask), "previous_size": opt._previous_size,
            "fp8": None if opt.fp8 is None else {"exponent": opt.fp8.exponent, "scaled": opt.fp8.scaled},
        },
    }


def _check(saved: Dict[str, Any], key: str, want, what: str) -> None:
    if saved.get(key) != want:
        raise ValueError(f"state_dict: {key} is {saved.get(key)!r}, this optimizer has {want!r} ({what})")


def load(opt, state_dict: Dict[str, Any]) -> None:
    if not isinstance(state_dict, dict) or "scape" not in state_dict:
        raise ValueError("state_dict: not a scape.torch.SCAPE state (no 'scape' entry)")
    saved = state_dict["scape"]
    _check(saved, "format", FORMAT, "written by another version")
    _check(saved, "n", opt.layout.n, "another model")
    _check(saved, "world_size", opt.comm.size, "each rank's residual is its own")
    _check(saved, "rank", opt.comm.rank, "load each rank's own state")
    _check(saved, "sharded", opt.sharded, "another state layout")
    load_groups(opt.param_groups, state_dict.get("param_groups", []))
    dev = opt.device
    opt._wait_next_mask()
    opt._m.copy_(saved["exp_avg"].to(dev))
    if opt._e.numel():
        opt._e = saved["residual"].to(dev, torch.float32).clone()
    if opt._q.numel():
        opt._q.copy_(saved["carried_momentum"].to(dev))
    for (p, view), master in zip(opt._low_precision, saved["masters"]):
        view.copy_(master.to(dev))
    opt._write_back_params()
    opt._t = int(saved["step"])
    opt.skipped_steps = int(saved["skipped_steps"])
    opt._mask = None if saved["mask"] is None else saved["mask"].to(dev)
    opt._mask_rho = saved["mask_rho"]
    opt._previous_mask = None if saved["previous_mask"] is None else saved["previous_mask"].to(dev)
    opt._previous_size = int(saved["previous_size"])
    if opt.fp8 is not None:
        if saved.get("fp8") is None:
            raise ValueError("state_dict: saved without wire_dtype fp8_e5m2, this optimizer has it")
        opt.fp8.exponent, opt.fp8.scaled = int(saved["fp8"]["exponent"]), bool(saved["fp8"]["scaled"])
    opt._next = None
    opt._metrics = None
