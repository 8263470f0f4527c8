"""scape.torch.DeMo: decoupled momentum with chunked DCT top-k extraction (Peng et al. 2024), as
the C++ core's `type = "demo"` computes it (docs/algorithms.md, "DeMo"), in torch ops over any
process group. Each rank keeps its own momentum m ← β m + g; the flat buffer is cut into chunks
of `chunk` coordinates (the last one shorter when `chunk` does not divide N), each chunk's
orthonormal DCT-II taken, its `topk` coefficients of largest magnitude (ties to the lower
index) extracted from m and all-gathered; the rank-order mean of everyone's extracted
coefficients, transformed back, gives the step θ ← θ(1 − ηλ) − η·sign(u).
python/tests/test_torch_scape_vs_core.py holds it to the core on a recorded trace."""
from __future__ import annotations

import math
from typing import Any, Dict, Tuple

import torch

from .adams import AdamS
from .arith import decay_factor
from .params import closure_loss, group_hypers, trainable_tensors

MAX_CHUNK = 4096  # the core's demo_chunk range: the basis is chunk² floats


def dct_basis(length: int) -> torch.Tensor:
    """D[f, j] = sqrt(c_f / ℓ) cos(π (2j + 1) f / (2ℓ)), c_0 = 1, c_f = 2: computed in double,
    rounded to fp32 once (the core's dct_basis)."""
    f = torch.arange(length, dtype=torch.float64).view(-1, 1)
    j = torch.arange(length, dtype=torch.float64).view(1, -1)
    scale = torch.sqrt(torch.where(f == 0, 1.0, 2.0) / length)
    return (scale * torch.cos(math.pi * (2 * j + 1) * f / (2.0 * length))).float()


def chunk_transform(x: torch.Tensor, basis: torch.Tensor, inverse: bool) -> torch.Tensor:
    """Every chunk of len(basis) values: y_f = Σ_j D[f, j] x_j (the inverse: x_j = Σ_f D[f, j] y_f),
    summed in double from the fp32 basis and rounded to fp32, as the core's chunk_transform."""
    length = basis.shape[0]
    rows = x.view(-1, length).double()
    applied = basis.double() if inverse else basis.double().t()
    return (rows @ applied).float().reshape(-1)


