"""scape.torch.SCAPE as the replicate-dimension optimizer of FSDP2 sharded inside the node
(mesh=, the core's optimizer.hierarchy = "node" with rail_split = "rows"), under torchrun (gloo,
W = 4 as 2 nodes × 2 ranks, torch_hsdp_worker.py), on the recorded trace of
test_torch_scape_vs_core.py:

- the identity that defines the hierarchy: FSDP2's reduce-scatter inside the node, then SCAPE
  between nodes on the local shards, equals flat SCAPE over the same rail group on plain tensors
  of the same dim-0 slices whose gradients are the node means taken by hand (rank order), bit
  for bit: masks at every step, the rail's parameters and the whole model;
- scape.torch.Hierarchical around SCAPE on the whole tensors, doing the node's collectives
  itself, equals the FSDP2 path bit for bit under rail_split "rows"; its node bytes are the
  closed form under both splits;
- held to the core: `scape run` with topology.ranks_per_node = 2, hierarchy "node" and the same
  rail split on the replay source ends at the same model within 1e-5 relative, for FSDP2's path
  and for Hierarchical under both splits, around SCAPE, dense AdamS and DiLoCo;
- a mesh refused, naming the argument: not 2-D ("inter", "intra"), given with a group, or with
  plain (unsharded) parameters."""
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import process_output, run_scape, write_json  # noqa: E402
from run_files import final_params  # noqa: E402
from test_torch_scape_vs_core import LAYOUT, STEPS, torchrun, write_trace  # noqa: E402

import scape.torch as st  # noqa: E402

CASES = [{"name": "lag1-90", "lr": 0.01, "sparsity": 0.9, "mask_lag": 1},
         {"name": "lag0-99", "lr": 0.01, "sparsity": 0.99, "mask_lag": 0},
         {"name": "sharded-lag1-90", "lr": 0.01, "sparsity": 0.9, "mask_lag": 1, "sharded": True}]
OTHERS = [{"name": "adams", "type": "adams", "lr": 0.01},
          {"name": "diloco-h3", "type": "diloco", "lr": 0.01, "inner_steps": 3}]
NODES, RANKS_PER_NODE = 2, 2


@pytest.fixture(scope="module")
def hsdp_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hsdp")
    write_trace(root / "trace.h5", NODES * RANKS_PER_NODE)
    result = torchrun(NODES * RANKS_PER_NODE, Path(__file__).with_name("torch_hsdp_worker.py"), "--trace",
                      root / "trace.h5", "--cases", write_json(root / "cases.json", CASES + OTHERS), "--out", root,
                      "--ranks-per-node", RANKS_PER_NODE)
    assert result.returncode == 0, process_output(result)
    return root


