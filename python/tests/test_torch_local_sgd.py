"""scape.torch.DiLoCo and SparseLoCo in one process (the traces against the core under torchrun
are in test_torch_scape_vs_core.py): DiLoCo's invariant at W = 1 (α = 1, μ = 0 is the inner
AdamS bit for bit), its outer step against its formula, the fragment schedule against the core's
rule; SparseLoCo's chunked top-k, k rule and quantizer on hand-computed vectors, its outer step
against its formula; resumes from state_dict (mid-delay) bit-identical; bad arguments named."""
import pytest

torch = pytest.importorskip("torch")

import scape.torch as st  # noqa: E402
from scape.optim.diloco import fragment_boundaries, fragment_synced_at  # noqa: E402
from scape.optim.sparseloco import chunk_topk, k_for, quantize_statistical  # noqa: E402


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def train(m, opt, first, steps):
    for t in range(first, first + steps):
        torch.manual_seed(t)
        opt.zero_grad(set_to_none=True)
        m(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


@pytest.mark.parametrize("fragments, overlap", [(1, False), (2, False), (1, True), (3, True)])
def test_at_one_rank_with_alpha_1_and_mu_0_it_is_its_inner_adams(fragments, overlap):
    """θ_g − (θ_g − θ_i) is θ_i exactly while θ_i/θ_g stays in [1/2, 2] (Sterbenz): the outer
    step then changes nothing, and DiLoCo is AdamS bit for bit."""
    def far_from_zero():  # every θ_i/θ_g stays near 1 over these few small steps
        m = model()
        with torch.no_grad():
            for p in m.parameters():
                p.uniform_(1.0, 2.0, generator=torch.Generator().manual_seed(p.numel()))
        return m
    reference = far_from_zero()
    plain = train(reference, st.AdamS(reference.parameters(), lr=1e-3), 1, 12)
    m = far_from_zero()
    opt = st.DiLoCo(m.parameters(), lr=1e-3, inner_steps=3, outer_lr=1.0, outer_momentum=0.0,
                    streaming_fragments=fragments, overlap_outer=overlap, total_steps=12)
    assert torch.equal(train(m, opt, 1, 12), plain)


def test_with_adamw_inner_steps_at_one_rank_it_is_torchs_adamw():
    """inner = "adamw", α = 1, μ = 0, one rank: torch.optim.AdamW's trajectory (decoupled decay,
    bias-corrected), which computes the same formula in another order of roundings (lerp,
    addcdiv): equal within a few fp32 ulps a step, not bit for bit; the AdamS inner rule is
    further away than that, so the test tells the two rules apart."""
    reference = model()
    torch_adamw = train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2, betas=(0.9, 0.95),
                                                     eps=1e-8, weight_decay=0.1), 1, 12)
    m = model()
    opt = st.DiLoCo(m.parameters(), lr=1e-2, inner="adamw", inner_steps=3, outer_lr=1.0, outer_momentum=0.0,
                    total_steps=12)
    got = train(m, opt, 1, 12)
    torch.testing.assert_close(got, torch_adamw, rtol=1e-5, atol=1e-6)
    assert set(opt.state[next(iter(m.parameters()))]) >= {"exp_avg", "exp_avg_sq"}
    adams = model()
    adams_run = train(adams, st.DiLoCo(adams.parameters(), lr=1e-2, inner_steps=3, outer_lr=1.0,
                                       outer_momentum=0.0, total_steps=12), 1, 12)
    assert float((adams_run - torch_adamw).abs().max()) > 1e-4


def test_one_outer_step_equals_its_formula():
    """H = 2, W = 1: after step 2, θ_g = θ_0 − α(Δ + μ·Δ) with Δ = θ_0 − θ_2 (b = Δ at the first
    outer step), and the parameters are θ_g."""
    m = model()
    opt = st.DiLoCo(m.parameters(), lr=1e-2, inner_steps=2, outer_lr=0.7, outer_momentum=0.9)
    theta0 = torch.cat([p.detach().reshape(-1) for p in m.parameters()]).clone()
    inner = model()
    theta2 = train(inner, st.AdamS(inner.parameters(), lr=1e-2), 1, 2)
    got = train(m, opt, 1, 2)
    delta = torch.neg(theta2).add_(theta0)
    mu, alpha = 0.9, 0.7
    update = torch.mul(delta, torch.tensor(mu).item()).add_(delta).mul_(-torch.tensor(alpha).item())
    assert torch.equal(got, theta0 + update)
    assert opt.last_metrics["pseudo_grad_norm"] == pytest.approx(float(delta.norm()), rel=1e-6)


