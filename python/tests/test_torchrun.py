"""torchrun ranks (gloo, deterministic reductions) give the simulator's parameters bit for bit,
and a failing rank takes the whole group down with rank 0's run file saying `failed`."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import scape  # noqa: E402
from run_files import assert_same_metrics, final_params, status  # noqa: E402
from tiny_problem import batch, loss_of, make_model  # noqa: E402

HERE = Path(__file__).resolve().parent
STEPS = 6
OPTIMIZERS = {
    "scape-90": {"type": "scape", "sparsity": 0.9, "lr": 0.01},
    "adams-sharded": {"type": "adams", "lr": 0.01},
}


def torchrun(ranks, out, optimizer, fail_at=0, timeout=240):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc_per_node", str(ranks), str(HERE / "torchrun_worker.py"), "--out", str(out),
               "--optimizer", json.dumps(optimizer), "--steps", str(STEPS)]
    if fail_at:
        command += ["--fail-at", str(fail_at)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def simulated(workers, optimizer, log, steps=STEPS):
    model = make_model()
    layout = scape.Layout.from_module(model)
    init = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    with scape.Simulator(layout, workers, optimizer, log=str(log), steps=steps, params=init, name="torchrun-test",
                         log_options={"save_params": True}) as sim:
        for t in range(1, steps + 1):
            grads, losses = [], []
            for w in range(workers):
                replica = make_model()
                with torch.no_grad():
                    torch.nn.utils.vector_to_parameters(torch.from_numpy(np.array(sim.params)), replica.parameters())
                x, y = batch(t, w)
                loss = loss_of(replica, x, y)
                loss.backward()
                grads.append(torch.cat([p.grad.reshape(-1) for p in replica.parameters()]))
                losses.append(loss.item())
            sim.step(grads, losses)
        return np.array(sim.params)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("label", sorted(OPTIMIZERS))
def test_torchrun_ranks_equal_the_simulator(ranks, label, tmp_path):
    optimizer = OPTIMIZERS[label]
    result = torchrun(ranks, tmp_path, optimizer)
    assert result.returncode == 0, result.stderr[-4000:]
    want = simulated(ranks, optimizer, tmp_path / "sim.h5")
    for r in range(ranks):
        np.testing.assert_array_equal(np.load(tmp_path / f"params-rank{r}.npy"), want)
    assert status(tmp_path / "run.h5") == "completed"
    # The same byte ledger and metrics as the simulator (train losses included: each rank's own).
    assert_same_metrics(tmp_path / "run.h5", tmp_path / "sim.h5")


def test_a_failing_rank_aborts_the_group(tmp_path):
    result = torchrun(2, tmp_path, OPTIMIZERS["scape-90"], fail_at=3, timeout=180)
    assert result.returncode != 0
    assert "injected failure on rank 1 before step 3" in result.stderr
    assert status(tmp_path / "run.h5") == "failed"
    import h5py
    with h5py.File(tmp_path / "run.h5", "r") as f:
        error = f.attrs["error"]
        error = error.decode() if isinstance(error, bytes) else str(error)
        assert error.startswith("step 3:"), error
        assert f["metrics/bytes_sent"].shape[0] == 2  # the two completed steps stay readable


def test_distributed_optimizer_checks_its_inputs(tmp_path):
    import torch.distributed as dist
    import scape.torch as st
    with pytest.raises(RuntimeError, match="init_process_group first"):
        st.DistributedOptimizer(torch.nn.Linear(4, 2).named_parameters(), {"type": "adams"}, steps=2,
                                log=str(tmp_path / "x.h5"))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/group", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"^params: weight is torch.float64"):
            st.DistributedOptimizer(torch.nn.Linear(4, 2).double().named_parameters(), {"type": "adams"}, steps=2,
                                    log=str(tmp_path / "d.h5"))
        with pytest.raises(ValueError, match=r"^optimizer.sparsity: "):
            st.DistributedOptimizer(torch.nn.Linear(4, 2).named_parameters(), {"type": "scape", "sparsity": 2},
                                    steps=2, log=str(tmp_path / "s.h5"))
        # One rank alone: the step works and the parameters are the core's buffer.
        model = make_model()
        opt = st.DistributedOptimizer(model.named_parameters(), OPTIMIZERS["scape-90"], steps=2,
                                      log=str(tmp_path / "one.h5"))
        for t in (1, 2):
            opt.zero_grad()
            x, y = batch(t, 0)
            loss = loss_of(model, x, y)
            loss.backward()
            assert not opt.step(loss.item())
            assert opt.metrics["bytes_sent"] >= 0
        assert opt.close()["status"] == "completed"
        got = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
        np.testing.assert_array_equal(got, simulated(1, OPTIMIZERS["scape-90"], tmp_path / "sim1.h5", steps=2))
    finally:
        dist.destroy_process_group()
