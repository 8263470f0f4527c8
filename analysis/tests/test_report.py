"""The report's numbers against values computed here straight from the run files (h5py only).

Run files come from real `scape run`/`scape sweep` calls (conftest.py). Expected values are
read with plain h5py, independently of analysis.runs, so a wrong column cannot agree with itself.
"""

import csv
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import REPO

PYTHON = sys.executable


def raw(path, name):
    """A dataset of a run file, read without the analysis package."""
    with h5py.File(path, "r", swmr=True) as f:
        return f[name][()]


def table_rows(text):
    """{file name: {column: cell}} from every Markdown table of summary.md."""
    rows, header = {}, None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-"):
            rows[cells[-1]] = dict(zip(header, cells))
    return rows


def csv_rows(out):
    """{file name: row} of summary.csv."""
    with open(out / "summary.csv", encoding="utf-8") as f:
        return {r["file"]: r for r in csv.DictReader(f)}


def test_comm_reduction_is_ratio_of_mean_bytes(mixed_dir, mixed_report):
    """SCAPE 0.99 vs dense AdamS: mean bytes_sent of the dense file / of the SCAPE file."""
    _, text, out = mixed_report
    for name, dense in (("q-scape99.h5", "q-adams.h5"), ("q-scape90.h5", "q-adams.h5"),
                        ("g-scape99.h5", "g-adams.h5")):
        expected = raw(mixed_dir / dense, "metrics/bytes_sent").mean() / raw(mixed_dir / name, "metrics/bytes_sent").mean()
        assert expected > 5, f"{name}: implausible reduction {expected}"
        assert table_rows(text)[name]["comm. reduction"] == f"{expected:.2f}×"
        assert float(csv_rows(out)[name]["comm_reduction"]) == pytest.approx(expected, rel=1e-12)
        assert csv_rows(out)[name]["baseline"] == dense
    assert table_rows(text)["q-adams.h5"]["comm. reduction"] == "1.00×"


def test_speedup_is_ratio_of_mean_step_time(mixed_dir, mixed_report):
    """Speedup = dense mean step_time_model / the run's."""
    _, text, out = mixed_report
    t = {n: raw(mixed_dir / n, "metrics/step_time_model").mean() for n in ("q-adams.h5", "q-scape99.h5")}
    assert float(csv_rows(out)["q-scape99.h5"]["speedup"]) == pytest.approx(t["q-adams.h5"] / t["q-scape99.h5"])
    assert table_rows(text)["q-scape99.h5"]["step time (ms, modelled)"] == f"{t['q-scape99.h5'] * 1e3:.4g}"


def test_validation_columns(mixed_dir, mixed_report):
    """Final and best validation loss and the difference from dense AdamS of the GPT runs."""
    _, text, out = mixed_report
    val = {n: raw(mixed_dir / n, "eval/val_loss") for n in ("g-adams.h5", "g-scape99.h5")}
    assert len(val["g-scape99.h5"]) == 2  # eval at steps 5 and 10
    row = table_rows(text)["g-scape99.h5"]
    assert row["final val"] == f"{val['g-scape99.h5'][-1]:.4f}"
    assert row["best val"] == f"{val['g-scape99.h5'].min():.4f}"
    delta = val["g-scape99.h5"][-1] - val["g-adams.h5"][-1]
    assert row["Δ vs dense"] == f"{delta:+.4f}"
    assert float(csv_rows(out)["g-scape99.h5"]["delta"]) == pytest.approx(delta)


def test_quadratic_delta_uses_train_loss(mixed_dir, mixed_report):
    """Without a validation set Δ compares the mean train loss of the last 10 steps, and says so."""
    _, text, _ = mixed_report
    tail = {n: raw(mixed_dir / n, "metrics/train_loss")[-10:].mean() for n in ("q-adams.h5", "q-scape99.h5")}
    row = table_rows(text)["q-scape99.h5"]
    assert row["final val"] == "—"
    assert row["Δ vs dense"] == f"{tail['q-scape99.h5'] - tail['q-adams.h5']:+.4f} (train)"


