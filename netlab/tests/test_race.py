"""The race's plan and analysis (netlab/race_plan.py, netlab/race.py; `scripts/netlab race`):
the steps that fit a budget, the schedule over them, time to target on hand-built curves, the t
interval over seeds against a hand computation, the CSV round trip, and bad input named. No torch,
no root: the nodes' side (netlab/race_node.py) runs in the smoke run docs/NETLAB.md describes."""
import csv
import hashlib
import math
import subprocess

import pytest

from conftest import REPO
from netlab import race, race_driver, race_plan
from netlab.race_plan import RaceInputError


def test_steps_in_budget_from_a_measured_step():
    assert race_plan.steps_in_budget(173.0, 0.0974) == 1776  # floor(1776.18)
    assert race_plan.steps_in_budget(10.0, 0.1) == 100  # an exact fit is not lost to rounding
    assert race_plan.steps_in_budget(0.05, 0.1) == 1  # slower than the budget: one step, one evaluation
    # A local-SGD arm's count is whole sync rounds, so its last evaluation (read at B) is on a sync:
    # 1776 steps fit, H = 50 takes 1750; its evaluations then all fall on syncs.
    assert race_plan.steps_in_budget(173.0, 0.0974, every=50) == 1750
    assert race_plan.steps_in_budget(173.0, 0.0974, every=10) == 1770
    assert race_plan.steps_in_budget(1.0, 0.1, every=50) == 50  # slower than one round: one round
    assert all(s % 50 == 0 for s in race_plan.eval_steps(1750, 20, every=50))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(RaceInputError, match="step time"):
            race_plan.steps_in_budget(10.0, bad)
    with pytest.raises(RaceInputError, match="budget"):
        race_plan.steps_in_budget(0.0, 0.1)


def test_warmup_and_cosine_over_the_arms_own_count():
    assert race_plan.warmup_steps(1776) == 89 and race_plan.warmup_steps(10) == 1
    total, warmup = 105, 5
    assert race_plan.lr_factor(1, total, warmup) == pytest.approx(0.2)
    assert race_plan.lr_factor(5, total, warmup) == pytest.approx(1.0)
    assert race_plan.lr_factor(55, total, warmup) == pytest.approx(0.55)  # half-way down the cosine
    assert race_plan.lr_factor(105, total, warmup) == pytest.approx(0.1)
    after = [race_plan.lr_factor(s, total, warmup) for s in range(warmup, total + 1)]
    assert all(a >= b for a, b in zip(after, after[1:]))
    # the same shape stretched over twice the steps: a faster arm's schedule ends where the slow one's does
    assert race_plan.lr_factor(210, 210, 10) == pytest.approx(race_plan.lr_factor(105, 105, 5))


def test_eval_steps_fall_on_syncs_and_end_at_the_last_step():
    assert race_plan.eval_steps(100, 4) == [25, 50, 75, 100]
    assert race_plan.eval_steps(95, 4, every=10) == [30, 50, 80, 95]
    assert race_plan.eval_steps(3, 10) == [1, 2, 3]
    with pytest.raises(RaceInputError, match="eval-points"):
        race_plan.eval_steps(10, 0)


def curve(arm, seed, lr, losses, step_s=1.0, every=10, rate=100.0, budget=40.0, bytes_a_step=1000):
    return [{"rate_mbit": rate, "arm": arm, "seed": seed, "lr": lr, "planned_steps": every * len(losses),
             "budget_s": budget, "step": every * (i + 1), "wall_s": step_s * every * (i + 1), "val_loss": loss,
             "bytes_sent": bytes_a_step * every * (i + 1)} for i, loss in enumerate(losses)]


def write(path, rows, columns=race_plan.COLUMNS):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return str(path)


def test_time_to_target_is_not_reached_after_b():
    """An arm whose run overshot B (1.25 s a step, B = 40 s: evaluations at 12.5, 25, 37.5, 50 s)
    and reaches the target only at 50 s: read at B (2.10 at 37.5 s), not reached."""
    over = curve("scape-99", 1, 3e-3, [3.0, 2.5, 2.1, 2.01], step_s=1.25)
    assert race.at_budget(over)["wall_s"] == 37.5
    assert race.time_to_target(over, 2.02) is None
    assert race.time_to_target(over, 2.2)["wall_s"] == 37.5  # within B it is found as before


