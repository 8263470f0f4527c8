"""A recorded gradient trace through scape.Simulator and through `scape run` with the replay
source gives bit-identical parameters, masks, residual norms and byte counts."""
import h5py
import numpy as np
import pytest

import scape
from conftest import REPO, run_scape, write_json
from run_files import assert_same_metrics, deterministic_metrics, final_params

WORKERS, STEPS = 3, 8

OPTIMIZERS = {
    "adams": {"type": "adams", "lr": 0.01},
    "scape-paper": {"type": "scape", "sparsity": 0.9, "lr": 0.01, "formulation": "paper"},
    "scape-artifact": {"type": "scape", "sparsity": 0.9, "lr": 0.01, "formulation": "artifact"},
    "scape-frozen": {"type": "scape", "sparsity": 0.9, "lr": 0.01, "formulation": "frozen_momentum"},
    "scape-replicated-99": {"type": "scape", "sparsity": 0.99, "lr": 0.01, "sharded": False},
    "topk-ef": {"type": "topk_ef", "sparsity": 0.9, "lr": 0.01, "sharded": False},
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "trace.h5"
    from scape.trace import write_demo
    write_demo(str(path), steps=STEPS, workers=WORKERS, seed=3)
    return path


def read_trace(path):
    with h5py.File(path, "r") as f:
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in f["layout/names"][()]]
        sizes = [int(s) for s in f["layout/sizes"][()]]
        decay = [bool(d) for d in f["layout/decay"][()]]
        return names, sizes, decay, f["init/params"][()], f["grads"][()]


@pytest.mark.parametrize("label", sorted(OPTIMIZERS))
def test_simulator_equals_scape_run_on_a_trace(label, trace, tmp_path, scape_binary):
    optimizer = OPTIMIZERS[label]
    config = {"name": label, "workers": WORKERS, "steps": STEPS,
              "model": {"type": "replay", "path": str(trace)}, "optimizer": optimizer,
              "log": {"save_params": True}}
    run_file = tmp_path / "run.h5"
    run_scape(scape_binary, "run", write_json(tmp_path / "run.json", config), "--out", run_file, "--quiet")

    names, sizes, decay, init, grads = read_trace(trace)
    layout = scape.Layout((n, (s,), d) for n, s, d in zip(names, sizes, decay))
    sim_file = tmp_path / "sim.h5"
    masks = []
    with scape.Simulator(layout, WORKERS, optimizer, log=str(sim_file), steps=STEPS, params=init, name=label,
                         log_options={"save_params": True}) as sim:
        for t in range(STEPS):
            params, metrics = sim.step(grads[t])  # one [W, N] array
            assert not metrics["diverged"]
            assert metrics["bytes_sent"] > 0
            masks.append(np.array(sim.mask))
    np.testing.assert_array_equal(final_params(sim_file), final_params(run_file))
    np.testing.assert_array_equal(np.asarray(params), final_params(run_file))
    assert_same_metrics(sim_file, run_file)
    want = deterministic_metrics(run_file)
    if optimizer["type"] in ("scape", "topk_ef"):
        # The mask itself: its popcount is the logged mask size, step by step.
        sizes_logged = want["mask_size"] if "mask_size" in want else None
        bits = [int(np.unpackbits(m.view(np.uint8)).sum()) for m in masks]
        assert all(b > 0 for b in bits)
        if sizes_logged is not None:
            assert bits == [int(x) for x in sizes_logged]
        assert np.all(want["residual_norm"] > 0)
    else:
        assert all(m.size == 0 for m in masks)


def test_a_list_of_per_worker_tensors_equals_one_matrix(trace, tmp_path):
    torch = pytest.importorskip("torch")
    names, sizes, decay, init, grads = read_trace(trace)
    layout = [(n, (s,), d) for n, s, d in zip(names, sizes, decay)]
    optimizer = OPTIMIZERS["scape-paper"]
    finals = []
    for i, as_list in enumerate((False, True)):
        with scape.Simulator(layout, WORKERS, optimizer, log=str(tmp_path / f"s{i}.h5"), steps=STEPS,
                             params=init) as sim:
            for t in range(STEPS):
                g = [torch.from_numpy(grads[t, w].copy()) for w in range(WORKERS)] if as_list else grads[t]
                sim.step(g)
            finals.append(np.array(sim.params))
    np.testing.assert_array_equal(finals[0], finals[1])


def test_handed_in_compute_seconds_are_the_runs_compute_time(tmp_path):
    layout = [("w", (256,), True)]
    grads = np.ones((2, 256), np.float32) * 1e-3
    with scape.Simulator(layout, 2, {"type": "adams"}, {"preset": "ib_ndr400"}, log=str(tmp_path / "c.h5"),
                         steps=2) as sim:
        _, first = sim.step(grads, compute_seconds=[0.25, 0.5])
        _, second = sim.step(grads, compute_seconds=0.125)
    assert first["compute_time"] == 0.375  # the mean over workers (docs/run-files.md)
    assert first["step_time_model"] >= 0.25
    assert second["compute_time"] == 0.125
    with scape.Simulator(layout, 2, {"type": "adams"}, log=str(tmp_path / "d.h5"), steps=1) as sim:
        with pytest.raises(ValueError, match=r"^compute_seconds: 3 values for 2 workers$"):
            sim.step(grads, compute_seconds=[1.0, 2.0, 3.0])
        sim.step(grads)