def test_status_column(mixed_dir, mixed_report):
    """completed, diverged at the recorded step (final values left out), running with its row count."""
    _, text, _ = mixed_report
    rows = table_rows(text)
    assert rows["q-adams.h5"]["status"] == "completed"
    last = int(raw(mixed_dir / "q-diverged.h5", "metrics/step")[-1])
    with h5py.File(mixed_dir / "q-diverged.h5", "r", swmr=True) as f:
        assert f.attrs["status"] == "diverged"
    assert 1 <= last < 30
    assert rows["q-diverged.h5"]["status"] == f"**diverged** at step {last}"
    assert rows["q-diverged.h5"]["final train"] == "—" and rows["q-diverged.h5"]["Δ vs dense"] == "—"
    n_killed = len(raw(mixed_dir / "q-killed.h5", "metrics/step"))
    assert n_killed >= 5
    assert rows["q-killed.h5"]["status"] == f"running ({n_killed}/1000000 steps)"


def test_failed_runs_listed_not_tabled(mixed_report):
    """A failed run appears with its error in its own section, in no table and no figure."""
    report, text, _ = mixed_report
    assert "q-failed.h5" not in table_rows(text)
    section = text.split("## Failed runs", 1)[1].split("##", 1)[0]
    assert "q-failed.h5" in section and "step 7: simulated failure" in section
    assert all(r.run.path.name != "q-failed.h5" for r in report.rows)


def test_unreadable_files_named_with_reason(mixed_report):
    """Old layouts and non-HDF5 files are reported by name with the reason, not as tracebacks."""
    report, text, _ = mixed_report
    problems = {p.name: msg for p, msg in report.problems}
    assert set(problems) == {"old-layout.h5", "future-layout.h5", "notes.h5"}
    assert "older run-file layout (no 'layout_version' attribute)" in problems["old-layout.h5"]
    assert "layout_version 2" in problems["future-layout.h5"]
    assert "not an HDF5 file" in problems["notes.h5"]
    for msg in problems.values():
        assert msg in text


def test_groups_separate_problems(mixed_report):
    """Quadratic, GPT and the long killed run are different groups; each compares within itself."""
    report, _, _ = mixed_report
    assert len(report.groups) == 3
    by_file = {r.run.path.name: r for r in report.rows}
    assert by_file["g-scape99.h5"].group == by_file["g-adams.h5"].group != by_file["q-adams.h5"].group
    assert by_file["q-killed.h5"].baseline == "" and "no dense run in this group" in by_file["q-killed.h5"].notes
    # Labels name the optimizer settings that vary inside the group: lr only where the diverged run is.
    assert by_file["g-scape99.h5"].label == "SCAPE(adams) s=0.99" and by_file["g-adams.h5"].label == "AdamS"
    assert by_file["q-scape99.h5"].label == "SCAPE(adams) s=0.99 lr=0.01"
    assert by_file["q-diverged.h5"].label == "AdamW lr=1e+10"


def test_figures_are_images(mixed_report):
    """Every figure the summary links exists and is a PNG with pixels in it."""
    import matplotlib.image as mpimg

    _, text, out = mixed_report
    linked = re.findall(r"\]\(([\w.]+\.png)\)", text)
    assert {"loss_vs_step.png", "loss_vs_time.png", "bytes.png", "mask.png", "residual.png",
            "staleness.png", "fill_in.png"} <= set(linked)
    for name in linked:
        img = mpimg.imread(out / name)
        assert img.shape[0] > 200 and img.shape[1] > 300
        assert img[..., :3].std() > 0.01, f"{name} is blank"
    assert (out / "summary.md").read_text(encoding="utf-8").strip() == text.strip()


