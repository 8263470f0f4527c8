"""`scripts/netlab race forecast --race CSV... [--base CSV] --links DIR --out DIR`: how well the
simulator plus `scape predict` forecast the race (issue 60, docs/NETLAB.md "Forecasting the
race"). Debian's python3 and the scape binary (analysis.runs.scape_binary: SCAPE_BINARY, a
build of this checkout, or scape on PATH); no root.

Each arm of a race at a rate R is forecast without R's race runs, in two parts:

  step time  the arm's step at the fastest rate F raced (--base; its step-time run there, DDP
             AdamW's B / S) less the communication `scape predict` exposes at F, plus what it
             exposes at R, both on the links `scape predict --calibrate --links-from-bench`
             fits to the gloo bench-comm files timed on the netlab at that rate (`scripts/netlab
             race links`): torch.distributed's all-reduce for the arms that call it (NATIVE),
             scape.torch's collectives for the others. The compute and the optimizer's own time
             are F's measurement: the part scape predict cannot give for the torch runtime
             (netlab/torch_predict.py does the same). At F itself the step is fitted, not
             forecast. PowerSGD's step is not forecast: scape predict refuses powersgd (its
             bytes need the tensor shapes); its loss is.
  loss       the simulator, `scape run`, training the race's model shape on the race's corpus
             (the bytes whose sha256 the plan names) with the arm's optimizer in the core's
             terms (ARMS below), W = the race's nodes, the arm's chosen rate, planned steps and
             warm-up + cosine to a tenth, on each seed the race ran at that rate (or --seeds).

From them, per arm at R, beside what the race measured (`scripts/netlab race tables`):

  − DDP AdamW's   the simulator's loss at the arm's planned count minus its DDP AdamW's at S,
                  paired by seed (mean and Student t 95% interval), against the race's loss at B
                  minus DDP AdamW's, paired the same way
  time to target  the simulator's steps to its own target (its DDP AdamW's loss at S, the mean
                  over the seeds, + the margin: the race's rule on the simulator's scale) times
                  the forecast step; "not reached (k of n)" as in the race
  Spearman rho    the rank correlation, over the arms other than DDP AdamW, of the forecast's
                  paired differences with the race's: does the forecast order the arms as the
                  race did?

What the simulator's run is not (docs/NETLAB.md): its GPT ties the output head to the token
table and its vocabulary is the 256 byte values (the race's model: an untied head and the bytes
present); it never decays the embeddings (the race decays every matrix); the core's PowerSGD
compresses from the first step (torch's hook from the third), and its DiLoCo and SparseLoCo are
the ones scape.torch's are held to. The simulator's runs are OUT/sim/RATE/ARM-lrLR-seedS.h5,
kept and reused when complete. Exit status 2, naming the file: a race CSV without its plan beside
it, a plan whose corpus is not the checkout's, a rate without a gloo file in --links."""
import argparse
import concurrent.futures
import csv
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from netlab import race, race_links, race_plan
from netlab.race_plan import BASELINE, RaceInputError

