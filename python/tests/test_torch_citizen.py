"""scape.torch.SCAPE and AdamS as torch citizens (issue 54): torch.distributed.checkpoint round
trips and resharding, ranks that disagree, clipping under overlap_backward, tensors unfrozen
later, FSDP2's DTensors, exiting without finish() (under torchrun, gloo: torch_citizen_worker.py),
and in one process: dense by shape where names are unknown, add_param_group, parameters
reloaded in place, replaced, or moved by p.data."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import scape.torch as st  # noqa: E402
from conftest import REPO, process_output  # noqa: E402

HERE = Path(__file__).resolve().parent


def torchrun(workers, mode, out, *args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node",
           str(workers), str(HERE / "torch_citizen_worker.py"), "--mode", mode, "--out", str(out), *map(str, args)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    return result


def found(out, mode, workers):
    return [json.loads((Path(out) / f"{mode}.rank{r}.json").read_text()) for r in range(workers)]


def run_mode(tmp_path, workers, mode, *args):
    result = torchrun(workers, mode, tmp_path, *args)
    assert result.returncode == 0, process_output(result)
    return found(tmp_path, mode, workers)


KINDS = ("scape-replicated", "scape-sharded", "adams")


@pytest.mark.parametrize("workers", [2, 3])
def test_dcp_round_trip_is_bit_identical_and_saving_changes_nothing(tmp_path, workers):
    for rank in run_mode(tmp_path, workers, "dcp"):
        for kind in KINDS:
            assert rank[f"{kind}_save_changes_nothing"], kind  # get_state_dict stepped nothing
            assert rank[f"{kind}_state_kept"], kind            # a state entry per trained tensor
            assert rank[f"{kind}_steps_after_load"] == 4, kind
            assert rank[f"{kind}_resume_bit_identical"], kind


@pytest.mark.parametrize("workers", [2, 3])
def test_the_local_sgd_family_resumes_bit_identical_from_dcp_between_syncs(tmp_path, workers):
    """DCP keeps one copy of a key every rank saves; DiLoCo's, SparseLoCo's and DeMo's state and
    (between syncs) parameters differ by rank, so they save under keys of the rank's own."""
    for rank in run_mode(tmp_path, workers, "local_sgd_dcp"):
        for kind in ("diloco", "sparseloco", "demo"):
            assert rank[f"{kind}_own_keys"], kind
            assert rank[f"{kind}_resume_bit_identical"], kind
        assert rank["torch_inner_into_fresh_refused"]  # a torch inner optimizer's state DCP could not fill


@pytest.mark.parametrize("saved, loaded", [(2, 1), (2, 3), (3, 2)])
def test_a_dcp_checkpoint_resumes_at_another_world_size(tmp_path, saved, loaded):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    run_mode(tmp_path, saved, "save", "--ckpt", ckpt)
    for rank in run_mode(tmp_path, loaded, "reshard", "--ckpt", ckpt):
        for kind in KINDS:
            exact = rank[f"{kind}_carried_exact"]
            want = {"params", "exp_avg", "step"} | {"scape-replicated": {"mask", "residual_restarts_at_zero"},
                                                    "scape-sharded": {"mask", "residual_is_saved_mean"},
                                                    "adams": set()}[kind]
            assert set(exact) == want and all(exact.values()), (kind, exact)
            assert rank[f"{kind}_steps_loaded"] == 4 and rank[f"{kind}_steps_after"] == 7
            assert rank[f"{kind}_loss_finite"] and rank[f"{kind}_replicas_equal"]


def test_replicated_state_saved_by_rank_0_alone(tmp_path):
    """`if rank == 0: torch.save(opt.state_dict())` and the HF Trainer save from one rank: the
    replicated state_dict() is local (it waits for no other rank), and a rank that loads rank 0's
    file keeps rank 0's residual only on rank 0 (the others start from zero, warned)."""
    ranks = run_mode(tmp_path, 2, "rank0_save")
    for rank in ranks:
        assert rank["steps"] == 5 and rank["replicas_equal"] and rank["loaded_step"] == 3
    assert any(ranks[0]["own_residual_loaded"]) and not any(ranks[1]["own_residual_loaded"])


