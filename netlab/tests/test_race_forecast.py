"""The race's forecast (netlab/race_forecast.py, `scripts/netlab race forecast`): Spearman's rho and
the simulator's time to target on hand cases, the step forecast against the ring formula by hand
through `scape predict`, every arm's simulator config accepted by `scape validate`, and a tiny
race forecast end to end (the simulator's runs reused, the table's values the functions' own),
with bad input named. No torch, no root."""
import json
import math
import subprocess

import pytest

from netlab import race_forecast, race_plan
from netlab.race_forecast import RaceInputError

SETTINGS = {"nodes": 2, "seeds": [1, 2], "width": 16, "layers": 1, "batch": 2, "block": 8, "eval_points": 2,
            "measure_steps": 5}
VOCAB = 10
# the race's GPT at SETTINGS with an untied head: V d + T d + L (12 d^2 + 13 d) + 2 d + V d
N_TINY = VOCAB * 16 + 8 * 16 + (12 * 16 * 16 + 13 * 16) + 2 * 16 + VOCAB * 16


def test_spearman_on_hand_cases():
    assert race_forecast.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert race_forecast.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ties take the average rank: x ranks 1, 2.5, 2.5, 4; sxy = 4.5, sxx = 4.5, syy = 5
    assert race_forecast.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert race_forecast.spearman([1, 2], [1, 2]) is None
    assert race_forecast.spearman([1, 1, 1], [1, 2, 3]) is None


def test_simulator_time_to_target_and_paired_delta_by_hand():
    curves = {1: [(10, 3.0), (20, 2.5), (30, 2.4)], 2: [(10, 2.55), (20, 2.5), (30, 2.3)]}
    iv, reached = race_forecast.sim_time_to_target(curves, 2.6, 0.1)
    assert reached == 2
    assert iv[0] == pytest.approx(1.5)  # seeds at steps 20 and 10: 2.0 s and 1.0 s
    assert iv[2] - iv[0] == pytest.approx(12.706 * math.sqrt(0.5) / math.sqrt(2))
    assert race_forecast.sim_time_to_target(curves, 2.35, 0.1) == (None, 1)
    base = {1: [(30, 2.5)], 2: [(30, 2.6)]}
    delta = race_forecast.sim_delta(curves, base)
    assert delta[0] == pytest.approx(-0.2)  # -0.1 and -0.3


def hardware(tmp_path, name, alpha_us, bandwidth_GBps):
    path = tmp_path / name
    path.write_text(json.dumps({"format": "scape-hardware-1",
                                "network": {"inter": {"alpha_us": alpha_us, "bandwidth_GBps": bandwidth_GBps}}}))
    return str(path)


def ring_s(alpha_us, bandwidth_GBps, n=N_TINY):
    """A ring all-reduce of n fp32 values among 2 ranks: 2 latency steps, n values sent."""
    return 2 * alpha_us * 1e-6 + 4 * n / (bandwidth_GBps * 1e9)


def plan(rate, budget, ddp_steps, arms, digest="x"):
    return {"rate": rate, "ddp_steps": ddp_steps, "budget_s": budget, "corpus_sha256": digest, "settings": SETTINGS,
            "arms": arms}


