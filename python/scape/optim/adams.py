"""scape.torch.AdamS: the dense baseline with SCAPE's conventions (param groups, the rank-order
gradient mean over the group, the artifact's AdamS, decoupled weight decay, last_metrics),
matching the C++ core's `type = "adams"` with replicated state (docs/algorithms.md, "Dense
data parallelism")."""
from __future__ import annotations

from typing import Any, Dict

import torch

from .arith import AdamScalars, adams_update, decay_factor, f32, momentum
from .comm import Group
from .params import check_tensors, flat_masters, load_groups, normalize_groups, saved_groups, write_back


class AdamS(torch.optim.Optimizer):
    """Dense AdamS on this rank of `group`: every step all-reduces the gradients (the mean in
    rank order, 2(W-1)/W·4N bytes sent a rank) and steps every parameter. Without a process
    group it is plain single-process AdamS."""

    _step_supports_amp_scaling = True

    def __init__(self, params, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1, *,
                 bias_correction: bool = True, broadcast_params: bool = True, group=None):
        beta1, beta2 = (float(b) for b in betas)
        for name, value in (("betas[0]", beta1), ("betas[1]", beta2)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name}: must lie in [0, 1), got {value}")
        if not eps > 0:
            raise ValueError(f"eps: must be > 0, got {eps}")
        groups = normalize_groups(params, dict(lr=lr, weight_decay=weight_decay, sparsity=0.0), [])
        self.device = check_tensors(groups)
        super().__init__(groups, dict(lr=lr, weight_decay=weight_decay))
        self.beta1, self.beta2, self.eps, self.bias_correction = beta1, beta2, float(eps), bool(bias_correction)
        self.comm = Group(group)
        self._tensors = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._bounds, at = [], 0
        for g in self.param_groups:
            first = at
            at += sum(p.numel() for p in g["params"] if p.requires_grad)
            self._bounds.append((first, at))
        self._theta, self._low_precision = flat_masters(self._tensors, self.device)
        starts = [0]
        for p in self._tensors:
            starts.append(starts[-1] + p.numel())
        self._ranges = list(zip(starts[:-1], starts[1:]))
        if broadcast_params:
            self.comm.broadcast_from_first(self._theta)
            self._write_back()
        self._m = torch.zeros_like(self._theta)
        self._g = torch.zeros_like(self._theta)
        self._t = 0
        self.skipped_steps = 0
        self._last: Dict[str, float] = {}

    def _write_back(self) -> None:
        write_back(self._low_precision)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        at = 0
        for p in self._tensors:
            part = self._g[at:at + p.numel()]
            part.zero_() if p.grad is None else part.copy_(p.grad.reshape(-1))
            at += p.numel()
        if grad_scale is not None:
            self._g.mul_(grad_scale.double().reciprocal().float().to(self._g.device))
        flag = (found_inf.to(self.device).float().reshape(1).clamp(max=1.0) if found_inf is not None
                else (~torch.isfinite(self._g.sum())).float().reshape(1))
        has_grad = torch.tensor([p.grad is not None for p in self._tensors], dtype=torch.float32, device=self.device)
        g_bar, flags = self.comm.all_reduce_mean(self._g, "grad_all_reduce", torch.cat((flag, has_grad)))
        if bool(flags[:, 0].gt(0).any()):
            if found_inf is not None or grad_scale is not None:
                self.skipped_steps += 1
                return loss
            from .scape_optimizer import NonFiniteGradient
            raise NonFiniteGradient(f"step {self._t + 1}: a gradient holds inf or NaN on rank(s) "
                                    f"{flags[:, 0].gt(0).nonzero().view(-1).tolist()} of the group; nothing was updated")
        t = self._t + 1
        b1, omb1 = f32(self.beta1), f32(1.0 - self.beta1)
        # A tensor without a gradient on any rank is skipped, as torch's optimizers skip it.
        untouched = [(at, end, self._theta[at:end].clone(), self._m[at:end].clone())
                     for (at, end), count in zip(self._ranges, flags[:, 1:].sum(dim=0).tolist()) if count == 0]
        for (first, end), group in zip(self._bounds, self.param_groups):
            if end <= first:
                continue
            theta, m, g = self._theta[first:end], self._m[first:end], g_bar[first:end]
            if group["weight_decay"]:
                theta.mul_(decay_factor(group["lr"], group["weight_decay"]))
            s = AdamScalars.at(group["lr"], self.beta1, self.beta2, self.eps, t, self.bias_correction)
            m_new = momentum(m, g, b1, omb1)
            theta.copy_(adams_update(theta, m, m_new, g, s))
            m.copy_(m_new)
        for at, end, theta, m in untouched:
            self._theta[at:end], self._m[at:end] = theta, m
        self._write_back()
        count = self.comm.take_count()
        self._last = {"step": t, "lr": float(self.param_groups[0]["lr"]), "bytes_sent": count.sent,
                      "bytes_received": count.received, "mask_density": 1.0}
        self._t = t
        return loss

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
        return {"state": {}, "param_groups": saved_groups(self.param_groups),
                "scape_adams": {"step": self._t, "skipped_steps": self.skipped_steps, "exp_avg": self._m.cpu().clone(),
                                "masters": [v.cpu().clone() for _, v in self._low_precision]}}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        saved = state_dict.get("scape_adams") if isinstance(state_dict, dict) else None
        if saved is None:
            raise ValueError("state_dict: not a scape.torch.AdamS state (no 'scape_adams' entry)")
        if saved["exp_avg"].numel() != self._m.numel():
            raise ValueError(f"state_dict: exp_avg has {saved['exp_avg'].numel()} values, this optimizer {self._m.numel()}")
        load_groups(self.param_groups, state_dict.get("param_groups", []))
        self._m.copy_(saved["exp_avg"].to(self.device))
        for (p, view), master in zip(self._low_precision, saved["masters"]):
            view.copy_(master.to(self.device))
        self._write_back()
        self._t, self.skipped_steps = int(saved["step"]), int(saved["skipped_steps"])