def test_the_fragment_schedule_is_the_cores():
    # H = 50, F = 4: fragments synced at steps 12, 25, 37 and 50 of each period (docs/algorithms.md)
    synced = {t: fragment_synced_at(t, 50, 4) for t in range(1, 101) if fragment_synced_at(t, 50, 4) >= 0}
    assert synced == {12: 0, 25: 1, 37: 2, 50: 3, 62: 0, 75: 1, 87: 2, 100: 3}
    assert fragment_boundaries([10, 20, 100], 2) == [0, 20, 100]   # the tensor edge nearest 50 ...
    assert fragment_boundaries([10, 15, 100], 2) == [0, 15, 100]   # ... ties and nearness by edge
    assert fragment_boundaries([100], 3) == [0, 33, 66, 100]       # one tensor: even cuts


def test_sparseloco_chunk_topk_k_rule_and_quantizer_by_hand():
    e = torch.tensor([1.0, -3.0, 3.0, 0.5, 2.0, -2.0, 0.1])
    # chunks [1, -3, 3], [0.5, 2, -2], [0.1]: ties go to the lower index, the short chunk keeps 1
    assert chunk_topk(e, 3, 2).tolist() == [1, 2, 4, 5, 6]
    assert (k_for(0.1, 64), k_for(0.01, 4096), k_for(0.5, 3), k_for(0.3, 10)) == (7, 41, 2, 3)
    # values 1, 2, 3, 10 at 2 bits: shift 4, centered -3 -2 -1 6, sigma = sqrt(50/3) = 4.08, scale
    # 6 sigma / 4 = 6.12; codes rint(c/scale + 2) = rint(1.51, 1.67, 1.84, 2.98) = 2, 2, 2, 3; the
    # bins' means: bin 2 holds -3, -2, -1 (mean -2), bin 3 holds 6, bins 0 and 1 are empty (0)
    shift, book, codes = quantize_statistical(torch.tensor([1.0, 2.0, 3.0, 10.0]), 2)
    scale = torch.tensor(6 * (50 / 3) ** 0.5 / 4, dtype=torch.float32)
    want = torch.round(torch.tensor([-3.0, -2.0, -1.0, 6.0]) / scale + 2).clamp(0, 3)
    assert shift == 4.0 and codes.tolist() == want.long().tolist() == [2, 2, 2, 3]
    assert book.tolist() == [0.0, 0.0, -2.0, 6.0]


def test_one_sparseloco_outer_step_equals_its_formula():
    """W = 1, H = 2, q = 0 (values exact), β = 1: e = Δ after step 2; the top-k of each chunk is
    delivered and θ_g = θ_0 − α · (Δ on the selected positions); e keeps the rest."""
    m = model()
    opt = st.SparseLoCo(m.parameters(), lr=1e-2, inner_steps=2, outer_lr=0.9, sparsity=0.75, chunk=8, quant_bits=0,
                        ef_decay=1.0)
    theta0 = torch.cat([p.detach().reshape(-1) for p in m.parameters()]).clone()
    inner = model()
    theta2 = train(inner, st.AdamS(inner.parameters(), lr=1e-2), 1, 2)
    got = train(m, opt, 1, 2)
    delta = torch.neg(theta2).add_(theta0)
    sent = torch.zeros_like(delta)
    at = 0
    for p in m.parameters():
        idx = chunk_topk(delta[at:at + p.numel()], 8, 2) + at
        sent[idx] = delta[idx]
        at += p.numel()
    assert torch.equal(got, theta0 + sent.mul(-torch.tensor(0.9).item()))
    assert torch.equal(opt._error, delta - sent)


@pytest.mark.parametrize("inner", ["adams", "adamw"])
@pytest.mark.parametrize("save_at", [3, 4])
@pytest.mark.parametrize("kind", ["diloco", "sparseloco"])
def test_a_resume_from_state_dict_is_bit_identical(save_at, kind, inner):
    """H = 3 with the one-step delay: saved right at a sync (the outer step in flight) and one
    step later; with AdamW inner steps the second moment travels too."""
    def make(seed=0):
        m = model(seed)
        if kind == "sparseloco":
            return m, st.SparseLoCo(m.parameters(), lr=1e-2, inner=inner, inner_steps=3, chunk=8, sparsity=0.75,
                                    overlap_outer=True, total_steps=10)
        return m, st.DiLoCo(m.parameters(), lr=1e-2, inner=inner, inner_steps=3, streaming_fragments=3,
                            overlap_outer=True, total_steps=10)
    whole = train(*make(), 1, 10)
    m, opt = make()
    train(m, opt, 1, save_at)
    saved = {"model": m.state_dict(), "opt": opt.state_dict()}
    m, opt = make(seed=7)
    m.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    assert torch.equal(train(m, opt, save_at + 1, 10 - save_at), whole)


