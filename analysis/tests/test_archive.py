"""`analysis archive`: block means against hand-computed cases, archives of real runs against the
originals read with plain h5py, the report of archives against the report of the originals, and
the refusals."""

import csv
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import REPO, TINY_GPT, run_scape, set_attrs

from analysis import load_run
from analysis.archive import ArchiveError, archive_run, archive_runs, block_means
from analysis.report import write_report


def test_block_means_hand_case():
    steps = np.arange(1, 8)
    values = np.array([1.0, 2.0, 6.0, 4.0, np.nan, 8.0, 7.0])
    last, means = block_means(steps, values, 3)
    assert last.tolist() == [3, 6, 7]
    assert means.tolist() == [3.0, 6.0, 7.0]  # (1+2+6)/3, (4+8)/2 without the NaN, 7 alone


def test_block_means_all_nan_block_stays_nan_and_inf_stays():
    last, means = block_means(np.arange(1, 5), np.array([np.nan, np.nan, 1.0, np.inf]), 2)
    assert last.tolist() == [2, 4]
    assert np.isnan(means[0]) and means[1] == np.inf


def test_block_means_of_columns_and_by_step_number():
    # Blocks follow step numbers, not rows: steps 2 and 3 share block (0, 3] with K = 3.
    table = np.array([[1.0, 10.0], [3.0, np.nan], [5.0, 30.0]])
    last, means = block_means(np.array([2, 3, 4]), table, 3)
    assert last.tolist() == [3, 4]
    assert means.tolist() == [[2.0, 10.0], [5.0, 30.0]]


@pytest.fixture(scope="module")
def two_runs(scape, tmp_path_factory):
    """Dense AdamS and SCAPE 99% on the tiny GPT, 20 steps, validation every 5."""
    d = tmp_path_factory.mktemp("archive-src")
    config = dict(TINY_GPT, steps=20)
    run_scape(scape, config, d / "g-adams.h5", "optimizer.type=adams")
    run_scape(scape, config, d / "g-scape99.h5", "optimizer.type=scape", "optimizer.sparsity=0.99")
    return d


def test_archive_keeps_attributes_and_eval_and_averages_blocks(two_runs, tmp_path):
    done, problems = archive_runs([two_runs], tmp_path / "a", block_steps=5)
    assert problems == [] and sorted(x.target.name for x in done) == ["g-adams.h5", "g-scape99.h5"]
    for name in ("g-adams.h5", "g-scape99.h5"):
        src, dst = two_runs / name, tmp_path / "a" / name
        with h5py.File(src, "r") as f, h5py.File(dst, "r") as g:
            for key, value in f.attrs.items():
                if key != "checksums":  # the original's tables' CRC-32s do not describe block means
                    assert g.attrs[key] == value, key
            assert f.attrs["checksums"] and "checksums" not in g.attrs
            assert g.attrs["archive_block_steps"] == 5
            assert "tensors" in f and "tensors" not in g
            assert np.array_equal(f["eval/val_loss"][()], g["eval/val_loss"][()])
            assert np.array_equal(f["eval/step"][()], g["eval/step"][()])
            assert g["metrics/step"][()].tolist() == [5, 10, 15, 20]
            loss = f["metrics/train_loss"][()]
            assert np.allclose(g["metrics/train_loss"][()], loss.reshape(4, 5).mean(axis=1), rtol=1e-15)
            bytes_sent = f["metrics/bytes_sent"][()]
            assert g["metrics/bytes_sent"][()].mean() == pytest.approx(bytes_sent.mean(), rel=1e-15)
        original, archive = load_run(src), load_run(dst)
        assert archive.archive_block_steps == 5 and original.archive_block_steps == 1
        assert archive.wall_clock()[-1] == pytest.approx(original.wall_clock()[-1], rel=1e-12)
        assert archive.wall_clock()[1] == pytest.approx(original.wall_clock()[9], rel=1e-12)