def test_load_run_library(mixed_dir):
    """load_run: the config as a dict, metrics aligned with step, NaN where not applicable."""
    from analysis import RunFileError, load_run

    run = load_run(mixed_dir / "q-scape99.h5")
    assert run.config["optimizer"]["type"] == "scape" and run.config["workers"] == 4
    assert run.status == "completed" and run.steps_completed == 30
    assert list(run.steps) == list(range(1, 31))
    assert all(len(v) == 30 for v in run.metrics.values())
    np.testing.assert_array_equal(run.metrics["bytes_sent"], raw(mixed_dir / "q-scape99.h5", "metrics/bytes_sent"))
    assert run.tensor_names == ["theta"] and run.tensors["mask_density"].shape == (30, 1)
    dense = load_run(mixed_dir / "q-adams.h5")
    assert np.isnan(dense.metrics["mask_jaccard"]).all()
    np.testing.assert_allclose(dense.wall_clock()[-1], raw(mixed_dir / "q-adams.h5", "metrics/step_time_model").sum())
    with pytest.raises(RunFileError, match="not an HDF5 file"):
        load_run(mixed_dir / "bad" / "notes.h5")


def test_sweep_groups_by_workers(sweep_dir, tmp_path):
    """A sweep over W: one group per W, each run compared with the dense run of its own W."""
    from analysis.report import write_report

    report, _ = write_report([sweep_dir], tmp_path)
    assert sorted(report.groups) == ["workers=2", "workers=4"]
    assert set(report.varying) >= {"workers", "optimizer.type", "optimizer.mask_partition"}
    for row in report.rows:
        dense = next(r for r in report.rows if r.group == row.group and r.run.optimizer_type == "adams")
        expected = raw(dense.run.path, "metrics/bytes_sent").mean() / raw(row.run.path, "metrics/bytes_sent").mean()
        assert row.comm_reduction == pytest.approx(expected, rel=1e-12)
        assert row.baseline == dense.run.path.name
    union4 = next(r for r in report.rows if r.group == "workers=4" and "local_union" in r.label)
    fill = raw(union4.run.path, "metrics/fill_in")
    assert fill.max() > 1.0  # four workers' local top-k do not coincide on a noisy quadratic
    part4 = next(r for r in report.rows if r.group == "workers=4" and "partitioned" in r.label)
    np.testing.assert_array_equal(raw(part4.run.path, "metrics/fill_in"), 1.0)
    assert (tmp_path / "fill_in.png").stat().st_size > 10000


def cli(*args):
    """`python3 -m analysis ARGS` from the repository root."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([PYTHON, "-m", "analysis", *map(str, args)], capture_output=True, encoding="utf-8",
                          cwd=REPO, env=env, timeout=300)


def test_cli_help():
    proc = cli("--help")
    assert proc.returncode == 0 and "report DIR_OR_FILES" in proc.stdout and "Exit status" in proc.stdout
    proc = cli("report", "--help")
    assert proc.returncode == 0 and "--out" in proc.stdout


def test_cli_bad_arguments(tmp_path):
    assert cli("report", tmp_path).returncode == 2  # --out missing
    assert cli("frobnicate").returncode == 2


def test_cli_no_run_files(tmp_path):
    """An empty folder, a missing path and a folder of junk are unusable input: exit 1, named, no traceback."""
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = cli("report", empty, "--out", tmp_path / "o1")
    assert proc.returncode == 1 and "no readable run file" in proc.stderr
    proc = cli("report", tmp_path / "missing", "--out", tmp_path / "o2")
    assert proc.returncode == 1 and "missing: no such file or folder" in proc.stderr
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "a.h5").write_bytes(b"\x00" * 100)
    proc = cli("report", junk / "a.h5", "--out", tmp_path / "o3")
    assert proc.returncode == 1 and "a.h5: not an HDF5 file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_prints_summary_and_exits_0(mixed_dir, tmp_path):
    """The command prints summary.md; bad files beside good ones are warnings, not failures."""
    gpt = [mixed_dir / "g-adams.h5", mixed_dir / "g-scape99.h5", mixed_dir / "bad" / "notes.h5"]
    proc = cli("report", *gpt, "--out", tmp_path / "rep")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (tmp_path / "rep" / "summary.md").read_text(encoding="utf-8").strip()
    assert "warning:" in proc.stderr and "notes.h5: not an HDF5 file" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- the paper sweeps (experiments/configs/paper) ------------------------------------------

PAPER = sorted((REPO / "experiments" / "configs" / "paper").glob("*.json"))


def synthetic_override():
    """The data override that docs/REPRODUCING.md tells users without tinyshakespeare to use."""
    doc = (REPO / "docs" / "REPRODUCING.md").read_text(encoding="utf-8")
    m = re.search(r"--set '(data=\{[^']*\})'", doc)
    assert m, "docs/REPRODUCING.md has no --set 'data={...}' override"
    return m.group(1)


def test_paper_sweeps_exist_and_say_what_they_test():
    assert len(PAPER) == 19
    for path in PAPER:
        sweep = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(sweep.get("description"), str) and "Claim:" in sweep["description"], path.name
        # A sweep not run yet (7, equal bytes) states an estimate and says so.
        assert re.search(r"\d+ (min|s)\b", sweep["description"]), f"{path.name}: no measured (or estimated) time"


def one_seed_one_lr(sweep):
    """The sweep with `repeat` dropped, a grid over seeds cut to its first seed and every lr_search
    cut to its first rate: each point and grid combination once, so CI runs every setting without
    the study's multiplicity."""
    small = json.loads(json.dumps(sweep))
    small.pop("repeat", None)
    if "seed" in small.get("grid", {}):
        small["grid"]["seed"] = small["grid"]["seed"][:1]
    if "lr_search" in small:
        small["lr_search"] = small["lr_search"][:1]
    for p in small.get("points", []):
        if "lr_search" in p:
            p["lr_search"] = p["lr_search"][:1]
    return small