ROOT = pathlib.Path(__file__).resolve().parents[1]
N_HEAD = 4  # netlab/race_node.py's TinyGPT
_SCAPE = {"type": "scape", "sharded": False, "formulation": "paper", "mask_lag": 1}  # scape.torch.SCAPE's defaults
# arm: its optimizer in the core's terms, the section of a run config (docs/configuration.md) and of a
# prediction config: what netlab/race_arms.py builds, with scape.torch's defaults where it takes them.
ARMS = {
    "ddp-adamw": {"type": "adamw", "sharded": False},
    "ddp-powersgd-r1": {"type": "powersgd", "inner": "adamw", "powersgd_rank": 1},
    "ddp-powersgd-r4": {"type": "powersgd", "inner": "adamw", "powersgd_rank": 4},
    "torchft-diloco": {"type": "diloco", "inner": "adamw", "inner_steps": 10, "outer_lr": 0.7, "outer_momentum": 0.9},
    "adams": {"type": "adams", "sharded": False},
    "scape-90": dict(_SCAPE, sparsity=0.9),
    "scape-99": dict(_SCAPE, sparsity=0.99),
    "diloco-h10": {"type": "diloco", "inner": "adamw", "inner_steps": 10, "outer_lr": 0.7, "outer_momentum": 0.9},
    "diloco-h50": {"type": "diloco", "inner": "adamw", "inner_steps": 50, "outer_lr": 0.7, "outer_momentum": 0.9},
    "diloco-streaming": {"type": "diloco", "inner": "adamw", "inner_steps": 50, "streaming_fragments": 5,
                         "outer_lr": 0.7, "outer_momentum": 0.9},
    "sparseloco": {"type": "sparseloco", "inner": "adamw", "inner_steps": 10, "sparsity": 0.99, "quant_bits": 2},
}
# The arms whose collectives are torch.distributed's own (DDP's bucket all-reduce, its PowerSGD
# hook's, torchft's Manager's): their link is the native all-reduce's.
NATIVE = ("ddp-adamw", "ddp-powersgd-r1", "ddp-powersgd-r4", "torchft-diloco")
# A custom GPU for scape predict whose compute is the race's measured one (so SCAPE's lagged mask
# all-gather hides behind as much compute as it had); its memory bandwidth only costs the
# predicted optimizer step, which the forecast does not use.
MEMORY_TBPS = 0.01


def scape_binary():
    from analysis.runs import ScapeBinaryError, scape_binary as find
    try:
        return find()
    except ScapeBinaryError as e:
        raise RaceInputError(str(e)) from None


# ---------------------------------------------------------------- the race's inputs

def load_race(paths):
    """{rate_mbit: {"rows": race rows, "plan": its plan, "path": the CSV}} from race CSVs, each with
    its plan (race-DATE-RATE.plan.json) beside it."""
    out = {}
    for path in paths:
        rows = race_plan.read(path)
        plan_path = str(path)[:-len(".csv")] + ".plan.json" if str(path).endswith(".csv") else None
        if not plan_path or not os.path.exists(plan_path):
            raise RaceInputError(f"{path}: no plan beside it ({plan_path}): the forecast needs the step-time runs")
        try:
            plan = json.loads(pathlib.Path(plan_path).read_text())
        except ValueError as e:
            raise RaceInputError(f"{plan_path}: not JSON ({e})") from None
        for rate in {r["rate_mbit"] for r in rows}:
            if rate in out:
                raise RaceInputError(f"{path}: {rate:g} Mbit/s is also in {out[rate]['path']}: give one race a rate")
            out[rate] = {"rows": [r for r in rows if r["rate_mbit"] == rate], "plan": plan, "path": str(path)}
    if not out:
        raise RaceInputError(f"{', '.join(map(str, paths))}: no rows")
    return out


MODEL_SETTINGS = ("nodes", "width", "layers", "batch", "block")


def base_race(race_by_rate, path):
    """The race whose step-time runs the steps start from: `path`'s (one rate), else the fastest of
    the races forecast; {"rows", "plan", "path", "rate"}. A base of another day may hold another
    corpus (a step's time does not depend on the text's bytes) but must hold the same model."""
    if path is None:
        rate = max(race_by_rate)
        return dict(race_by_rate[rate], rate=rate)
    (rate, entry), *more = load_race([path]).items()
    if more:
        raise RaceInputError(f"{path}: --base holds one rate, this has {len(more) + 1}")
    for race in race_by_rate.values():
        for key in MODEL_SETTINGS:
            mine, theirs = entry["plan"]["settings"].get(key), race["plan"]["settings"].get(key)
            if mine != theirs:
                raise RaceInputError(f"{path}: --base ran {key} = {mine}, the race {race['path']} {key} = {theirs}: "
                                     f"its step times are another model's")
    return dict(entry, rate=rate)


