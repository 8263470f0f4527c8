"""Statistics over seeds and the lr search (analysis/seeds.py) against hand-computed values.

Interval arithmetic uses Student-t quantiles known to many digits; best-lr selection, pairing by
seed and tokens to target use synthetic run files whose final losses are chosen here, so every
expected number below follows from the lists in this file.
"""

import csv
import json
import math
import subprocess

import numpy as np
import pytest

from conftest import QUADRATIC, gpt_config, write_run_file

T975 = {1: math.tan(0.475 * math.pi), 2: math.sqrt(2 * 0.95**2 / (1 - 0.95**2))}
"""t_{0.975, df} in closed form: df = 1 (Cauchy) tan(0.475 pi) = 12.7062047361747; df = 2, where
P(|T| <= t) = t / sqrt(2 + t^2), t = sqrt(2 c^2 / (1 - c^2)) = 4.30265272974946."""
TABLE = {3: 3.182446305284263, 4: 2.7764451051977987, 10: 2.2281388519649385, 30: 2.0422724563012373,
         200: 1.9718962236316089}
"""Printed tables (scipy.stats.t.ppf(0.975, df)); accurate to about 1e-10 relative."""


def test_t_critical_against_closed_forms_and_tables():
    from analysis.seeds import t_critical

    assert T975[1] == pytest.approx(12.7062047361747, rel=1e-13)
    assert T975[2] == pytest.approx(4.30265272974946, rel=1e-13)
    for df, t in T975.items():
        assert t_critical(df) == pytest.approx(t, rel=1e-13), df
    for df, t in TABLE.items():
        assert t_critical(df) == pytest.approx(t, rel=1e-9), df
    assert t_critical(2, 0.9) == pytest.approx(math.sqrt(2 * 0.81 / 0.19), rel=1e-13)
    assert t_critical(1, 0.5) == pytest.approx(1.0, rel=1e-13)  # the Cauchy quartile
    with pytest.raises(ValueError):
        t_critical(0)


def test_t_critical_against_scipy_where_present():
    stats = pytest.importorskip("scipy.stats")
    from analysis.seeds import t_critical

    for df in (1, 2, 5, 7, 16, 63):
        for c in (0.9, 0.95, 0.99):
            assert t_critical(df, c) == pytest.approx(stats.t.ppf((1 + c) / 2, df), rel=1e-8)
    # scipy's ppf is good to about 1e-9 here; the incomplete beta at 40 digits (mpmath) gives
    # t_{0.995, 63} = 2.6561450250998617, which the series matches to rounding.
    assert t_critical(63, 0.99) == pytest.approx(2.6561450250998617, rel=1e-13)


def test_interval_by_hand():
    from analysis.seeds import interval

    iv = interval([1.0, 2.0, 3.0])  # mean 2, s = 1
    assert (iv.n, iv.mean, iv.std) == (3, 2.0, 1.0)
    assert iv.lo == pytest.approx(2 - T975[2] / math.sqrt(3), rel=1e-12)
    assert iv.hi == pytest.approx(2 + T975[2] / math.sqrt(3), rel=1e-12)
    iv = interval([0.5, 0.7])  # mean 0.6, s = sqrt(0.02), half = t_{.975,1} s / sqrt 2 = 0.1 t
    assert iv.half_width == pytest.approx(0.1 * T975[1], rel=1e-12)
    one = interval([4.0, math.nan])  # NaN is no value
    assert one.n == 1 and one.mean == 4.0 and math.isnan(one.std) and math.isnan(one.lo)
    assert interval([]).n == 0 and math.isnan(interval([]).mean)


