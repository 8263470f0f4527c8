"""scape.torch.SCAPE on a CUDA device against the same optimizer on the CPU (which
test_torch_scape_vs_core.py holds to the C++ core): the recorded trace of that test stepped by
two torchrun ranks sharing one GPU (gloo, tensors staged through host memory) and by one rank
in a one-GPU NCCL group, every case of that test: masks equal at every step, final parameters
within 1e-5 relative; scape.torch.Hierarchical (2 nodes x 2 ranks sharing the GPU over gloo)
against its own CPU run, which test_torch_hsdp.py holds to the core. Then the training-loop checks
(overlap, resume, GradScaler, DDP) on CUDA.
Without a CUDA device every test here skips, saying so: scripts/device-check.sh torch runs them
on the lent GPU machine."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here: scripts/device-check.sh torch runs these on a GPU", allow_module_level=True)

from conftest import REPO, process_output, write_json  # noqa: E402
from test_torch_scape_vs_core import CASES, STEPS, relative_error, write_trace  # noqa: E402

HERE = Path(__file__).resolve().parent


def torchrun(workers, script, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node",
           str(workers), str(script), *map(str, args)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, process_output(result)


@pytest.fixture(scope="module", params=[(2, "gloo"), (1, "nccl")], ids=["W2-gloo-one-gpu", "W1-nccl"])
def runs(request, tmp_path_factory):
    workers, backend = request.param
    root = tmp_path_factory.mktemp(f"dev{workers}{backend}")
    write_trace(root / "trace.h5", workers)
    cases = write_json(root / "cases.json", CASES)
    for device in ("cpu", "cuda"):
        out = root / device
        out.mkdir()
        torchrun(workers, HERE / "torch_scape_worker.py", "--trace", root / "trace.h5", "--cases", cases,
                 "--out", out, "--device", device, "--backend", backend if device == "cuda" else "gloo")
    return workers, root


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_cuda_step_equals_cpu_step(case, runs):
    workers, root = runs
    for r in range(workers):
        cpu = np.load(root / "cpu" / f"{case['name']}.rank{r}.npz")
        cuda = np.load(root / "cuda" / f"{case['name']}.rank{r}.npz")
        err = relative_error(cuda["params"], cpu["params"])
        assert err <= 1e-5, f"rank {r}: CUDA parameters {err:.2e} from the CPU's"
        if case["type"] != "adams":
            for t in range(STEPS):
                assert np.array_equal(cuda["masks"][t], cpu["masks"][t]), f"step {t + 1}, rank {r}: masks differ"


@pytest.fixture(scope="module")
def hierarchical_runs(tmp_path_factory):
    """scape.torch.Hierarchical around SCAPE, AdamS and DiLoCo on test_torch_hsdp.py's 2 nodes x 2
    ranks (which holds the CPU run to the core's hierarchy), its tensors on the CPU and on the GPU
    the four ranks share (gloo, staged through host memory), both rail splits."""
    from test_torch_hsdp import CASES as SCAPE_CASES, NODES, OTHERS, RANKS_PER_NODE
    root = tmp_path_factory.mktemp("hier")
    world = NODES * RANKS_PER_NODE
    write_trace(root / "trace.h5", world)
    cases = SCAPE_CASES + OTHERS
    listed = write_json(root / "cases.json", cases)
    for device in ("cpu", "cuda"):
        out = root / device
        out.mkdir()
        torchrun(world, HERE / "torch_hsdp_worker.py", "--trace", root / "trace.h5", "--cases", listed, "--out", out,
                 "--ranks-per-node", RANKS_PER_NODE, "--modes", "hier-rows,hier-tensors", "--device", device)
    return world, root, cases


@pytest.mark.parametrize("split", ["rows", "tensors"])
def test_hierarchical_on_cuda_equals_the_cpu(split, hierarchical_runs):
    world, root, cases = hierarchical_runs
    for case in cases:
        for r in range(world):
            name = f"{case['name']}.hier-{split}.rank{r}.npz"
            cpu, cuda = np.load(root / "cpu" / name), np.load(root / "cuda" / name)
            err = relative_error(cuda["model"], cpu["model"])
            assert err <= 1e-5, f"{case['name']}, rank {r}: CUDA parameters {err:.2e} from the CPU's"
            assert np.array_equal(cuda["masks"], cpu["masks"]), f"{case['name']}, rank {r}: masks differ"


def test_training_loop_checks_on_cuda(tmp_path):
    torchrun(1, HERE / "torch_loop_worker.py", "--mode", "checks", "--out", tmp_path, "--device", "cuda")
    found = json.loads((tmp_path / "rank0.json").read_text())
    for key in ("overlap_equals_plain_sharded0", "overlap_equals_plain_sharded1", "resume_bit_identical_sharded0",
                "resume_bit_identical_sharded1", "ddp_hook_equals_plain", "scaler_replicas_equal"):
        assert found[key], key
