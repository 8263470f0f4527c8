"""The Pareto front, seed averaging and tokens-to-target of analysis/pareto.py, on hand-made rows
(no scape binary needed), and the report hook on real run files when the binary is there."""

import csv
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from analysis.pareto import collect_points, pareto_front, tokens_to_target
from conftest import TINY_GPT, run_scape

NAN = math.nan


def test_front_keeps_exactly_the_non_dominated_points():
    xs = [1.0, 2.0, 3.0, 2.0, 5.0, 1.0, NAN]
    ys = [5.0, 3.0, 3.0, 4.0, 1.0, 6.0, 0.0]
    # (3, 3) is dominated by (2, 3); (2, 4) by (2, 3); (1, 6) by (1, 5); NaN never counts.
    assert pareto_front(xs, ys) == [0, 1, 4]


def test_front_keeps_ties_and_handles_one_point():
    assert pareto_front([1.0, 1.0], [2.0, 2.0]) == [0, 1]
    assert pareto_front([3.0], [1.0]) == [0]
    assert pareto_front([], []) == []


def fake_run(name, opt_type, seed, val, steps, status="completed", batch=2, block=16, workers=4):
    config = {"seed": seed, "workers": workers, "model": {"type": "gpt", "block_size": block},
              "data": {"batch_size": batch}, "optimizer": {"type": opt_type}}
    return SimpleNamespace(path=Path(name), status=status, config=config, optimizer_type=opt_type,
                           val_loss=np.array(val), eval_step=np.array(steps))


def fake_row(run, bytes_per_step):
    val = run.val_loss[np.isfinite(run.val_loss)]
    return SimpleNamespace(run=run, bytes_per_step=bytes_per_step, final_val=float(val[-1]) if val.size else NAN,
                           best_val=float(val.min()) if val.size else NAN, final_train=NAN)


def flat(run):
    return {"seed": run.config["seed"], "optimizer.type": run.optimizer_type}


def test_points_average_seeds_and_mark_the_front():
    rows = [fake_row(fake_run("a1", "scape", 1, [3.0, 2.0], [5, 10]), 100.0),
            fake_row(fake_run("a2", "scape", 2, [3.0, 2.4], [5, 10]), 110.0),
            fake_row(fake_run("b1", "adamw", 1, [2.5, 1.8], [5, 10]), 1000.0),
            fake_row(fake_run("c1", "randk_ef", 1, [3.5, 2.9], [5, 10]), 300.0),
            fake_row(fake_run("d1", "topk_ef", 1, [9.0], [5], status="diverged"), 50.0)]
    points, target, left_out = collect_points(rows, config_of=flat)
    by_type = {p.optimizer_type: p for p in points}
    assert set(by_type) == {"scape", "adamw", "randk_ef"}
    scape = by_type["scape"]
    assert scape.bytes_per_step == pytest.approx(105.0)
    assert scape.loss == pytest.approx(2.2) and scape.loss_min == 2.0 and scape.loss_max == 2.4
    assert scape.files == ["a1", "a2"] and scape.label == "scape"
    assert [p.on_front for p in points] == [True, False, True]  # sorted by bytes: scape, randk, adamw
    assert left_out == ["d1 (diverged)"]
    # The loosest target every point reaches: the largest mean best validation loss (randk's 2.9).
    assert target == pytest.approx(2.9)
    # Every run reaches 2.9 at its step-10 evaluation; 10 steps * 4 workers * 2 sequences * 16 tokens.
    assert scape.tokens_to_target == pytest.approx(1280.0)
    assert by_type["adamw"].tokens_to_target == pytest.approx(640.0)  # 2.5 <= 2.9 already at step 5


def test_labels_name_the_type_and_what_varies_within_it():
    rows = [fake_row(fake_run(f"s{i}", "scape", 1, [3.0], [5]), 10.0 * i) for i in (1, 2)]
    rows.append(fake_row(fake_run("d", "adams", 1, [2.0], [5]), 100.0))
    sparsity = {"s1": 0.9, "s2": 0.99}

    def config(run):
        out = {"seed": 1, "optimizer.type": run.optimizer_type}
        if run.optimizer_type == "scape":
            out["optimizer.sparsity"] = sparsity[run.path.name]
        return out

    points, _, _ = collect_points(rows, config_of=config)
    assert [p.label for p in points] == ["scape, sparsity=0.9", "scape, sparsity=0.99", "adams"]


