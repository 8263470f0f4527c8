"""scape.run_file: a run file written from a training loop, read back with h5py, by
analysis.load_run and by `python3 -m analysis report`."""
import csv
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from scape import run_file  # imports neither torch nor the extension

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "python" / "scape" / "run_file.py"
RunFileWriter = run_file.RunFileWriter
TENSORS = [("wte", 4096), ("h.0.attn.weight", 3072), ("h.0.ln.bias", 64), ("lm_head", 4096)]
N = sum(n for _, n in TENSORS)
STEPS, WORKERS = 30, 4


def config(optimizer, lr=3e-3):
    return {"name": "torch-loop", "seed": 1, "workers": WORKERS, "steps": STEPS, "model": {"type": "external"},
            "optimizer": dict(optimizer, lr=lr), "network": {"preset": "ib_ndr400"}}


def metrics(t, sparse):
    """A plausible row: loss falling, fixed bytes per step, a 1% mask that settles."""
    dense_bytes = 2 * N * 4 * (WORKERS - 1) / WORKERS
    row = {"loss": 2.0 + 2.5 * math.exp(-t / 8), "lr": 3e-3 * min(1.0, t / 5), "grad_norm": 1.0 / t,
           "bytes_sent": dense_bytes * (0.02 if sparse else 1.0), "comm_time_exposed": 2e-5,
           "step_time_model": 1e-3 + (2e-5 if sparse else 2e-4), "update_norm": 0.01}
    if sparse:
        row.update(mask_density=0.01, jaccard=math.nan if t == 1 else 0.9, residual_norm=0.5 * (1 - math.exp(-t)),
                   bytes_sent_grad_reduce_scatter=row["bytes_sent"] / 2)
    return row


def write_run(path, optimizer, flush_interval=4, **close):
    sparse = optimizer["type"] == "scape"
    with RunFileWriter(path, config=config(optimizer), tensors=TENSORS, world_size=WORKERS,
                       flush_interval=flush_interval) as log:
        for t in range(1, STEPS + 1):
            log.write_step(t, metrics(t, sparse))
            if t % 10 == 0:
                log.write_eval(t, 2.1 + 2.0 * math.exp(-t / 8) + (0.02 if sparse else 0.0))
        return log.close(**close)


def test_layout_is_that_of_scape_run(tmp_path):
    path = tmp_path / "scape99.h5"
    params = np.linspace(-1, 1, N, dtype=np.float32)
    summary = write_run(path, {"type": "scape", "sparsity": 0.99, "inner": "adams"}, final_params=params)
    assert summary["status"] == "completed" and summary["steps_completed"] == STEPS and summary["n_params"] == N
    assert summary["final_val_loss"] == pytest.approx(2.1 + 2.0 * math.exp(-30 / 8) + 0.02)
    with h5py.File(path, "r") as f:  # closed: opens plainly
        assert f.attrs["status"] == "completed" and f.attrs["error"] == ""
        assert int(f.attrs["steps_completed"]) == STEPS and int(f.attrs["layout_version"]) == 1
        assert f.attrs["git_sha"] and f.attrs["scape_version"]
        m = f["metrics"]
        np.testing.assert_array_equal(m["step"][()], np.arange(1, STEPS + 1))
        assert "loss" not in m and "jaccard" not in m  # aliases name scape's columns
        assert np.all(np.diff(m["train_loss"][()]) < 0)
        jaccard = m["mask_jaccard"][()]
        assert math.isnan(jaccard[0]) and np.all(jaccard[1:] == 0.9)  # NaN stays NaN
        assert np.all(np.isnan(m["mask_oracle_overlap"][()]))  # a scape column the loop did not log
        assert m["bytes_sent_grad_reduce_scatter"].attrs["unit"] == "bytes"
        assert m["lr"].attrs["combine"] == "worker 0"
        assert m["bytes_sent_grad_reduce_scatter"].shape == (STEPS,)
        np.testing.assert_array_equal(f["eval/step"][()], [10, 20, 30])
        assert [n.decode() for n in f["tensors/names"][()]] == [n for n, _ in TENSORS]
        assert f["tensors/residual_norm"].shape == (STEPS, len(TENSORS))
        np.testing.assert_array_equal(f["final/params"][()], params)

    from analysis.runs import load_run  # the repository root is on sys.path (conftest.py)
    run = load_run(path)
    assert run.config["optimizer"]["sparsity"] == 0.99 and run.config["model"]["type"] == "external"
    assert run.status == "completed" and len(run.steps) == STEPS and len(run.val_loss) == 3


