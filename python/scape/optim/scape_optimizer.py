"""scape.torch.SCAPE: the SCAPE optimizer (AdamS with sparse first-moment communication) as a
torch.optim.Optimizer in torch ops only, on any device and any torch.distributed process group.

It computes the C++ core's `paper` formulation (docs/algorithms.md, "The paper formulation,
one step"); the numbered comments below are that section's steps. The C++ core is its
reference: python/tests/test_torch_scape_vs_core.py holds the two together on recorded
gradient traces. The collectives and their byte counts are in comm.py, the selection and the
packed mask in masks.py, the layout and owners in layout.py, the backward-overlapped sparse
reduce in overlap.py, checkpoints in checkpoint.py."""
from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from . import checkpoint
from .arith import AdamScalars, adams_update, decay_factor, f32
from .comm import Group
from .layout import FlatLayout, Slot
from .fp8 import Fp8Payload
from .masks import merge_segments, pack_positions, packed_positions, topk_indices, unpack_bits
from .metrics import StepMetrics
from .params import check_tensors, flat_masters, normalize_groups, write_back
from .schedule import DensitySchedule, k_piece

FORMULATIONS = ("paper",)
DEFAULT_DENSE_TENSORS = ("norm", "bias")


class NonFiniteGradient(FloatingPointError):
    """A step whose gradients hold inf or NaN on some rank, without a GradScaler to skip it."""


def _check_switch(value, name: str, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, allowed))}, got {value!r}")