def test_each_method_is_compared_at_its_best_rate_and_a_rate_with_a_failed_seed_is_never_chosen():
    # SCAPE at three rates: 0.03 has the lowest loss on the seed that completed but its other seed
    # diverged, so 0.01 (mean 2.1) beats 0.003 (mean 2.5). AdamS at one rate. Random-k's only rate
    # lost a seed: it has no rate to be compared at.
    runs = {
        ("s3a", "scape", 0.003, 1): [3.0, 2.4], ("s3b", "scape", 0.003, 2): [3.0, 2.6],
        ("s1a", "scape", 0.01, 1): [3.0, 2.0], ("s1b", "scape", 0.01, 2): [3.0, 2.2],
        ("s30a", "scape", 0.03, 1): [3.0, 1.5], ("s30b", "scape", 0.03, 2): None,
        ("da", "adams", 0.001, 1): [2.5, 1.9], ("db", "adams", 0.001, 2): [2.5, 2.1],
        ("ra", "randk_ef", 0.01, 1): [3.0, 1.0], ("rb", "randk_ef", 0.01, 2): None,
    }
    bytes_of = {"scape": 100.0, "adams": 1000.0, "randk_ef": 50.0}
    rows, lr_of = [], {}
    for (name, kind, lr, seed), val in runs.items():
        run = fake_run(name, kind, seed, val or [9.0], [5, 10][:len(val or [9.0])],
                       status="completed" if val else "diverged")
        lr_of[name] = lr
        rows.append(fake_row(run, bytes_of[kind]))

    def config(run):
        return {"seed": run.config["seed"], "optimizer.type": run.optimizer_type, "optimizer.lr": lr_of[run.path.name]}

    points, target, left_out = collect_points(rows, config_of=config)
    chosen = {p.optimizer_type: p for p in points if p.best_lr}
    assert set(chosen) == {"scape", "adams"}
    assert chosen["scape"].lr == 0.01 and chosen["scape"].loss == pytest.approx(2.1)
    assert chosen["scape"].lrs_tried == [0.003, 0.01, 0.03]
    assert not chosen["scape"].at_edge and not chosen["adams"].at_edge  # 0.01 is inside; one rate has no edge
    assert [p.seeds_failed for p in points if p.optimizer_type == "scape" and p.lr == 0.03] == [1]
    assert chosen["adams"].lr == 0.001
    # Random-k's point exists (one completed seed) but is not compared: not on the front although
    # it has the fewest bytes and the lowest loss.
    randk = [p for p in points if p.optimizer_type == "randk_ef"]
    assert len(randk) == 1 and not randk[0].best_lr and not randk[0].on_front
    assert randk[0].lrs_tried == [0.01]
    assert chosen["scape"].on_front and chosen["adams"].on_front
    assert not any(p.on_front for p in points if not p.best_lr)
    # The default target: the reference's (dense AdamS) worst final loss over seeds, 2.1, + 0.05.
    assert target == pytest.approx(2.15)
    # Without a reference, the loosest every compared method reaches: SCAPE's mean best 2.1 (AdamS
    # 2.0); random-k, not compared, does not loosen it.
    assert collect_points(rows, config_of=config, reference=None)[1] == pytest.approx(2.1)
    assert sorted(left_out) == ["rb (diverged)", "s30b (diverged)"]
    # Labels name the method, not the rate.
    assert {p.label for p in points if p.optimizer_type == "scape"} == {"scape"}


def test_tokens_to_target_is_nan_when_never_reached_or_not_a_gpt():
    run = fake_run("x", "scape", 1, [3.0, 2.5], [5, 10])
    assert tokens_to_target(run, 2.0) != tokens_to_target(run, 2.0)  # NaN
    assert tokens_to_target(run, 2.5) == 10 * 4 * 2 * 16
    run.config["model"]["type"] = "quadratic"
    assert math.isnan(tokens_to_target(run, 3.0))


def test_report_writes_the_pareto_figure_and_table(scape, tmp_path):
    """Two optimizers at two seeds on the tiny GPT: pareto.csv holds one point per setting."""
    from analysis.report import write_report

    runs = tmp_path / "runs"
    runs.mkdir()
    for seed in (1, 2):
        cfg = dict(TINY_GPT, seed=seed)
        run_scape(scape, cfg, runs / f"adams-{seed}.h5", "optimizer.type=adams")
        run_scape(scape, cfg, runs / f"randk-{seed}.h5", "optimizer.type=randk_ef", "optimizer.sparsity=0.9")
    out = tmp_path / "out"
    _, text = write_report([runs], out)
    assert (out / "pareto.png").stat().st_size > 0
    with open(out / "pareto.csv", encoding="utf-8") as f:
        points = list(csv.DictReader(f))
    assert sorted(p["type"] for p in points) == ["adams", "randk_ef"]
    assert all(p["seeds"] == "2" and p["best_lr"] == "1" and p["seeds_failed"] == "0" for p in points)
    # Random-k at density 0.1 sends a tenth of dense AdamS's all-reduce; the cheapest point is
    # always on the front.
    bytes_of = {p["type"]: float(p["bytes_per_step"]) for p in points}
    assert bytes_of["randk_ef"] < bytes_of["adams"] / 5
    cheapest = min(points, key=lambda p: float(p["bytes_per_step"]))
    assert cheapest["on_front"] == "1"
    assert "## Equal-bytes comparison (Pareto front)" in text


