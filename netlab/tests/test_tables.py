"""The netlab study's tables (`scripts/netlab tables`, netlab/tables.py): medians, spreads,
prediction errors, speedups and strong-scaling efficiency against hand-computed values from small
steps.csv files; the command through the driver, without root."""
import csv
import os
import subprocess

import pytest

from conftest import REPO
from netlab import tables
from netlab.steps_csv import COLUMNS
from netlab.tables import main


def write(path, rows, extra=()):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS + list(extra))
        w.writeheader()
        for r in rows:
            w.writerow(dict(zip(COLUMNS + list(extra), r)))
    return str(path)


def bench_runs(tmp_path):
    # three bench runs of two methods on the MPI runtime; SCAPE's prediction only in two of them
    runs = [[("mpi", "adams", 2, 100.0, 1600.0, 1500.0, 1550.0, 1000), ("mpi", "scape-99", 2, 100.0, 80.0, 70.0, 10.0, 20)],
            [("mpi", "adams", 2, 100.0, 1700.0, 1500.0, 1650.0, 1000), ("mpi", "scape-99", 2, 100.0, 70.0, "", 9.0, 20)],
            [("mpi", "adams", 2, 100.0, 1650.0, 1530.0, 1600.0, 1000), ("mpi", "scape-99", 2, 100.0, 75.0, 72.0, 8.0, 20)]]
    return [write(tmp_path / f"steps{i}.csv", r) for i, r in enumerate(runs)]


def test_cells_aggregate_over_runs(tmp_path):
    cells = {c["method"]: c for c in tables.cells(tables.read_rows(bench_runs(tmp_path)))}
    dense, scape = cells["adams"], cells["scape-99"]
    assert (dense["runs"], dense["step_ms"], dense["step_min_ms"], dense["step_max_ms"]) == (3, 1650.0, 1600.0, 1700.0)
    assert dense["predicted_ms"] == 1500.0 and dense["error"] == pytest.approx(1500 / 1650 - 1)
    assert scape["step_ms"] == 75.0 and scape["exposed_ms"] == 9.0
    assert scape["predicted_ms"] == 71.0  # the median of the two runs that predicted it
    assert scape["error"] == pytest.approx(71 / 75 - 1)
    assert scape["speedup"] == pytest.approx(1650 / 75) and dense["speedup"] == 1.0
    table = tables.markdown(list(cells.values()))
    assert "| scape-99 | 75.0 [70.0, 80.0] | 71.0 (-5.3%) | 9.0 | 20 | 22.00 |" in table


def test_efficiency_against_fewest_nodes(tmp_path):
    extra = ("compute_ms",)
    rows = [("mpi", "dense", 2, 100.0, 3000.0, "", 1000.0, 6e6, 2400), ("mpi", "dense", 8, 100.0, 2000.0, "", 1800.0, 1e7, 600),
            ("mpi", "scape99", 2, 100.0, 2500.0, "", 9.0, 9e4, 2400), ("mpi", "scape99", 8, 100.0, 750.0, "", 80.0, 1.6e5, 600),
            ("mpi", "scape99_lag0", 4, 100.0, 1300.0, "", 35.0, 1.4e5, 1200)]
    cells = {(c["method"], c["workers"]): c for c in tables.efficiency(tables.cells(tables.read_rows(
        [write(tmp_path / "s.csv", rows, extra)])))}
    assert cells[("dense", 8)]["efficiency"] == pytest.approx(3000 * 2 / (2000 * 8))
    assert cells[("scape99", 8)]["efficiency"] == pytest.approx(2500 * 2 / (750 * 8))
    assert cells[("scape99", 2)]["efficiency"] == 1.0
    assert cells[("scape99_lag0", 4)]["efficiency"] is None  # one node count: no scaling to report
    assert cells[("scape99", 8)]["speedup"] == pytest.approx(2000 / 750)


def test_scaling_table_gives_the_prediction_where_a_run_made_one(tmp_path):
    extra = ("compute_ms",)
    runs = [[("mpi", "dense", 2, 100.0, 3000.0, "", 1000.0, 6e6, 2400), ("mpi", "scape99", 2, 100.0, 2500.0, "", 9.0, 9e4, 2400)],
            [("mpi", "dense", 2, 100.0, 3100.0, 2600.0, 1100.0, 6e6, 2400), ("mpi", "scape99", 2, 100.0, 2450.0, 2460.0, 8.0, 9e4, 2400)]]
    files = [write(tmp_path / f"s{i}.csv", r, extra) for i, r in enumerate(runs)]
    table = tables.scaling_markdown(tables.efficiency(tables.cells(tables.read_rows(files))), 2)
    assert "## Strong scaling (2 runs)" in table
    # median measured 3050 and 2475; the one prediction each against those medians
    assert "| 2 | dense | 3050.0 [3000.0, 3100.0] | 2600.0 (-14.8%) | 1050.0 | – | 1.00 |" in table
    assert "| 2 | scape99 | 2475.0 [2450.0, 2500.0] | 2460.0 (-0.6%) | 8.5 | – | 1.23 |" in table


def test_command_writes_tables_and_figures(tmp_path, capsys):
    steps = bench_runs(tmp_path)
    assert main(["--steps", *steps, "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "netlab-steps.png").stat().st_size > 1000
    assert "## Measured steps (3 runs)" in (tmp_path / "out" / "netlab.md").read_text()
    assert "mpi, 100 Mbit/s, 2 nodes" in capsys.readouterr().out


def test_command_rejects_missing_and_foreign_files(tmp_path, capsys):
    assert main(["--steps", str(tmp_path / "absent.csv"), "--out", str(tmp_path)]) == 2
    assert "absent.csv: no such file" in capsys.readouterr().err
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("a,b\n1,2\n")
    assert main(["--steps", str(foreign), "--out", str(tmp_path)]) == 2
    assert "not a steps.csv of the netlab" in capsys.readouterr().err
    assert main(["--out", str(tmp_path)]) == 2


def test_the_driver_runs_the_tables_without_root(tmp_path):
    steps = bench_runs(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the driver sets its own
    done = subprocess.run([str(REPO / "scripts" / "netlab"), "tables", "--steps", *steps, "--out", str(tmp_path / "o"),
                           "--no-figures"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "| adams | 1650.0 [1600.0, 1700.0] | 1500.0 (-9.1%) | 1600.0 | 1,000 | 1.00 |" in done.stdout
    assert (tmp_path / "o" / "netlab.md").read_text() == done.stdout
    assert not (tmp_path / "o" / "netlab-steps.png").exists()
