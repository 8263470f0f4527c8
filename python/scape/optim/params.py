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
Where names are unknown (model.parameters(), or groups of bare tensors) a group is marked
`named: False`, and SCAPE sends its tensors of fewer than 2 dimensions (norm gains, biases)
dense: the shape stands in for the name rule.
Frozen tensors (requires_grad=False) take no part while frozen: no slot, no decay, no state.

The parameters stay the user's: the optimizers step on an fp32 flat buffer (mirror.py's
ParamMirror) whose slices plain fp32 parameters become and which the others are copied into
before each step and out of after it, so a parameter reloaded in place, moved by `p.data = ...`,
or unfrozen later is followed."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

# Keys torch.optim.lr_scheduler writes into the groups (every scheduler's initial_lr, OneCycleLR's
# and CyclicLR's bounds): accepted in a group handed back to add_param_group, unused by the step.
SCHEDULER_KEYS = ("initial_lr", "max_lr", "min_lr", "base_lr", "base_momentum", "max_momentum")
GROUP_KEYS = ("params", "lr", "weight_decay", "sparsity", "betas", "eps", "names", "named") + SCHEDULER_KEYS


# Where a saved entry has no "format": what torch.distributed.checkpoint's set_state_dict rebuilds
# from a state dict flattened by StateDictOptions(flatten_optimizer_state_dict=True), whose
# entries it fills from opt.state[p]'s keys rather than the saved ones.
FLATTENED_HINT = (" (an entry without 'format' is what set_state_dict rebuilds from a state dict saved with "
                  "StateDictOptions(flatten_optimizer_state_dict=True), which these optimizers do not support: "
                  "save and load without it)")


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


