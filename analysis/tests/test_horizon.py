"""The horizon section (analysis/horizon.py) against hand-computed cases.

Synthetic run files at two horizons, 100 and 400 steps, of dense AdamS and SCAPE at sparsity 0.9
(one lr each, 3 seeds). Evaluations are evenly spaced: at 100 steps [3.0, 2.6, f + 0.04, f] at
steps 25, 50, 75, 100; at 400 steps [3.0, 2.6, 2.2, f] at steps 100, 200, 300, 400 for AdamS and
[3.0, 2.2, 2.0, f] for SCAPE, so every count below follows from the lists. SCAPE's files record a
mask density of 0.5 for its first 20 steps and 0.1 after (a density warm-up).
"""

import math

import h5py
import numpy as np
import pytest

from conftest import gpt_config, write_run_file

FINAL = {  # (steps, optimizer) -> {seed: final val loss}
    (100, "adams"): {1: 2.0, 2: 2.1, 3: 2.2},
    (100, "scape"): {1: 2.3, 2: 2.5, 3: 2.4},
    (400, "adams"): {1: 1.5, 2: 1.6, 3: 1.7},
    (400, "scape"): {1: 1.7, 2: 1.74, 3: 1.9},
}


def val_curve(steps, kind, final):
    if steps == 100:
        return [3.0, 2.6, final + 0.04, final]
    return [3.0, 2.6, 2.2, final] if kind == "adams" else [3.0, 2.2, 2.0, final]


