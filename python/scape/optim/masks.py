"""Top-k selection and the packed mask, in torch ops on any device.

Selection follows kernels/cpu/select.cpp: exactly k positions of largest |x|, equal magnitudes
to the lower index. torch.topk picks among equal values arbitrarily, so its threshold is kept
and the positions tied at it are re-chosen by index whenever more than k reach it.

Packing: bit j of the mask is bit j % 8 of byte j // 8 (least significant first), so the packed
bytes read as little-endian 64-bit words are the C++ core's mask words."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

_DEVICE_TABLES = {}


def _device_table(name: str, device, make) -> torch.Tensor:
    """A small constant table made once a device: make(device) on the first call."""
    key = (name, str(device))
    if key not in _DEVICE_TABLES:
        _DEVICE_TABLES[key] = make(device)
    return _DEVICE_TABLES[key]


def _weights(device) -> torch.Tensor:
    return _device_table("bit weights", device, lambda d: torch.tensor([1, 2, 4, 8, 16, 32, 64, 128],
                                                                        dtype=torch.uint8, device=d))


_SAMPLE_STRIDE = 64


def _top_candidates(a: torch.Tensor, k: int):
    """(values, indices) of k largest entries of a (non-negative), in no order. For large
    pieces a strided sample gives a threshold low enough to keep at least k candidates (checked:
    otherwise the whole piece is ranked), and only those are ranked: exact, and several times
    faster than torch.topk over the piece on a CPU."""
    n = a.numel()
    if n >= 16 * _SAMPLE_STRIDE * 64 and k * 16 <= n:
        sample = a[::_SAMPLE_STRIDE]
        keep = min(sample.numel(), (3 * k) // (2 * _SAMPLE_STRIDE) + 8)
        floor = torch.topk(sample, keep, sorted=False).values.min()
        candidates = (a >= floor).nonzero().view(-1)
        if candidates.numel() >= k:
            top = torch.topk(a.index_select(0, candidates), k, sorted=False)
            return top.values, candidates.index_select(0, top.indices)
    top = torch.topk(a, k, sorted=False)
    return top.values, top.indices


def topk_indices(stats: Sequence[torch.Tensor], ks: Sequence[int]) -> List[torch.Tensor]:
    """For each 1-D statistic, the ascending positions of exactly k of its largest |x|, ties to
    the lower index (a NaN may land anywhere: a step with one is refused). One host
    synchronization for all of them."""
    mags, thresholds, picks = [], [], []
    for s, k in zip(stats, ks):
        if k >= s.numel():
            mags.append(None)
            thresholds.append(None)
            picks.append(torch.arange(s.numel(), device=s.device))
            continue
        a = s.abs()
        values, indices = _top_candidates(a, k)
        mags.append(a)
        thresholds.append(values.min())
        picks.append(indices)
    # Where ties at the threshold reach past k, the choice among them was arbitrary.
    live = [i for i, a in enumerate(mags) if a is not None]
    if live:
        counts = torch.stack([(mags[i] >= thresholds[i]).sum() for i in live]).tolist()
        for i, c in zip(live, counts):
            if c > ks[i]:
                a, thr = mags[i], thresholds[i]
                above = a > thr
                tied = a == thr
                need = ks[i] - int(above.sum())
                picks[i] = (above | (tied & (torch.cumsum(tied, 0) <= need))).nonzero().view(-1)
    return [torch.sort(p).values for p in picks]


def pack_positions(positions: torch.Tensor, begin_byte: int, count: int) -> torch.Tensor:
    """uint8 [count]: the bytes begin_byte .. begin_byte + count of a mask whose set bits are the
    global `positions` (distinct bits of one byte add up to their OR)."""
    # int32 sums, which CUDA adds atomically in hardware, then narrowed: each byte is at most 255.
    out = torch.zeros(count, dtype=torch.int32, device=positions.device)
    if positions.numel():
        rel = positions - 8 * begin_byte
        bits = torch.bitwise_left_shift(torch.ones_like(rel), rel & 7).to(torch.int32)
        out.index_add_(0, rel >> 3, bits)
    return out.to(torch.uint8)


def _byte_flags(device) -> torch.Tensor:
    """int64 [256]: entry b holds b's eight bits as eight bool bytes, bit j in byte j (read
    little-endian, as on every device torch runs on)."""
    return _device_table("byte flags", device, lambda d: torch.tensor(
        [sum(((b >> j) & 1) << (8 * j) for j in range(8)) for b in range(256)], dtype=torch.int64, device=d))


def packed_positions(packed: torch.Tensor) -> torch.Tensor:
    """The ascending set positions of a packed mask. A sparse mask touches only its set bytes'
    bits; where more than a quarter of the bytes are set (a 10% mask sets about 57%), the eight
    int64 candidates a set byte makes cost more than unpacking every bit and scanning once
    (measured 2.6x faster at 10% density, 2x slower at 1%). The unpacking looks each byte's
    eight flags up as one 64-bit word: 42 ms for 15.2M bits at 10% on the 2-core machine, one
    thread, where an AND with eight weights and a comparison took 67."""
    nonzero = packed.nonzero().view(-1)
    weights = _weights(packed.device)
    if 4 * nonzero.numel() > packed.numel():
        flags = _byte_flags(packed.device).index_select(0, packed.to(torch.int64))
        return flags.view(torch.bool).nonzero().view(-1)
    bytes_ = packed.index_select(0, nonzero)
    bits = (bytes_.view(-1, 1) & weights).ne(0)
    return (nonzero.view(-1, 1) * 8 + torch.arange(8, device=packed.device)).masked_select(bits)


def bits_at(packed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Whether each position is set in a packed mask."""
    return (packed.index_select(0, positions >> 3) >> (positions & 7).to(torch.uint8)) & 1


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """bool [n] -> uint8 [ceil(n/8)], bit j in byte j // 8 at weight 2^(j % 8)."""
    n = bits.numel()
    pad = (-n) % 8
    b = bits.to(torch.uint8)
    if pad:
        b = torch.cat((b, torch.zeros(pad, dtype=torch.uint8, device=b.device)))
    return (b.view(-1, 8) * _weights(b.device)).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 [ceil(n/8)] -> bool [n]."""
    w = _weights(packed.device)
    return (packed.view(-1, 1) & w).ne(0).view(-1)[:n]


def merge_segments(segments: torch.Tensor, byte_ranges: Sequence[Tuple[int, int]], total_bytes: int) -> torch.Tensor:
    """The global packed mask from every owner's segment (concatenated in rank order); owners
    that share a boundary byte are OR-ed together."""
    out = torch.zeros(total_bytes, dtype=torch.uint8, device=segments.device)
    at = 0
    for lo, hi in byte_ranges:
        count = hi - lo
        if count:
            out[lo:hi] |= segments[at:at + count]
        at += count
    return out