def test_analysis_report_reads_it(tmp_path):
    """Without any scape binary: the writer's configs are as given (config_as_given), so the report
    needs no key table from `scape schema`."""
    runs = tmp_path / "runs"
    runs.mkdir()
    write_run(runs / "adams.h5", {"type": "adams"})
    write_run(runs / "scape99.h5", {"type": "scape", "sparsity": 0.99, "inner": "adams"})
    out = tmp_path / "report"
    proc = subprocess.run(["/usr/bin/python3", "-m", "analysis", "report", str(runs), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, SCAPE_BINARY="/nonexistent/scape", PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stderr, proc.stderr
    summary = (out / "summary.md").read_text()
    assert "scape99.h5" in summary and "adams.h5" in summary and "SCAPE(adams) s=0.99" in summary
    rows = {r["file"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert {r["status"] for r in rows.values()} == {"completed"}
    assert float(rows["scape99.h5"]["comm_reduction"]) == pytest.approx(50.0)
    assert rows["scape99.h5"]["baseline"] == "adams.h5"


def test_a_killed_loop_leaves_its_flushed_rows(tmp_path):
    path = tmp_path / "killed.h5"
    script = textwrap.dedent(f"""
        import importlib.util, os, signal
        spec = importlib.util.spec_from_file_location("run_file", {str(MODULE)!r})
        run_file = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(run_file)
        log = run_file.RunFileWriter({str(path)!r}, config={{"name": "k", "steps": 100}}, tensors=[("w", 8)],
                                     flush_interval=5)
        for t in range(1, 13):
            log.write_step(t, {{"train_loss": 3.0 - 0.1 * t, **({{"surprise": t}} if t > 5 else {{}})}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    with h5py.File(path, "r", swmr=True) as f:  # as the analysis opens every file
        assert f.attrs["status"] == "running" and int(f.attrs["steps_completed"]) == 10
        np.testing.assert_array_equal(f["metrics/step"][()], np.arange(1, 11))
        np.testing.assert_allclose(f["metrics/train_loss"][()], 3.0 - 0.1 * np.arange(1, 11))
        surprise = f["metrics/surprise"][()]  # a column first logged after the first flush
        assert np.all(np.isnan(surprise[:5])) and list(surprise[5:]) == [6, 7, 8, 9, 10]
    from analysis.runs import load_run
    assert load_run(path).status == "running"


def test_bad_paths_are_named(tmp_path):
    kwargs = {"config": {"name": "x", "steps": 1}, "tensors": [("w", 8)]}
    missing = tmp_path / "no-such-folder" / "run.h5"
    with pytest.raises(ValueError, match="no-such-folder"):
        RunFileWriter(missing, **kwargs)
    existing = tmp_path / "taken.h5"
    existing.write_text("another run")
    with pytest.raises(ValueError, match=r"taken\.h5.*overwrite=True"):
        RunFileWriter(existing, **kwargs)
    assert existing.read_text() == "another run"
    RunFileWriter(existing, overwrite=True, **kwargs).close()
    assert h5py.is_hdf5(existing)
    with pytest.raises(ValueError, match=r"taken\.h5.*increase"):
        with RunFileWriter(existing, overwrite=True, **kwargs) as log:
            log.write_step(2, {"loss": 1.0})
            log.write_step(2, {"loss": 1.0})
    with h5py.File(existing, "r") as f:  # the exception closed it as failed, its rows kept
        assert f.attrs["status"] == "failed" and "increase" in f.attrs["error"]
        assert list(f["metrics/step"][()]) == [2]


def test_other_ranks_write_nothing(tmp_path):
    path = tmp_path / "rank1.h5"
    with RunFileWriter(path, config={"name": "r", "steps": 3}, tensors=[("w", 8)], rank=1, world_size=2) as log:
        for t in range(1, 4):
            log.write_step(t, {"loss": 1.0 / t})
        log.write_eval(3, 0.5)
        summary = log.close(final_params=np.zeros(8, dtype=np.float32))
    assert not path.exists() and list(tmp_path.iterdir()) == []
    assert summary["path"] is None and summary["status"] == "completed"


def test_a_non_finite_loss_records_a_diverged_run(tmp_path):
    path = tmp_path / "diverged.h5"
    with RunFileWriter(path, config={"name": "d", "steps": 5}, tensors=[("w", 8)]) as log:
        for t, loss in enumerate([2.0, 1.5, math.inf, math.nan], start=1):
            log.write_step(t, {"train_loss": loss, "mask_jaccard": None})
        summary = log.close(final_params=np.zeros(8, dtype=np.float32))
    assert summary["status"] == "diverged" and "step 3" in summary["error"]
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == "diverged" and "final" not in f  # scape run keeps no params either
        loss = f["metrics/train_loss"][()]
        assert loss[2] == math.inf and math.isnan(loss[3]) and np.all(np.isnan(f["metrics/mask_jaccard"][()]))


def test_one_writer_per_run_file_and_a_killed_writers_lock_is_taken_over(tmp_path, capfd):
    """The lock `scape run` takes (<file>.lock, flock, "pid host"): a second writer of a live
    file is refused naming the holder, with nothing written; the lock of a writer killed with
    SIGKILL is taken over, saying whose; a closed file leaves no lock behind."""
    path = tmp_path / "live.h5"
    script = textwrap.dedent(f"""
        import importlib.util, os, signal, sys, time
        spec = importlib.util.spec_from_file_location("run_file", {str(MODULE)!r})
        run_file = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(run_file)
        log = run_file.RunFileWriter({str(path)!r}, config={{"name": "k", "steps": 100}}, tensors=[("w", 8)])
        log.write_step(1, {{"train_loss": 3.0}})
        print("ready", flush=True)
        sys.stdin.readline()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        before = path.read_bytes()
        with pytest.raises(ValueError, match=rf"live\.h5': another writer holds it \(pid {proc.pid} on host "):
            RunFileWriter(path, overwrite=True, config={"name": "x", "steps": 1}, tensors=[("w", 8)])
        assert path.read_bytes() == before
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=60)
    assert proc.returncode == -9
    capfd.readouterr()
    log = RunFileWriter(path, overwrite=True, config={"name": "x", "steps": 1}, tensors=[("w", 8)])
    assert f"took over the lock of pid {proc.pid} on host" in capfd.readouterr().err
    log.write_step(1, {"train_loss": 1.0})
    log.close()
    assert not Path(str(path) + ".lock").exists()


def test_checksums_at_close_are_scape_runs_and_catch_a_changed_value(tmp_path):
    import zlib
    from analysis.runs import RunFileError, load_run
    path = tmp_path / "sums.h5"
    write_run(path, {"type": "scape", "sparsity": 0.99})
    with h5py.File(path, "r") as f:
        import json as json_
        sums = json_.loads(f.attrs["checksums"])
        assert "metrics/step" in sums and "eval/val_loss" in sums and "tensors/names" not in sums
        steps = f["metrics/step"][()].astype("<i8")
        assert sums["metrics/step"] == zlib.crc32(steps.tobytes())
    assert load_run(path).status == "completed"
    with h5py.File(path, "r+") as f:
        loss = f["metrics/train_loss"]
        loss[3] = loss[3] + 1e-9
    with pytest.raises(RunFileError, match=r"checksum mismatch in 'metrics/train_loss'"):
        load_run(path)
