"""One owner's top-k selection over its whole range of the flat buffer at once: exactly k per
tensor piece, equal magnitudes to the lower index (kernels/cpu/select.cpp's rule, as
masks.topk_indices), in a number of torch ops that does not grow with the number of pieces.

Per piece, a sample of its magnitudes (every P-th, P prime so that rows of a matrix are not
sampled in the same columns, the largest of a few primes that still leaves the piece a sample of
at least _SAMPLE_MIN points) brackets the k-th largest between a ceiling and a floor, with a
margin of several standard deviations of the sample's rank. Pieces too small for the smallest
stride are sampled whole, their bracket exact. Everything above the ceiling is
selected; the band between floor and ceiling is small and is ranked by (magnitude descending,
position ascending) in one stable sort of all pieces' bands together. Counting checks the
bracket per piece (at most k above the ceiling, at least k above the floor); a piece where the
sample misled (or a NaN hid) is selected on its own by masks.topk_indices, so the result is
exact either way, only slower for that piece."""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

from .masks import pack_positions, topk_indices

# The sample's strides, largest first: primes above the small factors of model widths (2, 3, 5,
# 7), so that no stride divides a row length such as 192 or 768. With 127 alone every piece under
# 127 * 256 values was sampled whole, and on a small model (29 tensors of 4096 to 16384 values)
# sorting that "sample" was half of the step.
_STRIDES = (127, 61, 31, 29, 23, 19, 17, 13, 11)
_SAMPLE_MIN = 256      # the fewest sample points a strided piece gets
_MARGIN_SIGMAS = 4.0   # the bracket's half-width, in standard deviations of the sample rank
_SPARSE_HITS = 50      # expected hits at most 1 in this many: found through 64-bit words
_SPARSE_MASK = 32      # chosen positions at most 1 in this many: packed from the positions


def sample_stride(size: int) -> int:
    """The stride of a sparse piece of `size` values: the largest of _STRIDES that leaves at
    least _SAMPLE_MIN sample points, or 1 (sampled whole)."""
    return next((s for s in _STRIDES if size >= s * _SAMPLE_MIN), 1)


def _float_keys(values: torch.Tensor) -> torch.Tensor:
    """Non-negative fp32 values as int64 keys of the same order (their IEEE bits)."""
    return values.contiguous().view(torch.int32).to(torch.int64)


def above_floor(stat: torch.Tensor, piece_of: torch.Tensor, floors: torch.Tensor, hit: torch.Tensor,
                magnitude: torch.Tensor, floor: torch.Tensor) -> None:
    """hit = |stat| >= its piece's floor (NaN: false), through the workspaces magnitude and floor,
    each position's floor gathered by its piece: the accelerators' form (no host sync)."""
    torch.abs(stat, out=magnitude)
    torch.index_select(floors, 0, piece_of, out=floor)
    torch.ge(magnitude, floor, out=hit)


def above_floor_by_piece(stat: torch.Tensor, pieces: List[torch.Tensor], floors: torch.Tensor, hit: torch.Tensor,
                         magnitude: torch.Tensor) -> None:
    """above_floor without the gather (the CPU's form; `pieces` are magnitude's views, one a
    piece): each piece's floor subtracted by one foreach op, then the sign tested. Equal flags:
    with gradual underflow a - f is 0 only where a = f, and NaN (a NaN value, a dense piece's
    NaN floor) is false either way. 20-45% less time than the gather and compare on the 2-core
    machine (15.2M values in 148 pieces; docs/python.md, "Speed")."""
    torch.abs(stat, out=magnitude)
    torch._foreach_sub_(pieces, floors.tolist())
    torch.ge(magnitude, 0.0, out=hit)