def test_ranks_built_differently_raise_on_every_rank_naming_the_setting(tmp_path):
    ranks = run_mode(tmp_path, 2, "agreement")
    for rank in ranks:
        assert rank["sparsity"].startswith("SCAPE: the ranks of the group disagree on sparsity of each param group")
        assert "disagree on mask_lag" in rank["mask_lag"]
        assert "disagree on sharded" in rank["sharded"]


def test_clipping_under_overlap_backward(tmp_path):
    for rank in run_mode(tmp_path, 2, "clip"):
        for sharded in (0, 1):
            # SCAPE's own clip_grad clips the reconstructed gradient: the same bits with the overlap
            assert rank[f"own_clip_factor_below_1_sharded{sharded}"]
            assert rank[f"own_clip_overlap_equals_plain_sharded{sharded}"]
            # the user's clip_grad_norm_ after the payload left raises, naming tensors; nothing stepped
            message = rank[f"users_clip_sharded{sharded}"]
            assert message.startswith("overlap_backward: the gradient of ") and "clip_grad_norm_" in message
            assert rank[f"users_clip_steps_done_sharded{sharded}"] == 1  # step 1 chose its own mask
            # a clip whose factor is 1 changed no value: the overlapped run equals the plain one
            assert rank[f"no_op_clip_equals_plain_sharded{sharded}"]


def test_a_tensor_unfrozen_later_is_updated(tmp_path):
    for rank in run_mode(tmp_path, 2, "unfreeze"):
        for kind in KINDS:
            assert rank[f"{kind}_frozen_unchanged"] and rank[f"{kind}_updated_after_unfreeze"], kind
            assert rank[f"{kind}_has_state"] and rank[f"{kind}_replicas_equal"], kind


def test_fsdp2_is_refused_and_its_local_shards_are_read_and_written(tmp_path):
    for rank in run_mode(tmp_path, 2, "fsdp2"):
        assert rank["refused"].startswith("params: wte.weight is a DTensor sharded by FSDP2 (fully_shard)")
        assert "HSDP" in rank["refused"]
        assert rank["mirror_reads_local_shards"] and rank["local_is_a_shard"] and rank["push_writes_local_shards"]


def test_ten_runs_without_finish_exit_cleanly(tmp_path):
    """The lagged all-gather is still in flight when the script ends (found: pending); with and
    without destroy_process_group, no run may abort. Before the fix 7 runs in 10 aborted with a
    collective in flight, so ten clean runs would pass by chance about once in 10^5 times."""
    codes = []
    for i in range(10):
        result = torchrun(2, "teardown", tmp_path, "--destroy", i % 2, timeout=120)
        codes.append(result.returncode)
        assert result.returncode == 0, (i, result.stdout[-2000:] + result.stderr[-2000:])
    assert all(r["pending"] for r in found(tmp_path, "teardown", 2))
    assert codes == [0] * 10


# ----- one process ----------------------------------------------------------------------------

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def step(m, opt, seed=0):
    torch.manual_seed(seed)
    opt.zero_grad(set_to_none=True)
    m(torch.randn(4, 8, dtype=next(m.parameters()).dtype)).float().pow(2).mean().backward()
    opt.step()


def test_unnamed_vectors_are_dense_and_the_named_rule_is_unchanged():
    opt = st.SCAPE(model().parameters(), lr=1e-3, sparsity=0.9)
    assert [s.dense for s in opt.layout.slots] == [False, True, True, True, False, True]
    m = model()
    groups = st.SCAPE([{"params": [m[0].weight, m[0].bias]}, {"params": [m[2].weight]}], lr=1e-3)
    assert [s.dense for s in groups.layout.slots] == [False, True, False]
    named = st.SCAPE(model().named_parameters(), lr=1e-3)
    # by name only: "0.bias" matches "bias", the LayerNorm's "1.weight" matches nothing
    assert [s.dense for s in named.layout.slots] == [False, True, False, True, False, True]


