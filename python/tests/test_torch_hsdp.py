"""scape.torch.SCAPE as the replicate-dimension optimizer of FSDP2 sharded inside the node
(mesh=, the core's optimizer.hierarchy = "node" with rail_split = "rows"), under torchrun (gloo,
W = 4 as 2 nodes × 2 ranks, torch_hsdp_worker.py), on the recorded trace of
test_torch_scape_vs_core.py:

- the identity that defines the hierarchy: FSDP2's reduce-scatter inside the node, then SCAPE
  between nodes on the local shards, equals flat SCAPE over the same rail group on plain tensors
  of the same dim-0 slices whose gradients are the node means taken by hand (rank order), bit
  for bit: masks at every step, the rail's parameters and the whole model;
- a mesh refused, naming the argument: not 2-D ("inter", "intra"), given with a group, or with
  plain (unsharded) parameters."""
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import write_json  # noqa: E402
from test_torch_scape_vs_core import STEPS, torchrun, write_trace  # noqa: E402

import scape.torch as st  # noqa: E402

CASES = [{"name": "lag1-90", "lr": 0.01, "sparsity": 0.9, "mask_lag": 1},
         {"name": "lag0-99", "lr": 0.01, "sparsity": 0.99, "mask_lag": 0},
         {"name": "sharded-lag1-90", "lr": 0.01, "sparsity": 0.9, "mask_lag": 1, "sharded": True}]
NODES, RANKS_PER_NODE = 2, 2


@pytest.fixture(scope="module")
def hsdp_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hsdp")
    write_trace(root / "trace.h5", NODES * RANKS_PER_NODE)
    result = torchrun(NODES * RANKS_PER_NODE, Path(__file__).with_name("torch_hsdp_worker.py"), "--trace",
                      root / "trace.h5", "--cases", write_json(root / "cases.json", CASES), "--out", root,
                      "--ranks-per-node", RANKS_PER_NODE)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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