# Final validation losses by (optimizer, lr, seed); curves fall to them through fixed points.
FINAL = {
    ("adams", 1e-3): {1: 2.00, 2: 2.10, 3: 2.20},   # mean 2.1
    ("adams", 3e-3): {1: 1.90, 2: 2.00, 3: 2.05},   # mean 1.98333: best
    ("adams", 1e-2): {1: 1.50, 2: None, 3: 1.60},   # lowest mean, but seed 2 diverged
    ("scape", 3e-3): {1: 2.30, 2: 2.40, 3: 2.20},   # mean 2.3
    ("scape", 1e-2): {1: 2.00, 2: 2.18, 3: 2.12},   # mean 2.1: best, at the edge of its search
}
"""Evaluations at steps 25, 50, 75, 100 read [3.0, 2.6, mid, final], mid = final + 0.04; a step
has 2 workers x 4 sequences x 16 tokens = 128 tokens."""


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory, scape):
    d = tmp_path_factory.mktemp("seeds")
    for (kind, lr), by_seed in FINAL.items():
        for seed, final in by_seed.items():
            # Names whose sorted order is not the seed order: pairing must go by the config's seed.
            path = d / f"{kind}-{lr:g}-{4 - seed}.h5"
            if final is None:
                write_run_file(path, gpt_config(kind, seed, lr), val_loss=[3.0, 2.6], eval_step=[25, 50],
                               train_loss=[2.0] * 60 + [math.inf], status="diverged")
            else:
                write_run_file(path, gpt_config(kind, seed, lr), val_loss=[3.0, 2.6, final + 0.04, final])
    return d


def problems_of(directory, **kwargs):
    from analysis.report import build_report, seed_problems

    report = build_report([directory])
    return seed_problems(report, **kwargs)


def arms_by_type(problem):
    return {a.config["optimizer.type"]: a for a in problem.arms}


def test_best_lr_is_lowest_mean_without_a_diverged_seed(synthetic_dir):
    (problem,) = problems_of(synthetic_dir)
    arms = arms_by_type(problem)
    adams, scape = arms["adams"], arms["scape"]
    assert adams.lrs == [1e-3, 3e-3, 1e-2] and scape.lrs == [3e-3, 1e-2]
    assert adams.best_lr == 3e-3 and adams.diverged[1e-2] == [2]
    assert adams.at_lr[1e-3].mean == pytest.approx(2.1) and adams.at_lr[1e-2].n == 2
    assert adams.final.mean == pytest.approx((1.9 + 2.0 + 2.05) / 3)
    assert adams.final.std == pytest.approx(np.std([1.9, 2.0, 2.05], ddof=1))
    assert adams.final.half_width == pytest.approx(T975[2] * np.std([1.9, 2.0, 2.05], ddof=1) / math.sqrt(3))
    assert scape.best_lr == 1e-2 and "best lr at the edge of the search" in scape.notes
    assert problem.reference is adams and adams.label == "AdamS" and scape.label == "SCAPE(adams) s=0.9"


def write_finals(folder, finals_by_lr, kind="scape"):
    """One run file per lr and seed whose last validation loss is the given final loss."""
    for lr, finals in finals_by_lr.items():
        for seed, final in finals.items():
            write_run_file(folder / f"{kind}-{lr:g}-{seed}.h5", gpt_config(kind, seed, lr),
                           val_loss=[3.0, final], train_loss=[5.5] + [final] * 99)


def test_a_seed_whose_loss_ends_above_its_start_counts_as_diverged(tmp_path):
    # lr 1e-2 has the lower loss on seed 1 but seed 2 blew up to 1e6, finite, status completed.
    write_finals(tmp_path, {1e-2: {1: 1.0, 2: 1e6}, 3e-3: {1: 2.0, 2: 2.2}})
    (problem,) = problems_of(tmp_path, reference="optimizer.type=scape")
    (arm,) = problem.arms
    assert arm.best_lr == 3e-3 and arm.diverged[1e-2] == [2]
    assert arm.final.mean == pytest.approx(2.1)


def test_lowest_on_common_seeds_by_hand():
    from analysis.stats import lowest_on_common_seeds

    # Seeds 1 and 2 are common: a's mean there is 2.5, b's 2.25 (c ran seed 3 only, so no common
    # seed includes it in the second call, which falls back to each key's own mean).
    assert lowest_on_common_seeds({"a": {1: 2.0, 2: 3.0, 3: 1.0}, "b": {1: 2.5, 2: 2.0}}) == ("b", [1, 2])
    assert lowest_on_common_seeds({"a": {1: 2.0, 2: 3.0}, "c": {3: 2.4}}) == ("c", [])
    assert lowest_on_common_seeds({}) == (None, [])