def test_a_best_rate_at_the_end_of_the_search_is_flagged():
    rows, lr_of = [], {}
    for name, lr, final in (("a", 0.001, 2.0), ("b", 0.003, 2.3), ("c", 0.01, 2.6)):
        rows.append(fake_row(fake_run(name, "adamw", 1, [3.0, final], [5, 10]), 1000.0))
        lr_of[name] = lr
    rows.append(fake_row(fake_run("s", "scape", 1, [3.0, 2.5], [5, 10]), 100.0))
    lr_of["s"] = 0.01

    def config(run):
        return {"seed": 1, "optimizer.type": run.optimizer_type, "optimizer.lr": lr_of[run.path.name]}

    points, _, _ = collect_points(rows, config_of=config)
    best = [p for p in points if p.best_lr]
    assert [(p.optimizer_type, p.lr, p.at_edge) for p in best] == [("scape", 0.01, False), ("adamw", 0.001, True)]


def test_a_finite_blow_up_counts_as_a_failed_seed():
    # 1-bit Adam's seed 2 ends at 1e15, finite, so the run says "completed": its loss rose above
    # the 5.5 it started from, so its rate is not eligible and the other rate is chosen.
    rows, lr_of = [], {}
    for name, lr, seed, final in (("a1", 0.003, 1, 3.3), ("a2", 0.003, 2, 1e15), ("b1", 0.001, 1, 3.5),
                                  ("b2", 0.001, 2, 3.6)):
        row = fake_row(fake_run(name, "onebit_adam", seed, [4.0, final], [5, 10]), 100.0)
        row.first_train = 5.5
        rows.append(row)
        lr_of[name] = lr
    rows.append(fake_row(fake_run("d", "adams", 1, [3.0, 2.0], [5, 10]), 1000.0))
    lr_of["d"] = 0.001

    def config(run):
        return {"seed": run.config["seed"], "optimizer.type": run.optimizer_type, "optimizer.lr": lr_of[run.path.name]}

    points, _, left_out = collect_points(rows, config_of=config)
    best = {p.optimizer_type: p for p in points if p.best_lr}
    assert best["onebit_adam"].lr == 0.001 and best["onebit_adam"].loss == pytest.approx(3.55)
    # A rate whose every seed failed has no point but was tried.
    rows.append(fake_row(fake_run("c1", "onebit_adam", 1, [9.0], [5], status="diverged"), 100.0))
    lr_of["c1"] = 0.01
    points, _, left_out = collect_points(rows, config_of=config)
    assert best["onebit_adam"].lrs_tried == [0.001, 0.003]
    best = {p.optimizer_type: p for p in points if p.best_lr}
    assert best["onebit_adam"].lrs_tried == [0.001, 0.003, 0.01] and best["onebit_adam"].lr == 0.001
    left_out.remove("c1 (diverged)")
    blown = [p for p in points if p.optimizer_type == "onebit_adam" and p.lr == 0.003][0]
    assert blown.seeds_failed == 1 and blown.files == ["a1"]
    assert left_out == ["a2 (did not train: final loss 1e+15 above its first 5.5)"]


def test_a_rate_searched_on_one_seed_is_judged_on_that_seed_as_in_the_seed_tables():
    # A pruned grid: 0.003 ran on seeds 1-3 (2.00 / 2.60 / 2.60, mean 2.40); 0.01 on seed 1 only
    # (2.10). Each rate's own mean would pick 0.01 (2.10 < 2.40); on seed 1, the seed both ran,
    # 0.003 wins (2.00 < 2.10), as stats.choose_best_lr decides.
    finals = {("a1", 0.003, 1): 2.0, ("a2", 0.003, 2): 2.6, ("a3", 0.003, 3): 2.6, ("b1", 0.01, 1): 2.1}
    rows, lr_of = [], {}
    for (name, lr, seed), loss in finals.items():
        rows.append(fake_row(fake_run(name, "scape", seed, [3.0, loss], [5, 10]), 100.0))
        lr_of[name] = lr

    def config(run):
        return {"seed": run.config["seed"], "optimizer.type": "scape", "optimizer.lr": lr_of[run.path.name]}

    points, _, _ = collect_points(rows, config_of=config)
    chosen = [p for p in points if p.best_lr]
    assert len(chosen) == 1 and chosen[0].lr == 0.003 and chosen[0].loss == pytest.approx(2.4)
