"""The flat layout of a torch-native optimizer's parameters, cut as the C++ core cuts it.

Tensors lie back to back in the order of the parameters across the param groups. Shards are
the core's (docs/algorithms.md, "Flat layout and shards"): s = 64·ceil(N / (64·W)), shard w is
[w·s, min((w+1)·s, N)). Mask owners and pieces follow optimizers/scape/mask_ownership.cpp: sharded state
owns shards and selects each tensor's fragment in its shard; replicated state deals whole
tensors in layout order (the artifact's rule, `tensor_runs`). Only torch-free Python here, so
the same arithmetic is testable without a device."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Sequence, Tuple


@dataclass(frozen=True)
class Slot:
    """One tensor of the flat buffer."""
    name: str
    offset: int
    numel: int
    group: int      # index of its param group
    dense: bool     # always on the mask (sparsity 0, or named in dense_tensors)

    @property
    def end(self) -> int:
        return self.offset + self.numel


@dataclass(frozen=True)
class Piece:
    """A run of one tensor that one owner selects on its own."""
    begin: int
    end: int
    slot: int       # index into the layout's slots
    dense: bool

    @property
    def size(self) -> int:
        return self.end - self.begin


def shard_size(n: int, workers: int) -> int:
    return 64 * math.ceil(n / (64 * workers)) if n else 0


def shard_range(n: int, workers: int, w: int) -> Tuple[int, int]:
    s = shard_size(n, workers)
    return min(w * s, n), min((w + 1) * s, n)


def tensor_runs(slots: Sequence[Slot], n: int, workers: int) -> List[Tuple[int, int]]:
    """Replicated owners (optimizers/scape/mask_ownership.cpp: tensor_runs): owner w takes tensors in layout
    order until its count reaches N/W (count·W >= N, the crossing tensor stays, the overshoot is
    not carried) and hands on earlier when only as many tensors remain as later owners."""
    runs: List[Tuple[int, int]] = [(n, n)] * workers
    w, count, start = 0, 0, 0
    for j, slot in enumerate(slots):
        count += slot.numel
        remaining = len(slots) - 1 - j
        later = workers - 1 - w
        if w + 1 < workers and remaining > 0 and (count * workers >= n or remaining <= later):
            runs[w] = (start, slot.end)
            start = slot.end
            w += 1
            count = 0
    runs[w] = (start, n)
    return runs


class FlatLayout:
    """Slots, owner ranges and pieces for W workers; `sharded` picks the owner rule."""

    def __init__(self, slots: Sequence[Slot], workers: int, sharded: bool):
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        self.slots = list(slots)
        self.n = self.slots[-1].end if self.slots else 0
        if self.n >= 2 ** 32:
            raise ValueError(f"params: {self.n} values; the wire's 32-bit indices allow fewer than 2^32")
        self.workers = workers
        self.sharded = sharded
        if sharded:
            self.owner_ranges = [shard_range(self.n, workers, w) for w in range(workers)]
        else:
            self.owner_ranges = tensor_runs(self.slots, self.n, workers)
        self.shard_ranges = [shard_range(self.n, workers, w) for w in range(workers)]
        self.pieces: List[List[Piece]] = []
        for lo_w, hi_w in self.owner_ranges:
            own = []
            for j, slot in enumerate(self.slots):
                lo, hi = max(slot.offset, lo_w), min(slot.end, hi_w)
                if lo < hi:
                    own.append(Piece(lo, hi, j, slot.dense))
            self.pieces.append(own)

    def mask_bytes(self, w: int) -> Tuple[int, int]:
        """The byte range of the packed global mask that carries owner w's bits (bit j of the
        mask is bit j % 8 of byte j // 8; neighbours may share a boundary byte)."""
        lo, hi = self.owner_ranges[w]
        if lo >= hi:
            return 0, 0
        return lo // 8, (hi + 7) // 8

    @property
    def mask_byte_count(self) -> int:
        return (self.n + 7) // 8