@pytest.mark.parametrize("path", PAPER, ids=[p.stem for p in PAPER])
def test_paper_sweep_runs_two_steps(scape, path, tmp_path):
    """Every point of every paper sweep is valid (all seeds and rates) and runs (2 steps, one seed and
    one rate); GPT sweeps with the documented synthetic-data override, so they also work where
    ../shared/data is absent."""
    sweep = json.loads(path.read_text(encoding="utf-8"))
    sets = ["steps=2"]
    if sweep["base"]["model"]["type"] == "gpt":
        assert sweep["base"]["data"]["path"] == "../../../../shared/data/tinyshakespeare.txt"
        sets += [synthetic_override(), "eval.batches=1"]
    set_args = [a for s in sets for a in ("--set", s)]
    full = subprocess.run([scape, "validate", str(path)] + set_args, capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stdout + full.stderr
    small = one_seed_one_lr(sweep)
    small_path = tmp_path / path.name  # the data override replaces the relative data path
    small_path.write_text(json.dumps(small), encoding="utf-8")
    proc = subprocess.run([scape, "sweep", str(small_path), "--out", str(tmp_path / "runs"), "--quiet"] + set_args,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted((tmp_path / "runs").glob("*.h5"))
    n_points = len(small.get("points", [{}])) * int(np.prod([len(v) for v in small.get("grid", {}).values()]))
    # Points that differ only in a key the override replaces (sweep 14's data.batch_size under the
    # synthetic data section) are one run: count the distinct run ids scape validate gives.
    listed = subprocess.run([scape, "validate", str(small_path)] + set_args, capture_output=True, text=True,
                            timeout=300)
    distinct = set(re.findall(r"run id ([0-9a-f]{16})", listed.stdout + listed.stderr))
    assert 0 < len(distinct) <= n_points
    assert len(files) == len(distinct)
    for f in files:
        with h5py.File(f, "r", swmr=True) as h:
            assert h.attrs["status"] == "completed"
            if sweep["base"]["model"]["type"] == "gpt":
                assert json.loads(h.attrs["config"])["data"]["type"] == "synthetic"


def test_baseline_prefers_a_completed_dense_run_among_equally_alike_ones():
    """A sparse run at lr 3e-3 in a group whose dense runs are at 1e-4 (still running, listed first)
    and 3e-4 (completed): neither shares its lr, so the completed one is the baseline; a running
    dense run at the sparse run's own lr is still preferred for being more alike."""
    from pathlib import Path
    from analysis.runs import Run
    from analysis.tables import pick_baseline

    def run(kind, lr, status):
        optimizer = {"type": kind, "lr": lr}
        if kind == "scape":
            optimizer["sparsity"] = 0.99
        return Run(path=Path(f"{kind}-{lr:g}.h5"), config={"name": "g", "optimizer": optimizer}, status=status,
                   steps_completed=1, error="", scape_version="", git_sha="")

    sparse = run("scape", 3e-3, "completed")
    running, completed = run("adams", 1e-4, "running"), run("adams", 3e-4, "completed")
    assert pick_baseline(sparse, [running, completed]) is completed
    assert pick_baseline(sparse, [completed, running]) is completed
    same_lr = run("adams", 3e-3, "running")
    assert pick_baseline(sparse, [completed, same_lr]) is same_lr


def test_effective_config_keeps_only_keys_that_apply():
    """Dense runs drop every SCAPE switch (device and offload too); top-k keeps its residual."""
    from pathlib import Path
    from analysis.runs import Run, effective_config

    optimizer = {"lr": 1e-3, "min_lr": 1e-4, "sparsity": 0.99, "inner": "adams", "residual": False,
                 "mask_lag": 1, "device": "cuda", "residual_offload": True, "offload_chunk": 4096,
                 "sharded": False}

    def run(kind):
        return Run(path=Path(f"{kind}.h5"), config={"name": kind, "optimizer": dict(optimizer, type=kind)},
                   status="completed", steps_completed=1, error="", scape_version="", git_sha="")

    dense = effective_config(run("adams"))
    assert not [k for k in dense if k.split(".")[-1] in ("sparsity", "residual", "device", "residual_offload",
                                                         "offload_chunk", "mask_lag")]
    assert dense["optimizer.sharded"] is False
    assert "optimizer.min_lr" not in dense  # the default lr/10
    topk = effective_config(run("topk_ef"))
    assert topk["optimizer.residual"] is False and topk["optimizer.sparsity"] == 0.99
    assert "optimizer.device" not in topk and "optimizer.sharded" not in topk
    scape = effective_config(run("scape"))
    assert scape["optimizer.device"] == "cuda" and scape["optimizer.residual_offload"] is True


def test_optimizer_key_types_come_from_scape_schema(monkeypatch):
    """Which optimizer reads which key is `scape schema`'s "x-applies-to"; a missing binary is named."""
    from analysis import runs

    runs.optimizer_key_types.cache_clear()
    try:
        types = runs.optimizer_key_types()
        assert types["lr"] == {"adamw", "adams", "scape", "topk_ef", "randk_ef", "onebit_adam", "powersgd", "demo",
                               "diloco", "sparseloco"}
        assert types["residual"] == {"scape", "topk_ef", "randk_ef"} and types["offload_chunk"] == {"scape"}
        assert types["freeze_step"] == {"onebit_adam"}
        assert types["inner"] == {"scape", "topk_ef", "randk_ef", "powersgd", "diloco", "sparseloco"}
        assert types["inner_steps"] == {"diloco", "sparseloco"} and types["outer_momentum"] == {"diloco"}
        assert types["sparsity"] == {"scape", "topk_ef", "randk_ef", "sparseloco"}
        assert types["powersgd_rank"] == {"powersgd"} and types["demo_topk"] == {"demo"}
        runs.optimizer_key_types.cache_clear()
        monkeypatch.setenv("SCAPE_BINARY", "/nonexistent/scape")
        with pytest.raises(runs.ScapeBinaryError, match="SCAPE_BINARY"):
            runs.optimizer_key_types()
    finally:
        runs.optimizer_key_types.cache_clear()


def test_summary_names_the_compute_of_the_modelled_step():
    """Each group says what its modelled step time takes as compute (the run's `compute` section)."""
    from types import SimpleNamespace

    from analysis.report import compute_text

    flops = SimpleNamespace(config={"compute": {"type": "flops", "device": "gh200", "mfu": 0.4}})
    assert compute_text(flops) == "FLOPs of one worker's micro-batch on gh200 at MFU 0.4"
    for config in ({"compute": {"type": "measured"}}, {}):
        assert compute_text(SimpleNamespace(config=config)) == "measured CPU time of one simulated worker"


def test_killed_run_opens_plainly_after_scape_repair(scape, mixed_dir, tmp_path):
    """A killed run's file refuses a plain open; `scape repair` makes it open plainly, marked killed."""
    from analysis.report import status_text
    from analysis.runs import load_run
    path = tmp_path / "q-killed.h5"
    shutil.copyfile(mixed_dir / "q-killed.h5", path)
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(path, "r")
    with h5py.File(path, "r", swmr=True) as f:
        kept = int(f.attrs["steps_completed"])
    proc = subprocess.run([scape, "repair", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"status killed (was running); {kept} steps kept" in proc.stdout
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == "killed"
        assert f["metrics/step"].shape == (kept,)
    assert status_text(load_run(path)) == f"killed ({kept}/1000000 steps)"


def test_interrupted_run_opens_plainly_with_its_status(scape, tmp_path):
    """SIGTERM stops a run at a step boundary: its file opens plainly, status 'interrupted'."""
    import signal
    import time

    from analysis.report import status_text
    from analysis.runs import load_run
    from conftest import QUADRATIC
    cfg = tmp_path / "long.json"
    cfg.write_text(json.dumps(dict(QUADRATIC, steps=1000000)))
    path = tmp_path / "q-term.h5"
    proc = subprocess.Popen([scape, "run", str(cfg), "--out", str(path), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (path.exists() and _steps_or_zero(path) >= 20):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == "interrupted"
        kept = int(f.attrs["steps_completed"])
        assert f["metrics/step"].shape == (kept,)
    assert kept >= 20
    assert status_text(load_run(path)) == f"interrupted ({kept}/1000000 steps)"


def _steps_or_zero(path):
    from analysis.runs import load_run
    try:
        return len(load_run(path).steps)
    except Exception:  # noqa: BLE001  between creation and the first flush
        return 0


def test_nodes_of_several_ranks_head_their_inter_node_bytes(scape, tmp_path):
    """topology.ranks_per_node = 2 (4 workers as 2 nodes): the table's bytes/worker/step is the
    mean of bytes_sent_inter, read here with h5py, and the comm. reduction against the flat dense
    run divides by it; a note says so. The flat run's stays bytes_sent."""
    from conftest import TINY_GPT, run_scape
    runs = tmp_path / "runs"
    runs.mkdir()
    run_scape(scape, TINY_GPT, runs / "flat-adams.h5", "optimizer.type=adams")
    run_scape(scape, TINY_GPT, runs / "node-scape.h5", "optimizer.type=scape", "optimizer.sparsity=0.99",
              "optimizer.hierarchy=node", "topology.ranks_per_node=2")
    out = tmp_path / "out"
    proc = subprocess.run([PYTHON, "-m", "analysis", "report", str(runs), "--out", str(out)], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = (out / "summary.md").read_text()
    inter = raw(runs / "node-scape.h5", "metrics/bytes_sent_inter").mean()
    every = raw(runs / "node-scape.h5", "metrics/bytes_sent").mean()
    dense = raw(runs / "flat-adams.h5", "metrics/bytes_sent").mean()
    assert 0 < inter < every  # the node's collectives are the rest
    rows = table_rows(text)
    assert rows["node-scape.h5"]["bytes/worker/step"] == f"{inter:.4g}"
    assert rows["node-scape.h5"]["comm. reduction"] == f"{dense / inter:.2f}×"
    assert rows["flat-adams.h5"]["bytes/worker/step"] == f"{dense:.4g}"
    assert "Runs with nodes of 2 ranks (`topology.ranks_per_node`)" in text