def corpus_file(plans, corpus_root, folder):
    """The race's corpus as one text file for `scape run`, checked against every plan's sha256;
    and its vocabulary (the distinct bytes: the race's model's rows)."""
    digest = race_plan.corpus_digest(corpus_root)
    for plan in plans:
        if plan.get("corpus_sha256") != digest:
            raise RaceInputError(f"the corpus at {corpus_root} (README.md and docs/*.md, sha256 {digest[:12]}…) is not "
                                 f"the race's at {plan.get('rate')} (sha256 {str(plan.get('corpus_sha256'))[:12]}…): give "
                                 "--corpus-root a checkout of the commit the race ran from")
    data = b"".join(p.read_bytes() for p in race_plan.corpus_paths(corpus_root))
    path = pathlib.Path(folder) / "corpus.txt"
    path.write_bytes(data)
    return str(path), len(set(data))


def measured_step_at(plan, arm):
    """An arm's steady step at a rate, as the race measured it: its step-time run; DDP AdamW's B / S."""
    if arm == BASELINE:
        return plan["budget_s"] / plan["ddp_steps"]
    return plan["arms"][arm]["step_s"]


def compute_at(plan):
    """The model's forward and backward on one core at a rate: the median over the arms' step-time runs."""
    return statistics.median(a["compute_s"] for a in plan["arms"].values() if "compute_s" in a)


# ---------------------------------------------------------------- step time

def prediction_config(arm, settings, vocab, hardware, peak_tflops):
    """scape predict's config of one arm as the race runs it: its GPT (untied head), W ranks of
    `batch` sequences, no bucketed overlap (DDP's gradient fits one bucket; PowerSGD's was made
    one), SCAPE's lagged mask all-gather behind the compute."""
    workers = settings["nodes"]
    return {"name": f"race-{arm}", "workers": [workers],
            "model": {"family": "gpt2", "n_layer": settings["layers"], "n_embd": settings["width"], "n_head": N_HEAD,
                      "vocab_size": vocab, "context": settings["block"], "tied_embeddings": False},
            "batch": {"scaling": "strong", "seq_len": settings["block"], "global_sequences": settings["batch"] * workers},
            "gpu": {"peak_TFLOPs": peak_tflops, "memory_bandwidth_TBps": MEMORY_TBPS, "mfu": 1.0},
            "overlap": {"grad_reduce": False, "param_gather": False, "sparse_reduce": False, "mask_gather": True},
            "optimizer": ARMS[arm], "hardware": os.path.abspath(hardware)}


class NotPredicted(RaceInputError):
    """scape predict refuses the arm's optimizer (PowerSGD: its bytes need the tensor shapes)."""