class SCAPE(torch.optim.Optimizer):
    """SCAPE on this rank of `group` (the default group when torch.distributed is initialized,
    else a group of one).

    params          model.parameters(), model.named_parameters() (names in `dense_tensors` are
                    sent dense, matrices decayed), or param groups with lr, weight_decay and
                    sparsity (0 = dense)
    lr, betas, eps, weight_decay   AdamS's (defaults as the core: 0.9, 0.95, 1e-8, 0.1)
    sparsity        fraction of the first moment NOT sent, in [0, 1) (0.99: 1% sent)
    mask_lag        1: the mask of step t+1 is chosen at step t and all-gathered behind the next
                    forward and backward pass; 0: chosen and gathered inside the step
    residual, residual_decay   error feedback of what was not sent (off, or faded by gamma)
    clip_grad       global-norm clipping of the reconstructed gradient (0 = off)
    density_warmup, density_start, density_cooldown, density_cooldown_start   the density schedule
    sharded         False: every rank keeps the first moment (replicated); True: ZeRO-1 style,
                    each rank keeps it for its shard of the flat layout and parameters are
                    re-gathered
    overlap_backward  pack and reduce each tensor's selected values as its gradient is ready,
                    during backward (needs mask_lag 1; see overlap.py)
    bucket_bytes    payload per bucket of overlap_backward
    broadcast_params  start every rank from rank 0's parameters
    total_steps     when given, the last step starts no lagged all-gather (no step would use it);
                    otherwise call finish() before destroying the process group
    wire_dtype      "fp32", or "fp8_e5m2": the payload one byte a value with the core's shared
                    scale, the rounding error kept in the residual (replicated state only)
    """

    _step_supports_amp_scaling = True  # GradScaler hands grad_scale and found_inf to step()

    def __init__(self, params, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1,
                 sparsity: float = 0.99, *, formulation: str = "paper", mask_lag: int = 1, residual: bool = True,
                 residual_decay: float = 1.0, clip_grad: float = 0.0, density_warmup: int = 0,
                 density_start: float = 1.0, density_cooldown: int = 0, density_cooldown_start: int = 0,
                 sharded: bool = False, dense_tensors: Sequence[str] = DEFAULT_DENSE_TENSORS,
                 bias_correction: bool = True, overlap_backward: bool = False, bucket_bytes: int = 25_000_000,
                 broadcast_params: bool = True, total_steps: Optional[int] = None, wire_dtype: str = "fp32",
                 group=None):
        _check_switch(formulation, "formulation", FORMULATIONS)
        _check_switch(mask_lag, "mask_lag", (0, 1))
        _check_switch(bool(residual), "residual", (True, False))
        _check_switch(wire_dtype, "wire_dtype", ("fp32", "fp8_e5m2"))
        if wire_dtype == "fp8_e5m2" and (sharded or overlap_backward):
            raise ValueError("wire_dtype: fp8_e5m2 needs sharded=False and overlap_backward=False (the core's fp8 "
                             "payload is replicated state's)")
        try:
            beta1, beta2 = (float(b) for b in betas)
        except (TypeError, ValueError):
            raise ValueError(f"betas: expected two numbers, got {betas!r}") from None
        for name, value in (("betas[0]", beta1), ("betas[1]", beta2)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name}: must lie in [0, 1), got {value}")
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
        defaults = dict(lr=lr, weight_decay=weight_decay, sparsity=sparsity)
        groups = normalize_groups(params, defaults, list(dense_tensors))
        self.device = check_tensors(groups)
        super().__init__(groups, defaults)
        self.beta1, self.beta2, self.eps = beta1, beta2, float(eps)
        self.mask_lag, self.residual, self.residual_decay = mask_lag, bool(residual), float(residual_decay)
        self.clip_grad, self.sharded, self.bias_correction = float(clip_grad), bool(sharded), bool(bias_correction)
        self.density = DensitySchedule(density_warmup, float(density_start), density_cooldown, density_cooldown_start)
        self.total_steps = total_steps
        self.fp8 = Fp8Payload() if wire_dtype == "fp8_e5m2" else None
        self._fp8_step = None  # this step's (undelivered error, exponent) until it is kept
        self.comm = Group(group)
        self._build_layout()
        self._allocate_state()
        if broadcast_params:
            self.comm.broadcast_from_first(self._theta)
            self._write_back_params()
        self._t = 0
        self.skipped_steps = 0
        self._mask: Optional[torch.Tensor] = None      # packed M_t
        self._mask_rho: Optional[List[float]] = None   # per-group density M_t was drawn at
        self._next: Optional[Dict[str, Any]] = None    # the lagged all-gather of M_{t+1}
        self._previous_mask: Optional[torch.Tensor] = None
        self._previous_size = 0
        self._metrics: Optional[StepMetrics] = None
        # Seconds of the last step: before the update (candidate, mask, collective), waiting for
        # the mask all-gather, and in the payload's collective (after backward, when overlapped).
        self._exposed = self._mask_wait = self._grad_wait = 0.0
        self._frozen: List[int] = []  # slots without a gradient on any rank this step
        self.overlap = None
        if overlap_backward:
            from .overlap import BackwardOverlap
            self.overlap = BackwardOverlap(self, bucket_bytes)

    # ----- layout and state -------------------------------------------------------------------
    def _build_layout(self) -> None:
        slots, tensors, at = [], [], 0
        self._group_bounds = []
        for gi, g in enumerate(self.param_groups):
            first = at
            for name, p in zip(g["names"], g["params"]):
                if not p.requires_grad:
                    continue
                slots.append(Slot(name, at, p.numel(), gi, g["sparsity"] == 0.0))
                tensors.append(p)
                at += p.numel()
            self._group_bounds.append((first, at))
        self.layout = FlatLayout(slots, self.comm.size, self.sharded)
        self._tensors = tensors
        self._own_range = self.layout.owner_ranges[self.comm.rank]
        self._state_range = (self.layout.shard_ranges[self.comm.rank] if self.sharded else (0, self.layout.n))

    def _allocate_state(self) -> None:
        n, dev = self.layout.n, self.device
        self._theta, self._low_precision = flat_masters(self._tensors, dev)
        lo, hi = self._state_range
        self._m = torch.zeros(hi - lo, dtype=torch.float32, device=dev)
        self._e = torch.zeros(n if self.residual else 0, dtype=torch.float32, device=dev)
        carries = self.sharded and self.residual and self.residual_decay > 0
        self._q = torch.zeros(hi - lo if carries else 0, dtype=torch.float32, device=dev)
        # Workspaces, not state: the step's gradient and its candidate, which then trades places
        # with the residual (a CPU allocation of N floats a step would fault every page in anew).
        self._work_g = torch.empty(n, dtype=torch.float32, device=dev)
        self._spare = torch.empty(n, dtype=torch.float32, device=dev)

    def _write_back_params(self) -> None:
        write_back(self._low_precision)

    def state_bytes_per_parameter(self) -> float:
        """Bytes of optimizer state per parameter on this rank, everything the step keeps
        between steps: first moment, residual, carried momentum, fp32 masters of non-fp32
        parameters and the packed masks (docs/python.md, "State")."""
        n = self.layout.n
        total = (self._m.numel() + self._e.numel() + self._q.numel()) * 4
        total += sum(view.numel() for _, view in self._low_precision) * 4
        total += 3 * self.layout.mask_byte_count  # M_t, M_{t+1} in flight, the previous mask
        return total / n

    # ----- the step ---------------------------------------------------------------------------
    def _rho(self, t: int) -> List[float]:
        return [self.density.density(1.0 - g["sparsity"], t) for g in self.param_groups]

    def _owner_k(self, rho: List[float]) -> List[int]:
        ks = []
        for pieces in self.layout.pieces:
            ks.append(sum(p.size if p.dense else k_piece(rho[self.layout.slots[p.slot].group], p.size)
                          for p in pieces))
        return ks

    def _flat_grads(self, grad_scale: Optional[torch.Tensor]) -> torch.Tensor:
        """This step's local gradient in layout order, unscaled (in the reused workspace)."""
        g = self._work_g
        for slot, p in zip(self.layout.slots, self._tensors):
            part = g[slot.offset:slot.end]
            if p.grad is None:
                part.zero_()
            else:
                part.copy_(p.grad.reshape(-1))
        if grad_scale is not None:
            g.mul_(grad_scale.double().reciprocal().float().to(g.device))
        return g

    def _candidate(self, g: torch.Tensor) -> torch.Tensor:
        """Step 1: c = (b1 m_prev + (1-b1) g) + e (replicated); a = (1-b1) g + e (sharded, where
        the owner adds b1 m_prev and the carried momentum after the reduction)."""
        c = self._spare
        g.mul_(f32(1.0 - self.beta1))
        if self.sharded:
            c.copy_(g)
        else:
            torch.mul(self._m, f32(self.beta1), out=c).add_(g)
        if self.residual:
            c.add_(self._e)
        return c

    def _statistic(self, c: torch.Tensor) -> torch.Tensor:
        """Step 9's ranking statistic over the own range: c itself (replicated), or the owner's
        candidate (b1 m_prev + a) + q (sharded)."""
        lo, hi = self._own_range
        if not self.sharded:
            return c[lo:hi]
        stat = torch.mul(self._m, f32(self.beta1)).add_(c[lo:hi])
        if self._q.numel():
            stat.add_(self._q)
        return stat

    def _select(self, stat: torch.Tensor, rho: List[float]) -> torch.Tensor:
        """This owner's bits of the mask at densities rho, packed as its byte segment."""
        lo, hi = self._own_range
        pieces = self.layout.pieces[self.comm.rank]
        sparse = [p for p in pieces if not p.dense]
        picks = topk_indices([stat[p.begin - lo:p.end - lo] for p in sparse],
                             [k_piece(rho[self.layout.slots[p.slot].group], p.size) for p in sparse])
        positions = [chosen + p.begin for p, chosen in zip(sparse, picks)]
        positions += [torch.arange(p.begin, p.end, device=self.device) for p in pieces if p.dense]
        first, end = self.layout.mask_bytes(self.comm.rank)
        if not positions:
            return torch.zeros(end - first, dtype=torch.uint8, device=self.device)
        return pack_positions(torch.cat(positions), first, end - first)

    def _gather_mask(self, segment: torch.Tensor, rho: List[float], async_op: bool) -> Dict[str, Any]:
        ranges = [self.layout.mask_bytes(w) for w in range(self.comm.size)]
        recv, work = self.comm.all_gather_uneven(segment, [hi - lo for lo, hi in ranges], "mask_all_gather",
                                                 async_op=async_op)
        return {"recv": recv, "work": work, "ranges": ranges, "rho": rho}

    def _complete_mask(self, pending: Dict[str, Any]) -> None:
        if pending["work"] is not None:
            pending["work"].wait()
        self._mask = merge_segments(pending["recv"], pending["ranges"], self.layout.mask_byte_count)
        self._mask_rho = pending["rho"]

    def finish(self) -> None:
        """Waits for the lagged mask all-gather still in flight after the last step. Call it
        before destroying the process group: a rank that tears the group down while a peer's
        part of that collective is still on the wire makes the peer abort. (state_dict() waits
        too; with total_steps the last step starts none.)"""
        self._wait_next_mask()

    def _wait_next_mask(self) -> None:
        """Completes the lagged all-gather (the start of step t+1, or a checkpoint)."""
        if self._next is not None:
            pending, self._next = self._next, None
            self._complete_mask(pending)

    def _mask_indices(self) -> torch.Tensor:
        return packed_positions(self._mask)

    def _shard_counts(self, idx: torch.Tensor) -> List[int]:
        if not self.sharded:
            return []
        return self._owner_k(self._mask_rho)

    @torch.no_grad()
    def step(self, closure=None):
        """One SCAPE step on this rank's local gradients: a collective over the group. A missing
        .grad counts as zeros. Under GradScaler a step whose gradients are not finite on any
        rank is skipped on every rank; without one it raises NonFiniteGradient on every rank,
        naming the step, with nothing changed."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        scaled = found_inf is not None or grad_scale is not None
        started = time.perf_counter()
        if self.overlap is not None and self.overlap.in_flight():
            if scaled:
                self.overlap.abandon()
                raise ValueError("overlap_backward: the payload left during backward, before GradScaler unscaled "
                                 "the gradients; use overlap_backward=False with a GradScaler")
            t, c, idx, reduced, flags = self.overlap.finish()
            self._mask_wait, self._grad_wait = self.overlap.mask_wait, self.overlap.last_waited
            stat = None
        else:
            if self.overlap is not None:
                self.overlap.abandon()
            t, c, stat, idx, reduced, flags = self._exchange(grad_scale, found_inf)
        self._exposed = time.perf_counter() - started
        if self._agreed_skip(flags, t, scaled):
            return loss
        self._finish_step(t, c, stat, idx, reduced)
        return loss

    def _exchange(self, grad_scale, found_inf):
        """Steps 1-3 after backward: the candidate, the mask (received, or chosen now), the
        one collective on it."""
        t = self._t + 1
        g = self._flat_grads(grad_scale)
        local_bad = (found_inf.to(self.device).float().reshape(1).clamp(max=1.0) if found_inf is not None
                     else (~torch.isfinite(g.sum())).float().reshape(1))  # inf and NaN survive a sum
        local_bad = torch.cat((local_bad, self._has_grad()))
        mask_known = self.mask_lag == 1 and t > 1
        waited = time.perf_counter()
        if mask_known:
            self._wait_next_mask()
        self._mask_wait = time.perf_counter() - waited
        c = self._candidate(g)
        del g
        stat = None
        if not mask_known:
            stat = self._statistic(c)
            rho = self._rho(t)
            segment = self._select(stat, rho)
            waited = time.perf_counter()
            self._complete_mask(self._gather_mask(segment, rho, async_op=False))
            self._mask_wait = time.perf_counter() - waited
        idx = self._mask_indices()
        waited = time.perf_counter()
        reduced, flags = self._reduce(c, idx, local_bad, t)
        self._grad_wait = time.perf_counter() - waited
        return t, c, stat, idx, reduced, flags

    def _has_grad(self) -> torch.Tensor:
        return torch.tensor([p.grad is not None for p in self._tensors], dtype=torch.float32, device=self.device)

    def _reduce(self, c: torch.Tensor, idx: torch.Tensor, flag: torch.Tensor, t: int):
        """Step 3: one collective on the mask positions, in mask order, with this rank's flags
        riding beside the payload: non-finite gradients, then which tensors have a gradient."""
        payload = c.index_select(0, idx)
        if self.fp8 is not None:
            b_bar, flags, error, exponent = self.fp8.reduce(self.comm, payload, t, flag)
            self._fp8_step = (error, exponent)
            return b_bar, flags
        if self.sharded:
            return self.comm.reduce_scatter_mean(payload, self._shard_counts(idx), "grad_reduce_scatter", flag)
        return self.comm.all_reduce_mean(payload, "grad_all_reduce", flag)

    def _agreed_skip(self, flags: torch.Tensor, t: int, scaled: bool) -> bool:
        self._frozen = [j for j, count in enumerate(flags[:, 1:].sum(dim=0).tolist()) if count == 0]
        bad = flags[:, 0].gt(0)
        if not bool(bad.any()):
            return False
        ranks = bad.nonzero().view(-1).tolist()
        # M_t stays the mask of the next step: nothing of this step happened.
        self._metrics, self._fp8_step = None, None
        if scaled:
            self.skipped_steps += 1
            return True
        raise NonFiniteGradient(f"step {t}: a gradient holds inf or NaN on rank(s) {ranks} of the group; "
                                f"nothing was updated (use a GradScaler to skip such steps, or lower the lr)")

    def _finish_step(self, t: int, c: torch.Tensor, stat: Optional[torch.Tensor], idx: torch.Tensor,
                     b_bar: torch.Tensor) -> None:
        """Steps 4-9 once the payload is reduced: b_bar is the mean on the mask (the own part
        of it when sharded)."""
        lo, hi = self._state_range
        b1, omb1 = f32(self.beta1), f32(1.0 - self.beta1)
        kept = self._keep_untouched(self._frozen)
        # Step 9, from m_prev and q before this step changes them (none after the last step).
        if self.mask_lag == 1 and t != self.total_steps:
            if stat is None:
                stat = self._statistic(c)
            rho_next = self._rho(t + 1)
            self._next = self._gather_mask(self._select(stat, rho_next), rho_next, async_op=True)
        if self.sharded:
            counts = self._shard_counts(idx)
            first = sum(counts[:self.comm.rank])
            own_idx = idx[first:first + counts[self.comm.rank]]
            local = own_idx - lo
        else:
            own_idx = local = idx
        m_prev = self._m.index_select(0, local)
        if self.sharded:
            b_bar.add_(torch.mul(m_prev, b1))
            if self._q.numel():
                b_bar.add_(self._q.index_select(0, local))
        self._keep_residual(c, idx)                                   # step 4
        if self._fp8_step is not None:  # the exponent holds; the rounding error stays behind
            error, self.fp8.exponent = self._fp8_step
            self.fp8.scaled, self._fp8_step = True, None
            if self.residual and self.residual_decay > 0:
                self._e.index_copy_(0, idx, error)
        g_hat = torch.sub(b_bar, torch.mul(m_prev, b1)).div_(omb1)    # step 5
        clip_factor = self._clip(g_hat, m_prev, b_bar, b1, omb1)      # step 6
        if self._q.numel():                                           # step 4 for the owner's q
            self._q.add_(torch.mul(self._m, b1))
            if self.residual_decay != 1.0:
                self._q.mul_(f32(self.residual_decay))
            self._q.index_fill_(0, local, 0.0)
        self._update(t, own_idx, local, m_prev, b_bar, g_hat)         # step 7
        if self.sharded:                                              # step 8
            values, _ = self.comm.all_gather_uneven(self._theta.index_select(0, own_idx), counts,
                                                    "param_all_gather")
            self._theta.index_copy_(0, idx, values)
        self._restore_untouched(kept)
        self._write_back_params()
        self._metrics = StepMetrics.collect(self, t, idx, clip_factor)
        self._metrics.extra.update(mask_wait_exposed=self._mask_wait, grad_wait_exposed=self._grad_wait,
                                   step_exchange_time=self._exposed)
        self._previous_mask, self._previous_size = self._mask, int(idx.numel())
        self._t = t

    def _keep_untouched(self, slots: List[int]):
        """A tensor without a gradient on any rank is skipped as torch's optimizers skip it: its
        parameter (no decay), first moment and residual stay as they were."""
        lo, hi = self._state_range
        kept = []
        for j in slots:
            s = self.layout.slots[j]
            a, b = max(s.offset, lo), min(s.end, hi)
            kept.append((s, self._theta[s.offset:s.end].clone(),
                         self._e[s.offset:s.end].clone() if self._e.numel() else None,
                         (a, b, self._m[a - lo:b - lo].clone(), self._q[a - lo:b - lo].clone() if self._q.numel() else None)
                         if a < b else None))
        return kept

    def _restore_untouched(self, kept) -> None:
        lo = self._state_range[0]
        for s, theta, e, state in kept:
            self._theta[s.offset:s.end] = theta
            if e is not None:
                self._e[s.offset:s.end] = e
            if state is not None:
                a, b, m, q = state
                self._m[a - lo:b - lo] = m
                if q is not None:
                    self._q[a - lo:b - lo] = q

    def _keep_residual(self, c: torch.Tensor, idx: torch.Tensor) -> None:
        if not self.residual:
            return
        if self.residual_decay == 0.0:
            self._e.zero_()
            return
        self._e, self._spare = c, self._e  # c becomes the residual; the old one the next workspace
        self._e.index_fill_(0, idx, 0.0)
        if f32(self.residual_decay) != 1.0:
            self._e.mul_(f32(self.residual_decay))

    def _clip(self, g_hat, m_prev, b_bar, b1: float, omb1: float) -> float:
        if self.clip_grad <= 0:
            return 1.0
        total = g_hat.double().square().sum()
        if self.sharded and self.comm.size > 1:
            parts = self.comm.all_gather_scalars(total, "clip_norm_all_gather")
            total = parts[0].clone()
            for r in range(1, parts.numel()):
                total += parts[r]
        factor = self.clip_grad / (math.sqrt(float(total)) + 1e-6)
        if factor >= 1.0:
            return 1.0
        g_hat.mul_(f32(factor))
        b_bar.copy_(torch.mul(m_prev, b1).add_(torch.mul(g_hat, omb1)))
        return factor

    def _update(self, t: int, own_idx, local, m_prev, b_bar, g_hat) -> None:
        """Step 7: weight decay on every decayed coordinate of every replica, the AdamS step on
        the mask, m = b_bar on the mask and 0 off it."""
        for (first, end), group in zip(self._group_bounds, self.param_groups):
            if group["weight_decay"] and end > first:
                self._theta[first:end].mul_(decay_factor(group["lr"], group["weight_decay"]))
        cuts = torch.searchsorted(own_idx, torch.tensor([b for b, _ in self._group_bounds[1:]],
                                                        dtype=own_idx.dtype, device=own_idx.device)).tolist()
        edges = [0] + cuts + [own_idx.numel()]
        new_theta = torch.empty_like(b_bar)
        theta_on_mask = self._theta.index_select(0, own_idx)
        for gi, group in enumerate(self.param_groups):
            a, b = edges[gi], edges[gi + 1]
            if b <= a:
                continue
            s = AdamScalars.at(group["lr"], self.beta1, self.beta2, self.eps, t, self.bias_correction)
            new_theta[a:b] = adams_update(theta_on_mask[a:b], m_prev[a:b], b_bar[a:b], g_hat[a:b], s)
        self._theta.index_copy_(0, own_idx, new_theta)
        self._m.zero_()
        self._m.index_copy_(0, local, b_bar)

    # ----- results and checkpoints ------------------------------------------------------------
    @property
    def last_metrics(self) -> Dict[str, float]:
        """This rank's figures of the last step taken (empty before the first, and after a
        skipped one): bytes sent and received (counted from the tensors handed to the
        collectives, by purpose), mask density, Jaccard index with the previous mask,
        residual norm, clip factor."""
        return {} if self._metrics is None else self._metrics.as_dict()

    def config(self) -> Dict[str, Any]:
        """The optimizer section of a run config (docs/configuration.md) for what this optimizer
        computes: the run file records it, and `analysis report` groups runs by it. Per-group
        values are the first sparse group's."""
        sparse = [g for g in self.param_groups if g["sparsity"] > 0] or self.param_groups
        out = {"type": "scape", "formulation": "paper", "inner": "adams", "lr": float(self.defaults["lr"]),
               "sparsity": float(sparse[0]["sparsity"]), "weight_decay": float(sparse[0]["weight_decay"]),
               "betas": [self.beta1, self.beta2], "eps": self.eps, "sharded": self.sharded,
               "mask_lag": self.mask_lag, "residual": self.residual, "mask_encoding": "bitmap",
               "wire_dtype": "fp8_e5m2" if self.fp8 is not None else "fp32"}
        if self.residual_decay != 1.0:
            out["residual_decay"] = self.residual_decay
        if self.clip_grad > 0:
            out["clip_grad"] = self.clip_grad
        if self.density.warmup:
            out.update(density_warmup=self.density.warmup, density_start=self.density.start)
        if self.density.cooldown:
            out.update(density_cooldown=self.density.cooldown, density_cooldown_start=self.density.cooldown_start)
        return out

    @property
    def steps_done(self) -> int:
        return self._t

    def workspace_bytes_per_parameter(self) -> float:
        """Bytes per parameter of the step's reusable workspaces (gradient, candidate)."""
        return (self._work_g.numel() + self._spare.numel()) * 4 / self.layout.n

    def mask_bits(self) -> torch.Tensor:
        """The mask of the last step as bools over the flat layout (empty before step 1)."""
        if self._previous_mask is None:
            return torch.zeros(0, dtype=torch.bool)
        return unpack_bits(self._previous_mask, self.layout.n)

    def flat_params(self) -> torch.Tensor:
        """The fp32 parameters (the masters of low-precision ones) in layout order."""
        return self._theta

    def state_dict(self) -> Dict[str, Any]:
        return checkpoint.save(self)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        checkpoint.load(self, state_dict)