@pytest.mark.parametrize("kwargs, message", [
    ({"inner": "sgd"}, r"^inner: expected one of 'adams', 'adamw' or a torch optimizer, got 'sgd'"),
    ({"inner_steps": 0}, r"^inner_steps: must be an integer >= 1"),
    ({"inner_steps": 2, "streaming_fragments": 3}, r"^streaming_fragments: 3 fragments need inner_steps >= 3"),
    ({"outer_wire": "fp16"}, r"^outer_wire: expected one of 'fp32', 'bf16', 'fp8_e5m2', got 'fp16'"),
    ({"outer_momentum": 1.0}, r"^outer_momentum: must lie in \[0, 1\)"),
    ({"outer_lr": 0.0}, r"^outer_lr: must be > 0"),
])
def test_bad_arguments_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        st.DiLoCo(model().parameters(), lr=1e-3, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"sparsity": 1.0}, r"^sparsity: must lie in \[0, 1\)"),
    ({"chunk": 0}, r"^chunk: an integer in \[1, 32768\]"),
    ({"quant_bits": 4}, r"^quant_bits: expected one of 0, 2, 8, got 4"),
    ({"ef_decay": 1.5}, r"^ef_decay: must lie in \[0, 1\]"),
    ({"wire_dtype": "fp8_e5m2"}, r"^wire_dtype: expected one of 'fp32', 'bf16'"),
])
def test_sparseloco_bad_arguments_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        st.SparseLoCo(model().parameters(), lr=1e-3, **kwargs)


def test_a_state_saved_with_adams_inner_steps_is_refused_by_adamw_naming_the_moment():
    m = model()
    saved = st.DiLoCo(m.parameters(), lr=1e-2, inner_steps=2).state_dict()
    opt = st.DiLoCo(m.parameters(), lr=1e-2, inner="adamw", inner_steps=2)
    with pytest.raises(ValueError, match=r"has no exp_avg_sq \(saved with another inner rule than this "
                                         r"optimizer's 'adamw'\?\)"):
        opt.load_state_dict(saved)


def far_from_zero_model():
    """Every θ_i/θ_g stays in [1/2, 2] over a few small steps (see the α = 1, μ = 0 test)."""
    m = model()
    with torch.no_grad():
        for p in m.parameters():
            p.uniform_(1.0, 2.0, generator=torch.Generator().manual_seed(p.numel()))
    return m


@pytest.mark.parametrize("as_function", [False, True])
def test_with_a_torch_optimizer_as_inner_at_alpha_1_and_mu_0_it_is_that_optimizer_bit_for_bit(as_function):
    """inner = torch.optim.AdamW (an instance, or a function of the parameters): at one rank with
    α = 1, μ = 0 the outer step changes nothing (Sterbenz), so the run is torch's AdamW itself,
    bit for bit; and its learning rate is the inner optimizer's."""
    reference = far_from_zero_model()
    plain = train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.05), 1, 12)
    m = far_from_zero_model()
    make = lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)  # noqa: E731
    inner = make if as_function else make(list(m.parameters()))
    opt = st.DiLoCo(m.parameters(), inner=inner, inner_steps=3, outer_lr=1.0, outer_momentum=0.0)
    assert torch.equal(train(m, opt, 1, 12), plain)
    assert opt.last_metrics["lr"] == 1e-3 and opt.config()["inner"] == "AdamW"


def test_with_a_torch_optimizer_as_inner_one_outer_step_equals_its_formula():
    """H = 2, W = 1, inner torch SGD: after step 2, θ_g = θ_0 − α(Δ + μΔ), Δ = θ_0 − θ_2, where θ_2
    is two steps of the same SGD alone."""
    m = model()
    sgd = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.5)
    opt = st.DiLoCo(m.parameters(), inner=sgd, inner_steps=2, outer_lr=0.7, outer_momentum=0.9)
    theta0 = torch.cat([p.detach().reshape(-1) for p in m.parameters()]).clone()
    alone = model()
    theta2 = train(alone, torch.optim.SGD(alone.parameters(), lr=0.05, momentum=0.5), 1, 2)
    got = train(m, opt, 1, 2)
    delta = torch.neg(theta2).add_(theta0)
    update = torch.mul(delta, torch.tensor(0.9).item()).add_(delta).mul_(-torch.tensor(0.7).item())
    assert torch.equal(got, theta0 + update)
    assert opt.last_metrics["pseudo_grad_norm"] == pytest.approx(float(delta.norm()), rel=1e-6)