def predict_row(scape, config):
    """scape predict's optimizer row (a dict of its CSV) for `config`; NotPredicted when scape
    predict says it cannot predict that optimizer."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "p.json")
        with open(path, "w") as f:
            json.dump(config, f)
        done = subprocess.run([scape, "predict", path, "--out", os.path.join(tmp, "p.h5"), "--csv",
                               os.path.join(tmp, "p.csv")], capture_output=True, text=True)
        if done.returncode != 0:
            kind = NotPredicted if "cannot be predicted" in done.stderr else RaceInputError
            raise kind(f"scape predict of {config['name']} exited {done.returncode}: {done.stderr.strip()[-400:]}")
        with open(os.path.join(tmp, "p.csv"), newline="") as f:
            return next(r for r in csv.DictReader(f) if r["config"] == "optimizer")


def peak_for_compute(scape, settings, vocab, hardware, compute_s):
    """The peak (TFLOP/s, at MFU 1) at which scape predict's compute of the race's step is
    `compute_s`: its compute at 1 TFLOP/s over the seconds wanted."""
    at_one = float(predict_row(scape, prediction_config(BASELINE, settings, vocab, hardware, 1.0))["compute_s"])
    return at_one / compute_s


def calibrate(scape, bench, folder, rate, native=False):
    """The hardware description scape predict fits to a gloo bench-comm file (links only)."""
    name = f"{'native-' if native else ''}{rate}"
    out = os.path.join(folder, f"hardware-{name}.json")
    with open(os.path.join(folder, f"calibration-{name}.txt"), "w") as report:
        done = subprocess.run([scape, "predict", "--calibrate", bench, "--links-from-bench", "--out", out],
                              stdout=report, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RaceInputError(f"{bench}: scape predict --calibrate exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return out


def exposed_s(scape, arm, settings, vocab, hardware, peak):
    """scape predict's exposed communication of one arm's step; `hardware` is {"native": path,
    "scape": path} (or one path for both)."""
    link = hardware if isinstance(hardware, str) else hardware["native" if arm in NATIVE else "scape"]
    return float(predict_row(scape, prediction_config(arm, settings, vocab, link, peak))["exposed_comm_s"])


def forecast_steps(scape, race_by_rate, base_entry, hardware, vocab):
    """{rate: {arm: (forecast step s, exposed at the rate s)}}: the base rate's step less its
    exposed communication, plus the rate's (module docstring)."""
    plan_f, fastest = base_entry["plan"], base_entry["rate"]
    settings = plan_f["settings"]
    link = hardware[fastest] if isinstance(hardware[fastest], str) else hardware[fastest]["scape"]
    peak = peak_for_compute(scape, settings, vocab, link, compute_at(plan_f))
    out = {}
    base = {}
    for rate, entry in race_by_rate.items():
        if rate > fastest:
            raise RaceInputError(f"{entry['path']}: {rate:g} Mbit/s is faster than the base's {fastest:g}: the base "
                                 "is the fastest rate raced")
        out[rate] = {}
        for arm in entry["plan"]["arms"]:
            if arm not in plan_f["arms"]:
                raise RaceInputError(f"{base_entry['path']}: no {arm} in its plan, which the forecast of {arm} at "
                                     f"{rate:g} Mbit/s starts from")
            try:
                if arm not in base:
                    base[arm] = measured_step_at(plan_f, arm) - exposed_s(scape, arm, settings, vocab,
                                                                          hardware[fastest], peak)
                exposed = exposed_s(scape, arm, settings, vocab, hardware[rate], peak)
            except NotPredicted as e:
                print(f"netlab race forecast: {arm}: no step forecast ({e})", file=sys.stderr)
                out[rate][arm] = (None, None)
                continue
            out[rate][arm] = (base[arm] + exposed, exposed)
    return out


# ---------------------------------------------------------------- the simulator's loss