def test_a_pruned_grid_is_judged_on_the_seeds_every_rate_ran(tmp_path):
    # Sweep 15's SCAPE 90% at 16000 steps: 1e-3 ran on seed 1 only, 3e-3 on seeds 1-3. By each
    # rate's own mean 1e-3 wins (1.6063 < 1.6095); seed against seed 3e-3 does (1.6055 < 1.6063).
    write_finals(tmp_path, {1e-3: {1: 1.6063}, 3e-3: {1: 1.6055, 2: 1.5907, 3: 1.6322}})
    (problem,) = problems_of(tmp_path, reference="optimizer.type=scape")
    (arm,) = problem.arms
    assert arm.best_lr == 3e-3
    assert arm.final.n == 3 and arm.final.mean == pytest.approx((1.6055 + 1.5907 + 1.6322) / 3)
    assert "best lr chosen on the seeds every lr ran (1)" in arm.notes
    assert not any("rests on" in n for n in arm.notes)


def test_a_one_seed_rate_that_wins_seed_against_seed_is_flagged(tmp_path):
    # 1e-3's three-seed mean (1.7) beats 3e-3's one seed (1.9), but on seed 1 3e-3 is better.
    write_finals(tmp_path, {1e-3: {1: 2.0, 2: 1.5, 3: 1.6}, 3e-3: {1: 1.9}})
    (problem,) = problems_of(tmp_path, reference="optimizer.type=scape")
    (arm,) = problem.arms
    assert arm.best_lr == 3e-3 and arm.final.n == 1 and arm.final.mean == pytest.approx(1.9)
    assert "best lr rests on 1 seed(s), other rates on up to 3" in arm.notes


def test_rates_without_a_common_seed_fall_back_to_their_own_means(tmp_path):
    write_finals(tmp_path, {1e-3: {1: 2.0, 2: 1.6}, 3e-3: {3: 1.7}})
    (problem,) = problems_of(tmp_path, reference="optimizer.type=scape")
    (arm,) = problem.arms
    assert arm.best_lr == 3e-3  # 1.7 < 1.8
    assert "no seed common to every lr: best lr by each lr's own mean" in arm.notes


def test_paired_difference_goes_by_seed(synthetic_dir):
    (problem,) = problems_of(synthetic_dir)
    scape = arms_by_type(problem)["scape"]
    # Seeds 1, 2, 3 at the best lrs 1e-2 and 3e-3: d = 0.10, 0.18, 0.07; mean 0.35 / 3,
    # s^2 = (0.0473 - 0.35^2 / 3) / 2 = 0.0097 / 3.
    assert scape.delta_pairs == 3
    assert scape.delta.mean == pytest.approx(0.35 / 3, rel=1e-12)
    assert scape.delta.std == pytest.approx(math.sqrt(0.0097 / 3), rel=1e-12)
    assert scape.delta.half_width == pytest.approx(T975[2] * math.sqrt(0.0097 / 3) / math.sqrt(3), rel=1e-12)
    # Unpaired, the spread of the difference of means would be far wider than the paired one.
    unpaired = math.hypot(np.std([2.0, 2.18, 2.12], ddof=1), np.std([1.9, 2.0, 2.05], ddof=1))
    assert scape.delta.std < unpaired


def test_missing_seed_is_left_unpaired(synthetic_dir, tmp_path):
    from conftest import set_attrs

    for f in synthetic_dir.glob("*.h5"):
        if f.name != "scape-0.01-1.h5":  # seed 3 of SCAPE's best lr is missing
            (tmp_path / f.name).write_bytes(f.read_bytes())
    set_attrs(synthetic_dir / "scape-0.01-1.h5", tmp_path / "running.h5", status="running")  # still going: left out
    (problem,) = problems_of(tmp_path)
    scape = arms_by_type(problem)["scape"]
    assert scape.best_lr == 1e-2 and scape.final.n == 2
    assert scape.delta_pairs == 2 and scape.delta.mean == pytest.approx((0.10 + 0.18) / 2)
    assert "seeds without a partner: 3" in scape.notes and "1 unfinished run(s) left out" in scape.notes
    assert "best lr rests on 2 seed(s), other rates on up to 3" in scape.notes
    assert not any("rests on" in n for n in arms_by_type(problem)["adams"].notes)


