"""scape.torch.Hierarchical: the core's optimizer.hierarchy = "node" (docs/algorithms.md,
"Hierarchy") for plain (unsharded) models, around any of scape.torch's optimizers. On a mesh of
nodes × G ranks ("inter", "intra"), each step on the rank at (node, local rank l):

  (a) the gradient is reduce-scattered inside the node, so that l holds the node's mean
      (summed in rank order) of rail l's part of the parameters;
  (b) the wrapped optimizer steps that part alone over mesh["inter"], the rail of local rank l
      of every node: its masks, moments, residual and payload are the rail's;
  (c) the updated parts are all-gathered inside the node into every rank's parameters.

A rail's part follows `rail_split`, as the core's optimizers/rail_partition.cpp cuts it:
"tensors", whole tensors dealt largest first (ties: the earlier) to the rail whose part is
smallest so far (ties: the lower rail), kept in parameter order, so the paper formulation's
per-tensor k is exact (a tensor larger than N/G stays whole, its rail's part then larger);
"rows", every tensor cut on dim 0 into G slices as torch.chunk and FSDP2 cut it, k a slice
(empty slices left out). With FSDP2 already sharding inside the node, SCAPE(..., mesh=) is the
"rows" path without the copies (docs/python.md, "FSDP2 and HSDP")."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

from .comm import Group
from .params import MESH_DIMS, check_mesh, closure_loss
from .protocol import load_state_dict_with_hooks, refuse_copy, state_dict_with_hooks

RAIL_SPLITS = ("tensors", "rows")


def rail_pieces(shapes: Sequence[torch.Size], rails: int, split: str) -> List[List[Tuple[int, int, torch.Size]]]:
    """Each rail's pieces as (tensor index, first element in the flattened tensor, piece shape),
    in parameter order."""
    if split not in RAIL_SPLITS:
        raise ValueError(f"rail_split: expected one of {', '.join(map(repr, RAIL_SPLITS))}, got {split!r}")
    parts: List[List[Tuple[int, int, torch.Size]]] = [[] for _ in range(rails)]
    if split == "rows":
        for j, shape in enumerate(shapes):
            rows = shape[0] if len(shape) else 1
            row_size = (torch.Size(shape).numel() // rows) if rows else 0
            chunk = -(-rows // rails)
            for rail in range(rails):
                first, last = min(rows, rail * chunk), min(rows, (rail + 1) * chunk)
                if last > first:
                    parts[rail].append((j, first * row_size, torch.Size((last - first, *shape[1:]))))
    else:
        sizes = [torch.Size(s).numel() for s in shapes]
        load, rail_of = [0] * rails, [0] * len(shapes)
        for j in sorted(range(len(shapes)), key=lambda i: -sizes[i]):  # stable: ties keep the earlier
            lightest = load.index(min(load))
            rail_of[j] = lightest
            load[lightest] += sizes[j]
        for j, shape in enumerate(shapes):
            parts[rail_of[j]].append((j, 0, torch.Size(shape)))
    for rail, part in enumerate(parts):
        if not part:
            raise ValueError(f"rail_split: {split!r} leaves rail {rail} of {rails} without parameters "
                             f"({len(shapes)} tensors); use fewer ranks a node or the other split")
    return parts


def _piece(t: torch.Tensor, first: int, numel: int) -> torch.Tensor:
    """Elements [first, first + numel) of t flattened (a view where t is contiguous)."""
    return t.detach().reshape(-1)[first:first + numel]


def _named_groups(params) -> List[Dict[str, Any]]:
    """Param groups as lists of (name, tensor): named_parameters(), plain tensors (named
    param<i>), or dicts of either with their options."""
    items = list(params)
    if items and isinstance(items[0], dict):
        out = []
        for g in items:
            group = dict(g)
            group["params"] = _named_groups(g["params"])[0]["params"]
            out.append(group)
        return out
    named = [item if isinstance(item, tuple) else (f"param{i}", item) for i, item in enumerate(items)]
    return [{"params": named}]


class Hierarchical(torch.optim.Optimizer):
    """`optimizer_class(rail_groups, group=mesh["inter"], **options)` on this rank's rail part,
    dense inside the node (see the module). params: named_parameters() (names keep SCAPE's dense
    rule), tensors, or param groups of either (their options reach the wrapped optimizer).
    param_groups are the wrapped optimizer's, so schedulers set its learning rates;
    last_metrics adds bytes_sent_intra (this rank's node collectives) and bytes_sent_inter (the
    wrapped optimizer's) to its bytes_sent. state_dict is this rank's own (its rail's state)."""

    # GradScaler then hands step() its scale instead of unscaling the rail pieces' gradients
    # (set only inside step()) and failing on "no inf checks": step() refuses it by name.
    _step_supports_amp_scaling = True

    def __init__(self, params, mesh, optimizer_class, rail_split: str = "tensors", **options):
        if "group" in options or "mesh" in options:
            raise ValueError("group, mesh: Hierarchical hands the wrapped optimizer mesh[\"inter\"] itself")
        check_mesh(mesh, None, "Hierarchical")
        groups = _named_groups(params)
        # A frozen tensor takes no part (no rail piece, no decay), as in the optimizers it wraps;
        # the rail parts are cut once, so the tensors that train may not change later (step()).
        self._given = [(name, p) for g in groups for name, p in g["params"]]
        entries = [(gi, name, p) for gi, g in enumerate(groups) for name, p in g["params"] if p.requires_grad]
        if not entries:
            raise ValueError("params: no parameters that require a gradient")
        self.node, self.rail = Group(mesh["intra"].get_group()), mesh.get_local_rank("intra")
        self.rail_split = rail_split
        shapes = [p.shape for _, _, p in entries]
        self._parts = rail_pieces(shapes, self.node.size, rail_split)
        self._counts = [sum(shape.numel() for _, _, shape in part) for part in self._parts]
        self._tensors = [p for _, _, p in entries]
        self._mine = [(j, first, torch.nn.Parameter(_piece(self._tensors[j], first, shape.numel()).clone().view(shape)))
                      for j, first, shape in self._parts[self.rail]]
        rail_groups = []
        for gi, g in enumerate(groups):
            named = [(entries[j][1], rail_param) for j, _, rail_param in self._mine if entries[j][0] == gi]
            if named:
                rail_groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": named})
        self.inner = optimizer_class(rail_groups, group=mesh["inter"].get_group(), **options)
        super().__init__(self._tensors, {})
        self.param_groups = self.inner.param_groups
        self.defaults = self.inner.defaults
        self._last: Dict[str, float] = {}

    def _gradient_in_rail_order(self) -> torch.Tensor:
        pieces = []
        for part in self._parts:
            for j, first, shape in part:
                grad = self._tensors[j].grad
                pieces.append(torch.zeros(shape.numel(), device=self._tensors[j].device) if grad is None
                              else _piece(grad, first, shape.numel()).float())
        return torch.cat(pieces)

    def _check_trainable(self) -> None:
        now = [id(p) for _, p in self._given if p.requires_grad]
        if now != [id(p) for p in self._tensors]:
            built = {id(p) for p in self._tensors}
            changed = [name for name, p in self._given if p.requires_grad != (id(p) in built)]
            raise ValueError(f"Hierarchical: the tensors that train changed (requires_grad) since it was built: "
                             f"{', '.join(changed)}; its rail parts are cut over the tensors that trained then: "
                             f"build a new Hierarchical (its state_dict does not carry over)")

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None:
            raise ValueError("Hierarchical: not with GradScaler (its gradients are the rail pieces', made inside "
                             "step()); train in bf16, or use SCAPE or AdamS over the whole group, which take it")
        self._check_trainable()
        for j, first, rail_param in self._mine:  # the parameters are the truth, as in SCAPE's mirror
            rail_param.copy_(_piece(self._tensors[j], first, rail_param.numel()).view_as(rail_param))
        gradient = self._gradient_in_rail_order()
        mean, _ = self.node.reduce_scatter_mean(gradient, self._counts, "node_grad_reduce_scatter")
        at = 0
        for _, _, rail_param in self._mine:
            rail_param.grad = mean[at:at + rail_param.numel()].view_as(rail_param).to(rail_param.dtype)
            at += rail_param.numel()
        self.inner.step()
        own = torch.cat([rail_param.detach().reshape(-1).float() for _, _, rail_param in self._mine])
        gathered, _ = self.node.all_gather_uneven(own, self._counts, "node_param_all_gather")
        at = 0
        for part in self._parts:
            for j, first, shape in part:
                flat = self._tensors[j].data.view(-1)
                flat[first:first + shape.numel()] = gathered[at:at + shape.numel()].to(flat.dtype)
                at += shape.numel()
        self._record_metrics()
        return loss

    def _record_metrics(self) -> None:
        inner = dict(self.inner.last_metrics)
        intra = self.node.take_count()
        inter = int(inner.get("bytes_sent", 0))
        inner.update(bytes_sent_intra=intra.sent, bytes_sent_inter=inter, bytes_sent=intra.sent + inter,
                     bytes_received=int(inner.get("bytes_received", 0)) + intra.received)
        inner.update(intra.metrics())
        self._last = inner

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self._tensors:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()
        self.inner.zero_grad(set_to_none=set_to_none)

    @property
    def last_metrics(self) -> Dict[str, float]:
        return dict(self._last)

    def finish(self) -> None:
        getattr(self.inner, "finish", lambda: None)()

    def config(self) -> Dict[str, Any]:
        """The optimizer section of a run config for what this computes: the wrapped optimizer's,
        with the hierarchy and the rail split (the run's `topology.ranks_per_node` is the node
        group's size, a key of the run config, not of this section)."""
        return {**self.inner.config(), "hierarchy": "node", "rail_split": self.rail_split}

    def state_dict(self) -> Dict[str, Any]:
        """This rank's: its rail, the split, and the wrapped optimizer's state of the rail's part."""
        return state_dict_with_hooks(self, lambda: {
            "hierarchical": {"rail": self.rail, "rails": self.node.size, "rail_split": self.rail_split},
            "inner": self.inner.state_dict()})

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        load_state_dict_with_hooks(self, state_dict, self._load_state_dict)

    def __getstate__(self):
        refuse_copy(self)

    def _load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        mine = {"rail": self.rail, "rails": self.node.size, "rail_split": self.rail_split}
        saved = state_dict.get("hierarchical") if isinstance(state_dict, dict) else None
        if saved != mine:
            raise ValueError(f"state_dict: saved for {saved}, this rank is {mine} (each rank loads its own)")
        self.inner.load_state_dict(state_dict["inner"])


__all__ = ["Hierarchical", "MESH_DIMS", "RAIL_SPLITS", "rail_pieces"]
