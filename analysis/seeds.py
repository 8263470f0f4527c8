"""The report's "Seeds and learning rates" section: its Markdown tables and seeds.csv.

The statistics themselves (arms, problems, Student-t intervals, best lr, paired differences,
tokens to target) are computed in analysis/stats.py; their names stay importable from here.
"""

import math

import numpy as np

from .stats import (  # noqa: F401  (re-exported: code and tests import these from analysis.seeds)
    CONFIDENCE, DEFAULT_REFERENCE, DEFAULT_TARGET_MARGIN, Arm, Interval, Problem, build_problems, choose_best_lr,
    fill_tokens, final_loss, interval, pair_with, parse_reference, t_critical, tokens_per_step, tokens_to_target)


def tokens_text(arm):
    """'1.23e+05 ± 4.5e+03' over the seeds, or what kept it from being one."""
    values = [v for v in arm.tokens.values() if not math.isnan(v)]
    if not values:
        return "—"
    never = sum(1 for v in values if math.isinf(v))
    if never:
        return f"not reached by {never}/{len(values)} seeds"
    iv = interval(values)
    return f"{iv.mean:.3g}" + (f" ± {iv.half_width:.2g}" if iv.n > 1 else "")


# ---- the summary section and seeds.csv --------------------------------------------------------

def _num(value, spec):
    return "—" if value is None or not math.isfinite(value) else f"{value:{spec}}"


def _interval_text(iv, spec=".4f"):
    if iv is None or iv.n < 2:
        return "—"
    return f"[{iv.lo:{spec}}, {iv.hi:{spec}}]"


SECTION_HEADER = ["arm", "seeds", "lrs tried", "best lr", "final loss mean", "std", "95% interval",
                  "Δ vs reference (paired)", "Δ 95% interval", "tokens to target", "notes"]


def arm_cells(arm, problem):
    """One row of a problem's table (the order of SECTION_HEADER)."""
    final = arm.final
    if arm is problem.reference:
        delta, delta_iv = "reference", ""
    elif arm.delta is not None and arm.delta.n:
        delta = f"{arm.delta.mean:+.4f} (n={arm.delta_pairs})"
        delta_iv = _interval_text(arm.delta, "+.4f")
    else:
        delta, delta_iv = "—", "—"
    return [arm.label, str(final.n if final else 0), ", ".join(f"{lr:g}" for lr in arm.lrs),
            _num(arm.best_lr, "g"), _num(final.mean if final else math.nan, ".4f"),
            _num(final.std if final else math.nan, ".4f"), _interval_text(final), delta, delta_iv,
            tokens_text(arm), "; ".join(arm.notes)]


def lr_table(problem):
    """Mean final loss (n seeds) of every arm at every lr tried in the problem."""
    lrs = sorted({lr for arm in problem.arms for lr in arm.lrs})
    lines = ["| arm | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |", "|---|" + "---|" * len(lrs)]
    for arm in problem.arms:
        cells = []
        for lr in lrs:
            iv = arm.at_lr.get(lr)
            if iv is None:
                cells.append("")
                continue
            text = f"{_num(iv.mean, '.4f')} (n={iv.n})"
            if arm.diverged.get(lr):
                text += f", diverged: seed {', '.join(map(str, arm.diverged[lr]))}"
            cells.append(f"**{text}**" if lr == arm.best_lr else text)
        lines.append("| " + " | ".join([arm.label.replace("|", "\\|")] + cells) + " |")
    return "\n".join(lines)


def markdown_section(problems, reference):
    """The "Seeds and learning rates" section of summary.md."""
    out = ["## Seeds and learning rates", "",
           "Runs equal but for `seed` and `optimizer.lr` form an arm. *best lr*: the lowest mean final loss",
           "over the seeds every lr ran (final validation loss on the held-out split; the mean train loss of",
           "the last steps for models without validation) among the lrs no seed diverged at (a NaN/Inf, or a",
           "loss that ended above its first train loss; bold below). At the best lr: mean, standard",
           f"deviation (n−1) and {CONFIDENCE:.0%} Student-t interval over seeds; *Δ vs reference*: the paired",
           f"difference arm − reference (`{reference}`, at its best lr) over the seeds both ran, with its",
           "own interval; *tokens to target*: training tokens (workers × batch × block) at the first evaluation",
           "at or below the target validation loss, mean ± half-width of the interval over seeds.", ""]
    for problem in problems:
        target = (f"Target validation loss {problem.target:.4f} ({problem.target_from})."
                  if math.isfinite(problem.target) else "No target validation loss (no reference with validation).")
        out += [f"### {problem.label}", "", target] + [f"Note: {n}." for n in problem.notes] + [""]
        out += ["| " + " | ".join(SECTION_HEADER) + " |", "|" + "---|" * len(SECTION_HEADER)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in arm_cells(a, problem)) + " |" for a in problem.arms]
        out += ["", "Mean final loss at each lr (n seeds; best in bold):", "", lr_table(problem), ""]
    return "\n".join(out)


def write_seeds_csv(problems, path):
    """seeds.csv: one row per arm at full precision."""
    import csv

    fields = ["problem", "arm", "loss_on", "lrs", "best_lr", "n", "mean", "std", "lo", "hi", "delta_n",
              "delta_mean", "delta_std", "delta_lo", "delta_hi", "target", "tokens_mean", "tokens_never", "notes"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for p in problems:
            for a in p.arms:
                fin = a.final or interval([])
                d = a.delta or interval([])
                tok = [v for v in a.tokens.values() if not math.isnan(v)]
                reached = [v for v in tok if math.isfinite(v)]
                w.writerow([p.label, a.label, a.loss_on, " ".join(f"{lr!r}" for lr in a.lrs), a.best_lr, fin.n,
                            fin.mean, fin.std, fin.lo, fin.hi, d.n, d.mean, d.std, d.lo, d.hi, p.target,
                            float(np.mean(reached)) if reached else math.nan, len(tok) - len(reached),
                            "; ".join(a.notes)])
