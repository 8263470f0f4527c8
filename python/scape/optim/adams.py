"""scape.torch.AdamS: the dense baseline with SCAPE's conventions (param groups, the rank-order
gradient mean over the group, the artifact's AdamS, decoupled weight decay, last_metrics),
matching the C++ core's `type = "adams"` with replicated state (docs/algorithms.md, "Dense
data parallelism"). Its state is world-size independent (every rank holds the same first
moment), so a checkpoint resumes at any world size bit-identically."""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from .agreement import check_agreement
from .arith import AdamScalars, adams_update, adamw_update, decay_factor, f32, momentum
from .comm import Group
from . import rank_state
from .mirror import ParamMirror
from .protocol import load_state_dict_with_hooks, refuse_copy, state_dict_with_hooks
from .params import (FLATTENED_HINT, added_group, check_betas, check_tensors, closure_loss, group_hypers, local_tensor,
                     normalize_groups, refuse_sharded_parameters, saved_groups, state_by_param, trainable_tensors)

FORMAT = 2
INNER_RULES = ("adams", "adamw")


class AdamS(torch.optim.Optimizer):
    """Dense AdamS on this rank of `group`: every step all-reduces the gradients (the mean in
    rank order, 2(W-1)/W·4N bytes sent a rank) and steps every parameter. Without a process
    group it is plain single-process AdamS. opt.state[p] holds "exp_avg" (a view of the flat
    first moment) and "step". parameters_as_views as SCAPE's: each plain fp32 parameter a view
    of the flat buffer the step writes (save with torch.save or DCP, not safetensors)."""

    _step_supports_amp_scaling = True

    _inner_rule = "adams"  # DiLoCo and SparseLoCo take "adamw" too: a second moment, exp_avg_sq

    def __init__(self, params, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1, *,
                 bias_correction: bool = True, broadcast_params: bool = True, parameters_as_views: bool = False,
                 group=None):
        beta1, beta2 = check_betas(betas)
        if not eps > 0:
            raise ValueError(f"eps: must be > 0, got {eps}")
        if parameters_as_views not in (True, False):
            raise ValueError(f"parameters_as_views: expected True or False, got {parameters_as_views!r}")
        defaults = dict(lr=lr, weight_decay=weight_decay, sparsity=0.0, betas=(beta1, beta2), eps=float(eps))
        groups = normalize_groups(params, defaults, [])
        refuse_sharded_parameters(groups, "AdamS")
        self.device = check_tensors(groups)
        self._ready = False
        super().__init__(groups, defaults)
        self.bias_correction = bool(bias_correction)
        self.comm = Group(group)
        self.parameters_as_views = bool(parameters_as_views)
        self._t = 0
        self._step_count = torch.tensor(0.0)
        self.skipped_steps = 0
        self._last: Dict[str, float] = {}
        self._build()
        check_agreement(self.comm, self._settings(), "AdamS", self.device)
        if broadcast_params:
            self.comm.broadcast_from_first(self._theta)
            self.mirror.push()
        self._ready = True

    # In the param groups, as torch's optimizers keep them (params.group_hypers).
    beta1 = property(lambda self: group_hypers(self)[0])
    beta2 = property(lambda self: group_hypers(self)[1])
    eps = property(lambda self: group_hypers(self)[2])

    def _build(self, kept: Dict[int, torch.Tensor] = None) -> None:
        """The flat layout of the tensors that train now; `kept` first moments carried over."""
        self._tensors = trainable_tensors(self.param_groups)
        self._bounds, at = [], 0
        for g in self.param_groups:
            first = at
            at += sum(local_tensor(p).numel() for p in g["params"] if p.requires_grad)
            self._bounds.append((first, at))
        self.mirror = ParamMirror(self._tensors, self.device, bind=self.parameters_as_views)
        self._theta = self.mirror.theta
        self._ranges, at = [], 0
        for p in self._tensors:
            self._ranges.append((at, at + local_tensor(p).numel()))
            at += local_tensor(p).numel()
        self._m = torch.zeros_like(self._theta)
        self._v = torch.zeros_like(self._theta) if self._inner_rule == "adamw" else None
        self._g = torch.zeros_like(self._theta)
        for p, (a, b) in zip(self._tensors, self._ranges):
            shape = local_tensor(p).shape
            for key, buffer in self._moments():
                saved = (kept or {}).get((key, id(p)))
                if saved is None and key in self.state.get(p, {}):
                    saved = self.state[p][key].reshape(-1)  # a tensor that left and came back
                if saved is not None:
                    buffer[a:b] = saved
            self.state[p] = {"step": self._step_count,
                             **{key: buffer[a:b].view(shape) for key, buffer in self._moments()}}

    # Whether the ranks' states differ (the local-SGD family between syncs, DeMo's momentum):
    # state_dict then saves each tensor under this rank's own key (rank_state.py).
    _per_rank_state = False

    def _moments(self):
        """The per-parameter moments as (torch's state key, flat buffer)."""
        return [("exp_avg", self._m)] + ([("exp_avg_sq", self._v)] if self._v is not None else [])

    def _settings(self):
        layout = [(n, local_tensor(p).numel(), str(p.dtype)) for g in self.param_groups
                  for n, p in zip(g["names"], g["params"]) if p.requires_grad]
        return [("lr of each param group", [g["lr"] for g in self.param_groups]),
                ("weight_decay of each param group", [g["weight_decay"] for g in self.param_groups]),
                ("layout (name, numel, dtype)", layout),
                ("betas", (self.beta1, self.beta2)), ("eps", self.eps), ("bias_correction", self.bias_correction)]

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch's add_param_group; the tensors join at the next step() (on every rank)."""
        if not getattr(self, "_ready", False):
            super().add_param_group(param_group)
            return
        group = added_group(param_group, self, [], "AdamS")
        super().add_param_group(group)

    def _sync_layout(self) -> None:
        if [id(p) for p in trainable_tensors(self.param_groups)] == [id(p) for p in self._tensors]:
            return
        kept = {(key, id(p)): buffer[a:b].clone() for p, (a, b) in zip(self._tensors, self._ranges)
                for key, buffer in self._moments()}
        for p in self._tensors:
            self.state[p] = {key: kept[(key, id(p))] for key, _ in self._moments()}
        self.mirror.release()  # a tensor that left keeps none of the old buffer alive
        self._build(kept)
        check_agreement(self.comm, self._settings(), f"AdamS at step {self._t + 1} (tensors joined or left)",
                        self.device)

    @torch.no_grad()
    def step(self, closure=None):
        return self._adams_step(closure)

    def _adams_step(self, closure):
        """step()'s body: subclasses call it rather than super().step(), which torch wraps with
        the step hooks once an AdamS exists, so that their hooks would fire twice."""
        loss = closure_loss(closure)
        group_hypers(self)  # groups whose betas or eps disagree raise before anything is sent
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        self._sync_layout()
        self.mirror.pull()
        flag = self._read_gradients(grad_scale, found_inf)
        has_grad = torch.tensor([p.grad is not None for p in self._tensors], dtype=torch.float32, device=self.device)
        g_bar, flags = self._gradient_for_step(torch.cat((flag, has_grad)))
        if bool(flags[:, 0].gt(0).any()):
            if found_inf is not None or grad_scale is not None:
                self.skipped_steps += 1
                self._after_skipped_step()
                return loss
            from .scape_optimizer import NonFiniteGradient
            raise NonFiniteGradient(f"step {self._t + 1}: a gradient holds inf or NaN on rank(s) "
                                    f"{flags[:, 0].gt(0).nonzero().view(-1).tolist()} of the group; nothing was updated")
        counts = flags[:, 1:].sum(dim=0).tolist()
        if self._tensors and not any(counts):
            raise ValueError(f"step {self._t + 1}: no parameter of this optimizer has a gradient on any rank, so "
                             f"nothing would be updated; were the model's parameters replaced after the optimizer "
                             f"was built (model.load_state_dict(..., assign=True), a new module)?")
        t = self._t + 1
        b1, omb1 = f32(self.beta1), f32(1.0 - self.beta1)
        # A tensor without a gradient on any rank is skipped, as torch's optimizers skip it.
        buffers = [self._theta] + [buffer for _, buffer in self._moments()]
        untouched = [(a, b, [buffer[a:b].clone() for buffer in buffers])
                     for (a, b), count in zip(self._ranges, counts) if count == 0]
        for (first, end), group in zip(self._bounds, self.param_groups):
            if end <= first:
                continue
            theta, m, g = self._theta[first:end], self._m[first:end], g_bar[first:end]
            if group["weight_decay"]:
                theta.mul_(decay_factor(group["lr"], group["weight_decay"]))
            s = AdamScalars.at(group["lr"], self.beta1, self.beta2, self.eps, t, self.bias_correction)
            if self._v is not None:
                theta.copy_(adamw_update(theta, m, self._v[first:end], g, s))
                continue
            m_new = momentum(m, g, b1, omb1)
            theta.copy_(adams_update(theta, m, m_new, g, s))
            m.copy_(m_new)
        for a, b, saved in untouched:
            for buffer, values in zip(buffers, saved):
                buffer[a:b] = values
        extra = self._after_update(t)
        self.mirror.push()
        count = self.comm.take_count()
        self._last = {"step": t, "lr": float(self.param_groups[0]["lr"]), "bytes_sent": count.sent,
                      "bytes_received": count.received, "mask_density": 1.0, **count.metrics(), **extra}
        self._t = t
        self._step_count.fill_(float(t))
        return loss

    def _read_gradients(self, grad_scale, found_inf) -> torch.Tensor:
        """The gradients into the flat buffer (unscaled under a GradScaler); returns this rank's
        non-finite flag, shape [1]."""
        for p, (a, b) in zip(self._tensors, self._ranges):
            part = self._g[a:b]
            part.zero_() if p.grad is None else part.copy_(local_tensor(p.grad).reshape(-1))
        if grad_scale is not None:
            self._g.mul_(grad_scale.double().reciprocal().float().to(self._g.device))
        return (found_inf.to(self.device).float().reshape(1).clamp(max=1.0) if found_inf is not None
                else (~torch.isfinite(self._g.sum())).float().reshape(1))

    def _gradient_for_step(self, flags: torch.Tensor):
        """The gradient the update uses and every rank's flags [W, e] (non-finite, then which
        tensors have a gradient): here the rank-order mean over the group, the flags riding
        beside it."""
        return self.comm.all_reduce_mean(self._g, "grad_all_reduce", flags)

    def _after_skipped_step(self) -> None:
        """What a subclass does when a GradScaler skips the step (here every rank skips it
        together: the flags ride with the gradient's all-reduce)."""

    def _after_update(self, t: int) -> Dict[str, float]:
        """What a subclass does to the flat parameters after step t's update (DiLoCo's outer
        step); returns extra metrics."""
        return {}

    def finish(self) -> None:
        """Nothing is left in flight after a step (SCAPE's finish() waits for its mask)."""

    def config(self) -> Dict[str, Any]:
        """The optimizer section of a run config for this optimizer (see SCAPE.config)."""
        return {"type": "adams", "lr": float(self.defaults["lr"]), "weight_decay": float(self.defaults["weight_decay"]),
                "betas": [self.beta1, self.beta2], "eps": self.eps, "sharded": False}

    @property
    def steps_done(self) -> int:
        return self._t

    @property
    def last_metrics(self) -> Dict[str, float]:
        return dict(self._last)

    def flat_params(self) -> torch.Tensor:
        return self._theta

    def state_dict(self) -> Dict[str, Any]:
        """torch's form, per parameter: step, exp_avg, the fp32 master of a bf16/fp16 one."""
        return state_dict_with_hooks(self, self._state_dict)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        load_state_dict_with_hooks(self, state_dict, self._load_state_dict)

    def __getstate__(self):
        refuse_copy(self)

    def _state_dict(self) -> Dict[str, Any]:
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        masters = self.mirror.masters()
        state = {}
        for j, (p, (a, b)) in enumerate(zip(self._tensors, self._ranges)):
            shape = local_tensor(p).shape
            entry = {"format": FORMAT, "step": torch.tensor(float(self._t)),
                     "skipped_steps": torch.tensor(self.skipped_steps),  # a tensor, so that DCP loads it
                     **{key: buffer[a:b].view(shape).clone() for key, buffer in self._moments()}}
            if j in masters:
                entry["master"] = masters[j].view(shape).clone()
            entry.update(self._extra_state(a, b, shape))
            if self._per_rank_state:
                entry = rank_state.own_keys(entry, self.comm.rank, self.comm.size)
            state[index[id(p)]] = entry
        return {"state": state, "param_groups": saved_groups(self.param_groups)}

    def _extra_state(self, a: int, b: int, shape) -> Dict[str, Any]:
        """A subclass's own entries for the tensor at [a, b) of the flat buffer (DiLoCo's)."""
        return {}

    def _load_extra_state(self, entry: Dict[str, Any], a: int, b: int) -> None:
        """A subclass's own entries back into [a, b) of its buffers."""

    def _load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if not isinstance(state_dict, dict):
            raise ValueError(f"state_dict: expected a dict, got {type(state_dict).__name__}")
        by_param = state_by_param(self.param_groups, state_dict)
        self._sync_layout()
        entries: List[Dict[str, Any]] = []
        for g in self.param_groups:
            for name, p in zip(g["names"], g["params"]):
                if not p.requires_grad:
                    continue
                entry = by_param.get(id(p))
                if entry is not None and self._per_rank_state:
                    entry = rank_state.plain_keys(entry, self.comm.rank, self.comm.size, name, type(self).__name__)
                if entry is None or entry.get("format") != FORMAT or "exp_avg" not in entry:
                    raise ValueError(f"state_dict: no scape.torch.AdamS state (format {FORMAT}) for {name}"
                                     + (FLATTENED_HINT if entry is not None and "format" not in entry else ""))
                for key, _ in self._moments():
                    if key not in entry:
                        raise ValueError(f"state_dict: {name} has no {key} (saved with another inner rule than "
                                         f"this optimizer's {self._inner_rule!r}?)")
                    if entry[key].numel() != local_tensor(p).numel():
                        raise ValueError(f"state_dict: {name}'s {key} has {entry[key].numel()} values, the "
                                         f"parameter {local_tensor(p).numel()}")
                entries.append(entry)
        self.mirror.pull()
        masters = self.mirror.masters()
        for j, (entry, (a, b)) in enumerate(zip(entries, self._ranges)):
            for key, buffer in self._moments():
                buffer[a:b] = entry[key].reshape(-1).to(self.device, torch.float32)
            if j in masters:
                masters[j].copy_(entry["master"].reshape(-1).to(self.device, torch.float32))
            self._load_extra_state(entry, a, b)
        if entries:
            self._t, self.skipped_steps = int(float(entries[0]["step"])), int(entries[0]["skipped_steps"])
        self._step_count.fill_(float(self._t))
        self.mirror.push()
