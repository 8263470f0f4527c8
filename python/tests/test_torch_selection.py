"""scape.optim.selection.RangeSelector held to masks.topk_indices, the per-tensor selection the C++
core's rule was first checked on: exactly k per piece, equal magnitudes to the lower index, dense
pieces whole, the bits placed in the owner's byte range. The strided sample's bracket at every
stride (and the lone ranking of a piece whose bracket fails, here on ties, zeros and a sample
placed on the smallest magnitudes) is held here, on pieces from sampled whole to stride 127."""
import random

import pytest

torch = pytest.importorskip("torch")

from scape.optim.layout import Piece  # noqa: E402
from scape.optim.masks import topk_indices, unpack_bits  # noqa: E402
from scape.optim.selection import RangeSelector, sample_stride  # noqa: E402


def expected_bits(stat, pieces, ks, lo):
    want = torch.zeros(stat.numel(), dtype=torch.bool)
    sparse = [(p, k) for p, k in zip(pieces, ks) if not p.dense and k > 0]  # k = 0: no bit
    picks = topk_indices([stat[p.begin - lo:p.end - lo] for p, _ in sparse], [k for _, k in sparse])
    for (p, _), chosen in zip(sparse, picks):
        want[chosen + p.begin - lo] = True
    for p in pieces:
        if p.dense:
            want[p.begin - lo:p.end - lo] = True
    return want


