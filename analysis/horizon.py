"""The report's "Horizon" section: the gap to the reference against the number of steps.

Problems that agree on every setting outside `optimizer.*` except the horizon (`steps`, and the
`eval.interval` that follows it) form one horizon study. In it, an arm's *curve* joins its arms at
the different horizons: arms equal in every other setting, with the warm-ups (`warmup_steps`,
`density_warmup`) either the same number of steps at every horizon or the same fraction of
the steps (a protocol whose warm-ups scale with the run). Per curve and horizon, at the arm's
best lr:

- updates per coordinate: the run's recorded `mask_density` summed over its steps (so a density
  warm-up counts), the mean number of steps a coordinate is updated; steps · (1 − sparsity)
  where the file lacks it, steps for the dense optimizers;
- the paired difference from the reference at that horizon (analysis/stats.py);
- each seed's steps to the problem's target loss (the first evaluation at or below it), and
  their ratio to the reference's steps on the same seed, with the number of pairs.

Within each longer horizon's runs, the same steps are counted to the reference's mean final
validation loss at every shorter horizon: how many steps an arm needs for the loss dense reached
in fewer, the "steps to reach dense's loss" of the horizon question. Steps are known only at
evaluations, so the tables give that resolution.
"""

import math
from collections import defaultdict

import numpy as np

from .runs import SPARSE_TYPES
from .stats import first_step_at_or_below, interval

HORIZON_KEYS = ("steps", "eval.interval")
SCALED_KEYS = ("optimizer.warmup_steps", "optimizer.density_warmup")


def density(config):
    """The fraction of coordinates an arm updates a step: 1 − sparsity for the sparse optimizers."""
    if config.get("optimizer.type") in SPARSE_TYPES:
        return 1.0 - float(config.get("optimizer.sparsity", 0.0))
    return 1.0


def updates_per_coordinate(arm):
    """Mean over the best lr's completed seeds of the summed mask density; steps × density
    where a run has no finite mask_density (dense optimizers, older files)."""
    steps = arm.config["steps"]
    totals = []
    for run in arm.runs.get(arm.best_lr, {}).values():
        if run.status != "completed":
            continue
        series = run.metric("mask_density")
        finite = series[np.isfinite(series)]
        totals.append(float(finite.sum()) if finite.size == len(series) and finite.size else steps * density(arm.config))
    return float(np.mean(totals)) if totals else steps * density(arm.config)


def steps_to_loss(arm, target):
    """{seed: steps to `target`} of the completed runs at the arm's best lr (inf: never reached)."""
    out = {}
    for seed, run in arm.runs.get(arm.best_lr, {}).items():
        steps = first_step_at_or_below(run, target) if run.status == "completed" else math.nan
        if not math.isnan(steps):
            out[seed] = steps
    return out


def ratio_text(mine, ref_steps):
    """'0.67 [0.60, 0.74] (n=3)' over the seeds both reached it; who never reached it otherwise."""
    never = sum(1 for v in mine.values() if math.isinf(v))
    if never:
        return f"not reached by {never}/{len(mine)} seeds"
    ratios = [mine[s] / ref_steps[s] for s in sorted(mine)
              if s in ref_steps and math.isfinite(ref_steps[s]) and ref_steps[s] > 0]
    if not ratios:
        return "—"
    iv = interval(ratios)
    return f"{iv.mean:.2f}" + (f" [{iv.lo:.2f}, {iv.hi:.2f}]" if iv.n > 1 else "") + f" (n={iv.n})"


def _seed_steps(values):
    if not values:
        return "—"
    return ", ".join("never" if math.isinf(values[s]) else f"{values[s]:.0f}" for s in sorted(values))


def _escape(label):
    return label.replace("|", "\\|")


def _steps(problem):
    return problem.arms[0].config["steps"]


def _shared_settings(problem):
    """A problem's settings outside optimizer.* without the horizon: what its horizons share."""
    return {k: v for k, v in problem.arms[0].config.items() if not k.startswith("optimizer.") and k not in HORIZON_KEYS}


def _study_key(problem):
    return tuple(sorted((k, repr(v)) for k, v in _shared_settings(problem).items()))


def study_titles(found):
    """A heading per study: the settings in which the studies differ (none for a single study)."""
    if len(found) < 2:
        return [""] * len(found)
    configs = [_shared_settings(st[0]) for st in found]
    keys = sorted({k for c in configs for k in c if len({repr(d.get(k)) for d in configs}) > 1})
    return [", ".join(f"{k}={c.get(k)}" for k in keys) for c in configs]


def studies(problems):
    """[(problems sorted by steps)] for every group of problems with two or more horizons."""
    groups = defaultdict(list)
    for p in problems:
        if p.arms and "steps" in p.arms[0].config:
            groups[_study_key(p)].append(p)
    out = []
    for members in groups.values():
        members.sort(key=_steps)
        if len({_steps(p) for p in members}) > 1:
            out.append(members)
    return out


def curves(study):
    """[(label, [(problem, arm), ...] by steps)]: each arm's run across the horizons."""
    coarse = defaultdict(list)  # settings but the horizon and the warm-ups -> [(problem, arm)]
    for problem in study:
        for arm in problem.arms:
            key = tuple(sorted((k, repr(v)) for k, v in arm.config.items() if k not in HORIZON_KEYS + SCALED_KEYS))
            coarse[key].append((problem, arm))
    out, seen = [], set()
    for members in coarse.values():
        rules = defaultdict(dict)  # (kind, warm-up values) -> {steps: (problem, arm)}
        for problem, arm in members:
            steps = _steps(problem)
            values = tuple(arm.config.get(k) for k in SCALED_KEYS)
            fractions = tuple(None if v is None else round(v / steps, 9) for v in values)
            rules[("steps", values)].setdefault(steps, (problem, arm))
            rules[("fraction", fractions)].setdefault(steps, (problem, arm))
        for (kind, _), by_steps in rules.items():
            chain = [by_steps[s] for s in sorted(by_steps)]
            ids = tuple(id(arm) for _, arm in chain)
            if len(chain) < 2 or ids in seen:
                continue
            seen.add(ids)
            label = chain[-1][1].label
            if kind == "fraction" and len({tuple(a.config.get(k) for k in SCALED_KEYS) for _, a in chain}) > 1:
                label += " (warm-ups ∝ steps)"
            out.append((label, chain))
    return out