def flag_positions(flags: torch.Tensor, sparse: bool) -> torch.Tensor:
    """The ascending positions of the set flags (bool, their storage a whole number of 64-bit
    words). Sparse: the words that hold a set flag are found first, then the flags in those; on
    the 2-core machine, one thread, 15.2M flags, 13.9 against 27.5 ms for torch's nonzero at 1.6%
    set, level at 3%, 1.6x slower at 12% (docs/python.md, "Speed"): torch's nonzero takes about
    1.5 ns a flag however few are set, and the first scan reads an eighth as many elements."""
    if not sparse:
        return flags.nonzero().view(-1)
    words = flags.view(torch.int64)
    held = words.nonzero().view(-1)
    within = words.index_select(0, held).view(torch.bool).nonzero().view(-1)
    return held.index_select(0, within >> 3).mul_(8).add_(within & 7)


def _pack_words(bits: torch.Tensor) -> torch.Tensor:
    """bool [8 m] -> uint8 [m] as masks.pack_bits, eight flags a 64-bit word at once (read
    little-endian, as on every device torch runs on): the product with 0x0102040810204080
    gathers byte j's low bit into bit 56 + j, the word's last byte, which is read in place (a
    shift and a mask of the words cost four times the product)."""
    words = bits.view(torch.uint8).view(torch.int64)
    return (words * 0x0102040810204080).view(torch.uint8).view(-1, 8)[:, 7].contiguous()