def test_step_forecast_is_the_base_less_its_exposed_time_plus_the_rates(scape, tmp_path):
    fast, slow = hardware(tmp_path, "f.json", 20.0, 1.0), hardware(tmp_path, "s.json", 200.0, 0.0125)
    arms = {"ddp-adamw": {"steps": 100, "lr": 1e-3},
            "diloco-h10": {"step_s": 0.030, "compute_s": 0.025, "steps": 300, "lr": 1e-3}}
    base = {"plan": plan("1gbit", 5.0, 100, arms), "rate": 1000.0, "path": "base.csv"}
    races = {100.0: {"plan": plan("100mbit", 9.0, 30, arms), "path": "slow.csv"}}
    steps = race_forecast.forecast_steps(scape, races, base, {1000.0: fast, 100.0: slow}, VOCAB)
    ddp, ddp_exposed = steps[100.0]["ddp-adamw"]
    assert ddp_exposed == pytest.approx(ring_s(200.0, 0.0125), rel=1e-6)
    assert ddp == pytest.approx(5.0 / 100 - ring_s(20.0, 1.0) + ring_s(200.0, 0.0125), rel=1e-6)
    # DiLoCo all-reduces the whole model once every 10 steps: a tenth of the ring a step
    diloco, _ = steps[100.0]["diloco-h10"]
    assert diloco == pytest.approx(0.030 + (ring_s(200.0, 0.0125) - ring_s(20.0, 1.0)) / 10, rel=1e-6)
    # torch.distributed's all-reduce for DDP, scape.torch's (here at half the rate) for DiLoCo
    half = hardware(tmp_path, "h.json", 200.0, 0.00625)
    links = {1000.0: {"native": fast, "scape": fast}, 100.0: {"native": slow, "scape": half}}
    steps = race_forecast.forecast_steps(scape, races, base, links, VOCAB)
    assert steps[100.0]["ddp-adamw"][1] == pytest.approx(ring_s(200.0, 0.0125), rel=1e-6)
    assert steps[100.0]["diloco-h10"][1] == pytest.approx(ring_s(200.0, 0.00625) / 10, rel=1e-6)
    with pytest.raises(RaceInputError, match="faster than the base"):
        race_forecast.forecast_steps(scape, {1e4: races[100.0]}, base, {1000.0: fast, 1e4: slow}, VOCAB)


def corpus_root(tmp_path):
    root = tmp_path / "checkout"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    (root / "docs" / "a.md").write_text("pack my box with five dozen liquor jugs. " * 40)
    return root