def test_reference_is_selectable_and_its_lr_can_be_pinned(synthetic_dir):
    (problem,) = problems_of(synthetic_dir, reference="optimizer.type=scape")
    arms = arms_by_type(problem)
    assert problem.reference is arms["scape"]
    assert arms["adams"].delta.mean == pytest.approx(-0.35 / 3)
    (problem,) = problems_of(synthetic_dir, reference="optimizer.type=adams,optimizer.lr=0.001")
    arms = arms_by_type(problem)
    assert arms["adams"].best_lr == 1e-3  # pinned, not its best
    assert arms["scape"].delta.mean == pytest.approx(np.mean([0.0, 0.08, -0.08]), abs=1e-12)
    (problem,) = problems_of(synthetic_dir, reference="optimizer.type=adamw")
    assert problem.reference is None and "no arm matches the reference" in problem.notes[0]


def test_tokens_to_target(synthetic_dir):
    (problem,) = problems_of(synthetic_dir)
    arms = arms_by_type(problem)
    assert problem.target == pytest.approx(2.05 + 0.05)  # AdamS's worst seed at its best lr, + margin
    # Evaluations [3.0, 2.6, final + 0.04, final] at steps 25, 50, 75, 100. AdamS at 3e-3: mids
    # 1.94, 2.04, 2.09 are all below 2.1 at step 75. SCAPE at 1e-2: mids 2.04, 2.22, 2.16 and finals
    # 2.00, 2.18, 2.12: seed 1 at step 75, seeds 2 and 3 never.
    assert arms["adams"].tokens == {1: 75 * 128.0, 2: 75 * 128.0, 3: 75 * 128.0}
    assert arms["scape"].tokens == {1: 75 * 128.0, 2: math.inf, 3: math.inf}
    from analysis.seeds import tokens_text

    assert tokens_text(arms["scape"]) == "not reached by 2/3 seeds"
    assert tokens_text(arms["adams"]) == "9.6e+03 ± 0"  # no spread over seeds: a zero-width interval
    (problem,) = problems_of(synthetic_dir, target_loss=2.02)
    arms = arms_by_type(problem)
    assert arms["adams"].tokens == {1: 75 * 128.0, 2: 100 * 128.0, 3: math.inf}
    (problem,) = problems_of(synthetic_dir, target_margin=0.3)
    arms = arms_by_type(problem)
    assert problem.target == pytest.approx(2.35)
    assert arms["scape"].tokens == {1: 75 * 128.0, 2: 75 * 128.0, 3: 75 * 128.0}
    iv_tokens = [75 * 128.0, 100 * 128.0]
    (problem,) = problems_of(synthetic_dir, target_loss=2.02, reference="optimizer.type=scape")
    assert arms_by_type(problem)["adams"].tokens == {1: iv_tokens[0], 2: iv_tokens[1], 3: math.inf}