@pytest.mark.parametrize("save_at", [3, 4])
def test_with_a_torch_optimizer_as_inner_a_resume_is_bit_identical(save_at):
    """The inner optimizer's own state (AdamW's moments and step) travels in state_dict."""
    def make(seed=0):
        m = model(seed)
        inner = torch.optim.AdamW(m.parameters(), lr=1e-2)
        return m, st.DiLoCo(m.parameters(), inner=inner, inner_steps=3, overlap_outer=True, total_steps=10)
    whole = train(*make(), 1, 10)
    m, opt = make()
    train(m, opt, 1, save_at)
    saved = {"model": m.state_dict(), "opt": opt.state_dict()}
    assert "inner_optimizer_rank0_of_1" in saved["opt"]  # each rank's own (DCP keeps them apart)
    m, opt = make(seed=7)
    m.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    assert torch.equal(train(m, opt, save_at + 1, 10 - save_at), whole)
    with pytest.raises(ValueError, match=r"^state_dict: saved with a torch optimizer as inner"):
        st.DiLoCo(model().parameters(), lr=1e-2, inner_steps=3).load_state_dict(saved["opt"])
    with pytest.raises(ValueError, match=r"^state_dict: no inner_optimizer"):
        opt.load_state_dict(st.DiLoCo(m.parameters(), lr=1e-2, inner_steps=3).state_dict())


def test_a_torch_inner_optimizer_over_other_parameters_or_of_another_kind_is_refused_naming_inner():
    m, other = model(), model(1)
    with pytest.raises(ValueError, match=r"^inner: the torch optimizer holds 4 tensors, not exactly DiLoCo's 6"):
        st.DiLoCo(m.parameters(), inner=torch.optim.AdamW(list(m.parameters())[:4]))
    with pytest.raises(ValueError, match=r"^inner: the torch optimizer holds"):
        st.DiLoCo(m.parameters(), inner=torch.optim.AdamW(other.parameters()))
    with pytest.raises(ValueError, match=r"^inner: the function returned a int"):
        st.DiLoCo(m.parameters(), inner=lambda params: 3)
    with pytest.raises(ValueError, match=r"^inner: a scape.torch optimizer communicates"):
        st.DiLoCo(m.parameters(), inner=st.AdamS(m.parameters(), lr=1e-3))
    with pytest.raises(ValueError, match=r"^lr: required with inner = 'adams'"):
        st.DiLoCo(m.parameters())


def test_a_scheduler_on_diloco_with_a_torch_inner_optimizer_is_refused_not_ignored():
    """With a torch optimizer as inner, DiLoCo's own lr is unused: a scheduler attached to DiLoCo
    would change nothing, so the next step says where to attach it."""
    m = model()
    opt = st.DiLoCo(m.parameters(), inner=torch.optim.AdamW(m.parameters(), lr=1e-3), inner_steps=2)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 ** k).step()
    with pytest.raises(ValueError, match=r"^step 1: DiLoCo's lr was changed .* schedule the inner optimizer"):
        train(m, opt, 1, 1)


def with_suffix(state, old, new):
    """A state_dict whose per-rank keys end in `new` instead of `old`."""
    out = dict(state)
    out["state"] = {i: {(k[:-len(old)] + new if k.endswith(old) else k): v for k, v in entry.items()}
                    for i, entry in state["state"].items()}
    return out


def test_the_per_rank_state_is_refused_by_a_group_of_another_size_or_another_rank_naming_both():
    """Each rank's DiLoCo state (inner moments, its own parameters between syncs) lives under a
    key of its own, so that torch.distributed.checkpoint keeps every rank's; a group of another
    size, or another rank's file, is told so instead of resuming from values that are not its own.
    A state of the plain keys (saved per rank before these keys) is read as the rank's own."""
    m = model()
    opt = st.DiLoCo(m.parameters(), lr=1e-2, inner_steps=3)
    train(m, opt, 1, 2)
    state = opt.state_dict()
    assert all(k.endswith("_rank0_of_1") for entry in state["state"].values() for k in entry
               if k not in ("step", "format", "skipped_steps", "outer_global_set"))
    with pytest.raises(ValueError, match="saved by a group of 2 ranks, this one has 1"):
        opt.load_state_dict(with_suffix(state, "_rank0_of_1", "_rank1_of_2"))
    with pytest.raises(ValueError, match=r"holds the state of rank\(s\) \[1\] of 1, not of this rank 0"):
        opt.load_state_dict(with_suffix(state, "_rank0_of_1", "_rank1_of_1"))
    resumed, plain = st.DiLoCo(model().parameters(), lr=1e-2, inner_steps=3), with_suffix(state, "_rank0_of_1", "")
    resumed.load_state_dict(plain)
    assert all(torch.equal(a, b) for a, b in zip(resumed.state_dict()["state"][0].values(),
                                                 state["state"][0].values()) if isinstance(a, torch.Tensor))