def test_a_run_without_loss_at_b_is_named_not_averaged(tmp_path):
    """A diverged seed at the chosen rate (val_loss nan), or a run whose first evaluation came
    after B, is a RaceInputError naming it, not a traceback out of statistics or a NaN target;
    in the grid such a run is just not chosen."""
    rows = race_rows()
    for r in rows:
        if r["arm"] == "ddp-adamw" and r["seed"] == 2 and r["step"] == 40:
            r["val_loss"] = float("nan")
    with pytest.raises(RaceInputError, match=r"^ddp-adamw at 100 Mbit/s, lr 0\.001, seed 2: validation loss nan at "
                                             r"step 40 \(a diverged run\)"):
        race.tables(rows, 0.02)
    assert race.main([write(tmp_path / "nan.csv", rows)]) == 2
    late = [dict(r, budget_s=4.0) if (r["arm"], r["seed"]) == ("scape-99", 2) else r for r in race_rows()]
    with pytest.raises(RaceInputError, match=r"^scape-99 at 100 Mbit/s, lr 0\.003, seed 2: no evaluation within "
                                             r"B \(its first came at 5 s, B = 4 s\)"):
        race.tables(late, 0.02)
    grid = [dict(r, val_loss=float("nan")) if (r["arm"], r["lr"]) == ("scape-99", 3e-3) and r["seed"] == 1 else r
            for r in race_rows()]
    assert race_plan.best_lr(grid, 100.0, "scape-99") == 1e-3  # the diverged rate is not chosen


def test_time_to_target_is_the_first_evaluation_at_or_below_it():
    c = curve("scape-99", 1, 3e-3, [3.0, 2.5, 2.1, 1.9])  # walls 10, 20, 30, 40
    assert race.time_to_target(c, 2.1)["wall_s"] == 30.0  # equal counts as reached
    hit = race.time_to_target(c, 2.0)
    assert (hit["wall_s"], hit["step"], hit["bytes_sent"]) == (40.0, 40, 40_000)  # not interpolated to 35
    assert race.time_to_target(c, 1.8) is None


def test_t_interval_against_a_hand_computation():
    mean, low, high = race.t_interval([30.0, 40.0, 44.0])
    sd = math.sqrt((8 ** 2 + 2 ** 2 + 6 ** 2) / 2)  # 7.2111
    half = 4.303 * sd / math.sqrt(3)  # t(0.975, 2) = 4.303: 17.915
    assert mean == 38.0 and low == pytest.approx(38 - half) and high == pytest.approx(38 + half)
    assert low == pytest.approx(20.085, abs=1e-3)
    assert race.t_interval([5.0]) == (5.0, None, None)


def race_rows():
    """DDP AdamW (grid on seed 1: 1e-3 wins), SCAPE 99% faster and reaching, PowerSGD whose
    seed 2 never reaches. DDP's losses at B: 2.00, 2.04, 2.02 -> target 2.02 + 0.02 = 2.04."""
    rows = curve("ddp-adamw", 1, 5e-4, [3.0, 2.6, 2.3, 2.2]) + curve("ddp-adamw", 1, 2e-3, [3.0, 2.7, 2.4, 2.3])
    rows += curve("ddp-adamw", 1, 1e-3, [3.0, 2.5, 2.1, 2.00]) + curve("ddp-adamw", 2, 1e-3, [3.0, 2.5, 2.2, 2.04])
    rows += curve("ddp-adamw", 3, 1e-3, [3.0, 2.5, 2.2, 2.02])  # reaches 2.04 at 40, 40, 40 s
    # SCAPE 99%: 0.5 s a step, twice the steps; grid 1e-3 loses to 3e-3 on seed 1
    rows += curve("scape-99", 1, 1e-3, [3.0, 2.8, 2.6, 2.5, 2.4, 2.3, 2.2, 2.1], step_s=0.5, bytes_a_step=10)
    for seed, losses in ((1, [3.0, 2.6, 2.3, 2.1, 2.0, 1.98, 1.96, 1.95]), (2, [3.0, 2.5, 2.2, 2.1, 2.05, 2.04, 2.0, 1.99]),
                         (3, [3.0, 2.6, 2.4, 2.2, 2.1, 2.03, 2.0, 1.97])):
        rows += curve("scape-99", seed, 3e-3, losses, step_s=0.5, bytes_a_step=10)  # reach at 25, 30, 30 s
    for seed, losses in ((1, [3.0, 2.5, 2.03, 2.0]), (2, [3.0, 2.6, 2.3, 2.2])):
        rows += curve("ddp-powersgd-r1", seed, 1e-3, losses, step_s=1.25)  # ends at 50 s, 1.25 B
    return rows