def load(root, case, mode, rank):
    return np.load(root / f"{case['name']}.{mode}.rank{rank}.npz")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_fsdp_inside_the_node_then_scape_between_equals_flat_scape_on_the_node_means(case, hsdp_runs):
    for rank in range(NODES * RANKS_PER_NODE):
        fsdp, manual = load(hsdp_runs, case, "fsdp", rank), load(hsdp_runs, case, "manual", rank)
        assert fsdp["masks"].shape[0] == STEPS
        np.testing.assert_array_equal(fsdp["masks"], manual["masks"])
        np.testing.assert_array_equal(fsdp["params"], manual["params"])
        np.testing.assert_array_equal(fsdp["model"], manual["model"])
        np.testing.assert_array_equal(fsdp["model"], load(hsdp_runs, case, "fsdp", 0)["model"])  # every rank alike
    # the two rails of a node chose different masks (their parts of the model differ)
    assert load(hsdp_runs, case, "fsdp", 0)["params"].shape != load(hsdp_runs, case, "fsdp", 1)["params"].shape or \
        not np.array_equal(load(hsdp_runs, case, "fsdp", 0)["masks"], load(hsdp_runs, case, "fsdp", 1)["masks"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_hierarchical_with_row_slices_equals_scape_on_fsdps_shards(case, hsdp_runs):
    """scape.torch.Hierarchical's own reduce-scatter and all-gather inside the node, around SCAPE
    on the whole tensors: the same masks, rail parameters and model as FSDP2's, bit for bit."""
    for rank in range(NODES * RANKS_PER_NODE):
        fsdp, hier = load(hsdp_runs, case, "fsdp", rank), load(hsdp_runs, case, "hier-rows", rank)
        np.testing.assert_array_equal(hier["masks"], fsdp["masks"])
        np.testing.assert_array_equal(hier["params"], fsdp["params"])
        np.testing.assert_array_equal(hier["model"], fsdp["model"])


@pytest.mark.parametrize("split", ["rows", "tensors"])
def test_the_node_bytes_are_the_other_rails_parts_in_and_this_rails_part_out(split, hsdp_runs):
    """bytes_sent_intra = 4 (N - own) for the reduce-scatter (every other rail's part of this
    rank's gradient) + 4 own (G - 1) for the all-gather, own the rail's part; the split "tensors"
    deals whole tensors largest first to the lightest rail."""
    n = sum(size for _, size, _ in LAYOUT)
    assert n == 4304
    # tensors, dealt by hand: 1024 -> 0, 1024 -> 1, 1024 -> 0, 768 -> 1, 320 -> 1, 64 -> 0 (tie:
    # the lower rail), 48 -> 0, 16 -> 1, 16 -> 1: rails of 2160 and 2144; rows: every size is
    # even, so each rail holds half of each tensor, 2152.
    own = {0: 2160, 1: 2144} if split == "tensors" else {0: 2152, 1: 2152}
    for rank in range(NODES * RANKS_PER_NODE):
        metrics = json.loads(str(load(hsdp_runs, CASES[0], f"hier-{split}", rank)["last_metrics"]))
        mine = own[rank % RANKS_PER_NODE]
        assert metrics["bytes_sent_node_grad_reduce_scatter"] == 4 * (n - mine)
        assert metrics["bytes_sent_node_param_all_gather"] == 4 * mine * (RANKS_PER_NODE - 1)
        assert metrics["bytes_sent_intra"] == 4 * (n - mine) + 4 * mine * (RANKS_PER_NODE - 1)
        assert metrics["bytes_sent"] == metrics["bytes_sent_intra"] + metrics["bytes_sent_inter"] > 0
        # Each blocking collective's wall time beside its bytes, under the run file's names (what
        # scape predict --calibrate reads); the lagged mask all-gather runs async, untimed.
        timed = {k[len("comm_time_measured_"):] for k in metrics if k.startswith("comm_time_measured_")}
        sent = {k[len("bytes_sent_"):] for k, v in metrics.items()
                if k.startswith("bytes_sent_") and k not in ("bytes_sent_intra", "bytes_sent_inter") and v > 0}
        assert timed == sent - {"mask_all_gather"} and {"node_grad_reduce_scatter", "node_param_all_gather"} <= timed
        assert all(metrics[f"comm_time_measured_{p}"] > 0 for p in timed)


HELD = ([(c, m) for c in CASES for m in ("fsdp", "hier-rows", "hier-tensors")]
        + [(c, m) for c in OTHERS for m in ("hier-rows", "hier-tensors")])  # SCAPE(mesh=) is SCAPE's alone


@pytest.mark.parametrize("case, mode", HELD, ids=[f"{c['name']}-{m}" for c, m in HELD])
def test_held_to_the_cores_hierarchy(case, mode, hsdp_runs, tmp_path, scape_binary):
    """`scape run` with topology.ranks_per_node = 2 and hierarchy "node" on the replay source, the
    rail split of the torch side: the same final model within 1e-5 relative (the torch side's
    arithmetic is the core's, rounded apart, not fused)."""
    if case.get("type") == "adams":
        optimizer = {"type": "adams", "lr": case["lr"], "sharded": False}
    elif case.get("type") == "diloco":
        optimizer = {"type": "diloco", "inner": "adams", "lr": case["lr"], "inner_steps": case["inner_steps"]}
    else:
        optimizer = {"type": "scape", "formulation": "paper", "lr": case["lr"], "sparsity": case["sparsity"],
                     "sharded": case.get("sharded", False), "mask_lag": case["mask_lag"],
                     "dense_tensors": ["norm", "bias"]}
    optimizer.update(hierarchy="node", rail_split="tensors" if mode == "hier-tensors" else "rows")
    config = {"name": case["name"], "workers": NODES * RANKS_PER_NODE, "steps": STEPS,
              "topology": {"ranks_per_node": RANKS_PER_NODE},
              "model": {"type": "replay", "path": str(hsdp_runs / "trace.h5")}, "optimizer": optimizer,
              "log": {"save_params": True}}
    run_file = tmp_path / "run.h5"
    run_scape(scape_binary, "run", write_json(tmp_path / "run.json", config), "--out", run_file, "--quiet")
    want = final_params(run_file)
    # DiLoCo's nodes differ between syncs (the last is step 9 of 10): the core's final parameters
    # are worker 0's, so node 0's ranks are compared; every other method's ranks agree.
    ranks = RANKS_PER_NODE if case.get("type") == "diloco" else NODES * RANKS_PER_NODE
    for rank in range(ranks):
        got = load(hsdp_runs, case, mode, rank)["model"]
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        assert err <= 1e-5, f"rank {rank}: final parameters {err:.2e} from the core's (relative to its largest)"


@pytest.fixture(scope="module")
def one_rank_mesh(tmp_path_factory):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    store = tmp_path_factory.mktemp("store") / "file"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1, 1), mesh_dim_names=("inter", "intra"))
    dist.destroy_process_group()


