"""`scripts/netlab race tables CSV... [--target-margin 0.02] [--out DIR]`: the race's table and
figure (issue 60, docs/NETLAB.md "The race") from race-*.csv files (race_plan.COLUMNS); Debian's
python3, no root. Exit status 2, naming the file and column: a CSV that lacks a column, names an
unknown arm or has no DDP AdamW rows at a rate; naming the run: a run at an arm's chosen rate
with no evaluation within B or a non-finite loss there (diverged).

Per rate and arm, over the seeds run at the arm's chosen rate (the best of its grid on the
first seed, race_plan.best_lr):
  target          DDP AdamW's validation loss at B (the mean over its seeds of its last
                  evaluation within B) + the margin
  time to target  a seed's wall seconds at its first evaluation at or below the target within
                  B (no interpolation between evaluations, so it is late by up to one
                  evaluation interval; a run that overshot B does not reach it after B); "not
                  reached" when any seed never gets there (never extrapolated)
  interval        a Student t 95% interval over the seeds, mean ± t(0.975, n-1) s / sqrt(n);
                  none with one seed
  loss at B       the run's last evaluation within B of wall clock (its step count was planned
                  to fit B; a run that overshot, end / B above 1, is read at B, not at its end)
  − DDP AdamW's   the arm's loss at B minus DDP AdamW's on the same seed, mean and t interval
                  over the seeds both ran (negative: the arm ends lower at equal wall clock)
  end / B         the run's training wall time over B: how well the planned count fit B (a
                  machine whose load changed between the step-time run and the training shows
                  here; time to target is wall clock either way)
  steps, bytes    to target: the means over the seeds at that first evaluation (bytes a rank sent)
  s/step          the run's training wall time over its steps
  × DDP AdamW     DDP AdamW's mean time to target over the arm's
  − the lowest    below the table: the arm with the lowest mean loss at B, and every other arm's
                  loss at B minus its, paired by seed the same way (an interval that holds 0:
                  level with it), so the table says which arm wins a rate and by how much"""
import argparse
import math
import statistics
import sys
from pathlib import Path

from netlab import race_plan
from netlab.race_plan import BASELINE, RaceInputError

# Student t's 0.975 quantile by degrees of freedom (scipy.stats.t.ppf; beyond 30 the normal's 1.96
# is within 4%); a table, so the netlab's Python needs no scipy.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
        29: 2.045, 30: 2.042}


def t_interval(values):
    """(mean, low, high) of a Student t 95% interval; low = high = None for a single value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None, None
    half = T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def time_to_target(curve, target):
    """The first evaluation of a run (rows by step) at or below target within its budget B, or
    None: a run whose planned count overshot B does not reach the target after B."""
    last = at_budget(curve)
    if last is None:
        return None
    for r in curve:
        if r["val_loss"] <= target:
            return r
        if r is last:
            break
    return None


at_budget = race_plan.at_budget


def loss_at_b(curve, arm, rate, seed, lr):
    """The run's validation loss at B (at_budget); RaceInputError naming the run when there is
    none (no evaluation within B) or it is not finite (a diverged run): the table cannot
    average it, and leaving the seed out would report the others as if it had not run."""
    row = at_budget(curve)
    if row is None:
        raise RaceInputError(f"{arm} at {rate:g} Mbit/s, lr {lr:g}, seed {seed}: no evaluation within B (its first "
                             f"came at {curve[0]['wall_s']:g} s, B = {curve[0]['budget_s']:g} s)")
    if not math.isfinite(row["val_loss"]):
        raise RaceInputError(f"{arm} at {rate:g} Mbit/s, lr {lr:g}, seed {seed}: validation loss {row['val_loss']} at "
                             f"step {row['step']} (a diverged run) at the arm's chosen rate: rerun the seed or "
                             f"leave the arm out")
    return row["val_loss"]


def losses_at_b(rows, rate, arm, first_seed):
    """{seed: loss at B} of the arm's runs at its chosen rate."""
    curves, lr = chosen_runs(rows, rate, arm, first_seed)
    return {s: loss_at_b(c, arm, rate, s, lr) for s, c in curves.items()}


def chosen_runs(rows, rate, arm, first_seed):
    """The arm's curves at its chosen rate: {seed: rows by step}, and that rate."""
    lr = race_plan.best_lr(rows, rate, arm, first_seed)
    runs = race_plan.runs(rows)
    return {s: c for (r, a, s, l), c in runs.items() if (r, a, l) == (rate, arm, lr)}, lr


def target_at(rows, rate, margin, first_seed, path="the CSVs"):
    curves, _ = chosen_runs(rows, rate, BASELINE, first_seed)
    if not curves:
        raise RaceInputError(f"{path}: no {BASELINE} rows at {rate:g} Mbit/s (seed {first_seed}): the target is its loss")
    return statistics.fmean(losses_at_b(rows, rate, BASELINE, first_seed).values()) + margin