def chunk_topk(y: torch.Tensor, length: int, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """In every chunk of `length` values, the min(k, length) of largest |y| (ties to the lower
    index), ascending: their offsets within the chunk [chunks, k] and their values."""
    rows = y.view(-1, length)
    order = torch.sort(rows.abs(), dim=1, descending=True, stable=True).indices[:, :min(k, length)]
    offsets = torch.sort(order, dim=1).values
    return offsets, torch.gather(rows, 1, offsets)


class DeMo(AdamS):
    """DeMo on this rank of `group` (lr, betas[0] as β, weight_decay as AdamS's; betas[1] and
    eps unused: the step is a sign).

    chunk     C, the DCT's length (default 64, 1 to 4096; the core's demo_chunk)
    topk      k coefficients extracted a chunk (default 4, 1 to C; the core's demo_topk)
    On the wire: every rank's positions within their chunks as int16 and values as fp32,
    all-gathered (the core codes the positions Elias-Fano, so its ledger counts fewer bytes).
    The momentum is this rank's own: state_dict saves it under this rank's key (rank_state.py),
    so that torch.distributed.checkpoint keeps every rank's."""

    _per_rank_state = True

    def __init__(self, params, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1, *,
                 chunk: int = 64, topk: int = 4, bias_correction: bool = True, broadcast_params: bool = True,
                 group=None):
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
            raise ValueError(f"chunk: an integer in [1, {MAX_CHUNK}], got {chunk!r}")
        if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= chunk:
            raise ValueError(f"topk: an integer in [1, chunk = {chunk}], got {topk!r}")
        self.chunk, self.topk = chunk, topk
        super().__init__(params, lr, betas, eps, weight_decay, bias_correction=bias_correction,
                         broadcast_params=broadcast_params, group=group)
        n = self._theta.numel()
        self._whole = n - n % chunk
        self._basis = dct_basis(chunk).to(self.device)
        self._tail_basis = dct_basis(n % chunk).to(self.device) if n % chunk else None
        self._starts = torch.cat([torch.arange(first, end, length, device=self.device)
                                  .repeat_interleave(min(topk, length)) for first, end, length in self._chunk_runs()])

    def _sync_layout(self) -> None:
        if [id(p) for p in trainable_tensors(self.param_groups)] != [id(p) for p in self._tensors]:
            raise ValueError(f"DeMo: step {self._t + 1}: the tensors that train changed (requires_grad, "
                             f"add_param_group); DeMo's chunks follow the layout it was built with")

    def _settings(self):
        return super()._settings() + [("chunk", self.chunk), ("topk", self.topk)]

    def _transform(self, x: torch.Tensor, inverse: bool) -> torch.Tensor:
        parts = [chunk_transform(x[:self._whole], self._basis, inverse)] if self._whole else []
        if self._tail_basis is not None:
            parts.append(chunk_transform(x[self._whole:], self._tail_basis, inverse))
        return torch.cat(parts)

    def _extract(self):
        """Positions among N (ascending), offsets within their chunks and values of the
        coefficients taken out of m; m ← m − IDCT(extracted)."""
        coeffs = self._transform(self._m, inverse=False)
        offsets, values = [], []
        for first, end, length in self._chunk_runs():
            off, val = chunk_topk(coeffs[first:end], length, self.topk)
            offsets.append(off.reshape(-1))
            values.append(val.reshape(-1))
        offsets, values = torch.cat(offsets), torch.cat(values)
        positions = offsets + self._starts
        extracted = torch.zeros_like(self._m).index_put_((positions,), values)
        self._m.add_(self._transform(extracted, inverse=True).neg_())
        return positions, offsets, values

    def _chunk_runs(self):
        """(first, end, chunk length) of the whole chunks, then of the tail."""
        n = self._theta.numel()
        runs = [(0, self._whole, self.chunk)] if self._whole else []
        if n > self._whole:
            runs.append((self._whole, n, n - self._whole))
        return runs

    def _mean_coefficients(self, offsets: torch.Tensor, values: torch.Tensor, flag: torch.Tensor):
        """Every rank's extracted coefficients added into zeros in rank order, divided by W;
        and every rank's non-finite flag."""
        w, k = self.comm.size, values.numel()
        # int16 offsets travel as their bytes: gloo moves no int16 tensors.
        wire = offsets.to(torch.int16).view(torch.uint8)
        got_bytes, _ = self.comm.all_gather_uneven(wire, [2 * k] * w, "demo_all_gather")
        got_offsets = got_bytes.view(torch.int16)
        got_values, _ = self.comm.all_gather_uneven(torch.cat((values, flag)), [k + 1] * w, "demo_all_gather")
        rows = got_values.view(w, k + 1)
        mean = torch.zeros_like(self._m)
        for r in range(w):
            at = got_offsets[r * k:(r + 1) * k].long() + self._starts
            mean.index_add_(0, at, rows[r, :k])
        return mean.div_(float(w)), rows[:, k]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        group_hypers(self)
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        self._sync_layout()
        self.mirror.pull()
        flag = self._read_gradients(grad_scale, found_inf)
        kept_m = self._m.clone()  # put back when a rank's gradient is not finite: nothing is updated
        self._m.mul_(torch.tensor(self.beta1, dtype=torch.float32).item()).add_(self._g)
        _, offsets, values = self._extract()
        mean, flags = self._mean_coefficients(offsets, values, flag)
        if bool(flags.gt(0).any()):
            self._m.copy_(kept_m)
            if found_inf is not None or grad_scale is not None:
                self.skipped_steps += 1
                self.comm.take_count()
                return loss
            from .scape_optimizer import NonFiniteGradient
            raise NonFiniteGradient(f"step {self._t + 1}: a gradient holds inf or NaN on rank(s) "
                                    f"{flags.gt(0).nonzero().view(-1).tolist()} of the group; nothing was updated")
        u = self._transform(mean, inverse=True)
        for (first, end), group in zip(self._bounds, self.param_groups):
            if end <= first:
                continue
            theta = self._theta[first:end]
            if group["weight_decay"]:
                theta.mul_(decay_factor(group["lr"], group["weight_decay"]))
            lr = torch.tensor(group["lr"], dtype=torch.float32).item()
            theta.sub_(torch.sign(u[first:end]).mul_(lr))
        self.mirror.push()
        t = self._t + 1
        count = self.comm.take_count()
        self._last = {"step": t, "lr": float(self.param_groups[0]["lr"]), "bytes_sent": count.sent,
                      "bytes_received": count.received, "mask_density": values.numel() / max(1, self._m.numel()),
                      **count.metrics()}
        self._t = t
        self._step_count.fill_(float(t))
        return loss

    def config(self) -> Dict[str, Any]:
        out = super().config()
        out.update(type="demo", demo_chunk=self.chunk, demo_topk=self.topk)
        return out


__all__ = ["DeMo", "chunk_topk", "chunk_transform", "dct_basis"]