def rows_of(study):
    """One row per curve and horizon: a dict of the section's figures."""
    rows = []
    ref_steps = {id(p): steps_to_loss(p.reference, p.target) if p.reference else {} for p in study}
    for label, chain in curves(study):
        for problem, arm in chain:
            ref = problem.reference
            mine = steps_to_loss(arm, problem.target)
            rows.append({
                "arm": label, "steps": _steps(problem), "updates": updates_per_coordinate(arm), "best_lr": arm.best_lr,
                "final": arm.final, "delta": None if arm is ref else arm.delta, "reference": arm is ref,
                "target": problem.target, "steps_to_target": mine,
                "ratio": "reference" if arm is ref else ratio_text(mine, ref_steps[id(problem)]),
            })
    return rows


def _num(x, spec):
    return "—" if x is None or not math.isfinite(x) else format(x, spec)


def _delta_cells(r):
    if r["reference"]:
        return "reference", ""
    delta = r["delta"]
    if delta is None or delta.n == 0:
        return "—", ""
    return f"{delta.mean:+.3f} (n={delta.n})", (f"[{delta.lo:+.3f}, {delta.hi:+.3f}]" if delta.n > 1 else "—")


def shorter_horizon_lines(study):
    """The table of steps to each shorter horizon's reference final val loss, within the longer runs."""
    lines = []
    for i, longer in enumerate(study):
        ref = longer.reference
        if ref is None:
            continue
        for shorter in study[:i]:
            sref = shorter.reference
            if sref is None or sref.final is None or sref.final.n == 0 or sref.loss_on != "val":
                continue
            target = sref.final.mean
            if not lines:
                lines = ["| within the runs of | evaluated every | to the loss of | loss | arm | steps (per seed) | "
                         "steps vs reference |", "|---|---|---|---|---|---|---|"]
            ref_steps = steps_to_loss(ref, target)
            every = longer.arms[0].config.get("eval.interval", "")
            for arm in longer.arms:
                mine = steps_to_loss(arm, target)
                ratio = "reference" if arm is ref else ratio_text(mine, ref_steps)
                lines.append(f"| {_steps(longer)} steps | {every} steps | {_escape(sref.label)} at "
                             f"{_steps(shorter)} steps | {target:.4f} | {_escape(arm.label)} | {_seed_steps(mine)} | {ratio} |")
    return lines + [""] if lines else []


def markdown_section(problems):
    """The section's lines; [] when no study has two horizons."""
    found = studies(problems)
    if not found:
        return []
    lines = ["## Horizon: the gap against steps and updates per coordinate", "",
             "Each arm at its best lr at each horizon; updates per coordinate: the recorded mask density",
             "summed over the steps (steps × (1 − sparsity) without it); Δ paired by seed with the reference",
             "at the same horizon (mean [95% t-interval]); steps to the horizon's target loss per seed (first",
             "evaluation at or below it: known to the evaluation interval), and their ratio to the reference's",
             "on the same seed.", ""]
    for study, title in zip(found, study_titles(found)):
        lines += ([f"### {title}", ""] if title else []) + [
                  "| arm | steps | updates per coordinate | best lr | final loss | Δ vs reference | Δ 95% interval | "
                  "target | steps to target (per seed) | steps vs reference |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows_of(study):
            dtext, div = _delta_cells(r)
            final = r["final"]
            lines.append(f"| {_escape(r['arm'])} | {r['steps']} | {r['updates']:.0f} | {_num(r['best_lr'], 'g')} | "
                         f"{_num(final.mean if final else None, '.4f')} | {dtext} | {div} | "
                         f"{_num(r['target'], '.4f')} | {_seed_steps(r['steps_to_target'])} | {r['ratio']} |")
        lines.append("")
        lines += shorter_horizon_lines(study)
    return lines


def draw(problems, path):
    """horizon.png: Δ against updates per coordinate and against steps, one line per curve with
    its 95% interval; False when there is nothing to draw."""
    found = studies(problems)
    series = []
    for study, title in zip(found, study_titles(found)):
        prefix = f"{title}: " if title else ""
        by_curve = defaultdict(list)
        for r in rows_of(study):
            if not r["reference"] and r["delta"] is not None and r["delta"].n > 0:
                by_curve[prefix + r["arm"]].append(r)
        series += list(by_curve.items())
    if not series:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, rs in series:
        for ax, key in zip(axes, ("updates", "steps")):
            d = [r["delta"] for r in rs]
            err = [[x.mean - x.lo if x.n > 1 else 0 for x in d], [x.hi - x.mean if x.n > 1 else 0 for x in d]]
            ax.errorbar([r[key] for r in rs], [x.mean for x in d], yerr=err, marker="o", capsize=3, label=label)
    for ax, title in zip(axes, ("updates per coordinate", "steps")):
        ax.set_xscale("log")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xlabel(title)
        ax.set_ylabel("final loss − reference's (paired)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Gap to the reference against the horizon (95% intervals over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
