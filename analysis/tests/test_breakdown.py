"""The measured step-time breakdown (analysis/breakdown.py) of a real MPI run at W = 2.

The parts are checked against means computed here with plain h5py over the same steady steps,
and on a copy whose measured columns are overwritten with known values, against the hand-derived
breakdown, with and without rank skew. A simulated run has no measured columns and gets no
breakdown.
"""

import csv
import json
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from conftest import TINY_GPT, run_scape

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1"}
STEPS = 12


def measured_run(scape, folder, optimizer):
    """A 12-step GPT run under mpirun -np 2 --backend mpi with `optimizer`, or skip."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("mpirun not on PATH (openmpi-bin)")
    config = dict(TINY_GPT, workers=2, steps=STEPS, optimizer=optimizer)
    cfg = folder / "mpi.json"
    cfg.write_text(json.dumps(config))
    out = folder / "mpi.h5"
    proc = subprocess.run([mpirun, "-np", "2", scape, "run", str(cfg), "--backend", "mpi", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **MPI_ENV})
    if proc.returncode == 2 and "built without MPI" in proc.stderr:
        pytest.skip("this scape was built without MPI")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    cfg.unlink()
    return out


@pytest.fixture(scope="module")
def mpi_run(scape, tmp_path_factory):
    """A SCAPE 90% run: a blocking sparse reduce-scatter and the lagged mask all-gather."""
    return measured_run(scape, tmp_path_factory.mktemp("measured"), {"type": "scape", "sparsity": 0.9, "lr": 3e-3})


@pytest.fixture(scope="module")
def bucketed_run(scape, tmp_path_factory):
    """Dense AdamS reducing its gradient in buckets during the backward pass."""
    return measured_run(scape, tmp_path_factory.mktemp("bucketed"),
                        {"type": "adams", "lr": 3e-3, "overlap_grad_reduce": True})


def steady_means(path):
    """{column: mean over steps 4 .. STEPS-1} of the measured columns, read with h5py alone."""
    with h5py.File(path, "r", swmr=True) as f:
        steps = f["metrics/step"][()]
        rows = (steps >= 4) & (steps < steps.max())
        return {name: float(np.mean(np.nan_to_num(f["metrics"][name][()][rows], nan=0.0)))
                for name in f["metrics"] if "wall_time" in name or name.startswith("comm_time_measured_")
                or name in ("mask_wait_exposed", "grad_wait_exposed", "optimizer_kernel_wall_time")}, int(rows.sum())


def test_breakdown_of_a_real_mpi_run_adds_up(mpi_run):
    from analysis import load_run
    from analysis.breakdown import breakdown, is_measured

    run = load_run(mpi_run)
    assert is_measured(run)
    b = breakdown(run, "scape")
    means, used = steady_means(mpi_run)
    assert b.steps_used == used == STEPS - 4
    assert b.workers == 2 and b.optimizer == "scape"
    assert b.compute == pytest.approx(means["compute_wall_time"], rel=1e-12)
    assert b.step == pytest.approx(means["compute_wall_time"] + means["optimizer_wall_time"], rel=1e-9)
    # Each rank's own kernels: positive even when its ranks were out of balance (this run's two ranks
    # share the machine's cores with whatever else runs), which the maxima of the parts can miss.
    assert b.optimizer_kernels == pytest.approx(means["optimizer_kernel_wall_time"], rel=1e-12)
    with h5py.File(mpi_run, "r", swmr=True) as f:
        kernels, phase = f["metrics/optimizer_kernel_wall_time"][()], f["metrics/optimizer_wall_time"][()]
    assert np.all(kernels > 0) and np.all(kernels <= phase)
    # The parts add up to forward/backward plus the whole optimizer phase, less the rank skew.
    assert b.compute + b.optimizer_kernels + b.exposed_comm + b.rank_skew == pytest.approx(b.step, rel=1e-12)
    blocking = {k[len("comm_time_measured_"):]: v for k, v in means.items()
                if k.startswith("comm_time_measured_") and k != "comm_time_measured_async_all_gather" and v > 0}
    assert b.collectives == pytest.approx(blocking, rel=1e-12)
    assert "grad_reduce_scatter" in b.collectives  # SCAPE's sparse reduce-scatter blocks
    assert b.mask_wait == pytest.approx(means["mask_wait_exposed"], abs=1e-15)
    assert b.lagged_all_gather == pytest.approx(means["comm_time_measured_async_all_gather"], rel=1e-12)
    assert b.compute > 0 and b.optimizer_kernels > 0


def test_a_bucketed_dense_run_waits_for_its_buckets_and_lists_them_beside_compute(bucketed_run):
    from analysis import load_run
    from analysis.breakdown import breakdown

    b = breakdown(load_run(bucketed_run), "adams bucketed")
    means, _ = steady_means(bucketed_run)
    assert b.optimizer == "adams"
    assert b.step == pytest.approx(means["compute_wall_time"] + means["optimizer_wall_time"], rel=1e-9)
    # The buckets ran on the communication thread: not a blocking collective of the step.
    assert "grad_reduce_scatter" not in b.collectives and "async_reduce_scatter" not in b.collectives
    assert "param_all_gather" in b.collectives
    assert b.gradient_buckets == pytest.approx(means["comm_time_measured_async_reduce_scatter"], rel=1e-12)
    assert b.gradient_buckets > 0
    assert b.grad_wait == pytest.approx(means["grad_wait_exposed"], abs=1e-15)
    assert b.exposed_comm == pytest.approx(b.grad_wait + b.collectives["param_all_gather"], rel=1e-12)
    assert b.mask_wait == 0 and not np.isfinite(b.lagged_all_gather)



def test_exposed_communication_per_step_is_the_one_definition(bucketed_run, mpi_run):
    """exposed_comm (the netlab's medians read it too) gives per step the blocking collectives plus
    both waits: its mean over the steady steps is the breakdown's exposed communication, and on
    the bucketed run it holds the wait for the gradient buckets, not the buckets' own time."""
    from analysis import load_run
    from analysis.breakdown import breakdown, exposed_columns, exposed_comm, steady_rows

    for path, label in ((bucketed_run, "bucketed"), (mpi_run, "scape")):
        run = load_run(path)
        rows = steady_rows(run)
        per_step = exposed_comm(run.metrics, rows)
        assert per_step.shape == (rows.size,)
        assert float(np.mean(per_step)) == pytest.approx(breakdown(run, label).exposed_comm, rel=1e-12)
        with h5py.File(path, "r", swmr=True) as f:  # a run file's own /metrics group, read as the netlab does
            m = f["metrics"]
            by_hand = sum(np.nan_to_num(m[c][()][rows]) for c in m if c.startswith("comm_time_measured_")
                          and "async" not in c) + np.nan_to_num(m["mask_wait_exposed"][()][rows])
            by_hand += np.nan_to_num(m["grad_wait_exposed"][()][rows]) if "grad_wait_exposed" in m else 0.0
            np.testing.assert_allclose(exposed_comm(m, slice(3, -1)), by_hand, rtol=1e-12)
    bucketed = load_run(bucketed_run)
    assert "grad_wait_exposed" in exposed_columns(bucketed.metrics)
    assert not any("async" in c for c in exposed_columns(bucketed.metrics))
    # One step of scape.torch's last_metrics: scalars, no measured collectives.
    assert exposed_comm({"mask_wait_exposed": 0.25, "grad_wait_exposed": 0.5, "bytes_sent": 7.0}) == 0.75


def test_known_columns_give_the_hand_derived_breakdown(mpi_run, tmp_path):
    from analysis import load_run
    from analysis.breakdown import breakdown

    path = tmp_path / "known.h5"
    shutil.copy(mpi_run, path)
    with h5py.File(path, "r+") as f:
        del f.attrs["checksums"]  # edited by hand: no longer the tables scape closed
        m = f["metrics"]
        n = m["step"].shape[0]
        for name in m:
            if name.startswith("comm_time_measured_") or name == "mask_wait_exposed":
                m[name][...] = np.zeros(n)
        m["compute_wall_time"][...] = np.full(n, 0.010)
        m["optimizer_wall_time"][...] = np.full(n, 0.005)
        m["optimizer_kernel_wall_time"][...] = np.full(n, 0.002)  # one rank's own, in balance
        m["comm_time_measured_grad_reduce_scatter"][...] = np.full(n, 0.002)
        m["mask_wait_exposed"][...] = np.full(n, 0.001)
        m["comm_time_measured_async_all_gather"][...] = np.full(n, 0.004)
        m["compute_wall_time"][0] = 9.0  # step 1, outside the steady steps: must not count
        m["step_wall_time"][...] = np.arange(n) * 0.001 + 0.020  # rank 0's whole step, diagnostics included
        m["diagnostics_time"][...] = np.full(n, 0.003)
    b = breakdown(load_run(path), "known")
    steady = np.arange(n)[3:n - 1] * 0.001 + 0.020  # steps 4 .. n-1
    assert b.step_wall == pytest.approx(float(np.median(steady)))
    assert b.diagnostics == pytest.approx(0.003)  # beside the parts: the step is unchanged
    assert b.diagnostics_taken == "grad_norm every 100 steps"  # the multi-process default, no oracle for paper
    assert b.compute == pytest.approx(0.010)
    assert b.collectives == pytest.approx({"grad_reduce_scatter": 0.002})
    assert b.mask_wait == pytest.approx(0.001)
    assert b.optimizer_kernels == pytest.approx(0.005 - 0.002 - 0.001)
    assert b.step == pytest.approx(0.015)
    assert b.exposed_comm == pytest.approx(0.003)
    assert b.rank_skew == pytest.approx(0.0, abs=1e-15)
    assert b.lagged_all_gather == pytest.approx(0.004)

    # Out of balance: rank 0 waited 3 ms in the reduce-scatter for rank 1, which waited 2 ms for its
    # mask; each rank's phase is 5 ms with 1.5 ms of kernels. The maxima (3 + 2 ms) overcount the
    # phase by 1.5 ms, which the kernels' remainder would have made -0.5 ms: the skew shows it.
    with h5py.File(path, "r+") as f:
        m = f["metrics"]
        m["comm_time_measured_grad_reduce_scatter"][...] = np.full(n, 0.003)
        m["mask_wait_exposed"][...] = np.full(n, 0.002)
        m["optimizer_kernel_wall_time"][...] = np.full(n, 0.0015)
    b = breakdown(load_run(path), "skewed")
    assert b.optimizer_kernels == pytest.approx(0.0015)
    assert b.step == pytest.approx(0.015)
    assert b.rank_skew == pytest.approx(0.005 - (0.0015 + 0.003 + 0.002))

    # A file from before optimizer_kernel_wall_time: the kernels are the remainder of the maxima.
    with h5py.File(path, "r+") as f:
        del f["metrics/optimizer_kernel_wall_time"]
    b = breakdown(load_run(path), "older")
    assert b.optimizer_kernels == pytest.approx(0.005 - 0.003 - 0.002)
    assert b.rank_skew == pytest.approx(0.0, abs=1e-15)


def test_report_writes_the_section_csv_and_figure_for_measured_runs_only(scape, mpi_run, tmp_path):
    from analysis.report import write_report

    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(mpi_run, runs / "mpi.h5")
    run_scape(scape, dict(TINY_GPT, steps=STEPS), runs / "sim.h5")
    _, text = write_report([runs], tmp_path / "report")
    assert "## Measured step time (MPI and NCCL runs)" in text
    with open(tmp_path / "report" / "breakdown.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["file"] for r in rows] == ["mpi.h5"]  # the simulated run has no measured columns
    r = rows[0]
    parts = float(r["compute_s"]) + float(r["optimizer_kernels_s"]) + float(r["mask_wait_s"]) + float(
        r["grad_wait_s"]) + float(r["rank_skew_s"]) + sum(float(v) for k, v in r.items() if k.endswith("_s") and k not in (
            "lagged_all_gather_s", "gradient_buckets_s", "step_s", "compute_s", "optimizer_kernels_s", "mask_wait_s",
            "grad_wait_s", "rank_skew_s", "step_wall_median_s", "diagnostics_s"))
    assert parts == pytest.approx(float(r["step_s"]), rel=1e-9)
    assert (tmp_path / "report" / "breakdown.png").stat().st_size > 0

    sim_only = tmp_path / "sim-only"
    sim_only.mkdir()
    shutil.copy(runs / "sim.h5", sim_only / "sim.h5")
    _, text = write_report([sim_only], tmp_path / "report-sim", figures=False)
    assert "Measured step time" not in text
    assert not (tmp_path / "report-sim" / "breakdown.csv").exists()