@pytest.fixture(scope="module")
def horizon_dir(tmp_path_factory, scape):
    d = tmp_path_factory.mktemp("horizon")
    for (steps, kind), by_seed in FINAL.items():
        for seed, final in by_seed.items():
            config = gpt_config(kind, seed, 1e-3)
            config["steps"] = steps
            config["eval"] = {"interval": steps // 4, "batches": 1}
            path = write_run_file(d / f"{kind}-{steps}-{seed}.h5", config, val_loss=val_curve(steps, kind, final))
            if kind == "scape":
                with h5py.File(path, "a") as f:
                    f["metrics/mask_density"] = [0.5] * 20 + [0.1] * (steps - 20)
    return d


def problems_of(directory, **kwargs):
    from analysis.report import build_report, seed_problems

    return seed_problems(build_report([directory]), **kwargs)


def test_density_and_updates_per_coordinate():
    from analysis.horizon import density

    assert density({"optimizer.type": "adams"}) == 1.0
    assert density({"optimizer.type": "scape", "optimizer.sparsity": 0.99}) == pytest.approx(0.01)
    assert density({"optimizer.type": "topk_ef", "optimizer.sparsity": 0.9}) == pytest.approx(0.1)
    assert density({"optimizer.type": "powersgd", "optimizer.sparsity": 0.9}) == 1.0  # no sparsity of its own


def test_rows_pair_each_horizon_with_its_own_reference(horizon_dir):
    from analysis.horizon import rows_of, studies

    (study,) = studies(problems_of(horizon_dir))
    assert [p.arms[0].config["steps"] for p in study] == [100, 400]
    rows = {(r["arm"], r["steps"]): r for r in rows_of(study)}
    scape100, scape400 = rows[("SCAPE(adams) s=0.9", 100)], rows[("SCAPE(adams) s=0.9", 400)]
    # The recorded densities summed: 20 · 0.5 + 80 · 0.1 = 18 and 20 · 0.5 + 380 · 0.1 = 48, not
    # steps · 0.1 = 10 and 40; AdamS records none: its steps.
    assert scape100["updates"] == pytest.approx(18.0) and scape400["updates"] == pytest.approx(48.0)
    assert rows[("AdamS", 400)]["updates"] == 400 and rows[("AdamS", 400)]["reference"]
    # Paired differences: 100 steps 0.3, 0.4, 0.2; 400 steps 0.2, 0.14, 0.2.
    assert scape100["delta"].mean == pytest.approx(0.3) and scape100["delta"].n == 3
    assert scape400["delta"].mean == pytest.approx(0.54 / 3)
    assert scape400["delta"].std == pytest.approx(np.std([0.2, 0.14, 0.2], ddof=1))
    # Targets: the reference's worst final + 0.05. At 100 steps 2.25: AdamS reaches it at step 75
    # on every seed (mids 2.04, 2.14, 2.24); SCAPE never (its lowest loss is 2.3).
    assert rows[("AdamS", 100)]["target"] == pytest.approx(2.25)
    assert rows[("AdamS", 100)]["steps_to_target"] == {1: 75.0, 2: 75.0, 3: 75.0}
    assert scape100["steps_to_target"] == {1: math.inf, 2: math.inf, 3: math.inf}
    assert scape100["ratio"] == "not reached by 3/3 seeds"
    # At 400 steps the target is 1.75: AdamS at step 400 on every seed; SCAPE seeds 1 and 2 at 400,
    # seed 3 never.
    assert scape400["steps_to_target"] == {1: 400.0, 2: 400.0, 3: math.inf}


def test_steps_to_a_shorter_horizons_loss_within_the_longer_runs(horizon_dir):
    from analysis.horizon import markdown_section, steps_to_loss, studies

    problems = problems_of(horizon_dir)
    (study,) = studies(problems)
    longer = study[1]
    # AdamS's mean final loss at 100 steps is 2.1. Within the 400-step runs ([3.0, 2.6, 2.2, f] at
    # 100..400) every arm first reaches 2.1 at its final evaluation, step 400.
    by_label = {a.label: a for a in longer.arms}
    assert steps_to_loss(by_label["AdamS"], 2.1) == {1: 400.0, 2: 400.0, 3: 400.0}
    # SCAPE's 400-step curve [3.0, 2.2, 2.0, f] first reaches 2.1 at step 300: 3/4 of AdamS's steps.
    assert steps_to_loss(by_label["SCAPE(adams) s=0.9"], 2.1) == {1: 300.0, 2: 300.0, 3: 300.0}
    assert steps_to_loss(by_label["SCAPE(adams) s=0.9"], 2.2) == {1: 200.0, 2: 200.0, 3: 200.0}
    assert steps_to_loss(by_label["SCAPE(adams) s=0.9"], 1.0) == {1: math.inf, 2: math.inf, 3: math.inf}
    text = "\n".join(markdown_section(problems))
    assert "## Horizon: the gap against steps and updates per coordinate" in text
    assert "| SCAPE(adams) s=0.9 | 400 | 48 | 0.001 | 1.7800 | +0.180 (n=3) |" in text
    assert ("| 400 steps | 100 steps | AdamS at 100 steps | 2.1000 | SCAPE(adams) s=0.9 | 300, 300, 300 | "
            "0.75 [0.75, 0.75] (n=3) |") in text
    assert "not reached by 1/3 seeds" in text  # SCAPE at 400 steps to its own horizon's target
    assert "###" not in text  # one study: no heading


def test_ratio_text_pairs_by_seed_and_counts_pairs():
    from analysis.horizon import ratio_text

    # Seed 3 has no partner; 0.5 and 1.0 pair: mean 0.75, n = 2, t(0.975, 1) · std / sqrt(2).
    text = ratio_text({1: 50.0, 2: 100.0, 3: 80.0}, {1: 100.0, 2: 100.0})
    half = math.tan(0.475 * math.pi) * np.std([0.5, 1.0], ddof=1) / math.sqrt(2)
    assert text == f"0.75 [{0.75 - half:.2f}, {0.75 + half:.2f}] (n=2)"
    assert ratio_text({1: 150.0}, {1: 100.0}) == "1.50 (n=1)"  # the arm's over the reference's
    assert ratio_text({1: math.inf, 2: 10.0}, {1: 5.0, 2: 5.0}) == "not reached by 1/2 seeds"
    assert ratio_text({1: 10.0}, {2: 5.0}) == "—"


def test_warm_ups_that_scale_with_the_horizon_join_one_curve():
    from analysis.horizon import curves
    from analysis.stats import Arm, Problem

    def arm(label, steps, warmup):
        return Arm(label=label, config={"steps": steps, "optimizer.type": "adams", "optimizer.warmup_steps": warmup})

    fixed_short = arm("short", 1000, 20)  # 2% of 1000 steps: both a fixed 20 and 2% of the run
    scaled, fixed = arm("scaled", 4000, 80), arm("fixed", 4000, 20)
    study = [Problem(label="a", arms=[fixed_short]), Problem(label="b", arms=[scaled, fixed])]
    found = {label: [a.label for _, a in chain] for label, chain in curves(study)}
    assert found == {"fixed": ["short", "fixed"], "scaled (warm-ups ∝ steps)": ["short", "scaled"]}


def test_one_horizon_gives_no_section(horizon_dir, tmp_path):
    from analysis.horizon import markdown_section

    for f in horizon_dir.glob("*-100-*.h5"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    assert markdown_section(problems_of(tmp_path)) == []


def test_report_draws_the_horizon_figure(horizon_dir, tmp_path):
    from analysis.report import write_report

    _, text = write_report([horizon_dir], tmp_path)
    assert (tmp_path / "horizon.png").stat().st_size > 0
    assert "[horizon.png](horizon.png)" in text and "## Horizon" in text
