"""`scripts/netlab race --extend` (netlab/race_driver.py's extend_at): a race that already ran has
the grids whose best rate lies at their edge widened, at the plan's step counts and B, and the
other seeds rerun at a best rate that moved; with a fake trainer, no root, no torch."""
import json

import pytest

from netlab import race, race_driver, race_plan
from test_race import curve

DATE = "2026-01-01"


def fake_train(args, ctx, arm, lr, seed, steps, optimum):
    """A run whose final loss is least at `optimum`, appended to the CSV as the driver's train does."""
    rows = [dict(r, budget_s=ctx["budget"]) for r in curve(arm, seed, lr, [3.0, abs(lr - optimum) * 100 + 2.0])]
    race_plan.append(ctx["csv"], rows)
    return rows


def a_race(tmp_path):
    """DDP AdamW chose 1e-3, inside its grid; SparseLoCo chose 2e-3, the top of its grid."""
    rows = []
    for arm, chosen in (("ddp-adamw", 1e-3), ("sparseloco", 2e-3)):
        for lr, final in ((5e-4, 2.6), (1e-3, 2.5 if arm == "ddp-adamw" else 2.45), (2e-3, 2.55 if arm == "ddp-adamw" else 2.4)):
            rows += curve(arm, 1, lr, [3.0, final], budget=20.0)
        for seed in (2, 3):
            rows += curve(arm, seed, chosen, [3.0, 2.5], budget=20.0)
    return write_race(tmp_path, rows)


def write_race(tmp_path, rows):
    """The race's CSV of `rows` and its plan: B = 20 s, DDP AdamW at 1e-3, SparseLoCo at 2e-3."""
    csv_path = tmp_path / f"race-{DATE}-100mbit.csv"
    race_plan.append(csv_path, rows)
    plan = {"rate": "100mbit", "ddp_steps": 20, "budget_s": 20.0, "corpus_sha256": race_plan.corpus_digest(race_driver.ROOT),
            "settings": {"nodes": 2, "seeds": [1, 2, 3], "width": 16, "layers": 1, "batch": 2, "block": 8,
                         "eval_points": 2, "measure_steps": 5},
            "arms": {"ddp-adamw": {"steps": 20, "lr": 1e-3}, "sparseloco": {"step_s": 0.05, "steps": 20, "lr": 2e-3}}}
    (tmp_path / f"race-{DATE}-100mbit.plan.json").write_text(json.dumps(plan))
    return csv_path


def test_extend_widens_only_the_grids_at_their_edge_and_reruns_the_seeds(tmp_path, monkeypatch, capsys):
    csv_path = a_race(tmp_path)
    calls = []
    monkeypatch.setattr(race_driver.subprocess, "run", lambda *a, **k: None)  # the nodes' `up`
    monkeypatch.setattr(race_driver, "train", lambda *a: calls.append(a[2:6]) or fake_train(*a, optimum=4e-3))
    args = race_driver.arguments(["--rate", "100mbit", "--extend", "--out", str(tmp_path), "--date", DATE])
    assert race_driver.extend_at(args, "100mbit") == str(csv_path)
    # SparseLoCo tries 4e-3 (better), then 8e-3 (worse), then its seeds 2 and 3 at 4e-3; DDP nothing
    assert calls == [("sparseloco", 4e-3, 1, 20), ("sparseloco", 8e-3, 1, 20), ("sparseloco", 4e-3, 2, 20),
                     ("sparseloco", 4e-3, 3, 20)]
    assert "sparseloco's best rate 0.002 is at the edge" in capsys.readouterr().err
    plan = json.loads((tmp_path / f"race-{DATE}-100mbit.plan.json").read_text())
    assert plan["arms"]["sparseloco"]["lr"] == 4e-3 and plan["arms"]["ddp-adamw"]["lr"] == 1e-3
    assert plan["extended"]["sparseloco"] == {"rates_tried": [5e-4, 1e-3, 2e-3, 4e-3, 8e-3], "lr_before": 2e-3,
                                              "lr": 4e-3}
    rows = race_plan.read(csv_path)
    curves, lr = race.chosen_runs(rows, 100.0, "sparseloco", 1)
    assert lr == 4e-3 and sorted(curves) == [1, 2, 3]
    assert all(r["budget_s"] == 20.0 for r in rows)