def summary(rows, rate, arm, target, first_seed, base_at_b):
    """One arm's line of the table at one rate (see the module's docstring); `base_at_b` is DDP
    AdamW's loss at B by seed, for the paired difference."""
    curves, lr = chosen_runs(rows, rate, arm, first_seed)
    if not curves:
        raise RaceInputError(f"{arm} at {rate:g} Mbit/s: no run on seed {first_seed}, the seed its rate is chosen on")
    at_b = losses_at_b(rows, rate, arm, first_seed)
    hits = {s: time_to_target(c, target) for s, c in curves.items()}
    reached = all(h is not None for h in hits.values())
    out = {"arm": arm, "lr": lr, "seeds": sorted(curves), "reached": sum(h is not None for h in hits.values()),
           "steps": statistics.fmean(c[-1]["planned_steps"] for c in curves.values()),
           "budget_s": next(iter(curves.values()))[-1]["budget_s"],
           "loss_at_b": t_interval(list(at_b.values())),
           "s_per_step": statistics.fmean(c[-1]["wall_s"] / c[-1]["step"] for c in curves.values()),
           "end_over_b": statistics.fmean(c[-1]["wall_s"] / c[-1]["budget_s"] for c in curves.values()),
           "at_b": at_b, "delta_at_b": paired_delta(at_b, base_at_b), "time": None, "steps_to": None, "bytes_to": None}
    if reached:
        out["time"] = t_interval([h["wall_s"] for h in hits.values()])
        out["steps_to"] = statistics.fmean(h["step"] for h in hits.values())
        out["bytes_to"] = statistics.fmean(h["bytes_sent"] for h in hits.values())
    return out


def tables(rows, margin, first_seed=1, path="the CSVs"):
    """{rate: (target, [arm summaries, DDP AdamW first])}, with each arm's ratio to DDP AdamW."""
    out = {}
    for rate in sorted({r["rate_mbit"] for r in rows}):
        target = target_at(rows, rate, margin, first_seed, path)
        arms = [BASELINE] + [a for a in dict.fromkeys(r["arm"] for r in rows if r["rate_mbit"] == rate) if a != BASELINE]
        base_at_b = losses_at_b(rows, rate, BASELINE, first_seed)
        lines = [summary(rows, rate, a, target, first_seed, base_at_b) for a in arms]
        base = lines[0]["time"]
        for line in lines:
            line["ratio"] = base[0] / line["time"][0] if base and line["time"] else None
        against_the_lowest(lines)
        out[rate] = (target, lines)
    return out


def against_the_lowest(lines):
    """Marks the arm with the lowest mean loss at B (`lowest`) and gives every arm its loss at B
    minus that arm's, paired by seed (`delta_to_lowest`; None without a common seed)."""
    lowest = min(lines, key=lambda line: line["loss_at_b"][0])
    for line in lines:
        line["lowest"] = line is lowest
        line["delta_to_lowest"] = None if line is lowest else paired_delta(line["at_b"], lowest["at_b"])


def paired_delta(at_b, base_at_b):
    """The arm's loss at B ({seed: loss}) minus another's (DDP AdamW's, or the lowest arm's) on
    the same seed, over the seeds both ran (mean and t interval): which arm ends lower at equal
    wall clock, free of the target's margin, and paired so that what a seed's data order does
    to both arms cancels. None without a common seed."""
    deltas = [loss - base_at_b[s] for s, loss in sorted(at_b.items()) if s in base_at_b]
    return t_interval(deltas) if deltas else None


def _interval(cell, digits, signed=False):
    mean, low, high = cell
    form = f"{'+' if signed else ''}.{digits}f"
    return f"{mean:{form}}" + (f" [{low:{form}}, {high:{form}}]" if low is not None else "")


def rates_tried(rows, rate, arm, first_seed):
    """[(lr, loss at B)] of the arm's runs on the first seed, by rate: its grid and any widening."""
    runs = race_plan.runs(rows)
    tried = [(lr, at_budget(c)) for (r, a, s, lr), c in runs.items() if (r, a, s) == (rate, arm, first_seed)]
    return sorted((lr, math.nan if row is None else row["val_loss"]) for lr, row in tried)