def test_every_arms_simulator_config_is_a_valid_run_config(scape, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abcdefgh" * 200)
    for arm in race_plan.ARMS:
        config = race_forecast.sim_config(arm, SETTINGS, 2e-3, 95, 3, str(corpus))
        assert config["optimizer"]["warmup_steps"] == 5 and config["optimizer"]["min_lr"] == pytest.approx(2e-4)
        assert config["eval"]["interval"] % race_plan.SYNC_EVERY.get(arm, 1) == 0
        path = tmp_path / f"{arm}.json"
        path.write_text(json.dumps(config))
        done = subprocess.run([scape, "validate", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, f"{arm}: {done.stdout}{done.stderr}"
    assert race_forecast.sim_config("diloco-h50", SETTINGS, 1e-3, 300, 1, str(corpus))["eval"]["interval"] == 150


def tiny_race(tmp_path, digest):
    """A race at 100 Mbit/s (DDP AdamW and DiLoCo H = 10, seeds 1 and 2) and its base at 1 Gbit/s."""
    from test_race import curve, write
    arms = {"ddp-adamw": {"steps": 20, "lr": 2e-3},
            "diloco-h10": {"step_s": 0.02, "compute_s": 0.015, "steps": 40, "lr": 2e-3}}
    rows = []
    for seed, shift in ((1, 0.0), (2, 0.05)):
        rows += curve("ddp-adamw", seed, 2e-3, [3.0 + shift, 2.8 + shift], step_s=0.1, budget=2.0)
        rows += curve("diloco-h10", seed, 2e-3, [2.9 + shift, 2.7 + shift, 2.6 + shift, 2.5 + shift], step_s=0.05,
                      budget=2.0)
    slow = write(tmp_path / "race-100mbit.csv", rows)
    (tmp_path / "race-100mbit.plan.json").write_text(json.dumps(plan("100mbit", 2.0, 20, arms, digest)))
    base_rows = [dict(r, rate_mbit=1000.0) for r in rows]
    fast = write(tmp_path / "race-1gbit.csv", base_rows)
    (tmp_path / "race-1gbit.plan.json").write_text(json.dumps(plan("1gbit", 1.0, 20, arms, digest)))
    return slow, fast


def test_a_tiny_race_forecast_end_to_end(scape, tmp_path, capsys):
    root = corpus_root(tmp_path)
    slow, fast = tiny_race(tmp_path, race_plan.corpus_digest(root))
    races = race_forecast.load_race([slow])
    base = race_forecast.base_race(races, fast)
    corpus, vocab = race_forecast.corpus_file([races[100.0]["plan"], base["plan"]], root, tmp_path)
    assert vocab == len(set((root / "README.md").read_bytes() + (root / "docs" / "a.md").read_bytes()))
    links = {1000.0: hardware(tmp_path, "f.json", 20.0, 1.0), 100.0: hardware(tmp_path, "s.json", 200.0, 0.0125)}
    steps = race_forecast.forecast_steps(scape, races, base, links, vocab)
    runs = race_forecast.sim_runs(races, corpus, str(tmp_path / "out"))
    assert [(arm, seed, c["steps"]) for _, arm, seed, _, c in runs] == [
        ("ddp-adamw", 1, 20), ("ddp-adamw", 2, 20), ("diloco-h10", 1, 40), ("diloco-h10", 2, 40)]
    race_forecast.run_all(scape, runs, 2)
    sims = race_forecast.sim_curves(runs)
    assert [s for s, _ in sims[(100.0, "diloco-h10")][1]] == [20, 40]  # evaluations on the syncs, the last one
    race_forecast.run_all(scape, runs, 2)
    assert "4 simulator runs kept, 0 to run" in capsys.readouterr().err
    result = race_forecast.compare(races, steps, sims, 0.02, base["rate"])
    target, lines = result[100.0]
    ddp_ends = [sims[(100.0, "ddp-adamw")][s][-1][1] for s in (1, 2)]
    assert target == pytest.approx(sum(ddp_ends) / 2 + 0.02)
    ddp, diloco = lines
    assert ddp["delta_sim"] is None and not ddp["fitted"]
    assert ddp["step_measured"] == pytest.approx(0.1) and ddp["step_forecast"] == pytest.approx(steps[100.0]["ddp-adamw"][0])
    ends = [sims[(100.0, "diloco-h10")][s][-1][1] - sims[(100.0, "ddp-adamw")][s][-1][1] for s in (1, 2)]
    assert diloco["delta_sim"][0] == pytest.approx(sum(ends) / 2)
    assert diloco["delta_race"][0] == pytest.approx(-0.3)  # 2.5 - 2.8 and 2.55 - 2.85, at B = 2 s
    text = race_forecast.markdown(result, 0.02)
    assert "| diloco-h10 | 0.002 | 40 | 0.0500 |" in text and "over 1 arms" in text


def test_bad_input_is_named(tmp_path):
    root = corpus_root(tmp_path)
    slow, fast = tiny_race(tmp_path, "not-the-digest")
    races = race_forecast.load_race([slow])
    with pytest.raises(RaceInputError, match="--corpus-root"):
        race_forecast.corpus_file([races[100.0]["plan"]], root, tmp_path)
    other_model = json.loads((tmp_path / "race-1gbit.plan.json").read_text())
    other_model["settings"] = dict(SETTINGS, width=32)
    (tmp_path / "race-1gbit.plan.json").write_text(json.dumps(other_model))
    with pytest.raises(RaceInputError, match=r"--base ran width = 32, the race .* width = 16"):
        race_forecast.base_race(races, fast)
    (tmp_path / "race-1gbit.plan.json").unlink()
    with pytest.raises(RaceInputError, match="no plan beside it"):
        race_forecast.load_race([fast])
    with pytest.raises(RaceInputError, match="also in"):
        race_forecast.load_race([slow, slow])
    status = race_forecast.main(["--race", slow, "--links", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
                                 "--corpus-root", str(root)])
    assert status == 2


def test_links_arguments_and_files_are_named():
    from netlab import race_links
    args = race_links.arguments(["--rate", "100mbit,10gbit", "--out", "links"])
    assert [r for r, _ in args.rates] == ["100mbit", "10gbit"] and args.idle_gap_ms == 35
    assert race_links.bench_path("links", "100mbit") == "links/gloo-100mbit.h5"
    assert race_links.bench_path("links", "100mbit", native=True) == "links/gloo-native-100mbit.h5"
    for bad in (["--rate", "9zbit", "--out", "x"], ["--rate", "1gbit", "--out", "x", "--nodes", "1"], ["--out", "x"]):
        with pytest.raises(SystemExit) as exit_:
            race_links.arguments(bad)
        assert exit_.value.code == 2