def sim_config(arm, settings, lr, steps, seed, corpus):
    """The `scape run` config of one arm's run: the race's model shape, data and schedule."""
    every = race_plan.SYNC_EVERY.get(arm, 1)
    interval = max(every, math.ceil(steps / settings["eval_points"] / every) * every)
    optimizer = dict(ARMS[arm], lr=lr, min_lr=0.1 * lr, warmup_steps=race_plan.warmup_steps(steps))
    return {"name": f"race-{arm}", "seed": seed, "workers": settings["nodes"], "steps": steps,
            "model": {"type": "gpt", "n_layer": settings["layers"], "n_head": N_HEAD, "n_embd": settings["width"],
                      "block_size": settings["block"], "vocab_size": 256},
            "data": {"type": "text", "path": corpus, "batch_size": settings["batch"], "val_fraction": 0.1},
            "optimizer": optimizer,
            # the race evaluates on 64 held-out sequences
            "eval": {"interval": interval, "batches": max(1, 64 // settings["batch"])},
            "log": {"flush_interval": 100}}


def sim_runs(race_by_rate, corpus, folder, seeds=None):
    """[(rate, arm, seed, path, config)] of every run the forecast needs: each arm at its chosen
    rate and planned count, on each seed the race ran it (those of them in `seeds`, if given)."""
    out = []
    for rate, entry in sorted(race_by_rate.items()):
        plan, rows = entry["plan"], entry["rows"]
        for arm, planned in plan["arms"].items():
            if arm not in ARMS:
                raise RaceInputError(f"{entry['path']}: arm {arm} has no core optimizer in the forecast")
            curves, lr = race.chosen_runs(rows, rate, arm, plan["settings"]["seeds"][0])
            for seed in sorted(s for s in curves if seeds is None or s in seeds):
                config = sim_config(arm, plan["settings"], lr, planned["steps"], seed, corpus)
                path = os.path.join(folder, "sim", plan["rate"], f"{arm}-lr{lr:g}-seed{seed}.h5")
                out.append((rate, arm, seed, path, config))
    return out


def completed(path, steps):
    from analysis.runs import load_run
    try:
        return os.path.exists(path) and load_run(path).steps_completed == steps
    except Exception:  # a killed run's file: run it again
        return False


def run_one(scape, path, config):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    config_path = path[:-len(".h5")] + ".json"
    with open(config_path, "w") as f:
        json.dump(config, f, indent=1)
    if os.path.exists(path):
        os.remove(path)
    with open(path[:-len(".h5")] + ".log", "w") as log:
        done = subprocess.run([scape, "run", config_path, "--out", path], stdout=log, stderr=subprocess.STDOUT,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
    if done.returncode != 0:
        raise RaceInputError(f"scape run {config_path} exited {done.returncode} (its log: {path[:-3]}.log)")


def run_all(scape, runs, jobs):
    """Runs the missing simulator runs, `jobs` at a time, saying how far it is."""
    missing = [r for r in runs if not completed(r[3], r[4]["steps"])]
    print(f"netlab race forecast: {len(runs) - len(missing)} simulator runs kept, {len(missing)} to run", file=sys.stderr)
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_one, scape, path, config): (rate, arm, seed) for rate, arm, seed, path, config in missing}
        for k, future in enumerate(concurrent.futures.as_completed(futures), start=1):
            future.result()
            rate, arm, seed = futures[future]
            print(f"netlab race forecast: simulator {k}/{len(missing)}: {arm} seed {seed} at {rate:g} Mbit/s "
                  f"({time.monotonic() - start:.0f} s)", file=sys.stderr)


def sim_curves(runs):
    """{(rate, arm): {seed: [(step, val loss)]}} of the simulator's runs."""
    from analysis.runs import load_run
    out = {}
    for rate, arm, seed, path, _ in runs:
        run = load_run(path)
        out.setdefault((rate, arm), {})[seed] = [(int(s), float(v)) for s, v in zip(run.eval_step, run.val_loss)]
    return out


# ---------------------------------------------------------------- the comparison

def spearman(xs, ys):
    """Spearman's rank correlation (average ranks for ties); None with fewer than 3 pairs or no spread."""
    if len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def _ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def sim_delta(curves, base):
    """The simulator's paired difference at the end: {seed: curve} minus DDP AdamW's {seed: curve}."""
    deltas = [c[-1][1] - base[s][-1][1] for s, c in sorted(curves.items()) if s in base]
    return race.t_interval(deltas) if deltas else None


def sim_time_to_target(curves, target, step_s):
    """(t interval of the seeds' seconds to the target, seeds reached): the first evaluation at or
    below it times the forecast step; None when any seed never reaches it."""
    hits = [next((s for s, v in c if v <= target), None) for c in curves.values()]
    reached = sum(h is not None for h in hits)
    if reached < len(hits):
        return None, reached
    return race.t_interval([h * step_s for h in hits]), reached


def compare(race_by_rate, steps, sims, margin, fastest):
    """{rate: (sim target, [one dict an arm])}: the race's figures beside the forecast's; the
    steps at `fastest` (the base's rate) are fitted."""
    out = {}
    for rate, entry in sorted(race_by_rate.items()):
        first_seed = entry["plan"]["settings"]["seeds"][0]
        _, measured = race.tables(entry["rows"], margin, first_seed, path=entry["path"])[rate]
        base = sims[(rate, BASELINE)]
        sim_target = statistics.fmean(c[-1][1] for c in base.values()) + margin
        lines = []
        for m in measured:
            arm = m["arm"]
            step, _ = steps[rate][arm]
            steps_iv, reached = sim_time_to_target(sims[(rate, arm)], sim_target, 1.0)
            time_iv = None if step is None or steps_iv is None else tuple(v if v is None else v * step for v in steps_iv)
            lines.append({"arm": arm, "lr": m["lr"], "steps": m["steps"], "step_measured": m["s_per_step"],
                          "step_forecast": step, "fitted": rate == fastest, "delta_race": m["delta_at_b"],
                          "delta_sim": None if arm == BASELINE else sim_delta(sims[(rate, arm)], base),
                          "time_race": m["time"], "reached_race": (m["reached"], len(m["seeds"])),
                          "time_sim": time_iv, "steps_sim": steps_iv, "reached_sim": (reached, len(sims[(rate, arm)])),
                          "loss_sim": race.t_interval([c[-1][1] for c in sims[(rate, arm)].values()]),
                          "loss_race": m["loss_at_b"]})
        out[rate] = (sim_target, lines)
    return out


# ---------------------------------------------------------------- output

def _cell(iv, digits=3, signed=False):
    return "–" if iv is None else race._interval(iv, digits, signed)


def _time(iv, reached, steps=None):
    if iv is None and steps is not None:  # reached, but scape predict gave no step to time it with
        return f"{steps[0]:.0f} steps (no step forecast)"
    return f"not reached ({reached[0]} of {reached[1]} seeds)" if iv is None else race._interval(iv, 1)


def markdown(result, margin):
    lines = []
    for rate, (sim_target, arms) in result.items():
        others = [a for a in arms if a["arm"] != BASELINE and a["delta_race"] and a["delta_sim"]]
        rho = spearman([a["delta_sim"][0] for a in others], [a["delta_race"][0] for a in others])
        errors = [abs(a["step_forecast"] / a["step_measured"] - 1) for a in arms
                  if not a["fitted"] and a["step_forecast"] is not None]
        fitted = arms and arms[0]["fitted"]
        lines += [f"**{rate:g} Mbit/s**: simulator's target = its DDP AdamW's loss at S + {margin:g} = {sim_target:.4f}; "
                  f"Spearman rho of the forecast's paired differences with the race's = "
                  f"{'–' if rho is None else f'{rho:+.2f}'} over {len(others)} arms; "
                  + ("steps fitted at this rate (the fastest raced)" if fitted else
                     f"step forecast off by {100 * statistics.fmean(errors):.0f}% on average over {len(errors)} "
                     f"arms (largest {100 * max(errors):.0f}%)"), "",
                  "| arm | lr | steps | s/step race | s/step forecast | loss race [95%] | loss simulator [95%] "
                  "| − DDP AdamW's, race [95%] | − DDP AdamW's, forecast [95%] | time to target s, race | "
                  "time to target s, forecast |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for a in arms:
            if a["step_forecast"] is None:
                step = "not predicted"
            else:
                step = f"{a['step_forecast']:.4f}" + (" (fitted)" if a["fitted"] else
                                                       f" ({100 * (a['step_forecast'] / a['step_measured'] - 1):+.0f}%)")
            lines.append(f"| {a['arm']} | {a['lr']:g} | {a['steps']:.0f} | {a['step_measured']:.4f} | {step} | "
                         f"{_cell(a['loss_race'])} | {_cell(a['loss_sim'])} | "
                         f"{_cell(None if a['arm'] == BASELINE else a['delta_race'], signed=True)} | "
                         f"{_cell(a['delta_sim'], signed=True)} | {_time(a['time_race'], a['reached_race'])} | "
                         f"{_time(a['time_sim'], a['reached_sim'], a['steps_sim'])} |")
        lines.append("")
    return "\n".join(lines)


def write_csv(result, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rate_mbit", "arm", "lr", "steps", "step_s_race", "step_s_forecast", "step_fitted",
                    "delta_race", "delta_race_lo", "delta_race_hi", "delta_forecast", "delta_forecast_lo",
                    "delta_forecast_hi", "time_s_race", "time_s_forecast"])
        for rate, (_, arms) in result.items():
            for a in arms:
                dr, ds = a["delta_race"] or (None,) * 3, a["delta_sim"] or (None,) * 3
                w.writerow([f"{rate:g}", a["arm"], f"{a['lr']:g}", f"{a['steps']:.0f}", f"{a['step_measured']:.6f}",
                            _num(a["step_forecast"]), int(a["fitted"]), *[_num(v) for v in dr], *[_num(v) for v in ds],
                            _num(a["time_race"] and a["time_race"][0]), _num(a["time_sim"] and a["time_sim"][0])])


def _num(value):
    return "" if value is None else f"{value:.6g}"


def arguments(argv=None):
    p = argparse.ArgumentParser(prog="scripts/netlab race forecast", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--race", nargs="+", required=True, help="race-*.csv files, each with its .plan.json beside it")
    p.add_argument("--base", help="the race at the fastest rate, whose step-time runs give each arm's compute and "
                   "optimizer time (default the fastest of --race); it may be another day's, of another corpus, "
                   "but must have run the same model (nodes, width, layers, batch, block)")
    p.add_argument("--seeds", help="comma-separated: the simulator's seeds (default every seed each arm raced)")
    p.add_argument("--links", required=True, help="the folder `scripts/netlab race links` wrote (gloo-RATE.h5)")
    p.add_argument("--out", required=True, help="folder of forecast.md, forecast.csv, the hardware files and sim/")
    p.add_argument("--corpus-root", default=str(ROOT), help="a checkout whose README.md and docs/*.md are the "
                   "race's corpus (the plan's sha256; default this one)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulator runs at once (default %(default)s)")
    p.add_argument("--target-margin", type=float, default=0.02, help="as the race's table (default %(default)s)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs: at least 1, got {args.jobs}")
    try:
        args.seeds = None if args.seeds is None else {int(s) for s in args.seeds.split(",")}
    except ValueError:
        p.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    return args


def main(argv=None):
    args = arguments(argv)
    try:
        scape = scape_binary()
        race_by_rate = load_race(args.race)
        base = base_race(race_by_rate, args.base)
        os.makedirs(args.out, exist_ok=True)
        corpus, vocab = corpus_file([e["plan"] for e in race_by_rate.values()], args.corpus_root, args.out)
        hardware = {}
        for rate, entry in {**race_by_rate, base["rate"]: base}.items():
            hardware[rate] = {}
            for native in (False, True):
                bench = race_links.bench_path(args.links, entry["plan"]["rate"], native)
                if not os.path.exists(bench):
                    raise RaceInputError(f"{bench}: missing (scripts/netlab race links --rate {entry['plan']['rate']} "
                                         f"--out {args.links})")
                hardware[rate]["native" if native else "scape"] = calibrate(scape, bench, args.out,
                                                                            entry["plan"]["rate"], native)
        steps = forecast_steps(scape, race_by_rate, base, hardware, vocab)
        runs = sim_runs(race_by_rate, corpus, args.out, args.seeds)
        run_all(scape, runs, args.jobs)
        result = compare(race_by_rate, steps, sim_curves(runs), args.target_margin, base["rate"])
    except RaceInputError as e:
        print(f"netlab race forecast: {e}", file=sys.stderr)
        return 2
    text = markdown(result, args.target_margin)
    print(text)
    pathlib.Path(args.out, "forecast.md").write_text(text)
    write_csv(result, os.path.join(args.out, "forecast.csv"))
    print(f"netlab race forecast: {args.out}/forecast.md, {args.out}/forecast.csv", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