def test_tables_per_arm_against_hand_values():
    target, lines = race.tables(race_rows(), 0.02)[100.0]
    assert target == pytest.approx(2.04)
    ddp, scape, powersgd = lines
    assert ddp["arm"] == "ddp-adamw" and ddp["lr"] == 1e-3 and ddp["seeds"] == [1, 2, 3]
    assert ddp["time"] == (40.0, 40.0, 40.0)  # every seed at its last evaluation, no spread
    assert scape["lr"] == 3e-3  # the grid's winner on seed 1; the 1e-3 run is not a seed
    mean, low, high = scape["time"]
    half = 4.303 * math.sqrt(((25 - 85 / 3) ** 2 + 2 * (30 - 85 / 3) ** 2) / 2) / math.sqrt(3)
    assert mean == pytest.approx(85 / 3) and (low, high) == pytest.approx((85 / 3 - half, 85 / 3 + half))
    assert scape["ratio"] == pytest.approx(40 / (85 / 3))
    assert scape["steps_to"] == pytest.approx(170 / 3) and scape["bytes_to"] == pytest.approx(10 * 170 / 3)
    assert scape["loss_at_b"][0] == pytest.approx((1.95 + 1.99 + 1.97) / 3)
    assert scape["s_per_step"] == pytest.approx(0.5) and scape["steps"] == 80
    assert scape["end_over_b"] == pytest.approx(1.0)
    assert powersgd["time"] is None and powersgd["reached"] == 1 and powersgd["ratio"] is None
    # PowerSGD overshot B (evaluations at 12.5, 25, 37.5 and 50 s, B = 40 s): read at 37.5 s,
    # 2.03 and 2.3, not at its end (2.0 and 2.2).
    assert powersgd["loss_at_b"][0] == pytest.approx((2.03 + 2.3) / 2)
    # Paired by seed against DDP's 2.00, 2.04, 2.02: SCAPE -0.05, -0.05, -0.05 (no spread);
    # PowerSGD seeds 1 and 2 only: +0.03 and +0.26, mean 0.145, sd 0.16263, half 12.706 sd / sqrt 2.
    assert ddp["delta_at_b"] == (0.0, 0.0, 0.0)
    assert scape["delta_at_b"] == pytest.approx((-0.05, -0.05, -0.05))
    half = 12.706 * math.sqrt(2 * 0.115 ** 2) / math.sqrt(2)
    assert half == pytest.approx(1.4612, abs=1e-4)
    assert powersgd["delta_at_b"] == pytest.approx((0.145, 0.145 - half, 0.145 + half))
    table = race.markdown(race.tables(race_rows(), 0.02), 0.02)
    assert "| ddp-powersgd-r1 | 0.001 | 2 | 40 | 1.2500 | 1.25 | 2.1650 [" in table
    assert "| +0.1450 [-1.3162, +1.6062] | not reached (1 of 2 seeds)" in table
    assert "| scape-99 | 0.003 | 3 | 80 | 0.5000 | 1.00 | 1.9700 [" in table
    assert "| -0.0500 [-0.0500, -0.0500] | 28.3 [" in table
    assert "| ddp-adamw | 0.001 | 3 | 150 " not in table and "| 2.0200 [1.9703, 2.0697] | – | 40.0 [40.0, 40.0] |" in table


def test_rates_tried_are_listed_with_the_chosen_one_in_bold():
    table = race.markdown(race.tables(race_rows(), 0.02), 0.02, race_rows())
    assert "| ddp-adamw | 0.0005: 2.2000, **0.001: 2.0000**, 0.002: 2.3000 |" in table
    assert "| scape-99 | 0.001: 2.1000, **0.003: 1.9500** |" in table
    assert "| ddp-powersgd-r1 | **0.001: 2.0300** |" in table  # read at B (37.5 s), not at its end


def test_widened_steps_past_the_edge_only():
    assert race_plan.widened([5e-4, 1e-3, 2e-3], 2e-3) == 4e-3
    assert race_plan.widened([5e-4, 1e-3, 2e-3], 5e-4) == 2.5e-4
    assert race_plan.widened([5e-4, 1e-3, 2e-3], 1e-3) is None
    assert race_plan.widened([5e-4, 1e-3, 2e-3, 4e-3], 2e-3) is None  # inside once widened