@pytest.mark.parametrize("gathered_floor", [False, True], ids=["floor-by-piece", "gathered-floor"])
@pytest.mark.parametrize("values", ["normal", "ties", "half-zero", "sample-misled"])
@pytest.mark.parametrize("density", [0.01, 0.1, 0.5, 1.0])
def test_the_range_selection_equals_the_per_tensor_one(values, density, gathered_floor, monkeypatch):
    """Both floor paths on the CPU: the gathered floor is the accelerators' default, so CI holds it
    to the same masks."""
    alone = []
    lone_ranking = RangeSelector._select_alone
    monkeypatch.setattr(RangeSelector, "_select_alone",
                        lambda self, *args: (alone.append(args[2]), lone_ranking(self, *args))[1])
    rng = random.Random(f"{values}-{density}")
    torch.manual_seed(rng.randrange(2 ** 31))
    for _ in range(4):
        lo = rng.choice([0, 3, 13, 64])
        pieces, at = [], lo
        for j in range(rng.randint(1, 7)):
            size = rng.choice([5, 300, 2900, 4000, 12000, 40000, 70000])
            pieces.append(Piece(at, at + size, j, rng.random() < 0.2))
            at += size
        stat = torch.randn(at - lo)
        if values == "ties":
            stat = torch.randint(-3, 4, (at - lo,)).float()
        elif values == "half-zero":
            stat[:(at - lo) // 2] = 0.0
        elif values == "sample-misled":  # the sampled positions hold the smallest magnitudes
            stat = 1.0 + torch.rand(at - lo)
            for p in pieces:
                stride = sample_stride(p.size)
                stat[p.begin - lo:p.end - lo:stride] = 1e-3 * torch.rand(len(range(p.begin, p.end, stride)))
        ks = [p.size if p.dense else max(1, int(density * p.size)) for p in pieces]
        first, end = lo // 8, (at + 7) // 8
        selector = RangeSelector(lo, at, pieces, (first, end), torch.device("cpu"), gathered_floor=gathered_floor)
        for _ in range(2):  # the second call runs on the reused buffers
            packed = selector.select(stat, ks)
            assert packed.dtype == torch.uint8 and packed.numel() == end - first
            bits = unpack_bits(packed, 8 * packed.numel())
            skip = lo - 8 * first
            assert not bits[:skip].any() and not bits[skip + at - lo:].any()
            got = bits[skip:skip + at - lo]
            assert torch.equal(got, expected_bits(stat, pieces, ks, lo))
            for p, k in zip(pieces, ks):
                assert int(got[p.begin - lo:p.end - lo].sum()) == (p.size if p.dense else k)
    if values == "sample-misled" and density in (0.1, 0.5):  # the bracket failed and was caught
        assert alone  # (at 1% the margin reaches the sample's top: the band is the whole piece)


def test_the_cpu_selection_keeps_no_index_of_pieces():
    """Bytes kept between calls, by hand: the dense flags (1 a position) before the first call,
    then the magnitudes (4), two flags (1 + 1) and, the mask being sparse, the dense flags packed
    (1/8); the gathered floor adds each position's piece (4) and its floor (4). Both give the
    same mask."""
    n = 20000
    pieces = [Piece(0, 4000, 0, False), Piece(4000, 4100, 1, True), Piece(4100, n, 2, False)]
    by_piece = RangeSelector(0, n, pieces, (0, n // 8), torch.device("cpu"))
    gathered = RangeSelector(0, n, pieces, (0, n // 8), torch.device("cpu"), gathered_floor=True)
    assert by_piece.piece_of is None and by_piece.workspace_bytes() == n
    assert gathered.workspace_bytes() == 5 * n
    stat = torch.randn(n, generator=torch.Generator().manual_seed(3))
    ks = [40, 100, 159]
    got = by_piece.select(stat, ks)
    assert torch.equal(got, gathered.select(stat, ks))
    assert int(unpack_bits(got, n).sum()) == 40 + 100 + 159
    assert by_piece.workspace_bytes() == 7 * n + n // 8 and gathered.workspace_bytes() == 15 * n + n // 8


def test_sample_strides_leave_enough_points_and_divide_no_common_width():
    assert sample_stride(11 * 256 - 1) == 1 and sample_stride(11 * 256) == 11
    assert sample_stride(4096) == 13 and sample_stride(16384) == 61 and sample_stride(127 * 256) == 127
    for size in (2816, 4096, 12288, 16384, 65536, 589824, 2359296):
        stride = sample_stride(size)
        assert (size + stride - 1) // stride >= 256
    for width in (64, 128, 192, 256, 384, 683, 768, 1024, 1536, 2048, 3072, 4096):
        assert all(width % s for s in (11, 13, 17, 19, 23, 29, 31, 61, 127))


def test_the_floor_by_piece_flags_what_the_gathered_floor_flags():
    """above_floor_by_piece (the CPU's subtraction of each piece's floor) against above_floor
    (each position's floor gathered): the same flags on NaN, infinities, signed zeros,
    subnormals and values equal to their floor, with a dense piece's NaN floor and the -1 that
    takes a whole piece."""
    from scape.optim.selection import above_floor, above_floor_by_piece
    gen = torch.Generator().manual_seed(5)
    sizes = [1000, 37, 4096, 1, 513]
    stat = torch.randn(sum(sizes), generator=gen)
    floors = torch.tensor([0.7, float("nan"), 1e-40, -1.0, 2.0])
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40, 3e38, 0.7, -0.7,
                             2.0, -2.0, 1.4e-45])
    where = torch.randint(0, stat.numel(), (260,), generator=gen)
    stat[where] = specials.repeat(20)
    piece_of = torch.arange(len(sizes), dtype=torch.int32).repeat_interleave(torch.tensor(sizes))
    want, got = torch.empty(stat.numel(), dtype=torch.bool), torch.empty(stat.numel(), dtype=torch.bool)
    above_floor(stat, piece_of, floors, want, torch.empty(stat.numel()), torch.empty(stat.numel()))
    magnitude = torch.empty(stat.numel())
    above_floor_by_piece(stat, list(magnitude.split(sizes)), floors, got, magnitude)
    assert torch.equal(got, want)
    assert bool(want[1000:1037].logical_not().all())  # the dense piece's NaN floor
    assert bool(want[5133]) != bool(stat[5133].isnan())  # floor -1: everything but NaN


@pytest.mark.parametrize("density", [0.0, 0.002, 0.016, 0.12, 1.0])
def test_the_word_scan_finds_what_nonzero_finds(density):
    """flag_positions through 64-bit words against torch's nonzero: flags in the first and last
    word and in every byte of a word, the storage's padding unset, at densities from none to all."""
    from scape.optim.selection import flag_positions
    gen = torch.Generator().manual_seed(11)
    for n in (8, 64, 1003, 40000):
        flags = torch.zeros(-(-n // 8) * 8, dtype=torch.bool)
        flags[:n] = torch.rand(n, generator=gen) < density
        flags[n - 1] = density > 0
        if n >= 16:
            flags[:16] = density > 0
        want = flags.nonzero().view(-1)
        assert torch.equal(flag_positions(flags, sparse=True), want)
        assert torch.equal(flag_positions(flags, sparse=False), want)


def test_one_selector_switches_between_its_paths():
    """A density schedule changes k between calls of one selector, so the word scan and the
    positions' packing alternate with the flags' paths on the same kept buffers: each call's mask
    equals the per-tensor selection, with pieces at k = 0, a dense piece, an owner range starting
    inside a byte, and a piece whose sample misleads its bracket beside the word scan."""
    gen = torch.Generator().manual_seed(21)
    lo = 13
    sizes = [40000, 300, 70000, 12000, 5, 300000]
    pieces, at = [], lo
    for j, size in enumerate(sizes):
        pieces.append(Piece(at, at + size, j, j == 1))
        at += size
    first, end = lo // 8, (at + 7) // 8
    selector = RangeSelector(lo, at, pieces, (first, end), torch.device("cpu"))
    paths = set()
    lone_ranking = RangeSelector._select_alone
    for call, density in enumerate([0.001, 0.2, 0.0, 0.005, 0.5, 0.002, 0.05, 0.001]):
        stat = torch.randn(at - lo, generator=gen)
        if call == 5:  # the third piece's sampled positions hold its smallest magnitudes
            p = pieces[2]
            stat[p.begin - lo:p.end - lo] = 1.0 + torch.rand(p.size, generator=gen)
            stride = sample_stride(p.size)
            stat[p.begin - lo:p.end - lo:stride] = 1e-3
        ks = [p.size if p.dense else int(density * p.size) for p in pieces]
        ks[4] = 0
        if call == 5:  # a k that gives the third piece a ceiling inside its (misleading) sample
            ks = [4, 300, 3500, 1, 0, 30]
        sparse_k = sum(k for p, k in zip(pieces, ks) if not p.dense)
        paths.add(50 * sparse_k < at - lo)
        alone = []
        RangeSelector._select_alone = lambda self, *args: (alone.append(args[2]), lone_ranking(self, *args))[1]
        try:
            packed = selector.select(stat, ks)
        finally:
            RangeSelector._select_alone = lone_ranking
        bits = unpack_bits(packed, 8 * packed.numel())
        skip = lo - 8 * first
        assert not bits[:skip].any() and not bits[skip + at - lo:].any()
        got = bits[skip:skip + at - lo]
        assert torch.equal(got, expected_bits(stat, pieces, ks, lo)), f"call {call}, density {density}"
        if call == 5:
            assert alone == [[2]] and 50 * sparse_k < at - lo  # the word scan found the hits
    assert paths == {True, False}