def test_extend_refuses_a_missing_race_and_s(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        race_driver.arguments(["--rate", "100mbit", "--extend", "--ddp-steps", "5"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        race_driver.arguments(["--rate", "100mbit"])
    assert exit_.value.code == 2
    args = race_driver.arguments(["--rate", "100mbit", "--extend", "--out", str(tmp_path), "--date", DATE])
    with pytest.raises(SystemExit) as exit_:
        race_driver.extend_at(args, "100mbit")
    assert exit_.value.code == 2


@pytest.mark.parametrize("seeds_there", [False, True])
def test_extend_reruns_the_seeds_of_an_arm_whose_choice_the_rule_moved(tmp_path, monkeypatch, seeds_there):
    """A race picked under an earlier rule (the lowest final loss): SparseLoCo's plan holds 2e-3,
    whose run overshot B; at B 1e-3 is lower, inside the grid, so no rate is added and seeds 2
    and 3 run at 1e-3, unless they ran there already (a rate the race had chosen before)."""
    rows = [] if not seeds_there else [r for seed in (2, 3) for r in curve("sparseloco", seed, 1e-3, [3.0, 2.5],
                                                                             budget=20.0)]
    for arm, chosen in (("ddp-adamw", 1e-3), ("sparseloco", 2e-3)):
        for lr, losses in ((5e-4, [3.0, 2.6]), (1e-3, [3.0, 2.45]), (2e-3, [3.0, 2.5, 2.3])):
            rows += curve(arm, 1, lr, losses if arm == "sparseloco" else losses[:2], budget=20.0)
        for seed in (2, 3):
            rows += curve(arm, seed, chosen, [3.0, 2.5], budget=20.0)
    csv_path = write_race(tmp_path, rows)
    calls = []
    monkeypatch.setattr(race_driver.subprocess, "run", lambda *a, **k: None)
    monkeypatch.setattr(race_driver, "train", lambda *a: calls.append(a[2:6]) or fake_train(*a, optimum=1e-3))
    args = race_driver.arguments(["--rate", "100mbit", "--extend", "--out", str(tmp_path), "--date", DATE])
    race_driver.extend_at(args, "100mbit")
    assert calls == ([] if seeds_there else [("sparseloco", 1e-3, 2, 20), ("sparseloco", 1e-3, 3, 20)])
    plan = json.loads((tmp_path / f"race-{DATE}-100mbit.plan.json").read_text())
    assert plan["arms"]["sparseloco"]["lr"] == 1e-3 and plan["extended"]["sparseloco"]["lr_before"] == 2e-3
    curves, lr = race.chosen_runs(race_plan.read(csv_path), 100.0, "sparseloco", 1)
    assert lr == 1e-3 and sorted(curves) == [1, 2, 3]


def test_train_returns_its_rows_with_b_as_the_csv_holds_them(tmp_path, monkeypatch):
    """race_node writes budget_s 0 (it does not know B); train() appends the rows with B and
    returns them with B too, so that the driver's choice (best_lr, at B) sees what the CSV says."""
    def node_run(args, node_args):
        out = node_args[node_args.index("--out") + 1]
        race_plan.append(out, curve("sparseloco", 1, 4e-3, [3.0, 2.6, 2.2], budget=0.0))
    monkeypatch.setattr(race_driver, "on_nodes", node_run)
    args = race_driver.arguments(["--rate", "100mbit", "--ddp-steps", "20", "--out", str(tmp_path)])
    ctx = {"scratch": str(tmp_path), "rate_mbit": 100.0, "csv": str(tmp_path / "race.csv"), "budget": 20.0}
    rows = race_driver.train(args, ctx, "sparseloco", 4e-3, 1, 30)
    assert [r["budget_s"] for r in rows] == [20.0] * 3
    assert race_plan.at_budget(rows)["val_loss"] == 2.6  # walls 10, 20, 30: read at B = 20 s
    assert race_plan.read(tmp_path / "race.csv") == rows
