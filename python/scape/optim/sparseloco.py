"""scape.torch.SparseLoCo: DiLoCo's outer loop (inner AdamS steps, θ_g, the delay) with the
outer momentum replaced by a per-rank error-feedback accumulator of pseudo-gradients, sent
sparse and quantized, as the C++ core's `type = "sparseloco"` computes it (docs/algorithms.md,
"SparseLoCo"): e_i ← β e_i + Δ_i; in every chunk of C coordinates of a tensor the k entries of
largest |e_i| (ties to the lower index); their values through Templar's statistical quantizer
(2^q bins over 6 standard deviations, per-bin means) or, with q = 0, at `wire_dtype`; e_i keeps
what was not delivered; every rank's message all-gathered; θ_g ← θ_g − α · (Σ_r delivered_r)/W.

On the wire here a message is the K positions within their chunks as int16 (the core packs
them at bit_width(C−1) bits or Elias-Fano codes them), the codes one byte each (the core packs
q bits) and each tensor's shift and codebook in fp32: bytes are counted from these tensors."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import torch

from .diloco import DiLoCo


def k_for(rho: float, n: int) -> int:
    """The shared rule ⌈ρn⌉, the product snapped to an integer within 1e-9 (core/schedule.cpp)."""
    if n == 0:
        return 0
    x = rho * n
    nearest = float(round(x))
    k = nearest if abs(x - nearest) <= 1e-9 * max(1.0, x) else math.ceil(x)
    if rho > 0 and k < 1:
        k = 1
    return min(n, int(k))


def chunk_topk(e: torch.Tensor, chunk: int, k: int) -> torch.Tensor:
    """Ascending positions (from the tensor's start) of the min(k, length) entries of largest |e|
    in each chunk of `chunk` coordinates, ties to the lower index (kernel chunk_topk)."""
    n = e.numel()
    rows = math.ceil(n / chunk)
    padded = torch.full((rows * chunk,), -1.0, dtype=torch.float32, device=e.device)
    padded[:n] = e.abs()
    order = torch.sort(padded.view(rows, chunk), dim=1, descending=True, stable=True).indices[:, :k]
    starts = torch.arange(rows, device=e.device).view(-1, 1) * chunk
    picked = (order + starts).view(-1)
    lengths = torch.clamp(n - starts.view(-1), max=chunk)
    keep = (torch.arange(k, device=e.device).view(1, -1) < lengths.view(-1, 1)).view(-1)
    return torch.sort(picked[keep]).values


def quantize_statistical(values: torch.Tensor, bits: int) -> Tuple[float, torch.Tensor, torch.Tensor]:
    """Templar's quantizer as the core computes it (quantize_statistical): (shift, codebook of
    2^bits bin means, codes)."""
    bins = 1 << bits
    n = values.numel()
    shift = torch.tensor(float(values.double().sum()) / n, dtype=torch.float32)
    centered = values - shift
    sigma = math.sqrt(float(centered.double().square().sum()) / (n - 1)) if n > 1 else 0.0
    scale = torch.tensor(6.0 * sigma / bins, dtype=torch.float32)
    if not (float(scale) > 0) or not math.isfinite(float(scale)):
        scale = torch.tensor(1.0)
    position = torch.round(centered / scale + float(bins // 2))  # rint: half to even
    codes = position.clamp(0, bins - 1).to(torch.int64)
    sums = torch.zeros(bins, dtype=torch.float64, device=values.device).index_add_(0, codes, centered.double())
    counts = torch.bincount(codes, minlength=bins).double()
    book = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums)).float()
    return float(shift), book, codes


class SparseLoCo(DiLoCo):
    """SparseLoCo on this rank of `group`, with AdamS or AdamW inner steps, or a torch optimizer
    of the user's (`inner`, as DiLoCo's).

    inner_steps, outer_lr   H and α (defaults 10, 0.9)
    sparsity        1 − the density of each chunk (default 0.99)
    chunk           C coordinates a chunk (default 4096, at most 32768)
    quant_bits      2 (default) or 8: Templar's quantizer at 2^q bins; 0: values at wire_dtype
    ef_decay        β of the error feedback (default 0.999)
    wire_dtype      "fp32" or "bf16", the values' width when quant_bits = 0
    overlap_outer, total_steps   as DiLoCo's"""

    def __init__(self, params, lr: float, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1, *,
                 inner: Any = "adams", inner_steps: int = 10, outer_lr: float = 0.9, sparsity: float = 0.99,
                 chunk: int = 4096, quant_bits: int = 2, ef_decay: float = 0.999, wire_dtype: str = "fp32",
                 overlap_outer: bool = False, total_steps: Optional[int] = None, bias_correction: bool = True,
                 broadcast_params: bool = True, group=None):
        if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0.0 <= sparsity < 1.0:
            raise ValueError(f"sparsity: must lie in [0, 1), got {sparsity!r}")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= 32768:
            raise ValueError(f"chunk: an integer in [1, 32768], got {chunk!r}")
        if quant_bits not in (0, 2, 8):
            raise ValueError(f"quant_bits: expected one of 0, 2, 8, got {quant_bits!r}")
        if not 0.0 <= ef_decay <= 1.0:
            raise ValueError(f"ef_decay: must lie in [0, 1], got {ef_decay}")
        if wire_dtype not in ("fp32", "bf16"):
            raise ValueError(f"wire_dtype: expected one of 'fp32', 'bf16', got {wire_dtype!r}")
        self.sparsity, self.chunk, self.quant_bits = float(sparsity), chunk, quant_bits
        self.ef_decay, self.wire_dtype = float(ef_decay), wire_dtype
        super().__init__(params, lr, betas, eps, weight_decay, inner=inner, inner_steps=inner_steps,
                         outer_lr=outer_lr, outer_momentum=0.0, overlap_outer=overlap_outer, total_steps=total_steps,
                         bias_correction=bias_correction, broadcast_params=broadcast_params, group=group)
        self.k = k_for(1.0 - self.sparsity, self.chunk)
        self._error = torch.zeros_like(self._theta)  # e_i, this rank's own

    def _settings(self):
        return super()._settings() + [("sparsity", self.sparsity), ("chunk", self.chunk),
                                      ("quant_bits", self.quant_bits), ("ef_decay", self.ef_decay),
                                      ("wire_dtype", self.wire_dtype)]

    def _outer_step(self, lo: int, hi: int) -> Dict[str, float]:
        delta = torch.neg(self._theta).add_(self._global)                  # Δ_i = θ_g − θ_i
        self._error.mul_(torch.tensor(self.ef_decay, dtype=torch.float32).item()).add_(delta)
        idx, values, message = self._compress()
        self._error.index_add_(0, idx, torch.neg(values))                  # e_i keeps the rest
        mean = torch.zeros_like(self._global)
        for r_idx, r_values in self._all_gather(message):                  # rank order
            mean.index_add_(0, r_idx, r_values)
        mean.div_(float(self.comm.size))
        mean.mul_(-torch.tensor(self.outer_lr, dtype=torch.float32).item())
        self._global.add_(mean)
        return {"pseudo_grad_norm": float(torch.linalg.vector_norm(delta)), "param_drift": float("nan")}

    def _compress(self):
        """This rank's selection: global positions, the values it delivers, its message (the
        positions within their chunks, codes and codebooks, or values)."""
        idx_parts: List[torch.Tensor] = []
        for a, b in self._ranges:
            idx_parts.append(chunk_topk(self._error[a:b], self.chunk, self.k) + a)
        idx = torch.cat(idx_parts) if idx_parts else torch.zeros(0, dtype=torch.int64)
        picked = self._error.index_select(0, idx)
        local = torch.cat([(part - a) % self.chunk for part, (a, _) in zip(idx_parts, self._ranges)]).to(torch.int16)
        if self.quant_bits == 0:
            values = picked.bfloat16().float() if self.wire_dtype == "bf16" else picked.clone()
            sent = picked.bfloat16() if self.wire_dtype == "bf16" else picked.clone()
            return idx, values, {"local": local, "values": sent}
        books, codes, values, at = [], [], [], 0
        for part in idx_parts:
            v = picked[at:at + part.numel()]
            at += part.numel()
            if not v.numel():
                continue
            shift, book, code = quantize_statistical(v, self.quant_bits)
            books.append(torch.cat((torch.tensor([shift]), book)))
            codes.append(code.to(torch.uint8))
            values.append(book.index_select(0, code).add_(shift))           # f32(codebook[code] + shift)
        return idx, torch.cat(values), {"local": local, "codes": torch.cat(codes), "books": torch.cat(books)}

    def _all_gather(self, message: Dict[str, torch.Tensor]):
        """Every rank's (positions, delivered values), in rank order."""
        w = self.comm.size
        gathered = {}
        for key, t in message.items():
            raw = t.view(torch.uint8) if t.dtype == torch.int16 else t  # gloo moves no int16
            full, _ = self.comm.all_gather_uneven(raw, [raw.numel()] * w, "sparseloco_all_gather")
            gathered[key] = full.view(w, -1)
        out = []
        for r in range(w):
            idx = self._positions(gathered["local"][r].contiguous().view(torch.int16).to(torch.int64))
            if self.quant_bits == 0:
                out.append((idx, gathered["values"][r].float()))
                continue
            values, at, book_at = [], 0, 0
            for a, b in self._ranges:
                count = self._entries(b - a)
                if not count:
                    continue
                book = gathered["books"][r][book_at:book_at + (1 << self.quant_bits) + 1]
                book_at += book.numel()
                code = gathered["codes"][r][at:at + count].to(torch.int64)
                values.append(book[1:].index_select(0, code).add_(float(book[0])))
                at += count
            out.append((idx, torch.cat(values)))
        return out

    def _entries(self, n: int) -> int:
        full, rest = divmod(n, self.chunk)
        return full * min(self.k, self.chunk) + (min(self.k, rest) if rest else 0)

    def _positions(self, local: torch.Tensor) -> torch.Tensor:
        """Global positions from the positions within their chunks (the entries come chunk by
        chunk, min(k, length) of each)."""
        starts = []
        for a, b in self._ranges:
            for start in range(a, b, self.chunk):
                starts.append(torch.full((min(self.k, b - start),), start, dtype=torch.int64))
        return torch.cat(starts) + local if starts else local

    def config(self) -> Dict[str, Any]:
        out = super().config()
        for key in ("outer_momentum", "outer_wire", "streaming_fragments"):
            out.pop(key, None)
        out.update(type="sparseloco", sparsity=self.sparsity, chunk=self.chunk, quant_bits=self.quant_bits,
                   ef_decay=self.ef_decay, wire_dtype=self.wire_dtype)
        return out

    def _extra_state(self, a: int, b: int, shape) -> Dict[str, Any]:
        return {**super()._extra_state(a, b, shape), "sparseloco_error": self._error[a:b].view(shape).clone()}

    def _load_extra_state(self, entry: Dict[str, Any], a: int, b: int) -> None:
        super()._load_extra_state(entry, a, b)
        if "sparseloco_error" not in entry:
            raise ValueError("state_dict: no sparseloco_error (not a scape.torch.SparseLoCo state)")
        self._error[a:b] = entry["sparseloco_error"].reshape(-1).to(self.device, torch.float32)
