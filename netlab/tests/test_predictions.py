"""The netlab's predictions through `scape predict`: torch_predict's config of a torch method gives
the predictor's α-β time of that method's collectives (checked against the ring formula by hand),
and the strong-scaling plan scales Vista's predicted compute and Llama-500M's N as documented."""
import csv
import json
import subprocess

import pytest

from netlab import scaling, torch_predict

N_TORCH = 112_384  # the example GPT of torch_bench: V d + T d + L (12 d^2 + 13 d) + 2 d + V d (untied)


def hardware(tmp_path, alpha_us, bandwidth_GBps):
    path = tmp_path / "gloo-hardware.json"
    path.write_text(json.dumps({"format": "scape-hardware-1",
                                "network": {"inter": {"alpha_us": alpha_us, "bandwidth_GBps": bandwidth_GBps}}}))
    return path


def test_dense_adams_is_one_ring_all_reduce_of_the_gradient(scape, tmp_path):
    exposed = torch_predict.predicted_exposed_s(scape, str(tmp_path), "adams", 2, hardware(tmp_path, 200.0, 0.0125))
    # W = 2: 2 (W - 1) latency steps, 2 (W - 1) / W of the fp32 gradient sent, nothing hides it.
    assert exposed == pytest.approx(2 * 200e-6 + 4 * N_TORCH / 12.5e6, rel=1e-6)
    config = json.loads((tmp_path / "predict-adams.json").read_text())
    assert config["workers"] == [2] and config["batch"]["global_sequences"] == 8
    assert "N = 112,384 parameters" in (tmp_path / "predict-adams.txt").read_text()


def test_sparse_methods_cost_less_and_lag_zero_exposes_the_mask(scape, tmp_path):
    link = hardware(tmp_path, 200.0, 0.0125)
    times = {m: torch_predict.predicted_exposed_s(scape, str(tmp_path), m, 2, link) for m in torch_predict.METHODS}
    dense = 2 * 200e-6 + 4 * N_TORCH / 12.5e6
    assert times["scape-99"] < times["scape-90"] < dense / 5
    assert times["scape-99-lag0"] > times["scape-99"]  # the blocking mask all-gather


def test_the_strong_scaling_plan_scales_vista_to_the_link(scape, tmp_path):
    subprocess.run([scape, "predict", str(scaling.ROOT) + "/experiments/configs/predict/vista-llama-500m.json",
                    "--set", "workers=[16,32]", "--out", str(tmp_path / "vista-prediction.h5"),
                    "--csv", str(tmp_path / "vista-prediction.csv")],
                   check=True, stdout=open(tmp_path / "vista-prediction.txt", "w"))
    scaling.plan(str(tmp_path), "100mbit", 256.0, 12, [2, 4], ablations=True)
    lines = (tmp_path / "plan.txt").read_text().split("\n")
    assert [line.split()[:2] for line in lines if line] == [
        ["2", "dense"], ["2", "scape90"], ["2", "scape99"], ["4", "dense"], ["4", "scape90"], ["4", "scape99"],
        ["4", "scape99_lag0"], ["4", "scape99_union"], ["4", "scape99_frozen_one_buffer"],
        ["4", "scape99_frozen_two_collectives"]]
    dense = json.loads((tmp_path / "dense-n4.json").read_text())
    assert dense["model"] == {"type": "quadratic", "size": round(513_590_784 / 256)}
    assert dense["workers"] == 4 and dense["steps"] == 12 and dense["optimizer"]["sharded"] is True
    vista = json.load(open(scaling.ROOT + "/experiments/hardware/tacc-vista-measured.json"))
    factor = vista["network"]["inter"]["bandwidth_GBps"] * 1e9 / (1e8 / 8) / 256
    compute = {int(r["workers"]): float(r["compute_s"]) for r in csv.DictReader(open(tmp_path / "vista-prediction.csv"))
               if r["config"] == "baseline"}
    assert dense["compute"] == {"type": "sleep", "seconds": pytest.approx(compute[32] * factor, rel=1e-12)}
    assert json.loads((tmp_path / "scape99_lag0-n4.json").read_text())["optimizer"]["mask_lag"] == 0


