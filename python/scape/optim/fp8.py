"""SCAPE's FP8 payload (`wire_dtype="fp8_e5m2"`, replicated state), as the C++ core scales it
(docs/algorithms.md, "Wire precision"; ScapeOptimizer::quantize_payload): every rank gathers the
largest magnitude of everyone's payload; the shared exponent s = floor(log2 max) is taken at
step 1, at every step with (t-1) mod 100 = 0, and when a value would pass e5m2's largest finite
57344 at the current s; each value goes as q = e5m2((c / W)·2^-s); the owners sum the q exactly
in fp32 in rank order, and b_bar = (mean·W)·2^s. What a value failed to deliver, c - W·(q·2^s),
stays in the sender's residual at its position.

On the wire here each value leaves its rank as its one fp8 byte; the segment means come back in
fp32 (a mean of e5m2 values is not one), so a rank sends (W-1)/W·K bytes and then (W-1)/W·4K,
where the core's ledger counts a ring all-reduce of K bytes."""
from __future__ import annotations

import math
from typing import List, Tuple

import torch

from .arith import f32
from .comm import Group, _split

E5M2_MAX = 57344.0


class Fp8Payload:
    def __init__(self):
        self.exponent = 0
        self.scaled = False

    def exponent_at(self, peak: float, workers: int, t: int) -> int:
        overflow = self.scaled and f32(f32(peak / workers) * math.ldexp(1.0, -self.exponent)) > E5M2_MAX
        if not self.scaled or (t - 1) % 100 == 0 or overflow:
            return math.frexp(peak)[1] - 1 if peak > 0 else 0
        return self.exponent

    def reduce(self, comm: Group, payload: torch.Tensor, t: int,
               flags: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """(b_bar on every rank, every rank's flags [W, e], this rank's undelivered error, the
        exponent used). The flags ride in the scale's all-gather."""
        w, me = comm.size, comm.rank
        peak_mine = payload.abs().max().reshape(1) if payload.numel() else payload.new_zeros(1)
        mine = torch.cat((peak_mine, flags))
        gathered, _ = comm.all_gather_uneven(mine, [mine.numel()] * w, "fp8_scale_all_gather")
        gathered = gathered.view(w, -1)
        exponent = self.exponent_at(float(gathered[:, 0].max()), w, t)
        up = math.ldexp(1.0, exponent)
        q8 = torch.div(payload, float(w)).mul_(math.ldexp(1.0, -exponent)).to(torch.float8_e5m2)
        q = q8.float()
        error = payload - torch.mul(q, up).mul_(float(w))
        counts: List[int] = _split(payload.numel(), w)
        recv, _ = comm.all_to_all(q8.view(torch.uint8), counts, [counts[me]] * w, "grad_all_reduce")
        rows = recv.view(torch.float8_e5m2).float().view(w, counts[me])
        mean = rows[0].clone()
        for r in range(1, w):
            mean.add_(rows[r])
        mean.div_(float(w))
        if w > 1:
            mean, _ = comm.all_gather_uneven(mean, counts, "grad_all_reduce")
        return mean.mul_(float(w)).mul_(up), gathered[:, 1:], error, exponent
