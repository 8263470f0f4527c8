"""scape.torch.SCAPE: the SCAPE optimizer (AdamS with sparse first-moment communication) as a
torch.optim.Optimizer in torch ops only, on any device and any torch.distributed process group.

It computes the C++ core's `paper` formulation (docs/algorithms.md, "The paper formulation,
one step"); the numbered comments below are that section's steps. The C++ core is its
reference: python/tests/test_torch_scape_vs_core.py holds the two together on recorded
gradient traces. The collectives and their byte counts are in comm.py, the selection and the
packed mask in masks.py, the layout and owners in layout.py, the backward-overlapped sparse
reduce in overlap.py, the per-parameter state and checkpoints in state.py, the check that
every rank built the same optimizer in agreement.py."""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence

import torch

from . import state as state_io
from .agreement import check_agreement
from .arguments import check_arguments, run_config
from .arith import AdamScalars, adams_update, decay_factor, f32
from .comm import Group
from .compiled import candidate_compiled, candidate_in_place
from .layout import FlatLayout, Slot
from .live import LIVE
from .fp8 import Fp8Payload
from .masks import merge_segments, packed_positions, unpack_bits
from .metrics import StepMetrics
from .mirror import ParamMirror
from .protocol import load_state_dict_with_hooks, refuse_copy, state_dict_with_hooks
from .params import (added_group, check_mesh, check_tensors, closure_loss, group_hypers, local_tensor, normalize_groups,
                     read_gradients, refuse_sharded_parameters, shaped_views, trainable_tensors)
from .schedule import DensitySchedule, k_piece
from .selection import RangeSelector

DEFAULT_DENSE_TENSORS = ("norm", "bias")


class NonFiniteGradient(FloatingPointError):
    """A step whose gradients hold inf or NaN on some rank, without a GradScaler to skip it."""