def test_report_writes_the_section_and_csv(synthetic_dir, tmp_path):
    from analysis.report import write_report

    report, text = write_report([synthetic_dir], tmp_path, figures=False)
    assert "## Seeds and learning rates" in text and "Target validation loss 2.1000" in text
    row = next(line for line in text.splitlines() if line.startswith("| SCAPE(adams) s=0.9 | 3 |"))
    assert "| 0.01 | 2.1000 |" in row and "+0.1167 (n=3)" in row and "not reached by 2/3 seeds" in row
    assert "**1.9833 (n=3)**" in text and "diverged: seed 2" in text
    with open(tmp_path / "seeds.csv", encoding="utf-8") as f:
        rows = {r["arm"]: r for r in csv.DictReader(f)}
    assert float(rows["SCAPE(adams) s=0.9"]["delta_mean"]) == pytest.approx(0.35 / 3)
    assert int(rows["AdamS"]["tokens_never"]) == 0 and int(rows["SCAPE(adams) s=0.9"]["tokens_never"]) == 2
    assert float(rows["AdamS"]["tokens_mean"]) == 75 * 128.0
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize("band", ["ci", "minmax"])
def test_band_figure(synthetic_dir, tmp_path, band):
    """seeds.png alone (the other figures are drawn by test_report.py): the band and the lr panel."""
    import matplotlib.image as mpimg
    from analysis.figures import _band, _seed_figure
    from analysis.report import build_report, seed_problems

    ys = np.array([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])
    mean, lo, hi = _band(ys, band)
    np.testing.assert_allclose(mean, [2.0, 4.0])
    if band == "minmax":
        np.testing.assert_allclose([lo, hi], [[1.0, 2.0], [3.0, 6.0]])
    else:  # s = (1, 2): half-widths t_{.975,2} s / sqrt 3
        np.testing.assert_allclose(hi - mean, T975[2] * np.array([1.0, 2.0]) / math.sqrt(3), rtol=1e-12)
    _seed_figure(seed_problems(build_report([synthetic_dir])), tmp_path / "seeds.png", band)
    img = mpimg.imread(tmp_path / "seeds.png")
    assert img.shape[0] > 200 and img[..., :3].std() > 0.01


def test_sweep_with_repeat_and_lr_search_end_to_end(scape, tmp_path):
    """A real sweep (repeat 2, lr_search of 2): arms of 4 runs; best lr from the train tails read with h5py."""
    import h5py
    from analysis.report import build_report, seed_problems

    base = dict(QUADRATIC, steps=12)
    sweep = {"base": base, "points": [{"optimizer.type": "adams"},
                                      {"optimizer.type": "scape", "optimizer.sparsity": 0.99}],
             "lr_search": [0.003, 0.03], "repeat": 2}
    (tmp_path / "s.json").write_text(json.dumps(sweep))
    proc = subprocess.run([scape, "sweep", str(tmp_path / "s.json"), "--out", str(tmp_path / "runs"), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tails = {}
    for f in (tmp_path / "runs").glob("*.h5"):
        with h5py.File(f, "r") as h:
            cfg = json.loads(h.attrs["config"])
            key = (cfg["optimizer"]["type"], cfg["optimizer"]["lr"])
            tails.setdefault(key, {})[cfg["seed"]] = h["metrics/train_loss"][-10:].astype(np.float64).mean()
    assert {s for v in tails.values() for s in v} == {3, 4}  # QUADRATIC's seed 3, then 4
    (problem,) = seed_problems(build_report([tmp_path / "runs"]))
    for arm in problem.arms:
        kind = arm.config["optimizer.type"]
        means = {lr: np.mean(list(tails[(kind, lr)].values())) for lr in (0.003, 0.03)}
        assert arm.best_lr == min(means, key=means.get)
        assert arm.final.mean == pytest.approx(means[arm.best_lr], rel=1e-12) and arm.loss_on == "train"


def test_cli_rejects_bad_reference_and_target(synthetic_dir, tmp_path):
    from test_report import cli

    proc = cli("report", synthetic_dir, "--out", tmp_path, "--reference", "adams")
    assert proc.returncode == 2 and "expected KEY=VALUE" in proc.stderr
    proc = cli("report", synthetic_dir, "--out", tmp_path, "--target-loss", "nan")
    assert proc.returncode == 2 and "--target-loss nan: expected a finite number" in proc.stderr
    proc = cli("report", synthetic_dir, "--out", tmp_path, "--quiet", "--target-loss", "2.5", "--no-figures")
    assert proc.returncode == 0, proc.stderr
    assert "Target validation loss 2.5000 (--target-loss)" in (tmp_path / "summary.md").read_text(encoding="utf-8")
