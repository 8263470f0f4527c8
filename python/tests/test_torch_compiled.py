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