class SCAPE(torch.optim.Optimizer):
    """SCAPE on this rank of `group` (the default group when torch.distributed is initialized,
    else a group of one).

    params          model.parameters(), model.named_parameters() (names in `dense_tensors` are
                    sent dense, matrices decayed), or param groups with lr, weight_decay and
                    sparsity (0 = dense); where names are unknown, tensors of fewer than 2
                    dimensions are sent dense
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
                    otherwise finish() (or interpreter exit) waits for the last one
    wire_dtype      "fp32", or "fp8_e5m2": the payload one byte a value with the core's shared
                    scale, the rounding error kept in the residual (replicated state only)
    mesh            a 2-D DeviceMesh with dims ("inter", "intra") (nodes × ranks a node), the
                    parameters FSDP2's shards inside the node (fully_shard(model,
                    mesh=mesh["intra"])): FSDP2 reduce-scatters and all-gathers inside the node,
                    SCAPE runs between nodes on the local shards, over mesh["inter"] (the
                    core's optimizer.hierarchy = "node" with rail_split = "rows"); instead of
                    `group`
    compile         True: the candidate c = (b1 m + (1-b1) g) + e runs as one kernel fused by
                    torch.compile (one pass over the layout, equal bit for bit to the eager
                    ops; the first step compiles it, seconds to a minute, and needs a C++
                    compiler on the CPU or Triton on a GPU); see docs/python.md, "Speed"
    parameters_as_views  True: each plain fp32 parameter becomes a view of the optimizer's flat
                    fp32 buffer, so the step writes it in place (two copies over the model a step
                    fewer, 4 bytes a parameter freed; mirror.py). The parameters then share one
                    storage: safetensors refuses them and accelerate's save keeps one of them,
                    so save with torch.save or torch.distributed.checkpoint
    """

    _step_supports_amp_scaling = True  # GradScaler hands grad_scale and found_inf to step()

    def __init__(self, params, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1,
                 sparsity: float = 0.99, *, formulation: str = "paper", mask_lag: int = 1, residual: bool = True,
                 residual_decay: float = 1.0, clip_grad: float = 0.0, density_warmup: int = 0,
                 density_start: float = 1.0, density_cooldown: int = 0, density_cooldown_start: int = 0,
                 sharded: bool = False, dense_tensors: Sequence[str] = DEFAULT_DENSE_TENSORS,
                 bias_correction: bool = True, overlap_backward: bool = False, bucket_bytes: int = 25_000_000,
                 broadcast_params: bool = True, total_steps: Optional[int] = None, wire_dtype: str = "fp32",
                 compile: bool = False, parameters_as_views: bool = False, group=None, mesh=None):
        beta1, beta2 = check_arguments(
            formulation=formulation, mask_lag=mask_lag, residual=residual, wire_dtype=wire_dtype, sharded=sharded,
            overlap_backward=overlap_backward, betas=betas, eps=eps, residual_decay=residual_decay,
            clip_grad=clip_grad, density_start=density_start, density_warmup=density_warmup,
            density_cooldown=density_cooldown, density_cooldown_start=density_cooldown_start,
            total_steps=total_steps, bucket_bytes=bucket_bytes, compile=compile,
            parameters_as_views=parameters_as_views)
        defaults = dict(lr=lr, weight_decay=weight_decay, sparsity=sparsity, betas=(beta1, beta2), eps=float(eps))
        self._dense_tensors = list(dense_tensors)
        groups = normalize_groups(params, defaults, self._dense_tensors)
        group = check_mesh(mesh, group, "SCAPE")
        refuse_sharded_parameters(groups, "SCAPE", mesh)
        self.mesh = mesh
        self.device = check_tensors(groups)
        self._ready = False
        super().__init__(groups, defaults)
        self.mask_lag, self.residual, self.residual_decay = mask_lag, bool(residual), float(residual_decay)
        self.clip_grad, self.sharded, self.bias_correction = float(clip_grad), bool(sharded), bool(bias_correction)
        self.density = DensitySchedule(density_warmup, float(density_start), density_cooldown, density_cooldown_start)
        self.total_steps = total_steps
        self.compile_kernels, self.parameters_as_views = bool(compile), bool(parameters_as_views)
        self._fused_candidate = self.compile_kernels and not self.sharded  # torch.compile's kernel
        self.fp8 = Fp8Payload() if wire_dtype == "fp8_e5m2" else None
        self._fp8_step = None  # this step's (undelivered error, exponent) until it is kept
        self.comm = Group(group)
        self._overlap_bucket_bytes = bucket_bytes if overlap_backward else None
        self._t = 0
        self._step_count = torch.tensor(0.0)  # opt.state[p]["step"] of every parameter
        self.skipped_steps = 0
        self._mask: Optional[torch.Tensor] = None      # packed M_t
        self._mask_rho: Optional[List[float]] = None   # per-group density M_t was drawn at
        self._mask_step = 0                            # the step M_t is for (0: none chosen yet)
        self._next: Optional[Dict[str, Any]] = None    # the lagged all-gather of M_{t+1}
        self._previous_mask: Optional[torch.Tensor] = None
        self._previous_size = 0
        self._metrics: Optional[StepMetrics] = None
        # Seconds of the last step before the update, waiting for the mask, in the payload's collective
        self._exposed = self._mask_wait = self._grad_wait = 0.0
        self._frozen: List[int] = []  # slots without a gradient on any rank this step
        self.overlap = None
        self._selector = None  # (the layout it was built for, its RangeSelector)
        self._decay = None       # (layout, the groups' decay factors, theta, its decayed ranges, their factors)
        self._build_layout()
        check_agreement(self.comm, self._settings(), "SCAPE", self.device)
        self._allocate_state()
        if broadcast_params:
            self.comm.broadcast_from_first(self._theta)
            self.mirror.push()
        self._attach_overlap()
        state_io.bind_views(self)
        self._ready = True
        LIVE.add(self)

    beta1 = property(lambda self: group_hypers(self)[0])  # in the param groups, as torch keeps them
    beta2 = property(lambda self: group_hypers(self)[1])
    eps = property(lambda self: group_hypers(self)[2])

    def _settings(self):
        """What every rank of the group must agree on (agreement.py)."""
        layout = [(s.name, s.numel, s.dense, str(p.dtype)) for s, p in zip(self.layout.slots, self._tensors)]
        return [*((f"{key} of each param group", [g[key] for g in self.param_groups])
                  for key in ("lr", "weight_decay", "sparsity")),
                ("layout (name, numel, dense, dtype)", layout),
                ("betas", (self.beta1, self.beta2)), ("eps", self.eps), ("mask_lag", self.mask_lag),
                ("residual", self.residual), ("residual_decay", self.residual_decay), ("clip_grad", self.clip_grad),
                ("sharded", self.sharded), ("bias_correction", self.bias_correction),
                ("density schedule", vars(self.density)), ("total_steps", self.total_steps),
                ("wire_dtype", self.fp8 is not None), ("overlap_backward", self._overlap_bucket_bytes)]

    def _attach_overlap(self) -> None:
        if self.overlap is not None:
            self.overlap.detach()
            self.overlap = None
        if self._overlap_bucket_bytes is not None:
            from .overlap import BackwardOverlap
            self.overlap = BackwardOverlap(self, self._overlap_bucket_bytes)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch's add_param_group; the new tensors join the layout at the next step() (every
        rank must add the same group), whose mask is then chosen inside that step."""
        if not getattr(self, "_ready", False):  # torch.optim.Optimizer.__init__ adding the first groups
            super().add_param_group(param_group)
            return
        group = added_group(param_group, self, self._dense_tensors, "SCAPE")
        super().add_param_group(group)

    # ----- layout and state -------------------------------------------------------------------
    def _build_layout(self) -> None:
        """Slots for the tensors that train now, in the groups' order. A tensor is dense when
        its group's sparsity is 0 or, where names are unknown, when it has fewer than 2
        dimensions (norm gains and biases: the shape's stand-in for the name rule)."""
        slots, tensors, at = [], [], 0
        self._group_bounds = []
        for gi, g in enumerate(self.param_groups):
            first = at
            for name, p in zip(g["names"], g["params"]):
                if not p.requires_grad:
                    continue
                local = local_tensor(p)
                dense = g["sparsity"] == 0.0 or (not g.get("named", True) and local.dim() < 2)
                slots.append(Slot(name, at, local.numel(), gi, dense))
                tensors.append(p)
                at += local.numel()
            self._group_bounds.append((first, at))
        self.layout = FlatLayout(slots, self.comm.size, self.sharded)
        self._tensors = tensors
        self._own_range = self.layout.owner_ranges[self.comm.rank]
        self._state_range = (self.layout.shard_ranges[self.comm.rank] if self.sharded else (0, self.layout.n))

    def _allocate_state(self) -> None:
        n, dev = self.layout.n, self.device
        self.mirror = ParamMirror(self._tensors, dev, bind=self.parameters_as_views)
        self._theta = self.mirror.theta
        lo, hi = self._state_range
        self._m = torch.zeros(hi - lo, dtype=torch.float32, device=dev)
        self._e = torch.zeros(n if self.residual else 0, dtype=torch.float32, device=dev)
        carries = self.sharded and self.residual and self.residual_decay > 0
        self._q = torch.zeros(hi - lo if carries else 0, dtype=torch.float32, device=dev)
        # Workspaces, not state: the candidate, which then trades places with the residual (a CPU
        # allocation of N floats a step would fault every page in anew), and, for the compiled
        # candidate alone, the gradient (the eager step reads the gradients into the candidate).
        self._work_g = torch.empty(n if self._fused_candidate else 0, dtype=torch.float32, device=dev)
        self._spare = torch.empty(n, dtype=torch.float32, device=dev)
        self._grad_views = {}  # id of a gradient workspace: (it, its views shaped as the tensors)
        self._m_support, self._m_version = None, -1  # where m may be non-zero (the last mask), when known

    def _sync_layout(self) -> None:
        state_io.follow_tensors(self)

    def state_bytes_per_parameter(self) -> float:
        """Bytes of optimizer state per parameter on this rank, everything the step keeps
        between steps: first moment, residual, carried momentum, fp32 masters of non-fp32
        parameters and the packed masks (docs/python.md, "State")."""
        n = self.layout.n
        total = (self._m.numel() + self._e.numel() + self._q.numel()) * 4
        total += sum(view.numel() for view in self.mirror.masters().values()) * 4
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
        """This step's local gradient in layout order, unscaled: in the candidate's workspace,
        where the eager candidate is then computed in place, or in the compiled one's own."""
        g = self._work_g if self._fused_candidate else self._spare
        if id(g) not in self._grad_views or self._grad_views[id(g)][0] is not g:  # c trades places with e
            self._grad_views[id(g)] = (g, shaped_views(g, self.layout.slots, self._tensors))
        read_gradients(self._tensors, self._grad_views[id(g)][1])
        if grad_scale is not None:
            g.mul_(grad_scale.double().reciprocal().float().to(g.device))
        return g

    def _candidate(self, g: torch.Tensor) -> torch.Tensor:
        """Step 1: c = (b1 m_prev + (1-b1) g) + e (replicated); a = (1-b1) g + e (sharded, where
        the owner adds b1 m_prev and the carried momentum after the reduction)."""
        c, e = self._spare, (self._e if self.residual else None)
        b1, omb1 = f32(self.beta1), f32(1.0 - self.beta1)
        if self._fused_candidate:
            candidate_compiled()(self._m, g, e, b1, omb1, c)
        else:  # g is c
            candidate_in_place(c, None if self.sharded else self._m, self._known_support(), e, b1, omb1)
        return c

    def _known_support(self) -> Optional[torch.Tensor]:
        """The last mask, where step 7 left m non-zero, unless m was written since (a load, or the
        views in self.state, which share m's version counter)."""
        return self._m_support if self._m._version == self._m_version else None

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
        pieces = self.layout.pieces[self.comm.rank]
        if self._selector is None or self._selector[0] is not self.layout:
            lo, hi = self._own_range
            self._selector = (self.layout, RangeSelector(lo, hi, pieces, self.layout.mask_bytes(self.comm.rank),
                                                         self.device))
        ks = [p.size if p.dense else k_piece(rho[self.layout.slots[p.slot].group], p.size) for p in pieces]
        return self._selector[1].select(stat, ks)

    def _gather_mask(self, segment: torch.Tensor, rho: List[float], async_op: bool, step: int) -> Dict[str, Any]:
        ranges = [self.layout.mask_bytes(w) for w in range(self.comm.size)]
        recv, work = self.comm.all_gather_uneven(segment, [hi - lo for lo, hi in ranges], "mask_all_gather",
                                                 async_op=async_op)
        return {"recv": recv, "work": work, "ranges": ranges, "rho": rho, "step": step}

    def _complete_mask(self, pending: Dict[str, Any]) -> None:
        if pending["work"] is not None:
            pending["work"].wait()
        self._mask = merge_segments(pending["recv"], pending["ranges"], self.layout.mask_byte_count)
        self._mask_rho, self._mask_step = pending["rho"], pending["step"]

    def finish(self) -> None:
        """Waits for the lagged mask all-gather still in flight after the last step. Call it
        before destroying the process group; at interpreter exit it is called for every live
        optimizer that still has one in flight. (state_dict() waits too; with total_steps the
        last step starts none.)"""
        if self.overlap is not None:
            self.overlap.abandon()
        self._wait_next_mask()

    def _wait_next_mask(self) -> None:
        """Completes the lagged all-gather (the start of step t+1, or a checkpoint)."""
        if self._next is not None:
            pending, self._next = self._next, None
            self._complete_mask(pending)

    def _mask_known(self, t: int) -> bool:
        """Whether step t's mask was chosen at step t-1 (mask lag 1, not the first step, and no
        change of layout since)."""
        if self.mask_lag != 1:
            return False
        if self._next is not None:
            return self._next["step"] == t
        return self._mask is not None and self._mask_step == t

    def _mask_indices(self) -> torch.Tensor:
        return packed_positions(self._mask)

    def _shard_counts(self, idx: torch.Tensor) -> List[int]:
        """How many mask positions fall in each shard: counted, since a mask resumed from a
        checkpoint of another world size was drawn by other owners."""
        if not self.sharded:
            return []
        bounds = torch.tensor([hi for _, hi in self.layout.shard_ranges], dtype=idx.dtype, device=idx.device)
        ends = torch.searchsorted(idx, bounds).tolist()
        return [ends[0]] + [ends[r] - ends[r - 1] for r in range(1, len(ends))]

    @torch.no_grad()
    def step(self, closure=None):
        """One SCAPE step on this rank's local gradients: a collective over the group. A missing
        .grad counts as zeros. Under GradScaler a step whose gradients are not finite on any
        rank is skipped on every rank; without one it raises NonFiniteGradient on every rank,
        naming the step, with nothing changed."""
        loss = closure_loss(closure)
        group_hypers(self)  # groups whose betas or eps disagree raise before anything is sent
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        scaled = found_inf is not None or grad_scale is not None
        started = time.perf_counter()
        if self.overlap is None or not self.overlap.in_flight():
            self._sync_layout()
        self.mirror.pull()
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
        mask_known = self._mask_known(t)
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
            # gathered now, blocking: comm_time_measured_mask_all_gather holds its seconds (the
            # mask wait is the lagged gather's alone, as in an MPI run file)
            self._complete_mask(self._gather_mask(segment, rho, async_op=False, step=t))
        idx = self._mask_indices()
        reduced, flags = self._reduce(c, idx, local_bad, t)
        # A blocking collective: its seconds are last_metrics' comm_time_measured_<purpose>, as
        # in an MPI run file; grad_wait_exposed is the wait for overlap_backward's buckets alone.
        self._grad_wait = 0.0
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
        if self._tensors and len(self._frozen) == len(self._tensors):
            self._metrics = None
            raise ValueError(f"step {t}: no parameter of this optimizer has a gradient on any rank, so nothing "
                             f"would be updated; were the model's parameters replaced after the optimizer was "
                             f"built (model.load_state_dict(..., assign=True), model.to_empty(), a new module)? "
                             f"Build the optimizer on the model's current parameters")
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
        kept = state_io.keep_untouched(self, self._frozen)
        # Step 9, from m_prev and q before this step changes them (none after the last step).
        if self.mask_lag == 1 and t != self.total_steps:
            if stat is None:
                stat = self._statistic(c)
            rho_next = self._rho(t + 1)
            self._next = self._gather_mask(self._select(stat, rho_next), rho_next, async_op=True, step=t + 1)
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
        state_io.restore_untouched(self, kept)
        self.mirror.push()
        self._metrics = StepMetrics.collect(self, t, idx, clip_factor)
        self._metrics.extra.update(mask_wait_exposed=self._mask_wait, grad_wait_exposed=self._grad_wait,
                                   step_exchange_time=self._exposed)
        self._previous_mask, self._previous_size = self._mask, int(idx.numel())
        self._t = t
        self._step_count.fill_(float(t))
        state_io.bind_residual_views(self)  # the residual traded places with the workspace

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
        the mask, m = b_bar on the mask and 0 off it. The groups differ only in lr and weight
        decay: the decay runs as one foreach op over the groups' ranges that decay (named
        parameters alternate groups, so a tensor may be a group), the lr is spread over the mask
        where it differs, and the arithmetic runs once (the same fp32 products)."""
        groups = [(first, end, g) for (first, end), g in zip(self._group_bounds, self.param_groups)]
        factors = [decay_factor(g["lr"], g["weight_decay"]) if g["weight_decay"] else 1.0 for _, _, g in groups]
        kept = self._decay is not None and self._decay[0] is self.layout and self._decay[2] is self._theta
        if not kept or self._decay[1] != factors:
            decayed = [(first, end, f) for (first, end, _), f in zip(groups, factors) if f != 1.0 and end > first]
            self._decay = (self.layout, factors, self._theta, [self._theta[a:b] for a, b, _ in decayed],
                           [f for _, _, f in decayed])
        if self._decay[3]:
            torch._foreach_mul_(self._decay[3], self._decay[4])
        s = AdamScalars.at(self.param_groups[0]["lr"], self.beta1, self.beta2, self.eps, t, self.bias_correction)
        lrs = [f32(g["lr"]) for _, _, g in groups]
        if len(set(lrs)) > 1:
            bounds = torch.tensor([end for _, end, _ in groups[:-1]], dtype=own_idx.dtype, device=own_idx.device)
            edges = torch.cat((own_idx.new_zeros(1), torch.searchsorted(own_idx, bounds),
                               own_idx.new_full((1,), own_idx.numel())))
            s = replace(s, lr=torch.tensor(lrs, dtype=torch.float32, device=self.device)
                        .repeat_interleave(edges[1:] - edges[:-1], output_size=own_idx.numel()))
        self._theta.index_copy_(0, own_idx, adams_update(self._theta.index_select(0, own_idx), m_prev, b_bar,
                                                         g_hat, s))
        support = self._known_support()
        if support is None:
            self._m.zero_()
        elif support.numel():
            self._m.index_fill_(0, support, 0.0)
        self._m.index_copy_(0, local, b_bar)
        # restore_untouched puts back the m of tensors no rank had a gradient for
        self._m_support, self._m_version = (None if self._frozen else local), self._m._version

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
        computes: the run file records it, and `analysis report` groups runs by it."""
        return run_config(self)

    @property
    def steps_done(self) -> int:
        return self._t

    def workspace_bytes_per_parameter(self) -> float:
        """Bytes per parameter of the step's reusable workspaces (the candidate, the compiled
        candidate's gradient, the selection's over this rank's own range)."""
        selection = self._selector[1].workspace_bytes() if self._selector is not None else 0
        return ((self._work_g.numel() + self._spare.numel()) * 4 + selection) / self.layout.n

    def mask_bits(self) -> torch.Tensor:
        """The mask of the last step as bools over the flat layout (empty before step 1)."""
        if self._previous_mask is None:
            return torch.zeros(0, dtype=torch.bool)
        return unpack_bits(self._previous_mask, self.layout.n)

    def flat_params(self) -> torch.Tensor:
        """The fp32 parameters (the masters of low-precision ones) in layout order."""
        return self._theta

    def state_dict(self) -> Dict[str, Any]:
        """torch's form, per parameter (state.py): resumes bit-identically at the same world
        size and at another through torch.distributed.checkpoint. A collective when W > 1."""
        return state_dict_with_hooks(self, lambda: state_io.save(self))

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        load_state_dict_with_hooks(self, state_dict, lambda sd: state_io.load(self, sd))

    def __getstate__(self):
        refuse_copy(self)
