"""parameters_as_views (scape/optim/mirror.py): the parameters as views of the optimizer's flat
buffer give the same steps, bit for bit, as copying them in and out, and the parameter stays the
truth: written in place, moved by p.data, frozen and unfrozen, sharing a storage, a view into a
larger buffer, bf16, or another optimizer's. One process, no process group."""
import pytest

torch = pytest.importorskip("torch")

import scape.torch as st  # noqa: E402
from scape.optim.mirror import ParamMirror  # noqa: E402

MAKERS = {
    "scape-replicated": lambda ps, views: st.SCAPE(ps, lr=1e-2, sparsity=0.75, parameters_as_views=views),
    "scape-sharded": lambda ps, views: st.SCAPE(ps, lr=1e-2, sparsity=0.75, sharded=True,
                                                 parameters_as_views=views),
    "adams": lambda ps, views: st.AdamS(ps, lr=1e-2, parameters_as_views=views),
}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def step(m, opt, seed):
    torch.manual_seed(100 + seed)
    opt.zero_grad(set_to_none=True)
    m(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()


def in_buffer(p, opt) -> bool:
    return p.untyped_storage().data_ptr() == opt.mirror.theta.untyped_storage().data_ptr()


def owns_storage(p) -> bool:
    return p.storage_offset() == 0 and p.untyped_storage().nbytes() == p.numel() * p.element_size()


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def moments(opt, m):
    return torch.cat([opt.state[p]["exp_avg"].reshape(-1) for p in m.parameters() if p in opt.state])


def both(kind, story):
    """`story(m, opt)` run on the copying optimizer and on the binding one: the parameters and
    first moments after it, bit for bit, and the binding run's model and optimizer."""
    runs = []
    for views in (False, True):
        m = model()
        opt = MAKERS[kind](m.parameters(), views)
        story(m, opt)
        runs.append((m, opt))
    (m0, opt0), (m1, opt1) = runs
    assert torch.equal(flat(m0), flat(m1))
    assert torch.equal(moments(opt0, m0), moments(opt1, m1))
    return m1, opt1


@pytest.mark.parametrize("kind", list(MAKERS))
def test_the_views_step_as_the_copies_do_bit_for_bit(kind):
    def story(m, opt):
        for t in range(5):
            step(m, opt, t)
    m, opt = both(kind, story)
    assert opt.mirror.bound == [True] * 6 and all(in_buffer(p, opt) for p in m.parameters())
    # each parameter is its own slice, in layout order
    at = 0
    for p in m.parameters():
        assert p.data_ptr() == opt.mirror.theta[at:].data_ptr()
        at += p.numel()


def test_without_the_switch_nothing_is_bound():
    m = model()
    opt = st.SCAPE(m.parameters(), lr=1e-2)
    step(m, opt, 0)
    assert opt.mirror.bound == [False] * 6 and all(owns_storage(p) for p in m.parameters())


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_parameter_written_in_place_is_the_buffer_already(kind):
    fresh = model().state_dict()

    def story(m, opt):
        step(m, opt, 0)
        m.load_state_dict(fresh)
        step(m, opt, 1)
    m, opt = both(kind, story)
    assert all(in_buffer(p, opt) for p in m.parameters())
    assert not torch.equal(m[0].weight, fresh["0.weight"])


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_parameter_moved_by_data_stays_in_the_users_storage(kind):
    kept = {}

    def story(m, opt):
        step(m, opt, 0)
        moved = m[2].weight.detach().clone() * 2
        m[2].weight.data = moved
        kept["moved"] = moved
        step(m, opt, 1)
        step(m, opt, 2)
    m, opt = both(kind, story)
    assert m[2].weight.data_ptr() == kept["moved"].data_ptr()  # updated in the user's storage
    assert opt.mirror.bound == [True, True, True, True, False, True]
    with pytest.warns(UserWarning, match=r"^parameters_as_views: 1 of 6 plain fp32 tensors stay copied"):
        opt2 = MAKERS[kind](m.parameters(), True)  # a new optimizer leaves the user's choice alone too
    assert opt2.mirror.bound == [True, True, True, True, False, True]


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_frozen_parameter_gets_its_storage_back_and_joins_again_unfrozen(kind):
    kept = {}

    def story(m, opt):
        step(m, opt, 0)
        m[0].weight.requires_grad_(False)
        step(m, opt, 1)
        kept["frozen"] = m[0].weight.detach().clone()
        kept["owns"] = owns_storage(m[0].weight)
        step(m, opt, 2)
        m[0].weight.requires_grad_(True)
        step(m, opt, 3)
    m, opt = both(kind, story)
    assert kept["owns"]  # it keeps none of the old buffer alive
    assert not torch.equal(m[0].weight, kept["frozen"]) and in_buffer(m[0].weight, opt)


def test_shared_storages_views_into_a_larger_buffer_and_bf16_are_copied():
    torch.manual_seed(0)
    whole = torch.randn(40)
    in_larger = torch.nn.Parameter(whole[:32].view(4, 8))  # e.g. a framework's own flat buffer
    base = torch.randn(3, 5)
    twin_a, twin_b = torch.nn.Parameter(base), torch.nn.Parameter(base)  # one storage, two parameters
    alone = torch.nn.Parameter(torch.randn(6, 2))
    low = torch.nn.Parameter(torch.randn(4, 4).to(torch.bfloat16))
    made_of = torch.randn(2, 3)
    kept_alias = torch.nn.Parameter(made_of)  # the tensor it was made of still held
    tensors = [in_larger, twin_a, twin_b, alone, low, kept_alias]
    counted = hasattr(torch._C, "_storage_Use_Count")  # without torch's count a kept alias is not seen
    with pytest.warns(UserWarning, match=rf"^parameters_as_views: {4 if counted else 3} of 5 plain fp32 tensors"):
        mirror = ParamMirror(tensors, torch.device("cpu"), bind=True)
    assert mirror.bound == [False, False, False, True, False, not counted]
    assert in_larger.data_ptr() == whole.data_ptr() and twin_a.data_ptr() == base.data_ptr()
    mirror.theta.add_(1.0)
    mirror.push()  # the copied ones written back where their owners keep them
    assert torch.equal(whole[:32], mirror.views[0]) and torch.equal(alone.reshape(-1), mirror.views[3])
    assert torch.equal(low.reshape(-1), mirror.views[4].to(torch.bfloat16))


def test_a_second_optimizer_binds_the_parameters_again_and_two_live_ones_alternate_bit_for_bit():
    def story(m, first, second):
        for t in range(4):
            step(m, first if t % 2 == 0 else second, t)
    finals = []
    for views in (False, True):
        m = model()
        first = st.SCAPE(m.parameters(), lr=1e-2, sparsity=0.75, parameters_as_views=views)
        step(m, first, 10)
        second = st.AdamS(m.parameters(), lr=1e-2, parameters_as_views=views)  # binds them to its buffer
        if views:
            assert all(in_buffer(p, second) for p in m.parameters())
        story(m, first, second)
        finals.append(flat(m))
    assert torch.equal(finals[0], finals[1])
    m = model()
    del first, second
    first = st.SCAPE(m.parameters(), lr=1e-2, parameters_as_views=True)
    del first
    second = st.SCAPE(m.parameters(), lr=1e-2, parameters_as_views=True)  # the first one's buffer is left
    assert second.mirror.bound == [True] * 6 and all(in_buffer(p, second) for p in m.parameters())


@pytest.mark.parametrize("kind", ["scape-replicated", "adams"])
def test_resume_through_torch_save_is_bit_identical(kind, tmp_path):
    m = model()
    opt = MAKERS[kind](m.parameters(), True)
    for t in range(3):
        step(m, opt, t)
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.pt")
    for t in range(3, 5):
        step(m, opt, t)
    saved = torch.load(tmp_path / "ckpt.pt")
    m2 = model()
    opt2 = MAKERS[kind](m2.parameters(), True)
    m2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    for t in range(3, 5):
        step(m2, opt2, t)
    assert torch.equal(flat(m), flat(m2))
    assert all(in_buffer(p, opt2) for p in m2.parameters())


def test_a_dcp_round_trip_of_the_views_is_bit_identical(tmp_path):
    """torch.distributed.checkpoint in one process, through get_state_dict and set_state_dict as
    a user's loop calls them: the views saved and loaded back in place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    m = model()
    opt = st.SCAPE(m.named_parameters(), lr=1e-2, sparsity=0.75, parameters_as_views=True)
    for t in range(3):
        step(m, opt, t)
    model_sd, optim_sd = get_state_dict(m, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp_path / "dcp"))
    for t in range(3, 5):
        step(m, opt, t)
    m2 = model()
    opt2 = st.SCAPE(m2.named_parameters(), lr=1e-2, sparsity=0.75, parameters_as_views=True)
    step(m2, opt2, 99)  # state to load into
    model_sd, optim_sd = get_state_dict(m2, opt2)
    loaded = {"model": model_sd, "optim": optim_sd}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "dcp"))
    set_state_dict(m2, opt2, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    for t in range(3, 5):
        step(m2, opt2, t)
    assert torch.equal(flat(m), flat(m2)) and all(in_buffer(p, opt2) for p in m2.parameters())


def test_a_bad_switch_raises_naming_it():
    with pytest.raises(ValueError, match=r"^parameters_as_views: expected one of True, False, got 'yes'"):
        st.SCAPE(model().parameters(), lr=1e-2, parameters_as_views="yes")
    with pytest.raises(ValueError, match=r"^parameters_as_views: expected True or False, got 'yes'"):
        st.AdamS(model().parameters(), lr=1e-2, parameters_as_views="yes")