@pytest.mark.parametrize("make", [lambda ps: st.SCAPE(ps, lr=1e-2, sparsity=0.5),
                                  lambda ps: st.AdamS(ps, lr=1e-2)], ids=["scape", "adams"])
def test_add_param_group_joins_at_the_next_step(make):
    m, extra = model(), torch.nn.Linear(8, 3)
    opt = make(m.parameters())
    step(m, opt)
    first = m[0].weight.detach().clone()
    kept = opt.state[m[0].weight]["exp_avg"].clone()
    opt.add_param_group({"params": extra.parameters(), "weight_decay": 0.0})
    assert len(opt.param_groups) == 2
    before = extra.weight.detach().clone()
    torch.manual_seed(1)
    opt.zero_grad(set_to_none=True)
    (m(torch.randn(4, 8)).pow(2).mean() + extra(torch.randn(4, 8)).pow(2).mean()).backward()
    opt.step()
    assert not torch.equal(before, extra.weight) and not torch.equal(first, m[0].weight)
    assert "exp_avg" in opt.state[extra.weight]
    if isinstance(opt, st.AdamS):  # the old tensors' state carried over: m = b1 m_prev + (1-b1) g
        g = m[0].weight.grad
        assert torch.allclose(opt.state[m[0].weight]["exp_avg"], 0.9 * kept + 0.1 * g, atol=1e-7)


def test_a_parameter_reloaded_in_place_or_moved_by_data_is_followed():
    m = model()
    opt = st.SCAPE(m.parameters(), lr=1e-2, sparsity=0.5)
    step(m, opt)
    fresh = model().state_dict()
    m.load_state_dict(fresh)  # in place: the optimizer reads the parameters each step
    step(m, opt, seed=1)
    assert not torch.equal(m[0].weight, fresh["0.weight"])
    moved = m[2].weight.detach().clone() * 2
    m[2].weight.data = moved  # another storage, which the step then updates in place
    snapshot = moved.clone()
    step(m, opt, seed=2)
    assert m[2].weight.data_ptr() == moved.data_ptr() and not torch.equal(m[2].weight, snapshot)
    # the step started from the moved values: its update is small against the factor 2
    assert torch.allclose(m[2].weight, snapshot, atol=0.05)


def test_a_bf16_master_survives_a_reload_of_the_same_values_and_follows_new_ones():
    m = model().to(torch.bfloat16)
    opt = st.SCAPE(m.parameters(), lr=1e-2, sparsity=0.5)
    step(m, opt)
    master = opt.mirror.masters()[0].clone()
    assert not torch.equal(master, m[0].weight.float().reshape(-1))  # more precise than the parameter
    m.load_state_dict(m.state_dict())  # the same values, a new version
    opt.mirror.pull()
    assert torch.equal(opt.mirror.masters()[0], master)
    with torch.no_grad():
        m[0].weight.fill_(0.5)
    opt.mirror.pull()
    assert torch.equal(opt.mirror.masters()[0], torch.full_like(master, 0.5))


@pytest.mark.parametrize("make", [lambda ps: st.SCAPE(ps, lr=1e-2, sparsity=0.5),
                                  lambda ps: st.AdamS(ps, lr=1e-2)], ids=["scape", "adams"])
def test_parameters_replaced_by_assign_raise_at_the_next_step(make):
    m = model()
    opt = make(m.parameters())
    step(m, opt)
    m.load_state_dict(model().state_dict(), assign=True)  # new Parameter objects in the module
    with pytest.raises(ValueError, match=r"^step 2: no parameter of this optimizer has a gradient on any rank"):
        step(m, opt)
    assert opt.steps_done == 1


