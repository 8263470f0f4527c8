"""torch.optim's protocol kept by scape.torch's optimizers, in one process (the review of
2026-12-07): step hooks fire once a step also for the subclasses of AdamS; the state dict hooks
run where torch runs them; copies are refused naming state_dict; a step GradScaler skips still
counts in DiLoCo's sync schedule (the ranks' syncs stay paired); and overlap_backward's hooks
go with the optimizer."""
import copy
import gc
import pickle
import weakref

import pytest

torch = pytest.importorskip("torch")

import scape.torch as st  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def far_from_zero_model():
    """Every θ_i/θ_g stays in [1/2, 2] over a few small steps, so DiLoCo's outer step at α = 1,
    μ = 0 changes nothing (test_torch_local_sgd.py)."""
    m = model()
    with torch.no_grad():
        for p in m.parameters():
            p.uniform_(1.0, 2.0, generator=torch.Generator().manual_seed(p.numel()))
    return m


def train(m, opt, first, steps, scaler=None, poison_at=()):
    for t in range(first, first + steps):
        torch.manual_seed(t)
        opt.zero_grad(set_to_none=True)
        loss = m(torch.randn(4, 8)).pow(2).mean()
        (scaler.scale(loss) if scaler else loss).backward()
        if t in poison_at:
            next(m.parameters()).grad[0, 0] = float("inf")
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


MAKERS = {
    "scape": lambda ps: st.SCAPE(ps, lr=1e-2, sparsity=0.5),
    "adams": lambda ps: st.AdamS(ps, lr=1e-2),
    "diloco": lambda ps: st.DiLoCo(ps, lr=1e-2, inner_steps=2),
    "sparseloco": lambda ps: st.SparseLoCo(ps, lr=1e-2, inner_steps=2, sparsity=0.9, chunk=16),
    "demo": lambda ps: st.DeMo(ps, lr=1e-2),
    "diloco-adamw-inner": lambda ps: st.DiLoCo(ps, inner=lambda q: torch.optim.AdamW(q, lr=1e-2), inner_steps=2),
}


@pytest.mark.parametrize("kind", list(MAKERS))
def test_step_hooks_fire_once_a_step(kind):
    """torch wraps each optimizer class's step with its hooks once an instance is built; DiLoCo,
    SparseLoCo and DeMo run AdamS's step body, not AdamS.step, or their hooks fired twice."""
    MAKERS["adams"](model().parameters())  # AdamS.step is now wrapped too
    m = model()
    opt = MAKERS[kind](m.parameters())
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    handle = register_optimizer_step_post_hook(lambda o, args, kwargs: calls.append(f"global {type(o).__name__}"))
    try:
        train(m, opt, 1, 3)
    finally:
        handle.remove()
    name = type(opt).__name__
    # A torch optimizer as inner is a torch optimizer stepping: torch's global hooks see it too.
    inner = ["global AdamW"] if kind == "diloco-adamw-inner" else []
    assert calls == (["pre", *inner, "post", f"global {name}"]) * 3


@pytest.mark.parametrize("kind", list(MAKERS))
def test_state_dict_hooks_run_where_torch_runs_them(kind):
    m = model()
    opt = MAKERS[kind](m.parameters())
    train(m, opt, 1, 2)
    seen = []
    opt.register_state_dict_pre_hook(lambda o: seen.append("save-pre"))
    opt.register_state_dict_post_hook(lambda o, sd: {**sd, "user_note": 7})
    saved = opt.state_dict()
    assert seen == ["save-pre"] and saved["user_note"] == 7

    def strip_note(o, sd):
        seen.append(f"load-pre {sd.get('user_note')}")
        return {k: v for k, v in sd.items() if k != "user_note"}
    opt.register_load_state_dict_pre_hook(strip_note)
    opt.register_load_state_dict_post_hook(lambda o: seen.append("load-post"))
    opt.load_state_dict(saved)
    assert seen == ["save-pre", "load-pre 7", "load-post"]
    assert saved["user_note"] == 7  # torch loads a shallow copy: the caller's dict is unchanged


