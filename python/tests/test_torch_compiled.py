"""SCAPE(..., compile=True): the kernel torch.compile fuses (scape.optim.compiled) held to its
eager reference bit for bit, on the values a step meets (NaN, infinities, signed zeros,
subnormals), and the whole optimizer's masks and parameters with compile=True equal to
compile=False. Also the mask-to-positions rule's two branches against a plain unpack."""
import random

import pytest

torch = pytest.importorskip("torch")

import scape.torch as st  # noqa: E402
from scape.optim import compiled  # noqa: E402
from scape.optim.masks import pack_bits, packed_positions, unpack_bits  # noqa: E402


@pytest.mark.parametrize("density", [0.0, 0.001, 0.01, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("n", [1, 7, 8, 1000, 99_999])
def test_packed_positions_equal_the_unpacked_bits_set(density, n):
    torch.manual_seed(n)
    bits = torch.rand(n) < density
    packed = pack_bits(bits)
    got = packed_positions(packed)
    want = unpack_bits(packed, n).nonzero().view(-1)
    assert got.dtype == torch.int64 and torch.equal(got, want)


def test_every_byte_value_unpacks_to_its_bits():
    """The dense branch's 256-entry lookup, each byte value once (every byte set: the dense branch),
    against bits read by hand."""
    packed = torch.arange(1, 256, dtype=torch.uint8)
    want = [8 * i + j for i, b in enumerate(range(1, 256)) for j in range(8) if (b >> j) & 1]
    assert packed_positions(packed).tolist() == want


def special_values(n, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40, 3e38])
    where = torch.randint(0, n, (64,), generator=gen)
    x[where] = specials.repeat(8)
    return x


@pytest.mark.parametrize("with_residual", [True, False])
def test_the_fused_candidate_equals_the_eager_ops(with_residual):
    n = 50_003
    m, g, e = special_values(n, 1), special_values(n, 2), special_values(n, 3)
    b1, omb1 = 0.89999997615814209, 0.10000000149011612  # f32(0.9), f32(0.1)
    want, got = torch.empty(n), torch.empty(n)
    compiled.candidate_eager(m, g.clone(), e if with_residual else None, b1, omb1, want)
    compiled.candidate_compiled()(m, g.clone(), e if with_residual else None, b1, omb1, got)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(0.0).view(torch.int32), want.nan_to_num(0.0).view(torch.int32))


def test_compile_must_be_a_bool():
    p = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="compile"):
        st.SCAPE([p], lr=1e-3, compile="yes")


def run_steps(compile_kernels, sparsity, steps=4):
    rng = random.Random(7)
    torch.manual_seed(7)
    shapes = [("wte", (300, 64)), ("h.0.ln.weight", (64,)), ("h.0.attn.weight", (64, 192)),
              ("h.0.attn.bias", (192,)), ("h.0.mlp.weight", (64, 256)), ("lm_head.weight", (512, 64))]
    named = [(name, torch.nn.Parameter(torch.randn(shape) * 0.02)) for name, shape in shapes]
    opt = st.SCAPE(named, lr=1e-3, sparsity=sparsity, compile=compile_kernels)
    masks = []
    for _ in range(steps):
        for _, p in named:
            p.grad = torch.randn(p.shape) * 1e-3 * rng.uniform(0.5, 2.0)
        opt.step()
        masks.append(opt.mask_bits().clone())
    return masks, opt.flat_params().clone()


@pytest.mark.parametrize("sparsity", [0.99, 0.9])
def test_scape_with_compiled_kernels_equals_the_eager_step(sparsity):
    eager_masks, eager_params = run_steps(False, sparsity)
    fused_masks, fused_params = run_steps(True, sparsity)
    for t, (a, b) in enumerate(zip(eager_masks, fused_masks), start=1):
        assert torch.equal(a, b), f"step {t}: the masks differ"
    assert torch.equal(eager_params, fused_params)


def test_the_in_place_candidate_equals_the_eager_ops():
    """The eager step's candidate (compiled.candidate_in_place: the gradient's buffer, m's term on
    its support alone) against the four-pass reference, m zero off a support of 1 in 7: equal
    values everywhere, equal bits but for the sign of a zero; with the support unknown, and with
    no momentum term (the sharded a), equal bits."""
    n = 50_003
    g, e = special_values(n, 2), special_values(n, 3)
    support = torch.arange(0, n, 7)
    m = torch.zeros(n)
    m[support] = special_values(support.numel(), 1)
    b1, omb1 = 0.89999997615814209, 0.10000000149011612
    want = torch.empty(n)
    compiled.candidate_eager(m, g.clone(), e, b1, omb1, want)
    for known in (support, None):
        got = g.clone()
        compiled.candidate_in_place(got, m, known, e, b1, omb1)
        assert torch.equal(got.isnan(), want.isnan())
        both_zero = (got == 0) & (want == 0)
        same_bits = got.nan_to_num(0.0).view(torch.int32) == want.nan_to_num(0.0).view(torch.int32)
        assert bool((same_bits | both_zero).all())
        if known is None:
            assert bool(same_bits.all())
    got = g.clone()
    compiled.candidate_in_place(got, None, None, e, b1, omb1)
    plain = g * omb1 + e
    assert torch.equal(got.nan_to_num(0.0).view(torch.int32), plain.nan_to_num(0.0).view(torch.int32))


def test_the_first_moment_written_through_its_views_is_followed():
    """opt.state[p]["exp_avg"] are views of the first moment: a caller who writes into them (off
    the mask, where the step knows m to be zero) gets the step that a fresh optimizer loaded
    with the same state takes."""
    torch.manual_seed(3)
    shapes = [("h.0.attn.weight", (64, 192)), ("h.0.ln.weight", (64,)), ("lm_head.weight", (512, 64))]
    named_a = [(name, torch.nn.Parameter(torch.randn(shape) * 0.02)) for name, shape in shapes]
    grads = [[torch.randn(shape) * 1e-3 for _, shape in shapes] for _ in range(3)]
    opt_a = st.SCAPE(named_a, lr=1e-3, sparsity=0.99)

    def step(named, opt, t):
        for (_, p), grad in zip(named, grads[t]):
            p.grad = grad.clone()
        opt.step()

    for t in range(2):
        step(named_a, opt_a, t)
    for _, p in named_a:
        opt_a.state[p]["exp_avg"].add_(1e-3)
    named_b = [(name, torch.nn.Parameter(p.detach().clone())) for name, p in named_a]
    opt_b = st.SCAPE(named_b, lr=1e-3, sparsity=0.99)
    opt_b.load_state_dict(opt_a.state_dict())
    assert torch.equal(opt_a._m, opt_b._m) and bool((opt_a._m != 0).all())
    step(named_a, opt_a, 2)
    step(named_b, opt_b, 2)
    assert torch.equal(opt_a.mask_bits(), opt_b.mask_bits())
    assert torch.equal(opt_a.flat_params(), opt_b.flat_params())