def test_a_state_dict_of_the_old_format_or_another_model_is_refused_naming_it():
    m = model()
    opt = st.SCAPE(m.named_parameters(), lr=1e-2, sparsity=0.5)
    step(m, opt)
    saved = opt.state_dict()
    with pytest.raises(ValueError, match=r"^state_dict: no 'state' dict"):
        opt.load_state_dict({"param_groups": saved["param_groups"], "scape": {}})
    other = st.SCAPE(torch.nn.Linear(8, 16).named_parameters(), lr=1e-2)
    with pytest.raises(ValueError, match=r"^state_dict: 6 param groups, this optimizer has 2"):
        other.load_state_dict(saved)
    bad = {"state": {i: dict(e, format=1) for i, e in saved["state"].items()}, "param_groups": saved["param_groups"]}
    with pytest.raises(ValueError, match=r"^state_dict: 0.weight has format 1, this version reads 2"):
        opt.load_state_dict(bad)


def test_a_compiled_model_trains_with_scape_as_the_eager_one_does():
    """torch.compile of the model (aot_eager: the graph capture without a C++ toolchain's
    codegen), SCAPE stepping eagerly: parameters within 1e-6 of the eager run after 5 steps."""
    import sys
    sys.path.insert(0, str(REPO / "examples"))
    from tiny_gpt import CorpusBatches, TinyGPT, cross_entropy, markov_corpus
    batches = CorpusBatches(markov_corpus(vocab=32, tokens=20_000), 1, 2, 16, seed=3)
    finals = []
    for compiled in (False, True):
        model = TinyGPT(vocab=32, block=16, n_embd=32, n_head=4, n_layer=2, seed=1)
        opt = st.SCAPE(model.named_parameters(), lr=3e-3, sparsity=0.9, dense_tensors=("ln_", "bias"))
        net = torch.compile(model, backend="aot_eager") if compiled else model
        for t in range(1, 6):
            x, y = batches(t)
            opt.zero_grad(set_to_none=True)
            cross_entropy(net(x[0]), y[0]).backward()
            opt.step()
        finals.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert opt.steps_done == 5
    assert torch.allclose(finals[0], finals[1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("make", [lambda ps: st.SCAPE(ps, lr=1e-2, sparsity=0.75),
                                  lambda ps: st.SCAPE(ps, lr=1e-2, sparsity=0.75, sharded=True),
                                  lambda ps: st.AdamS(ps, lr=1e-2),
                                  lambda ps: st.DiLoCo(ps, lr=1e-2, inner_steps=2)],
                         ids=["scape", "scape-sharded", "adams", "diloco"])
def test_opt_state_dict_straight_through_dcp_resumes_bit_identical(make, tmp_path):
    """dcp.save({"optim": opt.state_dict()}) and dcp.load into a fresh optimizer's state_dict,
    without get_state_dict: DCP loads tensors in place but writes a Python number under the key
    "0" beside the entry 0, where load_state_dict does not look, so the counters (the lagged
    mask's step, DiLoCo's set flag) are 0-d tensors. With them as ints the resumed SCAPE
    differed in 99 of 244 values after 2 steps."""
    import torch.distributed.checkpoint as dcp
    m = model()
    opt = make(m.parameters())
    for t in range(3):
        step(m, opt, seed=t)
    dcp.save({"model": m.state_dict(), "optim": opt.state_dict()}, checkpoint_id=str(tmp_path / "ckpt"))
    for t in range(3, 5):
        step(m, opt, seed=t)
    m2 = model()
    opt2 = make(m2.parameters())
    loaded = {"model": m2.state_dict(), "optim": opt2.state_dict()}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "ckpt"))
    m2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["optim"])
    for t in range(3, 5):
        step(m2, opt2, seed=t)
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)


def test_an_optimizer_built_before_init_process_group_under_torchrun_is_refused(monkeypatch):
    """Under torchrun (WORLD_SIZE > 1) without torch.distributed initialized, every rank would
    train alone, silently (the HF Trainer initializes it in TrainingArguments)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    for make in (lambda: st.SCAPE(model().parameters(), lr=1e-3), lambda: st.AdamS(model().parameters(), lr=1e-3)):
        with pytest.raises(ValueError, match=r"^group: torch.distributed is not initialized, but WORLD_SIZE is 2"):
            make()
