"""Param groups of the torch-native optimizers: what users pass, turned into torch param groups
and the flat layout's slots.

Accepted, as torch.optim accepts them:
  model.parameters()                one group;
  model.named_parameters()          groups made by the core's rules, in the parameters' order:
                                    a tensor whose name contains a `dense_tensors` pattern is sent
                                    dense (sparsity 0), matrices (2-D and up) take weight decay,
                                    vectors (biases, norm gains) do not;
  a list of dicts                   nanoGPT-style groups: "params" (tensors, or (name, tensor)
                                    pairs) and optional "lr", "weight_decay", "sparsity".
Frozen tensors (requires_grad=False) take no part: no slot, no decay, no state."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

GROUP_KEYS = ("params", "lr", "weight_decay", "sparsity", "names")


def _is_named(item) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)


def _check_sparsity(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: sparsity must be a number in [0, 1), got {value!r}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{where}: sparsity must lie in [0, 1) (0 sends the group dense), got {value}")
    return float(value)


def _check_number(value, name: str, where: str, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value) >= low:
        raise ValueError(f"{where}: {name} must be a number >= {low}, got {value!r}")
    return float(value)


def _dense_by_name(name: str, patterns: Sequence[str]) -> bool:
    return any(p in name for p in patterns)


def named_groups(named: List[Tuple[str, torch.Tensor]], patterns: Sequence[str]) -> List[Dict[str, Any]]:
    """Runs of consecutive parameters that share (dense, decayed), so the layout keeps the
    parameters' order."""
    groups: List[Dict[str, Any]] = []
    for name, p in named:
        dense = _dense_by_name(name, patterns)
        decayed = p.dim() >= 2
        key = (dense, decayed)
        if not groups or groups[-1]["_key"] != key:
            groups.append({"_key": key, "params": [], "names": []})
            if dense:
                groups[-1]["sparsity"] = 0.0
            if not decayed:
                groups[-1]["weight_decay"] = 0.0
        groups[-1]["params"].append(p)
        groups[-1]["names"].append(name)
    for g in groups:
        del g["_key"]
    return groups


def normalize_groups(params, defaults: Dict[str, Any], dense_tensors: Sequence[str]) -> List[Dict[str, Any]]:
    """User input -> a list of group dicts with "params" (tensors) and "names"."""
    if isinstance(params, torch.Tensor):
        raise ValueError("params: an iterable of tensors, (name, tensor) pairs or dicts, got one tensor")
    items = list(params)
    if not items:
        raise ValueError("params: empty; nothing to optimize")
    if all(isinstance(i, dict) for i in items):
        groups = []
        for gi, g in enumerate(items):
            unknown = sorted(set(g) - set(GROUP_KEYS))
            if unknown:
                raise ValueError(f"param_groups[{gi}]: unknown key {unknown[0]!r} (accepted: "
                                 f"{', '.join(GROUP_KEYS)}; betas, eps and the SCAPE switches are the optimizer's)")
            if "params" not in g:
                raise ValueError(f"param_groups[{gi}]: no 'params'")
            raw = g["params"]
            raw = [raw] if isinstance(raw, torch.Tensor) else list(raw)
            if raw and all(_is_named(x) for x in raw):
                names = [n for n, _ in raw]
                tensors = [p for _, p in raw]
            else:
                tensors = raw
                names = list(g.get("names") or [f"group{gi}.param{i}" for i in range(len(raw))])
            group = {k: v for k, v in g.items() if k not in ("params", "names")}
            group["params"], group["names"] = tensors, names
            groups.append(group)
    elif all(_is_named(i) for i in items):
        groups = named_groups(items, dense_tensors)
    elif all(isinstance(i, torch.Tensor) for i in items):
        groups = [{"params": items, "names": [f"param{i}" for i in range(len(items))]}]
    else:
        raise ValueError("params: mix tensors, (name, tensor) pairs and dicts in one list; pass one kind")
    seen = set()
    for gi, g in enumerate(groups):
        if len(g["names"]) != len(g["params"]):
            raise ValueError(f"param_groups[{gi}]: {len(g['names'])} names for {len(g['params'])} params")
        for name, p in zip(g["names"], g["params"]):
            if not isinstance(p, torch.Tensor):
                raise ValueError(f"params: {name} is a {type(p).__name__}, not a tensor")
            if id(p) in seen:
                raise ValueError(f"params: {name} appears twice")
            seen.add(id(p))
        for key, value in defaults.items():
            g.setdefault(key, value)
        where = f"param_groups[{gi}]"
        g["sparsity"] = _check_sparsity(g["sparsity"], where)
        g["lr"] = _check_number(g["lr"], "lr", where)
        g["weight_decay"] = _check_number(g["weight_decay"], "weight_decay", where)
    return groups


def check_tensors(groups: List[Dict[str, Any]]) -> torch.device:
    """One device for every trainable tensor, and dtypes the optimizer keeps (fp32, or bf16 and
    fp16 with an fp32 master copy)."""
    device = None
    for g in groups:
        for name, p in zip(g["names"], g["params"]):
            if not p.requires_grad:
                continue
            if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(f"params: {name} is {p.dtype}; SCAPE keeps float32, bfloat16 or float16 "
                                 f"parameters (the latter two with a float32 master copy)")
            if device is None:
                device = p.device
            elif p.device != device:
                raise ValueError(f"params: {name} is on {p.device}, others on {device}; "
                                 f"mixed devices are not supported")
    if device is None:
        raise ValueError("params: no tensor requires a gradient; nothing to optimize")
    return device


def flat_masters(tensors: List[torch.Tensor], device: torch.device):
    """The fp32 flat buffer of `tensors` in order, and the (tensor, view) pairs whose values the
    step must copy back. An fp32 tensor becomes a view of the buffer, its own master copy; a bf16
    or fp16 one keeps its dtype and takes the rounded master after each step."""
    theta = torch.empty(sum(p.numel() for p in tensors), dtype=torch.float32, device=device)
    low_precision, at = [], 0
    for p in tensors:
        view = theta[at:at + p.numel()]
        view.copy_(p.detach().reshape(-1))
        if p.dtype == torch.float32:
            p.data = view.view_as(p)
        else:
            low_precision.append((p, view))
        at += p.numel()
    return theta, low_precision


def write_back(low_precision) -> None:
    """The masters, rounded, into their low-precision parameters."""
    for p, view in low_precision:
        p.data.copy_(view.view_as(p))


def saved_groups(param_groups) -> List[Dict[str, Any]]:
    """torch's state_dict form of the groups: hyperparameters, and params as running indices."""
    out, index = [], 0
    for g in param_groups:
        entry = {k: v for k, v in g.items() if k != "params"}
        entry["params"] = list(range(index, index + len(g["params"])))
        index += len(g["params"])
        out.append(entry)
    return out


def load_groups(param_groups, saved: List[Dict[str, Any]]) -> None:
    """A state_dict's hyperparameters into the groups (as torch's load_state_dict takes them)."""
    if len(saved) != len(param_groups):
        raise ValueError(f"state_dict: {len(saved)} param groups, this optimizer has {len(param_groups)}")
    for gi, (mine, theirs) in enumerate(zip(param_groups, saved)):
        if len(theirs["params"]) != len(mine["params"]):
            raise ValueError(f"state_dict: param_groups[{gi}] has {len(theirs['params'])} params, "
                             f"this optimizer {len(mine['params'])}")
        for k, v in theirs.items():
            if k not in ("params", "names"):
                mine[k] = v