class RangeSelector:
    """The cached index structure of one owner's range [lo, hi) with its pieces: begin, end
    (global), dense flag, in layout order and covering the range."""

    def __init__(self, lo: int, hi: int, pieces: Sequence, byte_range, device: torch.device,
                 gathered_floor: Optional[bool] = None):
        self.lo, self.hi, self.device = lo, hi, device
        # An accelerator gathers each position's floor (one kernel); the CPU subtracts each
        # piece's floor by one foreach op, faster there and with no per-position index to keep.
        self.gathered_floor = device.type != "cpu" if gathered_floor is None else gathered_floor
        self.pieces = list(pieces)
        self.sizes = [p.end - p.begin for p in self.pieces]
        self.sizes_t = torch.tensor(self.sizes, dtype=torch.int64, device=device)
        ends = torch.tensor([p.end - lo for p in self.pieces], dtype=torch.int64, device=device)
        self.ends_t = ends
        self.piece_ids = torch.arange(len(self.pieces), dtype=torch.int64, device=device)
        # Each position's piece, so that per-piece bounds spread over the range by one gather
        # (repeat_interleave recounts the offsets every call and was several times slower).
        self.piece_of = (torch.arange(len(self.pieces), dtype=torch.int32, device=device).repeat_interleave(self.sizes_t)
                         if self.gathered_floor else None)
        # The sample of every sparse piece, as positions in the range, with each piece's count.
        self.sample_start, self.sample_count, self.strides, parts, seg = [], [], [], [], []
        at = 0
        for j, p in enumerate(self.pieces):
            size = p.end - p.begin
            stride = 1 if p.dense else sample_stride(size)
            count = 0 if p.dense else (size + stride - 1) // stride
            self.sample_start.append(at)
            self.sample_count.append(count)
            self.strides.append(stride)
            if count:
                parts.append(torch.arange(p.begin - lo, p.end - lo, stride, dtype=torch.int64, device=device))
                seg.append(torch.full((count,), j, dtype=torch.int64, device=device))
            at += count
        self.sample_total = at
        self.sample_idx = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)
        self.sample_seg = torch.cat(seg) if seg else torch.zeros(0, dtype=torch.int64, device=device)
        self.sample_seg_key = self.sample_seg << 32
        dense = torch.zeros(hi - lo, dtype=torch.bool, device=device)
        for p in self.pieces:
            if p.dense:
                dense[p.begin - lo:p.end - lo] = True
        self.dense = dense
        self.first_byte, self.end_byte = byte_range
        self._ws = None
        self._piece_views = None  # on the CPU, the kept magnitude workspace's views, one a piece
        self._dense_packed = None  # the dense pieces' bits, packed, once a sparse mask needs them
        self._sentinels = torch.tensor([math.inf, -1.0, math.nan], dtype=torch.float32, device=device)

    def workspace_bytes(self) -> int:
        """Bytes of the buffers kept between calls: each position's dense flag (1) and, where the
        floors are gathered, its piece (4); on the CPU, once the first selection ran, the
        magnitudes (4) and two flags (1 + 1); once a sparse mask was packed from its positions, the
        dense flags packed (1/8)."""
        kept = (self.piece_of.numel() * 4 if self.piece_of is not None else 0) + self.dense.numel()
        if self._ws is not None:
            kept += sum(t.numel() * t.element_size() for t in self._ws)
        if self._dense_packed is not None:
            kept += self._dense_packed.numel()
        return kept

    def _bracket(self, ks: List[int]) -> List[int]:
        """Indices into [sorted sample, +inf, -1, NaN] of each piece's ceiling, then floor."""
        inf, low, nan = self.sample_total, self.sample_total + 1, self.sample_total + 2
        ceilings, floors = [], []
        for j, p in enumerate(self.pieces):
            n, count = self.sizes[j], self.sample_count[j]
            if p.dense or not count:
                ceilings.append(inf)
                floors.append(nan)
                continue
            q = ks[j] * count / n            # the k-th largest's expected rank in the sample, from the top
            margin = _MARGIN_SIGMAS * math.sqrt(q) + 2 if self.strides[j] > 1 else 0
            top = self.sample_start[j] + count  # one past the piece's largest sample value
            r_ceiling = math.floor(q - margin) if self.strides[j] > 1 else ks[j]
            r_floor = math.ceil(q + margin) if self.strides[j] > 1 else ks[j]
            # the r-th largest sample is at top - r; the ceiling leaves fewer than k above it
            ceilings.append(top - r_ceiling if r_ceiling >= 1 else inf)
            floors.append(top - r_floor if 1 <= r_floor <= count else low)
        return ceilings + floors

    def _workspaces(self, n: int):
        """The step's buffers. On the CPU they are kept between calls: a fresh allocation of N
        values a step faults every page in anew, which cost as much as the pass that fills it. On
        an accelerator the caching allocator reuses freed blocks at no such cost, so they are
        made per call and their memory is free for the forward and backward passes in between.
        The gathered floors need a buffer of their own (above_floor_by_piece needs none)."""
        if self._ws is not None:
            return self._ws
        words = self.end_byte - self.first_byte
        cpu = self.device.type == "cpu"
        # the hit flags padded to whole 64-bit words, the padding zero and never set (flag_positions)
        flags = torch.empty(-(-n // 8) * 8, dtype=torch.bool, device=self.device)
        flags[n:].zero_()
        made = (torch.empty(n, dtype=torch.float32, device=self.device),
                torch.empty(n if self.gathered_floor else 0, dtype=torch.float32, device=self.device),
                torch.zeros(8 * words, dtype=torch.bool, device=self.device),
                flags)
        if cpu:
            self._ws = made
            self._piece_views = list(made[0].split(self.sizes))
        return made

    def select(self, stat: torch.Tensor, ks: List[int]) -> torch.Tensor:
        """The owner's packed byte segment of the mask for a statistic over [lo, hi) (ks: one k
        per piece, ignored for dense pieces)."""
        n_pieces, dev = len(self.pieces), self.device
        if not n_pieces:
            return torch.zeros(self.end_byte - self.first_byte, dtype=torch.uint8, device=dev)
        n = stat.numel()
        a, bound, bits, flags = self._workspaces(n)
        hit = flags[:n]
        sample = stat.index_select(0, self.sample_idx).abs_()
        ordered = torch.sort(self.sample_seg_key | _float_keys(sample)).values
        values = torch.cat(((ordered & 0xFFFFFFFF).to(torch.int32).view(torch.float32), self._sentinels))
        picks = torch.tensor(self._bracket(ks), dtype=torch.int64, device=dev)
        bounds = values.index_select(0, picks)
        skip = self.lo - 8 * self.first_byte
        if self.gathered_floor:
            above_floor(stat, self.piece_of, bounds[n_pieces:], hit, a, bound)
        else:
            views = self._piece_views if self._piece_views is not None else list(a.split(self.sizes))
            above_floor_by_piece(stat, views, bounds[n_pieces:], hit, a)
        # One scan finds what lies at or above the floor; among those (about k, plus the band)
        # the ceiling, which is at least the floor, separates the certain from the band.
        sparse_ks = [0 if p.dense else k for p, k in zip(self.pieces, ks)]
        found = flag_positions(flags, sparse=_SPARSE_HITS * sum(sparse_ks) < n)
        # Each hit's piece: the pieces' ends searched among the ascending hits (a search a piece,
        # not one a hit: 3x faster at 10% density) and each piece's id repeated over its hits.
        cuts = torch.searchsorted(found, self.ends_t)
        hits = torch.diff(cuts, prepend=cuts.new_zeros(1))
        found_seg = self.piece_ids.repeat_interleave(hits, output_size=found.numel())
        is_above = torch.gt(stat.index_select(0, found).abs_(), bounds[:n_pieces].index_select(0, found_seg))
        certain = found.masked_select(is_above)
        in_band_flags = is_above.logical_not_()
        where = found.masked_select(in_band_flags)
        seg = found_seg.masked_select(in_band_flags)
        in_band = torch.bincount(seg, minlength=n_pieces)
        k_t = torch.tensor(sparse_ks, dtype=torch.int64, device=dev)
        need = k_t - (hits - in_band)  # k less what lies above the ceiling
        # Rank each band by magnitude descending, then position ascending (the sort is stable
        # and the positions come ascending), pieces apart; keep the first `need` of each.
        keys = (seg << 32) | (0x7FFFFFFF - _float_keys(stat.index_select(0, where).abs_()))
        order = torch.sort(keys, stable=True).indices
        seg_sorted = seg.index_select(0, order)
        starts = torch.cumsum(in_band, 0) - in_band
        rank = torch.arange(where.numel(), device=dev) - starts.index_select(0, seg_sorted)
        chosen = where.index_select(0, order).masked_select(rank < need.index_select(0, seg_sorted))
        misled = ((need < 0) | (need > in_band)).nonzero().view(-1).tolist()
        if not misled and _SPARSE_MASK * (certain.numel() + chosen.numel()) < n:
            return self._pack_sparse(torch.cat((certain, chosen)).add_(skip), skip, n)
        mask = bits[skip:skip + n]
        mask.zero_()
        mask.index_fill_(0, certain, True)
        mask.index_fill_(0, chosen, True)
        mask.logical_or_(self.dense)
        if misled:
            self._select_alone(stat, mask, misled, ks)
        return _pack_words(bits)

    def _pack_sparse(self, positions: torch.Tensor, skip: int, n: int) -> torch.Tensor:
        """The packed segment from its sparse pieces' positions (counted from the segment's first
        byte) and the dense pieces' bits, packed once: no pass over a flag a position (2.0
        against 14.5 ms for a range of 15.2M values with 1.2% chosen; 18 against 11 ms at 10%)."""
        if self._dense_packed is None:
            frame = torch.zeros(8 * (self.end_byte - self.first_byte), dtype=torch.bool, device=self.device)
            frame[skip:skip + n] = self.dense
            self._dense_packed = _pack_words(frame)
        return pack_positions(positions, 0, self.end_byte - self.first_byte).bitwise_or_(self._dense_packed)

    def _select_alone(self, stat: torch.Tensor, mask: torch.Tensor, pieces: List[int], ks: List[int]) -> None:
        """The pieces whose bracket did not hold, each ranked on its own."""
        spans = [(self.pieces[j].begin - self.lo, self.pieces[j].end - self.lo) for j in pieces]
        picks = topk_indices([stat[b:e] for b, e in spans], [ks[j] for j in pieces])
        for (b, e), chosen in zip(spans, picks):
            part = mask[b:e]
            part.zero_()
            part.index_fill_(0, chosen, True)