def test_grid_widens_while_the_best_is_at_its_edge(monkeypatch, capsys):
    """A loss that falls with the rate up to 8e-3: the grid 5e-4, 1e-3, 2e-3 widens to 4e-3 and
    8e-3 (two extensions), then stops, still at the edge, and says so; with the best loss at
    2.5e-3 it tries 4e-3, finds 2e-3 better and inside, and stops."""
    def fake_train(args, ctx, arm, lr, seed, steps, optimum):
        loss = abs(lr - optimum) * 100 + 2.0
        return curve(arm, seed, lr, [3.0, loss])
    args = race_driver.arguments(["--rate", "100mbit", "--ddp-steps", "10"])
    ctx = {"rate_mbit": 100.0}
    monkeypatch.setattr(race_driver, "train", lambda *a: fake_train(*a, optimum=8e-3))
    assert race_driver.grid(args, ctx, "ddp-adamw", 20) == 8e-3
    err = capsys.readouterr().err
    assert "trying 0.004" in err and "trying 0.008" in err and "warning: ddp-adamw's best rate 0.008" in err
    monkeypatch.setattr(race_driver, "train", lambda *a: fake_train(*a, optimum=2.5e-3))
    assert race_driver.grid(args, ctx, "ddp-adamw", 20) == 2e-3
    err = capsys.readouterr().err
    assert "trying 0.004" in err and "trying 0.008" not in err and "warning" not in err
    args = race_driver.arguments(["--rate", "100mbit", "--ddp-steps", "10", "--grid-extensions", "0"])
    assert race_driver.grid(args, ctx, "ddp-adamw", 20) == 2e-3 and "warning" in capsys.readouterr().err


def test_csv_round_trip(tmp_path):
    path = tmp_path / "race.csv"
    rows = race_rows()[:6]
    race_plan.append(path, rows[:3])
    race_plan.append(path, rows[3:])  # a second append adds no second header
    with open(path) as f:
        assert f.readline().strip() == ",".join(race_plan.COLUMNS)
    assert race_plan.read(path) == rows


def run_tables(*args):
    return subprocess.run([str(REPO / "scripts" / "netlab"), "race", "tables", *args], capture_output=True,
                          text=True, cwd=REPO)


