"""scape.torch.DeMo in one process (its trace against the core under torchrun is in
test_torch_scape_vs_core.py): the DCT basis is orthonormal and its transform round-trips, the
chunked top-k picks by hand-computed magnitudes with ties to the lower index, the momentum is
conserved (β m_before + g = m_after + IDCT(extracted)), k = C steps by the sign of the momentum,
a resume from state_dict is bit-identical, a non-finite gradient updates nothing, and bad
arguments are named."""
import pytest

torch = pytest.importorskip("torch")

import scape.torch as st  # noqa: E402
from scape.optim.demo import chunk_topk, chunk_transform, dct_basis  # noqa: E402
from test_torch_local_sgd import model, train  # noqa: E402


@pytest.mark.parametrize("length", [1, 5, 64])
def test_the_dct_basis_is_orthonormal_and_its_transform_round_trips(length):
    d = dct_basis(length).double()
    torch.testing.assert_close(d @ d.t(), torch.eye(length, dtype=torch.float64), atol=1e-6, rtol=0)
    x = torch.randn(3 * length, generator=torch.Generator().manual_seed(length))
    back = chunk_transform(chunk_transform(x, dct_basis(length), inverse=False), dct_basis(length), inverse=True)
    torch.testing.assert_close(back, x, atol=1e-6, rtol=1e-6)
    # y_0 of a chunk is its sum over sqrt(length): the orthonormal DC term
    y = chunk_transform(x, dct_basis(length), inverse=False).view(3, length)
    torch.testing.assert_close(y[:, 0], x.view(3, length).sum(1) / length ** 0.5, atol=1e-6, rtol=1e-6)


def test_the_chunked_topk_by_hand_ties_to_the_lower_index():
    y = torch.tensor([1.0, -3.0, 3.0, 2.0, 2.0, 2.0, -2.0, 0.5])
    offsets, values = chunk_topk(y, 4, 2)
    assert offsets.tolist() == [[1, 2], [0, 1]]       # |-3| = |3| keep both; then three 2s: the lower two
    assert values.tolist() == [[-3.0, 3.0], [2.0, 2.0]]
    offsets, _ = chunk_topk(y, 4, 4)
    assert offsets.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]


def reference_extraction(g, chunk, topk):
    """IDCT(top-k per chunk of DCT(g)), in double from the cosine formula, k by a plain sort."""
    n = g.numel()
    out = torch.zeros(n, dtype=torch.float64)
    for first in range(0, n, chunk):
        x = g[first:first + chunk].double()
        length = x.numel()
        f = torch.arange(length, dtype=torch.float64).view(-1, 1)
        j = torch.arange(length, dtype=torch.float64).view(1, -1)
        c = torch.where(f == 0, 1.0, 2.0)
        d = torch.sqrt(c / length) * torch.cos(torch.pi * (2 * j + 1) * f / (2 * length))
        y = d @ x
        keep = torch.zeros(length, dtype=torch.float64)
        order = sorted(range(length), key=lambda i: (-abs(float(y[i])), i))[:min(topk, length)]
        keep[order] = y[order]
        out[first:first + length] = d.t() @ keep
    return out


def test_the_momentum_is_conserved_and_k_equal_to_c_steps_by_its_sign():
    """One step from m = 0 at W = 1 against a double-precision reference of the extraction E =
    IDCT(top-k per chunk of DCT(g)): m_after = g − E and the step is −η sign(E) (where E is clear
    of rounding). With k = C, E = g: nothing stays in m and the step is −η sign(g)."""
    for chunk, topk in ((8, 3), (8, 8), (7, 2)):  # 244 = 34·7 + 6: a tail chunk at 7
        m = model()
        opt = st.DeMo(m.parameters(), lr=1e-2, weight_decay=0.0, chunk=chunk, topk=topk)
        before = torch.cat([p.detach().reshape(-1) for p in m.parameters()]).clone()
        torch.manual_seed(1)
        m(torch.randn(4, 8)).pow(2).mean().backward()
        g = torch.cat([p.grad.reshape(-1) for p in m.parameters()]).clone()
        opt.step()
        after = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
        extracted = reference_extraction(g, chunk, topk)
        torch.testing.assert_close(opt._m.double(), g.double() - extracted, atol=1e-6, rtol=0)
        clear = extracted.abs() > 1e-6
        assert int(clear.sum()) > 100
        assert torch.equal(((before - after) / 1e-2).round().double()[clear], torch.sign(extracted[clear]))
        if topk == chunk:
            assert float(opt._m.abs().max()) < 1e-6
        else:
            assert float(opt._m.abs().max()) > 1e-4  # the coefficients not taken stay in m


@pytest.mark.parametrize("save_at", [2, 5])
def test_a_resume_from_state_dict_is_bit_identical(save_at):
    def make(seed=0):
        m = model(seed)
        return m, st.DeMo(m.parameters(), lr=1e-2, chunk=16, topk=4)
    whole = train(*make(), 1, 8)
    m, opt = make()
    train(m, opt, 1, save_at)
    saved = {"model": m.state_dict(), "opt": opt.state_dict()}
    m, opt = make(seed=7)
    m.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    assert torch.equal(train(m, opt, save_at + 1, 8 - save_at), whole)


def test_a_non_finite_gradient_updates_nothing_and_is_named():
    m = model()
    opt = st.DeMo(m.parameters(), lr=1e-2, chunk=16, topk=4)
    train(m, opt, 1, 2)
    params = [p.detach().clone() for p in m.parameters()]
    moment = opt._m.clone()
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    next(iter(m.parameters())).grad[0, 0] = float("nan")
    with pytest.raises(st.NonFiniteGradient, match=r"^step 3: a gradient holds inf or NaN on rank\(s\) \[0\]"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(params, m.parameters())) and torch.equal(opt._m, moment)


@pytest.mark.parametrize("kwargs, message", [
    ({"chunk": 0}, r"^chunk: an integer in \[1, 4096\], got 0"),
    ({"chunk": 5000}, r"^chunk: an integer in \[1, 4096\], got 5000"),
    ({"chunk": 8, "topk": 9}, r"^topk: an integer in \[1, chunk = 8\], got 9"),
    ({"topk": 2.5}, r"^topk: an integer in \[1, chunk = 64\], got 2.5"),
])
def test_bad_arguments_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        st.DeMo(model().parameters(), lr=1e-3, **kwargs)