@pytest.mark.parametrize("kind", list(MAKERS))
def test_copies_are_refused_naming_state_dict(kind):
    opt = MAKERS[kind](model().parameters())
    for copier in (copy.deepcopy, pickle.dumps, copy.copy):
        with pytest.raises(TypeError, match=r"cannot be copied or pickled .* Save opt\.state_dict\(\)"):
            copier(opt)


def test_a_step_the_scaler_skips_still_counts_in_the_sync_schedule():
    """inner_steps = 2, an inf at step 1: the step is skipped (nothing moves) but counted, so the
    outer sync comes at the second call on every rank, whichever rank overflowed (inner steps
    share nothing, so another rank's step 1 may have run)."""
    m = model()
    before = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    opt = st.DiLoCo(m.parameters(), lr=1e-2, inner_steps=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    after_1 = train(m, opt, 1, 1, scaler, poison_at=(1,))
    assert torch.equal(after_1, before)
    assert (opt.skipped_steps, opt.steps_done, opt.last_metrics["step"]) == (1, 1, 1)
    assert opt.last_metrics["pseudo_grad_norm"] != opt.last_metrics["pseudo_grad_norm"]  # NaN: no sync at 1
    train(m, opt, 2, 1, scaler)
    assert opt.steps_done == 2 and opt.last_metrics["pseudo_grad_norm"] > 0  # the sync of step 2 ran


def test_with_a_torch_inner_optimizer_a_skipped_step_is_that_optimizers_skip_bit_for_bit():
    """inner = torch.optim.AdamW, α = 1, μ = 0, one rank: DiLoCo under a GradScaler is AdamW under
    one, bit for bit (the same unscaling, the same skip at step 2), and the step it skipped counts
    in its schedule (the sync at the third call)."""
    reference = far_from_zero_model()
    plain = train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-3), 1, 6,
                  torch.amp.GradScaler("cpu", init_scale=1024.0), poison_at=(2,))
    m = far_from_zero_model()
    opt = st.DiLoCo(m.parameters(), inner=lambda q: torch.optim.AdamW(q, lr=1e-3), inner_steps=3,
                    outer_lr=1.0, outer_momentum=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    train(m, opt, 1, 2, scaler, poison_at=(2,))
    assert opt.skipped_steps == 1 and opt.steps_done == 2
    train(m, opt, 3, 1, scaler)
    assert opt.last_metrics["pseudo_grad_norm"] >= 0  # the sync of step 3, one call after the skip
    got = train(m, opt, 4, 3, scaler)
    assert torch.equal(got, plain)


def test_overlap_backward_hooks_go_with_the_optimizer():
    """SCAPE(overlap_backward=True) replaced by another optimizer: its gradient hooks on the
    user's parameters neither keep it alive nor fire again (they raised "accumulated twice")."""
    m = model()
    opt = st.SCAPE(m.parameters(), lr=1e-2, sparsity=0.5, overlap_backward=True)
    train(m, opt, 1, 3)
    gone = weakref.ref(opt)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    gc.collect()
    assert gone() is None
    assert all(not p._post_accumulate_grad_hooks for p in m.parameters())
    train(m, opt, 4, 3)  # two backward passes after the replacement, no hook left to raise


@pytest.mark.parametrize("kind", ["scape", "adams", "diloco"])
def test_betas_and_eps_live_in_the_param_groups_as_in_torch(kind):
    """A step reads betas and eps from the groups (a scheduler's change takes effect): betas set
    to (0.8, 0.9) before step 3 give the run of an optimizer built with them from step 3 on; a
    state dict restores them, as torch's optimizers restore every group key."""
    def run(betas_from_step_3):
        m = model()
        opt = MAKERS[kind](m.parameters())
        train(m, opt, 1, 2)
        for g in opt.param_groups:
            g["betas"] = betas_from_step_3
        return train(m, opt, 3, 3), opt
    changed, opt = run((0.8, 0.9))
    unchanged, _ = run((0.9, 0.95))
    assert not torch.equal(changed, unchanged)  # the change took effect
    assert (opt.beta1, opt.beta2) == (0.8, 0.9) and opt.config()["betas"] == [0.8, 0.9]
    saved = opt.state_dict()
    fresh = MAKERS[kind](model().parameters())
    fresh.load_state_dict(saved)
    assert tuple(fresh.param_groups[0]["betas"]) == (0.8, 0.9) and fresh.eps == opt.eps


def test_groups_with_different_betas_raise_naming_the_group():
    """Given so at construction, or set so later (a scheduler on one group), at the next step."""
    m = model()
    message = (r"^param_groups\[1\]: betas \(0\.8, 0\.9\) and eps 1e-08 differ from param_groups\[0\]'s "
               r"\(0\.9, 0\.95\) and 1e-08: AdamS steps every group")
    with pytest.raises(ValueError, match=message):
        st.AdamS([{"params": [m[0].weight]}, {"params": [m[2].weight], "betas": (0.8, 0.9)}], lr=1e-2)
    opt = st.AdamS([{"params": [m[0].weight]}, {"params": [m[2].weight]}], lr=1e-2)
    opt.param_groups[1]["betas"] = (0.8, 0.9)
    torch.manual_seed(0)
    m(torch.randn(4, 8)).pow(2).mean().backward()
    with pytest.raises(ValueError, match=message):
        opt.step()
    with pytest.raises(ValueError, match=r"^param_groups\[0\]: betas\[1\]: must lie in \[0, 1\), got 1\.5"):
        st.SCAPE([{"params": [m[0].weight], "betas": (0.9, 1.5)}], lr=1e-2)


@pytest.mark.parametrize("kind", ["scape", "adams"])
def test_one_cycle_lr_cycles_the_momentum_and_a_group_copied_back_is_accepted(kind):
    """OneCycleLR with its default cycle_momentum=True needs betas in the groups (it raised on
    construction); the first beta it sets is the one the optimizer reports. A group dict copied
    from param_groups after a scheduler ran (initial_lr, max_lr, ...) is accepted by
    add_param_group."""
    m = model()
    head = torch.nn.Linear(4, 4)
    opt = MAKERS[kind](m.parameters())
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=10)
    betas = []
    for t in range(4):
        torch.manual_seed(t)
        opt.zero_grad(set_to_none=True)
        m(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        sched.step()
        betas.append(opt.beta1)
    assert betas[0] < 0.95 and betas[-1] < betas[0]  # max_momentum 0.95 falls while the lr rises
    copied = {k: v for k, v in opt.param_groups[0].items() if k not in ("params", "names", "named")}
    opt.add_param_group({**copied, "params": list(head.parameters())})
    assert opt.param_groups[1]["initial_lr"] == opt.param_groups[0]["initial_lr"]


@pytest.mark.parametrize("kind", ["scape", "adams"])
def test_a_flattened_dcp_state_dict_is_refused_naming_the_option(kind):
    """set_state_dict rebuilds a flattened state dict's entries from opt.state[p]'s keys, not the
    saved ones, so the load cannot be right: it raises naming the option, not a bare "format"."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    m = model()
    opt = MAKERS[kind](m.parameters())
    train(m, opt, 1, 2)
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    model_state, optim_state = get_state_dict(m, opt, options=options)
    with pytest.raises(ValueError, match=r"flatten_optimizer_state_dict=True\), which these optimizers do not "
                                         r"support: save and load without it"):
        set_state_dict(m, opt, model_state_dict=model_state, optim_state_dict=optim_state, options=options)


@pytest.mark.parametrize("kind", ["scape", "adams", "diloco"])
def test_a_refused_state_dict_leaves_the_groups_settings_as_they_were(kind):
    m = model()
    opt = MAKERS[kind](m.parameters())
    train(m, opt, 1, 2)
    saved = opt.state_dict()
    saved["param_groups"] = [dict(g, lr=5e-3, betas=(0.5, 0.6), note="saved") for g in saved["param_groups"]]
    first = next(iter(saved["state"]))
    saved["state"][first] = {k: v for k, v in saved["state"][first].items() if k != "format"}
    before = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    with pytest.raises(ValueError, match="format"):
        opt.load_state_dict(saved)
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == before