def markdown(result, margin, rows=None, first_seed=1):
    lines = []
    for rate, (target, arms) in result.items():
        budget = arms[0]["budget_s"]
        lines += [f"**{rate:g} Mbit/s**: B = {budget:.1f} s; target = DDP AdamW's loss at B + {margin:g} = {target:.4f}",
                  "", "| arm | lr | seeds | steps | s/step | end / B | loss at B [95%] | − DDP AdamW's, paired [95%] "
                  "| time to target s [95%] | × DDP AdamW | steps to target | MB to target |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for a in arms:
            if a["time"]:
                time, steps, mb = _interval(a["time"], 1), f"{a['steps_to']:.0f}", f"{a['bytes_to'] / 1e6:.2f}"
            else:
                time, steps, mb = f"not reached ({a['reached']} of {len(a['seeds'])} seeds)", "–", "–"
            ratio = f"{a['ratio']:.2f}" if a["ratio"] else "–"
            delta = "–" if a["arm"] == BASELINE or not a["delta_at_b"] else _interval(a["delta_at_b"], 4, signed=True)
            lines.append(f"| {a['arm']} | {a['lr']:g} | {len(a['seeds'])} | {a['steps']:.0f} | {a['s_per_step']:.4f} | {a['end_over_b']:.2f} | "
                         f"{_interval(a['loss_at_b'], 4)} | {delta} | {time} | {ratio} | {steps} | {mb} |")
        lines += ["", ranking_line(arms), ""]
        if rows is not None:
            lines += [f"Learning rates tried on seed {first_seed} (loss at B; the chosen one, the lowest, in bold):",
                      "", "| arm | rates tried |", "|---|---|"]
            for a in arms:
                tried = [f"**{lr:g}: {loss:.4f}**" if lr == a["lr"] else f"{lr:g}: {loss:.4f}"
                         for lr, loss in rates_tried(rows, rate, a["arm"], first_seed)]
                lines.append(f"| {a['arm']} | {', '.join(tried)} |")
            lines.append("")
    return "\n".join(lines)


def ranking_line(arms):
    """The arm lowest at B and the others' paired distance to it, nearest first."""
    lowest = next(a for a in arms if a["lowest"])
    others = sorted((a for a in arms if not a["lowest"] and a["delta_to_lowest"]), key=lambda a: a["delta_to_lowest"][0])
    level = [a["arm"] for a in others if a["delta_to_lowest"][1] is not None
             and a["delta_to_lowest"][1] <= 0 <= a["delta_to_lowest"][2]]
    lower = [a["arm"] for a in others if a["delta_to_lowest"][0] < 0]
    one_seed = [a["arm"] for a in others if a["delta_to_lowest"][1] is None]
    text = (f"Lowest loss at B: **{lowest['arm']}** ({lowest['loss_at_b'][0]:.4f}); each other arm's loss at B "
            f"minus its, paired by seed [95%]: "
            + ", ".join(f"{a['arm']} {_interval(a['delta_to_lowest'], 4, signed=True)}" for a in others) + ". ")
    if lower:
        return text + (f"On the seeds they share, {', '.join(lower)} end(s) lower than it (the arms ran different "
                       f"seeds, and its mean is over its own): no winner is claimed.")
    if one_seed:
        return text + f"One common seed, no interval, so no winner is claimed: {', '.join(one_seed)}."
    if level:
        return text + f"Level with it (the interval holds 0): {', '.join(level)}."
    return text + "No other arm's interval holds 0: it wins the rate."


def figure(rows, result, first_seed, path):
    """Validation loss against wall clock, every arm's seeds at its chosen rate, one panel a rate."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(result), figsize=(7 * len(result), 5), squeeze=False)
    for ax, (rate, (target, arms)) in zip(axes[0], result.items()):
        for i, a in enumerate(arms):
            curves, _ = chosen_runs(rows, rate, a["arm"], first_seed)
            for k, curve in enumerate(curves.values()):
                ax.plot([r["wall_s"] for r in curve], [r["val_loss"] for r in curve], color=f"C{i % 10}",
                        linestyle="-" if i < 10 else "--", label=a["arm"] if k == 0 else None)
        ax.axhline(target, color="black", linestyle=":", label="target")
        ax.axvline(arms[0]["budget_s"], color="grey", linestyle=":", label="B")
        ax.set(title=f"{rate:g} Mbit/s", xlabel="wall clock, s (training only)", ylabel="validation loss")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def arguments(argv):
    p = argparse.ArgumentParser(prog="scripts/netlab race tables", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="+", help="race-*.csv files")
    p.add_argument("--target-margin", type=float, default=0.02, help="added to DDP AdamW's loss at B")
    p.add_argument("--first-seed", type=int, default=1, help="the seed the grid ran on")
    p.add_argument("--out", help="folder for race.md and race.png (else the table is only printed)")
    return p.parse_args(argv)


def main(argv=None):
    args = arguments(argv)
    try:
        rows = [r for path in args.csv for r in race_plan.read(path)]
        if not rows:
            raise RaceInputError(f"{', '.join(args.csv)}: no rows")
        result = tables(rows, args.target_margin, args.first_seed, path=", ".join(args.csv))
    except RaceInputError as e:
        print(f"netlab race tables: {e}", file=sys.stderr)
        return 2
    text = markdown(result, args.target_margin, rows, args.first_seed)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "race.md").write_text(text)
        figure(rows, result, args.first_seed, Path(args.out) / "race.png")
        print(f"netlab race tables: {args.out}/race.md, {args.out}/race.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