def test_keep_tensors_averages_the_per_tensor_tables(two_runs, tmp_path):
    archive_run(two_runs / "g-scape99.h5", tmp_path, block_steps=10, keep_tensors=True)
    original, archive = load_run(two_runs / "g-scape99.h5"), load_run(tmp_path / "g-scape99.h5")
    assert archive.tensor_names == original.tensor_names
    for name, table in original.tensors.items():
        expected = np.stack([np.nanmean(table[:10], axis=0), np.nanmean(table[10:], axis=0)]) \
            if not np.all(np.isnan(table)) else np.full((2, table.shape[1]), np.nan)
        assert np.allclose(archive.tensors[name], expected, equal_nan=True), name


def _csv(path):
    with open(path, encoding="utf-8") as f:
        return {r["file"]: r for r in csv.DictReader(f)}


def test_report_of_archives_equals_report_of_originals(two_runs, tmp_path):
    archive_runs([two_runs], tmp_path / "a", block_steps=5)
    write_report([two_runs], tmp_path / "r1", figures=False)
    write_report([tmp_path / "a"], tmp_path / "r2", figures=False)
    original, archived = _csv(tmp_path / "r1" / "summary.csv"), _csv(tmp_path / "r2" / "summary.csv")
    assert original.keys() == archived.keys()
    for name, row in original.items():
        for column in ("group", "label", "status", "final_val", "best_val", "delta", "baseline"):
            assert archived[name][column] == row[column], (name, column)
        # Means over 20 steps from means over 4 blocks of 5: equal up to the order of the sums.
        for column in ("bytes_per_step", "comm_reduction", "exposed_comm", "step_time", "speedup"):
            assert row[column] not in ("", "nan"), (name, column)
            assert float(archived[name][column]) == pytest.approx(float(row[column]), rel=1e-12), (name, column)


def test_refuses_running_files_archives_and_foreign_targets(two_runs, tmp_path):
    running = set_attrs(two_runs / "g-adams.h5", tmp_path / "running.h5", status="running")
    with pytest.raises(ArchiveError, match="status 'running'"):
        archive_run(running, tmp_path / "out")
    archive_run(two_runs / "g-adams.h5", tmp_path / "a")
    with pytest.raises(ArchiveError, match="already an archive"):
        archive_run(tmp_path / "a" / "g-adams.h5", tmp_path / "b")
    with pytest.raises(ArchiveError, match="own folder"):
        archive_run(two_runs / "g-adams.h5", two_runs)
    foreign = tmp_path / "c"
    foreign.mkdir()
    (foreign / "g-adams.h5").write_bytes((two_runs / "g-scape99.h5").read_bytes())
    with pytest.raises(ArchiveError, match="not an archive; not overwritten"):
        archive_run(two_runs / "g-adams.h5", foreign)
    assert (foreign / "g-adams.h5").read_bytes() == (two_runs / "g-scape99.h5").read_bytes()


def test_up_to_date_archive_is_left_alone(two_runs, tmp_path):
    first = archive_run(two_runs / "g-adams.h5", tmp_path)
    mtime = (tmp_path / "g-adams.h5").stat().st_mtime_ns
    second = archive_run(two_runs / "g-adams.h5", tmp_path)
    assert (first.outcome, second.outcome) == ("archived", "up to date")
    assert (tmp_path / "g-adams.h5").stat().st_mtime_ns == mtime


def cli(*args):
    return subprocess.run([sys.executable, "-m", "analysis", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def test_cli_exit_statuses(two_runs, tmp_path):
    ok = cli("archive", str(two_runs), "--out", str(tmp_path / "a"), "--block-steps", "4")
    assert ok.returncode == 0, ok.stderr
    assert "20 rows -> 5" in ok.stdout
    again = cli("archive", str(two_runs), "--out", str(tmp_path / "a"))
    assert again.returncode == 0 and again.stdout.count("up to date") == 2
    bad = cli("archive", str(two_runs), "--out", str(tmp_path / "b"), "--block-steps", "0")
    assert bad.returncode == 2 and "--block-steps 0" in bad.stderr
    refused = cli("archive", str(tmp_path / "a"), "--out", str(tmp_path / "c"))
    assert refused.returncode == 1 and "already an archive" in refused.stderr
    nothing = cli("archive", str(tmp_path / "empty-does-not-exist"), "--out", str(tmp_path / "d"))
    assert nothing.returncode == 1 and "no such file or folder" in nothing.stderr