def test_command_writes_table_and_figure(tmp_path):
    done = run_tables(write(tmp_path / "race.csv", race_rows()), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "target = DDP AdamW's loss at B + 0.02 = 2.0400" in done.stdout
    assert (tmp_path / "out" / "race.png").stat().st_size > 10_000
    assert (tmp_path / "out" / "race.md").read_text() in done.stdout


def test_a_missing_column_is_named(tmp_path):
    path = write(tmp_path / "short.csv", race_rows(), [c for c in race_plan.COLUMNS if c != "val_loss"])
    done = run_tables(path)
    assert done.returncode == 2 and "short.csv" in done.stderr and "val_loss" in done.stderr


def test_an_unknown_arm_is_named(tmp_path):
    rows = race_rows()
    rows[3] = dict(rows[3], arm="ddp-lamb")
    done = run_tables(write(tmp_path / "odd.csv", rows))
    assert done.returncode == 2 and "odd.csv:5" in done.stderr and "ddp-lamb" in done.stderr


def test_no_baseline_and_bad_numbers_are_named(tmp_path):
    no_ddp = [r for r in race_rows() if r["arm"] != "ddp-adamw"]
    done = run_tables(write(tmp_path / "noddp.csv", no_ddp))
    assert done.returncode == 2 and "noddp.csv" in done.stderr and "no ddp-adamw rows" in done.stderr
    rows = race_rows()
    rows[0] = dict(rows[0], wall_s="fast")
    done = run_tables(write(tmp_path / "text.csv", rows))
    assert done.returncode == 2 and "text.csv:2: column wall_s" in done.stderr


def test_driver_arguments_are_checked_before_anything_runs():
    with pytest.raises(SystemExit) as exit_:
        race_driver.arguments(["--rate", "100mbit", "--ddp-steps", "10", "--arms", "scape-99,ddp-lamb"])
    assert exit_.value.code == 2
    args = race_driver.arguments(["--rate", "100mbit", "--ddp-steps", "10", "--arms", "scape-99"])
    assert args.arms == ["ddp-adamw", "scape-99"] and args.seeds == [1, 2, 3]
    assert race_driver.rate_in_mbit("100mbit") == 100 and race_driver.rate_in_mbit("10gbit") == 10_000
    with pytest.raises(RaceInputError, match="--rate"):
        race_driver.rate_in_mbit("fast")
    done = subprocess.run([str(REPO / "scripts" / "netlab"), "race", "--rate", "9zbit", "--ddp-steps", "5"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "9zbit" in done.stderr


def test_corpus_is_the_repositorys_prose_and_its_digest_follows_it(tmp_path):
    (tmp_path / "docs").mkdir()
    for name, text in (("README.md", b"readme"), ("docs/b.md", b"bee"), ("docs/a.md", b"ay"), ("docs/c.txt", b"no")):
        (tmp_path / name).write_bytes(text)
    assert [p.name for p in race_plan.corpus_paths(tmp_path)] == ["README.md", "a.md", "b.md"]
    before = race_plan.corpus_digest(tmp_path)
    assert before == hashlib.sha256(b"readmeaybee").hexdigest()
    (tmp_path / "docs" / "a.md").write_bytes(b"AY")
    assert race_plan.corpus_digest(tmp_path) != before


def test_the_grid_picks_the_rate_with_the_lowest_loss_at_b():
    """A run whose planned count overshot B is judged at B, as the table reads it: 2e-3 ends
    lowest (2.0 at 30 s) but stands at 2.6 at B = 20 s, where 1e-3 stands at 2.5."""
    rows = curve("diloco-h10", 1, 2e-3, [3.0, 2.6, 2.0], budget=20.0) + curve("diloco-h10", 1, 1e-3, [3.0, 2.5],
                                                                                budget=20.0)
    assert race_plan.best_lr(rows, 100.0, "diloco-h10") == 1e-3
    assert race_plan.at_budget(rows[:3])["val_loss"] == 2.6


def test_two_runs_of_one_seed_and_rate_are_refused_naming_them():
    rows = curve("diloco-h10", 2, 5e-4, [3.0, 2.6]) + curve("diloco-h10", 2, 5e-4, [3.0, 2.5])
    with pytest.raises(race_plan.RaceInputError, match=r"diloco-h10 at 100 Mbit/s, seed 2, lr 0.0005: two runs"):
        race_plan.runs(rows)


def test_a_run_without_a_budget_is_read_at_its_end():
    """DDP AdamW's grid runs before B exists (race_node writes budget_s 0): its runs are judged at
    their end, not at their first evaluation."""
    rows = curve("ddp-adamw", 1, 1e-3, [3.0, 2.4], budget=0.0) + curve("ddp-adamw", 1, 2e-3, [2.9, 2.6], budget=0.0)
    assert race_plan.best_lr(rows, 100.0, "ddp-adamw") == 1e-3
    assert race_plan.at_budget(curve("adams", 1, 1e-3, [3.0, 2.4], budget=float("nan")))["val_loss"] == 2.4


def test_the_lowest_arm_and_the_others_paired_against_it():
    # SCAPE ends lowest (1.95, 1.99, 1.97 at B); DDP AdamW (2.00, 2.04, 2.02) is 0.05 above it on
    # every seed; PowerSGD (2.03, 2.3 at B, seeds 1 and 2) +0.08 and +0.31, mean 0.195,
    # half 12.706 * 0.16263 / sqrt 2.
    target, lines = race.tables(race_rows(), 0.02)[100.0]
    ddp, scape, powersgd = lines
    assert scape["lowest"] and not ddp["lowest"] and scape["delta_to_lowest"] is None
    assert ddp["delta_to_lowest"] == pytest.approx((0.05, 0.05, 0.05))
    half = 12.706 * math.sqrt(2 * 0.115 ** 2) / math.sqrt(2)
    assert powersgd["delta_to_lowest"] == pytest.approx((0.195, 0.195 - half, 0.195 + half))
    line = race.ranking_line(lines)
    assert line.startswith("Lowest loss at B: **scape-99** (1.9700); each other arm's loss at B minus its")
    assert "ddp-adamw +0.0500 [+0.0500, +0.0500], ddp-powersgd-r1 +0.1950 [-1.2662, +1.6562]." in line
    assert line.endswith("Level with it (the interval holds 0): ddp-powersgd-r1.")
    assert line in race.markdown(race.tables(race_rows(), 0.02), 0.02)
    clear = [dict(a, delta_to_lowest=(0.3, 0.1, 0.5)) if a["arm"] == "ddp-powersgd-r1" else a for a in lines]
    assert race.ranking_line(clear).endswith("No other arm's interval holds 0: it wins the rate.")
    single = [dict(a, delta_to_lowest=(0.3, None, None)) if a["arm"] == "ddp-powersgd-r1" else a for a in lines]
    assert race.ranking_line(single).endswith("no winner is claimed: ddp-powersgd-r1.")
    # An interval wholly below 0 does not hold 0; an arm lower on the seeds they share (the arms
    # ran different seeds, so the lowest mean is not the lowest arm) means no winner.
    below = [dict(a, delta_to_lowest=(-0.02, -0.03, -0.01)) if a["arm"] == "ddp-powersgd-r1" else a for a in lines]
    line = race.ranking_line(below)
    assert "Level with it" not in line
    assert line.endswith("On the seeds they share, ddp-powersgd-r1 end(s) lower than it (the arms ran different "
                         "seeds, and its mean is over its own): no winner is claimed.")