def test_a_bad_mesh_is_refused_naming_it(one_rank_mesh):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"^params: weight is a plain tensor, but a mesh was given"):
        st.SCAPE(model.named_parameters(), lr=1e-3, mesh=one_rank_mesh)
    flat_mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    with pytest.raises(ValueError, match=r"^mesh: expected a 2-D DeviceMesh with mesh_dim_names \('inter', 'intra'\)"):
        st.SCAPE(model.named_parameters(), lr=1e-3, mesh=flat_mesh)
    import torch.distributed as dist
    with pytest.raises(ValueError, match=r"^mesh, group: give one"):
        st.SCAPE(model.named_parameters(), lr=1e-3, mesh=one_rank_mesh, group=dist.group.WORLD)
    sharded = torch.nn.Linear(4, 4)
    fully_shard(sharded, mesh=one_rank_mesh["intra"])
    opt = st.SCAPE(sharded.named_parameters(), lr=1e-3, sparsity=0.5, mesh=one_rank_mesh)  # accepted
    assert opt.comm.size == 1
    whole_world = torch.nn.Linear(4, 4)
    fully_shard(whole_world, mesh=flat_mesh)
    with pytest.raises(ValueError, match=r"^params: weight is a DTensor on \('dp',\)"):
        st.SCAPE(whole_world.named_parameters(), lr=1e-3, mesh=one_rank_mesh)


def test_hierarchical_leaves_a_frozen_tensor_alone_and_refuses_a_change_of_the_trained_set(one_rank_mesh):
    """A frozen tensor has no rail piece (it trained under weight decay before 2026-12-07): on a
    1 x 1 mesh Hierarchical(AdamS) is AdamS over the tensors that train, bit for bit, and the
    frozen one keeps its values; unfreezing it later is refused naming it."""
    def run(make, steps=4):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
        model[0].weight.requires_grad_(False)
        frozen = model[0].weight.detach().clone()
        opt = make(model)
        for t in range(steps):
            torch.manual_seed(t)
            opt.zero_grad(set_to_none=True)
            model(torch.randn(4, 6)).pow(2).mean().backward()
            opt.step()
        assert torch.equal(model[0].weight, frozen)
        return model, opt
    _, plain = run(lambda m: st.AdamS([p for p in m.parameters() if p.requires_grad], lr=1e-2))
    model, hier = run(lambda m: st.Hierarchical(m.named_parameters(), one_rank_mesh, st.AdamS, lr=1e-2))
    assert torch.equal(hier.inner.flat_params(), plain.flat_params())
    model[0].weight.requires_grad_(True)
    model(torch.randn(4, 6)).pow(2).mean().backward()
    with pytest.raises(ValueError, match=r"^Hierarchical: the tensors that train changed \(requires_grad\) since it "
                                         r"was built: 0\.weight;"):
        hier.step()


def test_hierarchical_refuses_a_grad_scaler_by_name(one_rank_mesh):
    model = torch.nn.Linear(4, 3)
    opt = st.Hierarchical(model.named_parameters(), one_rank_mesh, st.AdamS, lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(model(torch.ones(2, 4)).sum()).backward()
    with pytest.raises(ValueError, match=r"^Hierarchical: not with GradScaler"):
        scaler.step(opt)


def test_rail_pieces_follow_the_cores_rules_on_hand_cut_cases():
    from scape.optim.hierarchy import rail_pieces
    shapes = [torch.Size((7, 3)), torch.Size((5,)), torch.Size((2, 2))]
    # rows: torch.chunk's ceil(d0/G) rows a slice; 5 rows into 3 rails are 2, 2, 1
    assert rail_pieces(shapes, 3, "rows") == [
        [(0, 0, torch.Size((3, 3))), (1, 0, torch.Size((2,))), (2, 0, torch.Size((1, 2)))],
        [(0, 9, torch.Size((3, 3))), (1, 2, torch.Size((2,))), (2, 2, torch.Size((1, 2)))],
        [(0, 18, torch.Size((1, 3))), (1, 4, torch.Size((1,)))]]  # the 2-row tensor has no third slice
    # tensors: 21 -> rail 0, 5 -> rail 1, 4 -> rail 1 (5 < 21); each rail in parameter order
    assert rail_pieces(shapes, 2, "tensors") == [[(0, 0, torch.Size((7, 3)))],
                                                 [(1, 0, torch.Size((5,))), (2, 0, torch.Size((2, 2)))]]
    with pytest.raises(ValueError, match=r"^rail_split: 'tensors' leaves rail 3 of 4 without parameters \(3 tensors\)"):
        rail_pieces(shapes, 4, "tensors")
    with pytest.raises(ValueError, match=r"^rail_split: expected one of 'tensors', 'rows', got 'cols'"):
        rail_pieces(shapes, 2, "cols")