def test_mpi_bench_launches_on_the_prefix_it_is_given(monkeypatch):
    """`scripts/netlab bench --prefix X` reaches the MPI runs: mpi_bench's mpirun names X."""
    from netlab import mpi_bench

    launched = []

    def fake_run(command, **kwargs):
        launched.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(mpi_bench.subprocess, "run", fake_run)
    mpi_bench.mpirun(2, ["scape", "bench-comm"], "xyz")
    mpi_bench.mpirun(3, ["scape", "run"])
    assert launched[0][1:6] == ["mpirun", "--prefix", "xyz", "--nodes", "2"]
    assert launched[0][-2:] == ["scape", "bench-comm"]
    assert launched[1][1:6] == ["mpirun", "--prefix", "snl", "--nodes", "3"]


def curves_hardware(tmp_path, scale=1.0):
    """A gloo link of 12.5 MB/s when idle and 6.25 MB/s when busy, measured at 2 ranks from 10 kB to
    10 MB a worker (scape predict --calibrate's network.inter_curves), its rate `scale` times that."""
    sizes = [1e4, 1e5, 1e6, 1e7]
    curve = {"bytes_sent": sizes}
    idle = {kind: dict(curve, time_s=[b / 12.5e6 for b in sizes]) for kind in ("all_reduce", "all_gather", "all_to_all")}
    busy = {kind: dict(curve, time_s=[b / 6.25e6 for b in sizes]) for kind in ("all_reduce", "all_gather", "all_to_all")}
    path = tmp_path / "gloo-hardware.json"
    path.write_text(json.dumps({"format": "scape-hardware-1", "network": {
        "inter": {"alpha_us": 0.0, "bandwidth_GBps": 0.00625},
        "inter_curves": {"workers": 2, "rate_scale": scale, "idle": idle, "busy": busy}}}))
    return path


def test_with_the_link_curves_the_first_collective_is_idle_and_a_slower_rate_scales_them(scape, tmp_path):
    # Dense AdamS's one all-reduce is the step's first collective: the idle curve, 2 (W-1)/W of the
    # gradient at 12.5 MB/s; at 0.6 of the bench's rate, what 1/0.6 as many bytes took there.
    sent = 4 * N_TORCH
    assert torch_predict.predicted_exposed_s(scape, str(tmp_path), "adams", 2, curves_hardware(tmp_path)) == \
        pytest.approx(sent / 12.5e6, rel=1e-9)
    assert torch_predict.predicted_exposed_s(scape, str(tmp_path), "adams", 2, curves_hardware(tmp_path, 0.6)) == \
        pytest.approx(sent / 0.6 / 12.5e6, rel=1e-9)
    # SCAPE at lag 0: the mask all-gather blocks first (idle), the payload follows it (busy).
    lag0 = torch_predict.predicted_exposed_s(scape, str(tmp_path), "scape-99-lag0", 2, curves_hardware(tmp_path))
    lag1 = torch_predict.predicted_exposed_s(scape, str(tmp_path), "scape-99", 2, curves_hardware(tmp_path))
    assert lag0 > lag1


def test_the_held_out_rate_takes_the_nearest_other_slower_rates_links():
    from netlab.mpi_bench import link_donor
    assert link_donor(100.0, [60.0, 100.0, 10000.0], 60.0) == 100.0
    assert link_donor(60.0, [60.0, 100.0, 10000.0], 60.0) == 100.0
    assert link_donor(60.0, [60.0, 100.0, 1000.0, 10000.0], 60.0) == 100.0
    assert link_donor(60.0, [60.0, 100.0, 10000.0], None) == 60.0
    with pytest.raises(SystemExit, match="no other rate below the fastest"):
        link_donor(60.0, [60.0, 10000.0], 60.0)
