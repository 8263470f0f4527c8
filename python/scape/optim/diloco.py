"""scape.torch.DiLoCo: local SGD with an outer optimizer, as the C++ core's `type = "diloco"`
computes it (docs/algorithms.md, "DiLoCo and Streaming DiLoCo"), in torch ops over any process
group. Each rank takes AdamS (or AdamW) steps on its own gradient (no collective); at the steps that sync
fragment f (every H = inner_steps steps, at f's offset), the ranks all-reduce the
pseudo-gradient Δ_i = θ_g − θ_i of the fragment in rank order at `outer_wire`, and take torch's
Nesterov SGD step on θ_g (OpenDiLoCo's and torchft's outer optimizer), which every rank then
adopts. `overlap_outer` delivers the outer step one inner step late, keeping the inner step taken
meanwhile (DiLoCoX's one-step delay). python/tests/test_torch_scape_vs_core.py holds it to the
core on a recorded trace. `inner` may also be a torch optimizer of the user's (an instance over
the same parameters, or a function that builds one from them), as torchft's DiLoCo takes one:
its steps are then the inner steps, and DiLoCo adds only the outer step."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import torch

from .adams import INNER_RULES, AdamS
from . import rank_state
from .comm import _split
from .params import closure_loss, trainable_tensors

WIRES = ("fp32", "bf16", "fp8_e5m2")


def fragment_boundaries(ends: List[int], fragments: int) -> List[int]:
    """The flat buffer cut into fragments at the tensor boundaries nearest to f·N/F (ties to the
    lower); when that leaves a fragment empty, at ⌊f·N/F⌋ (the core's fragment_boundaries)."""
    n = ends[-1] if ends else 0
    if fragments < 1 or n < fragments:
        raise ValueError(f"streaming_fragments: {fragments} fragments of a model of {n} parameters")
    edges = [0] + list(ends)
    bounds = [0] * (fragments + 1)
    bounds[fragments] = n
    aligned = True
    for f in range(1, fragments):
        target = f * n / fragments
        best = 0
        for edge in edges:
            if abs(edge - target) < abs(best - target):
                best = edge
        bounds[f] = best
        aligned = aligned and bounds[f] > bounds[f - 1]
    aligned = aligned and bounds[fragments] > bounds[fragments - 1]
    if not aligned:
        bounds = [f * n // fragments for f in range(fragments)] + [n]
    return bounds


def fragment_synced_at(step: int, inner_steps: int, fragments: int) -> int:
    """The fragment synced at `step` (-1: none): f at the steps t with t mod H = ⌊(f+1)H/F⌋ mod H."""
    if step < 1:
        return -1
    phase = step % inner_steps
    for f in range(fragments):
        if (f + 1) * inner_steps // fragments % inner_steps == phase:
            return f
    return -1


def torch_inner_optimizer(inner, params) -> torch.optim.Optimizer:
    """`inner` as a torch optimizer over exactly `params` (a list of tensors, or of param-group
    dicts): an instance is checked, a function is called with the tensors."""
    tensors = [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]
    if isinstance(inner, torch.optim.Optimizer):
        optimizer = inner
    elif callable(inner):
        optimizer = inner(tensors)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"inner: the function returned a {type(optimizer).__name__}, not a torch optimizer")
    else:
        raise ValueError(f"inner: expected 'adams', 'adamw', a torch optimizer or a function making one, got "
                         f"{type(inner).__name__}")
    if isinstance(optimizer, AdamS):
        raise ValueError("inner: a scape.torch optimizer communicates over its group; give the rule as "
                         "inner='adams' or 'adamw', or a torch optimizer")
    theirs = [id(p) for g in optimizer.param_groups for p in g["params"]]
    if sorted(theirs) != sorted(id(p) for p in tensors):
        raise ValueError(f"inner: the torch optimizer holds {len(theirs)} tensors, not exactly DiLoCo's "
                         f"{len(tensors)} parameters")
    return optimizer


class DiLoCo(AdamS):
    """DiLoCo (and Streaming DiLoCo, `streaming_fragments` > 1) on this rank of `group`, with
    AdamS or AdamW inner steps (lr, betas, eps, weight_decay as AdamS's).

    inner            "adams" (default) or "adamw" (the core's AdamW: a second moment, exp_avg_sq,
                     kept per rank beside exp_avg); or a torch optimizer over exactly these
                     parameters (an instance, or a function from the list of parameters to one):
                     its step() is the inner step and its learning rate, schedule and state its
                     own (lr, betas, eps and weight_decay here are then unused; lr defaults to
                     its first group's for last_metrics); state_dict carries its state
                     ("inner_optimizer") for a bit-identical resume
    inner_steps      H, the steps between two syncs of a fragment (default 10)
    outer_lr, outer_momentum   α and μ of the outer Nesterov SGD (defaults 0.7, 0.9)
    outer_wire       "fp32", "bf16" (Δ_i and the mean rounded to bf16) or "fp8_e5m2" (a shared
                     power-of-two scale, one byte a value, no error feedback)
    streaming_fragments   F <= H fragments, each synced once every H steps at its own offset
    overlap_outer    deliver each outer step after the next inner step
    total_steps      the run's length: its last step delivers a delayed outer step at once
    The parameters of the ranks differ between syncs: each rank saves its own state_dict (and
    its own model)."""

    def __init__(self, params, lr: Optional[float] = None, betas=(0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.1, *, inner: Any = "adams", inner_steps: int = 10, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 outer_wire: str = "fp32", streaming_fragments: int = 1, overlap_outer: bool = False,
                 total_steps: Optional[int] = None, bias_correction: bool = True, broadcast_params: bool = True,
                 group=None):
        params = list(params)
        self._torch_inner = None
        if isinstance(inner, str):
            if inner not in INNER_RULES:
                raise ValueError(f"inner: expected one of {', '.join(map(repr, INNER_RULES))} or a torch optimizer, "
                                 f"got {inner!r}")
            self._inner_rule = inner
        else:
            self._torch_inner = torch_inner_optimizer(inner, params)
            self._inner_rule = "adams"  # the flat state AdamS keeps; a torch inner never steps it
            if lr is None:
                lr = float(self._torch_inner.param_groups[0]["lr"])
        if lr is None:
            raise ValueError(f"lr: required with inner = {inner!r} (the inner AdamS/AdamW steps' rate)")
        for name, value in (("inner_steps", inner_steps), ("streaming_fragments", streaming_fragments)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if streaming_fragments > inner_steps:
            raise ValueError(f"streaming_fragments: {streaming_fragments} fragments need inner_steps >= "
                             f"{streaming_fragments}, got {inner_steps}")
        if not outer_lr > 0:
            raise ValueError(f"outer_lr: must be > 0, got {outer_lr}")
        if not 0.0 <= outer_momentum < 1.0:
            raise ValueError(f"outer_momentum: must lie in [0, 1), got {outer_momentum}")
        if outer_wire not in WIRES:
            raise ValueError(f"outer_wire: expected one of {', '.join(map(repr, WIRES))}, got {outer_wire!r}")
        if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                        or total_steps < 1):
            raise ValueError(f"total_steps: a positive integer or None, got {total_steps!r}")
        self.inner_steps, self.outer_lr, self.outer_momentum = inner_steps, float(outer_lr), float(outer_momentum)
        self.outer_wire, self.fragments, self.overlap_outer = outer_wire, streaming_fragments, bool(overlap_outer)
        self.total_steps = total_steps
        super().__init__(params, lr, betas, eps, weight_decay, bias_correction=bias_correction,
                         broadcast_params=broadcast_params, group=group)
        self.bounds = fragment_boundaries([b for _, b in self._ranges], self.fragments)
        self._global = self._theta.clone()        # θ_g, the same on every rank
        self._outer_m = torch.zeros_like(self._theta)  # the outer momentum buffer b
        self._snapshot = torch.zeros_like(self._theta) if self.overlap_outer else None
        self._global_set = False
        if self._torch_inner is not None:
            self._unused_lrs = [g["lr"] for g in self.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        if self._torch_inner is None:
            return self._adams_step(closure)
        return self._step_with_torch_inner(closure)

    def _step_with_torch_inner(self, closure):
        """The user's optimizer takes the inner step on the parameters; the outer step then runs
        on the flat copy, as after an AdamS inner step. DiLoCo takes GradScaler's scale itself
        (rather than letting the scaler skip step()), so that a step skipped on one rank still
        counts in its sync schedule."""
        loss = closure_loss(closure)
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        if [g["lr"] for g in self.param_groups] != self._unused_lrs:
            raise ValueError(f"step {self._t + 1}: DiLoCo's lr was changed (a scheduler on DiLoCo?), but with a "
                             f"torch optimizer as inner its own lr is the inner steps': schedule the inner optimizer")
        self._sync_layout()
        grads = [p.grad for p in self._tensors if p.grad is not None]
        scaled = found_inf is not None or grad_scale is not None
        overflow = bool(found_inf.gt(0).any()) if found_inf is not None else False
        if not scaled and grads and not all(bool(torch.isfinite(g).all()) for g in grads):
            from .scape_optimizer import NonFiniteGradient
            raise NonFiniteGradient(f"step {self._t + 1}: a gradient holds inf or NaN on this rank; nothing was "
                                    f"updated")
        if self._t == 0 and not self._global_set:
            self.mirror.pull()
            self._global.copy_(self._theta)
            self._global_set = True
        if overflow:
            self.skipped_steps += 1
        else:
            if grad_scale is not None and grads:
                torch._foreach_mul_(grads, grad_scale.double().reciprocal().float().to(grads[0].device))
            self._torch_inner.step()
        self.mirror.pull()
        self._close_step(self._t + 1, float(self._torch_inner.param_groups[0]["lr"]))
        return loss

    def _after_skipped_step(self) -> None:
        """A GradScaler skipped this rank's inner step: its gradient overflowed here, and inner
        steps share nothing, so the other ranks may have stepped. The step still counts in the
        sync schedule, so that every rank's outer syncs stay paired step for step."""
        self._close_step(self._t + 1, float(self.param_groups[0]["lr"]))

    def _close_step(self, t: int, lr: float) -> None:
        """Step t's outer step when its turn has come, the parameters pushed and the metrics kept."""
        extra = self._after_update(t)
        self.mirror.push()
        count = self.comm.take_count()
        self._last = {"step": t, "lr": lr, "bytes_sent": count.sent, "bytes_received": count.received,
                      "mask_density": 1.0, **count.metrics(), **extra}
        self._t = t
        self._step_count.fill_(float(t))

    # Between syncs each rank's inner moments and parameters are its own.
    _per_rank_state = True

    def _state_dict(self) -> Dict[str, Any]:
        out = super()._state_dict()
        if self._torch_inner is not None:
            end = rank_state.suffix(self.comm.rank, self.comm.size)
            inner = self._torch_inner.state_dict()
            out["inner_optimizer" + end] = inner
            # How many tensors' inner state there is: torch.distributed.checkpoint fills only the
            # entries its target already has, and a fresh torch optimizer has none until it steps.
            out["inner_optimizer_entries" + end] = len(inner.get("state", {}))
        return out

    def _load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if isinstance(state_dict, dict):
            inner = {k: v for k, v in state_dict.items() if k.startswith("inner_optimizer")}
            state_dict = {**{k: v for k, v in state_dict.items() if k not in inner},
                          **rank_state.plain_keys(inner, self.comm.rank, self.comm.size, "inner_optimizer",
                                                  type(self).__name__)}
        if self._torch_inner is not None:
            if not isinstance(state_dict, dict) or "inner_optimizer" not in state_dict:
                raise ValueError("state_dict: no inner_optimizer (saved by a DiLoCo with the adams/adamw inner "
                                 "rule, not a torch optimizer's)")
            state_dict = dict(state_dict)
            inner, saved = state_dict.pop("inner_optimizer"), state_dict.pop("inner_optimizer_entries", None)
            if saved is not None and len(inner.get("state", {})) < int(saved):
                raise ValueError(f"state_dict: inner_optimizer: the checkpoint holds the inner optimizer's state of "
                                 f"{int(saved)} tensors, {len(inner.get('state', {}))} reached it: "
                                 f"torch.distributed.checkpoint fills only the entries its target has, and a fresh "
                                 f"torch optimizer has none before its first step; save this DiLoCo on every rank "
                                 f"with torch.save, or load into one whose inner optimizer has stepped")
            self._torch_inner.load_state_dict(inner)
        elif isinstance(state_dict, dict) and "inner_optimizer" in state_dict:
            raise ValueError(f"state_dict: saved with a torch optimizer as inner; this DiLoCo's inner rule is "
                             f"{self._inner_rule!r}")
        super()._load_state_dict(state_dict)

    def _settings(self):
        return super()._settings() + [("inner_steps", self.inner_steps), ("outer_lr", self.outer_lr),
                                      ("outer_momentum", self.outer_momentum), ("outer_wire", self.outer_wire),
                                      ("streaming_fragments", self.fragments),
                                      ("overlap_outer", self.overlap_outer), ("total_steps", self.total_steps)]

    def _sync_layout(self) -> None:
        if [id(p) for p in trainable_tensors(self.param_groups)] != [id(p) for p in self._tensors]:
            raise ValueError(f"DiLoCo: step {self._t + 1}: the tensors that train changed (requires_grad, "
                             f"add_param_group); DiLoCo's fragments and θ_g follow the layout it was built with")

    def _gradient_for_step(self, flags: torch.Tensor):
        """The rank's own gradient: inner steps send nothing. A fresh run's θ_g is θ_0, the
        parameters as they are at the first step."""
        if self._t == 0 and not self._global_set:
            self._global.copy_(self._theta)
            self._global_set = True
        return self._g, flags.view(1, -1)

    def _after_update(self, t: int) -> Dict[str, float]:
        if self.overlap_outer and t > 1:
            late = fragment_synced_at(t - 1, self.inner_steps, self.fragments)
            if late >= 0:
                self._deliver_late(self.bounds[late], self.bounds[late + 1])
        f = fragment_synced_at(t, self.inner_steps, self.fragments)
        if f < 0:
            return {"pseudo_grad_norm": float("nan"), "param_drift": float("nan")}
        lo, hi = self.bounds[f], self.bounds[f + 1]
        metrics = self._outer_step(lo, hi)
        if self.overlap_outer and t != self.total_steps:
            self._snapshot[lo:hi] = self._theta[lo:hi]
        else:
            self._theta[lo:hi] = self._global[lo:hi]
        return metrics

    def _deliver_late(self, lo: int, hi: int) -> None:
        """θ_i ← θ_g + (θ_i − s_i) on the fragment: the inner step taken meanwhile is kept."""
        local_step = torch.neg(self._snapshot[lo:hi]).add_(self._theta[lo:hi])
        self._theta[lo:hi] = self._global[lo:hi]
        self._theta[lo:hi].add_(local_step)

    def _outer_step(self, lo: int, hi: int) -> Dict[str, float]:
        delta = torch.neg(self._theta[lo:hi]).add_(self._global[lo:hi])   # Δ_i = θ_g − θ_i
        mean = self._wire_mean(delta)
        drift = torch.neg(delta).add_(mean)
        mu = torch.tensor(self.outer_momentum, dtype=torch.float32).item()
        buf = self._outer_m[lo:hi]
        buf.mul_(mu).add_(mean)                                           # b ← μ b + Δ̄
        update = torch.mul(buf, mu).add_(mean)                             # u = Δ̄ + μ b
        update.mul_(-torch.tensor(self.outer_lr, dtype=torch.float32).item())
        self._global[lo:hi].add_(update)                                   # θ_g ← θ_g − α u
        return {"pseudo_grad_norm": float(torch.linalg.vector_norm(delta)),
                "param_drift": float(torch.linalg.vector_norm(drift))}

    def _wire_mean(self, delta: torch.Tensor) -> torch.Tensor:
        """The rank-order mean of every rank's Δ at the outer wire, in fp32 sums."""
        comm, w = self.comm, self.comm.size
        if self.outer_wire == "fp32":
            return comm.all_reduce_mean(delta, "outer_all_reduce")[0]
        scale = 1.0
        if self.outer_wire == "bf16":
            send = delta.bfloat16()
        else:
            peaks, _ = comm.all_gather_uneven(delta.abs().max().reshape(1) if delta.numel() else delta.new_zeros(1),
                                              [1] * w, "outer_scale_all_gather")
            peak = float(peaks.max())
            exponent = max(math.frexp(peak)[1] - 1 - 14, -126) if peak > 0 else 0
            scale = math.ldexp(1.0, exponent)
            send = torch.mul(delta, math.ldexp(1.0, -exponent)).to(torch.float8_e5m2).view(torch.uint8)
        counts = _split(delta.numel(), w)
        recv, _ = comm.all_to_all(send, counts, [counts[comm.rank]] * w, "outer_all_reduce")
        wire = torch.bfloat16 if self.outer_wire == "bf16" else torch.float8_e5m2
        rows = recv.view(wire).float().view(w, counts[comm.rank])
        mean = rows[0].clone()
        for r in range(1, w):
            mean.add_(rows[r])
        mean.div_(float(w))
        if self.outer_wire == "bf16":
            mean = mean.bfloat16()
        if w > 1:
            mean, _ = comm.all_gather_uneven(mean, counts, "outer_all_reduce")
        return mean.float().mul_(scale) if scale != 1.0 else mean.float()

    def config(self) -> Dict[str, Any]:
        out = super().config()
        inner = self._inner_rule if self._torch_inner is None else type(self._torch_inner).__name__
        out.update(type="diloco", inner=inner, inner_steps=self.inner_steps, outer_lr=self.outer_lr,
                   outer_momentum=self.outer_momentum, outer_wire=self.outer_wire,
                   streaming_fragments=self.fragments, overlap_outer=self.overlap_outer)
        return out

    def _extra_state(self, a: int, b: int, shape) -> Dict[str, Any]:
        """θ_g, the outer momentum, the delayed step's snapshot of the tensor and the rank's own
        parameters (between syncs they differ from the other ranks', and a checkpoint of the
        model through torch.distributed.checkpoint keeps one rank's: loading this state after the
        model's puts this rank's back)."""
        out = {"outer_global": self._global[a:b].view(shape).clone(),
               "outer_momentum": self._outer_m[a:b].view(shape).clone(),
               "outer_global_set": torch.tensor(self._global_set),
               "local_params": self._theta[a:b].view(shape).clone()}
        if self._snapshot is not None:
            out["outer_snapshot"] = self._snapshot[a:b].view(shape).clone()
        return out

    def _load_extra_state(self, entry: Dict[str, Any], a: int, b: int) -> None:
        for key, target in (("outer_global", self._global), ("outer_momentum", self._outer_m),
                            ("outer_snapshot", self._snapshot)):
            if target is None:
                continue
            if key not in entry:
                raise ValueError(f"state_dict: no {key} (not a scape.torch.DiLoCo state, or saved without "
                                 f"overlap_outer)")
            target[a:b] = entry[key].reshape(-1).to(self.device, torch.float32)
        if "local_params" in entry:  # a state saved before it kept them has the model's
            self._theta[a:b] = entry["local_params"].reshape(-1).to(self.device, torch.float32)
        self._global_set = bool(entry.get("outer_global_set", True))