def check_betas(value, where: str = "") -> Tuple[float, float]:
    """The two betas as floats; ValueError naming them (after `where`, a group) otherwise."""
    prefix = f"{where}: " if where else ""
    try:
        beta1, beta2 = (float(b) for b in value)
    except (TypeError, ValueError):
        raise ValueError(f"{prefix}betas: expected two numbers, got {value!r}") from None
    for name, b in (("betas[0]", beta1), ("betas[1]", beta2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{prefix}{name}: must lie in [0, 1), got {b}")
    return beta1, beta2


def group_hypers(opt) -> Tuple[float, float, float]:
    """(beta1, beta2, eps) from the param groups, read at each use as torch's optimizers read
    theirs, so that a scheduler's change (OneCycleLR's momentum) and a loaded state dict's take
    effect. The groups share one flat buffer and so one pair and one eps: groups that differ
    raise ValueError naming the group."""
    groups = opt.param_groups
    beta1, beta2 = check_betas(groups[0]["betas"], "param_groups[0]")
    eps = _check_number(groups[0]["eps"], "eps", "param_groups[0]")
    for gi, g in enumerate(groups[1:], 1):
        if check_betas(g["betas"], f"param_groups[{gi}]") != (beta1, beta2) or float(g["eps"]) != eps:
            raise ValueError(f"param_groups[{gi}]: betas {tuple(g['betas'])} and eps {g['eps']} differ from "
                             f"param_groups[0]'s ({beta1}, {beta2}) and {eps}: {type(opt).__name__} steps every "
                             f"group with one pair and one eps (a scheduler must set every group alike)")
    if not eps > 0:
        raise ValueError(f"param_groups[0]: eps must be > 0, got {eps}")
    return beta1, beta2, eps


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
            groups[-1]["named"] = True
        groups[-1]["params"].append(p)
        groups[-1]["names"].append(name)
    for g in groups:
        del g["_key"]
    return groups


def normalize_groups(params, defaults: Dict[str, Any], dense_tensors: Sequence[str],
                     first_group: int = 0) -> List[Dict[str, Any]]:
    """User input -> a list of group dicts with "params" (tensors), "names" and "named";
    `first_group` numbers the groups of a later add_param_group."""
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
                                 f"{', '.join(GROUP_KEYS)}; the SCAPE switches are the optimizer's)")
            if "params" not in g:
                raise ValueError(f"param_groups[{gi}]: no 'params'")
            raw = g["params"]
            raw = [raw] if isinstance(raw, torch.Tensor) else list(raw)
            named = bool(g.get("named", True))
            if raw and all(_is_named(x) for x in raw):
                names = [n for n, _ in raw]
                tensors = [p for _, p in raw]
            elif g.get("names"):
                tensors, names = raw, list(g["names"])
            else:
                tensors, named = raw, False
                names = [f"group{first_group + gi}.param{i}" for i in range(len(raw))]
            group = {k: v for k, v in g.items() if k not in ("params", "names", "named")}
            group["params"], group["names"], group["named"] = tensors, names, named
            groups.append(group)
    elif all(_is_named(i) for i in items):
        groups = named_groups(items, dense_tensors)
    elif all(isinstance(i, torch.Tensor) for i in items):
        groups = [{"params": items, "names": [f"param{i}" for i in range(len(items))], "named": False}]
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
        if "betas" in g:
            g["betas"] = check_betas(g["betas"], where)
        if "eps" in g and not _check_number(g["eps"], "eps", where) > 0:
            raise ValueError(f"{where}: eps must be > 0, got {g['eps']!r}")
    return groups


_DTENSOR_CLASS: list = []  # [DTensor, or None without it], looked up on the first call


def is_dtensor(t: torch.Tensor) -> bool:
    # The class is looked up once: an import statement per call cost about 0.1 ms of a small
    # model's step (a hundred calls).
    if not _DTENSOR_CLASS:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:  # a torch without DTensor has no FSDP2 either
            DTensor = None
        _DTENSOR_CLASS.append(DTensor)
    return _DTENSOR_CLASS[0] is not None and isinstance(t, _DTENSOR_CLASS[0])


def closure_loss(closure):
    """torch's step(closure): the closure's loss, computed with gradients on (the steps run
    under no_grad); None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of `t` this rank holds: a DTensor's local shard (FSDP2, HSDP), else t itself."""
    return t.to_local() if is_dtensor(t) else t


MESH_DIMS = ("inter", "intra")


def check_mesh(mesh, group, optimizer: str):
    """The 2-D mesh of a hierarchical run (None: none) checked; returns the process group the
    optimizer communicates over: the mesh's "inter" dimension, one rail (local rank l of every
    node) of the node-major layout that init_device_mesh((nodes, G), ("inter", "intra")) makes."""
    if mesh is None:
        return group
    if group is not None:
        raise ValueError(f"mesh, group: give one ({optimizer} communicates over the mesh's \"inter\" dimension)")
    dims = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if getattr(mesh, "ndim", None) != 2 or dims != MESH_DIMS:
        raise ValueError(f"mesh: expected a 2-D DeviceMesh with mesh_dim_names {MESH_DIMS} (replicate between "
                         f"nodes, shard within, as HSDP), got {getattr(mesh, 'ndim', '?')}-D {dims or '(unnamed)'}")
    return mesh["inter"].get_group()


def _sharded_on_rows_over(p, intra) -> bool:
    """Whether DTensor p is FSDP2's Shard(0) over the mesh dimension `intra` alone."""
    from torch.distributed.tensor import Shard
    same_mesh = (tuple(p.device_mesh.mesh_dim_names or ()) == ("intra",)
                 and torch.equal(p.device_mesh.mesh.flatten(), intra.mesh.flatten()))
    return same_mesh and len(p.placements) == 1 and isinstance(p.placements[0], Shard) and p.placements[0].dim == 0


def refuse_sharded_parameters(groups: List[Dict[str, Any]], optimizer: str, mesh=None) -> None:
    """FSDP2's parameters are DTensors sharded over a mesh. On a 1-D mesh of the whole world
    FSDP's own dense reduce-scatter has already sent every gradient byte before step(): a sparse
    optimizer has nothing left to save there. With `mesh` (2-D, ("inter", "intra")) the
    parameters may be sharded by FSDP2 over its "intra" dimension on dim 0: FSDP reduce-scatters
    inside the node and the optimizer runs between nodes on the local shards (the hierarchy's
    rail_split = "rows"). Plain tensors with a mesh are the hierarchy without FSDP, not built."""
    intra = mesh["intra"] if mesh is not None else None
    for g in groups:
        for name, p in zip(g["names"], g["params"]):
            if not is_dtensor(p):
                if mesh is not None:
                    raise ValueError(f"params: {name} is a plain tensor, but a mesh was given; shard the model "
                                     f"inside the node first (fully_shard(model, mesh=mesh[\"intra\"])): "
                                     f"{optimizer} then runs between nodes on the local shards (docs/python.md, "
                                     f"\"FSDP2 and HSDP\"). Its own dense reduce-scatter inside the node for "
                                     f"unsharded parameters is not built")
                continue
            placements = ", ".join(str(x) for x in p.placements)
            if intra is not None:
                if not _sharded_on_rows_over(p, intra):
                    raise ValueError(f"params: {name} is a DTensor on {tuple(p.device_mesh.mesh_dim_names or ())} "
                                     f"({placements}); with a mesh, {optimizer} expects FSDP2's Shard(0) over "
                                     f"mesh[\"intra\"] (fully_shard(model, mesh=mesh[\"intra\"]))")
                continue
            mesh_ = p.device_mesh
            dims = tuple(mesh_.mesh_dim_names or ())
            if mesh_.ndim == 1:
                raise ValueError(f"params: {name} is a DTensor sharded by FSDP2 (fully_shard) over a 1-D mesh "
                                 f"({placements}); FSDP reduce-scatters every gradient densely before step(), so "
                                 f"{optimizer} would save no bytes. Use DDP (with scape.torch.local_gradients_hook) "
                                 f"or plain torch.distributed, or HSDP with {optimizer} between replicas "
                                 f"(docs/python.md, \"FSDP2 and HSDP\")")
            raise ValueError(f"params: {name} is a DTensor on a {mesh_.ndim}-D mesh {dims or ''} ({placements}); "
                             f"as HSDP's replicate-dimension optimizer {optimizer} takes FSDP2 sharded over "
                             f"the node only: fully_shard(model, mesh=mesh[\"intra\"]) and {optimizer}(..., "
                             f"mesh=mesh) (docs/python.md, \"FSDP2 and HSDP\")")


def added_group(param_group: Dict[str, Any], opt, dense_tensors: Sequence[str], optimizer: str) -> Dict[str, Any]:
    """A group handed to add_param_group after construction, checked as the first ones were."""
    [group] = normalize_groups([param_group], opt.defaults, dense_tensors, len(opt.param_groups))
    refuse_sharded_parameters([group], optimizer, getattr(opt, "mesh", None))
    device = check_tensors([group])
    if device != opt.device:
        raise ValueError(f"add_param_group: its tensors are on {device}, the others on {opt.device}")
    return group


def check_tensors(groups: List[Dict[str, Any]]) -> torch.device:
    """One device for every tensor, and dtypes the optimizer keeps (fp32, or bf16 and fp16 with
    an fp32 master copy); at least one tensor that trains."""
    device, trainable = None, False
    for g in groups:
        for name, p in zip(g["names"], g["params"]):
            if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(f"params: {name} is {p.dtype}; SCAPE keeps float32, bfloat16 or float16 "
                                 f"parameters (the latter two with a float32 master copy)")
            if device is None:
                device = p.device
            elif p.device != device:
                raise ValueError(f"params: {name} is on {p.device}, others on {device}; "
                                 f"mixed devices are not supported")
            trainable = trainable or p.requires_grad
    if not trainable:
        raise ValueError("params: no tensor requires a gradient; nothing to optimize")
    return device


def shaped_views(flat: torch.Tensor, slots, tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """Views of a flat buffer in layout order, shaped as the tensors (made once: copies in and
    out are then one foreach op a step, not a reshape and a copy a tensor)."""
    return [flat[s.offset:s.end].view(local_tensor(p).shape) for s, p in zip(slots, tensors)]


@torch.no_grad()
def read_gradients(tensors: List[torch.Tensor], views: List[torch.Tensor]) -> None:
    """Each tensor's local gradient into its view, zeros where it has none."""
    grads = [p.grad for p in tensors]
    have = [j for j, grad in enumerate(grads) if grad is not None]
    if len(have) == len(grads):
        torch._foreach_copy_(views, [local_tensor(grad) for grad in grads])
        return
    if have:
        torch._foreach_copy_([views[j] for j in have], [local_tensor(grads[j]) for j in have])
    torch._foreach_zero_([views[j] for j, grad in enumerate(grads) if grad is None])


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


def state_by_param(param_groups, state_dict: Dict[str, Any]) -> Dict[int, Dict[str, Any]]:
    """Each saved per-parameter entry keyed by id() of this optimizer's parameter in the same
    place: torch's rule, which maps the saved "params" (indices, or the FQNs that
    torch.distributed.checkpoint puts there) to the current groups by position."""
    saved = state_dict.get("param_groups")
    if not isinstance(saved, list):
        raise ValueError("state_dict: no 'param_groups' list")
    load_groups(param_groups, saved)
    state = state_dict.get("state")
    if not isinstance(state, dict):
        raise ValueError("state_dict: no 'state' dict")
    out = {}
    for mine, theirs in zip(param_groups, saved):
        for key, p in zip(theirs["params"], mine["params"]):
            if key in state:
                out[id(p)] = state[key]
    return out


def trainable_tensors(param_groups) -> List[torch.Tensor]:
    """The tensors of the groups that require a gradient now, in the groups' order."""
    return [p for g in param_groups for p in g["params"] if p.requires_grad]
