"""The report's "Horizon" section: the gap to the reference against the number of steps.

Problems that agree on every setting outside `optimizer.*` except the horizon (`steps`, and the
`eval.interval` that follows it) form one horizon study; in it, arms with the same label at
different horizons are one arm's curve. Per arm and horizon, at the arm's best lr:

    updates per coordinate ≈ steps · density,   density = 1 − optimizer.sparsity for the
                                                 sparse optimizers, 1 for the dense ones

(the mean number of steps a coordinate is selected; SCAPE's dense norms and biases are more),
the paired difference from the reference at that horizon (analysis/stats.py), and each seed's
steps to the problem's target loss: the first evaluation at or below it, `tokens / tokens per
step`, with its ratio to the reference's steps on the same seed. A seed that never reaches the
target is reported as such.

Within each longer horizon's runs, the same steps are counted to the reference's mean final loss
at every shorter horizon: how many steps an arm needs for the loss dense reached in fewer, the
"steps to reach dense's loss" of the horizon question.
"""

import math
from collections import defaultdict

from .stats import interval, tokens_per_step, tokens_to_target

HORIZON_KEYS = ("steps", "eval.interval")
SPARSE_TYPES = ("scape", "topk_ef", "randk_ef")


def density(config):
    """The fraction of coordinates an arm updates a step: 1 − sparsity for the sparse optimizers."""
    if config.get("optimizer.type") in SPARSE_TYPES:
        return 1.0 - float(config.get("optimizer.sparsity", 0.0))
    return 1.0


def _study_key(problem):
    """What a problem's horizons share: its settings outside optimizer.* without the horizon."""
    config = problem.arms[0].config
    return tuple(sorted((k, repr(v)) for k, v in config.items()
                        if not k.startswith("optimizer.") and k not in HORIZON_KEYS))


def steps_to_target(arm):
    """{seed: steps to the target} at the arm's best lr (inf: never reached)."""
    out = {}
    runs = arm.runs.get(arm.best_lr, {})
    for seed, tokens in arm.tokens.items():
        run = runs.get(seed)
        per_step = tokens_per_step(run) if run is not None else math.nan
        if math.isfinite(per_step) and per_step > 0 and not math.isnan(tokens):
            out[seed] = tokens / per_step
    return out


def steps_to_loss(arm, target):
    """{seed: steps to `target`} at the arm's best lr, counted afresh (inf: never reached)."""
    out = {}
    for seed, run in arm.runs.get(arm.best_lr, {}).items():
        per_step = tokens_per_step(run)
        tokens = tokens_to_target(run, target)
        if run.status == "completed" and math.isfinite(per_step) and per_step > 0 and not math.isnan(tokens):
            out[seed] = tokens / per_step
    return out


def _ratio_text(mine, ref_steps):
    never = sum(1 for v in mine.values() if math.isinf(v))
    if never:
        return f"not reached by {never}/{len(mine)} seeds"
    ratios = [mine[s] / ref_steps[s] for s in mine if s in ref_steps and math.isfinite(ref_steps[s]) and ref_steps[s] > 0]
    if not ratios:
        return "—"
    iv = interval(ratios)
    return f"{iv.mean:.2f}" + (f" [{iv.lo:.2f}, {iv.hi:.2f}]" if iv.n > 1 else "")


def shorter_horizon_lines(study):
    """The table of steps to each shorter horizon's reference final loss, within the longer runs."""
    lines = []
    for i, longer in enumerate(study):
        ref = longer.reference
        if ref is None:
            continue
        for shorter in study[:i]:
            if shorter.reference is None or shorter.reference.final is None or shorter.reference.final.n == 0:
                continue
            target = shorter.reference.final.mean
            if not lines:
                lines = ["| within the runs of | to the loss of | loss | arm | steps (per seed) | steps vs reference |",
                         "|---|---|---|---|---|---|"]
            ref_steps = steps_to_loss(ref, target)
            for arm in longer.arms:
                mine = steps_to_loss(arm, target)
                label = arm.label.replace("|", "\\|")
                ratio = "reference" if arm is ref else _ratio_text(mine, ref_steps)
                lines.append(f"| {longer.arms[0].config['steps']} steps | {ref.label.replace('|', '')} at "
                             f"{shorter.arms[0].config['steps']} steps | {target:.4f} | {label} | "
                             f"{_seed_steps(mine)} | {ratio} |")
    return lines + [""] if lines else []


def studies(problems):
    """[(problems sorted by steps)] for every group of problems with two or more horizons."""
    groups = defaultdict(list)
    for p in problems:
        if p.arms and "steps" in p.arms[0].config:
            groups[_study_key(p)].append(p)
    out = []
    for members in groups.values():
        members.sort(key=lambda p: p.arms[0].config["steps"])
        if len({p.arms[0].config["steps"] for p in members}) > 1:
            out.append(members)
    return out


def rows_of(study):
    """One row per arm and horizon: a dict of the section's figures."""
    rows = []
    for problem in study:
        ref = problem.reference
        ref_steps = steps_to_target(ref) if ref is not None else {}
        for arm in problem.arms:
            steps = arm.config["steps"]
            mine = steps_to_target(arm)
            ratios = [mine[s] / ref_steps[s] for s in mine
                      if s in ref_steps and math.isfinite(mine[s]) and math.isfinite(ref_steps[s]) and ref_steps[s] > 0]
            rows.append({
                "arm": arm.label, "steps": steps, "updates": steps * density(arm.config), "best_lr": arm.best_lr,
                "final": arm.final, "delta": None if arm is ref else arm.delta, "reference": arm is ref,
                "target": problem.target, "steps_to_target": mine,
                "never": sum(1 for v in mine.values() if math.isinf(v)),
                "ratio": interval(ratios) if ratios and not any(math.isinf(v) for v in mine.values()) else None,
            })
    return rows


def _num(x, spec):
    return "—" if x is None or not math.isfinite(x) else format(x, spec)


def _seed_steps(values):
    if not values:
        return "—"
    return ", ".join("never" if math.isinf(values[s]) else f"{values[s]:.0f}" for s in sorted(values))


def markdown_section(problems):
    """The section's lines; [] when no study has two horizons."""
    found = studies(problems)
    if not found:
        return []
    lines = ["## Horizon: the gap against steps and updates per coordinate", "",
             "Each arm at its best lr at each horizon; updates per coordinate ≈ steps × (1 − sparsity);",
             "Δ paired by seed with the reference at the same horizon (mean [95% t-interval]); steps to the",
             "horizon's target loss per seed (first evaluation at or below it), and their ratio to the",
             "reference's on the same seed.", ""]
    for study in found:
        lines += ["| arm | steps | updates per coordinate | best lr | final loss | Δ vs reference | Δ 95% interval | "
                  "target | steps to target (per seed) | steps vs reference |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows_of(study):
            final = r["final"]
            delta = r["delta"]
            if r["reference"]:
                dtext, div = "reference", ""
            elif delta is None or delta.n == 0:
                dtext, div = "—", ""
            else:
                dtext = f"{delta.mean:+.3f} (n={delta.n})"
                div = f"[{delta.lo:+.3f}, {delta.hi:+.3f}]" if delta.n > 1 else "—"
            if r["reference"]:
                ratio = "reference"
            elif r["never"]:
                ratio = f"not reached by {r['never']}/{len(r['steps_to_target'])} seeds"
            elif r["ratio"] is None:
                ratio = "—"
            else:
                iv = r["ratio"]
                ratio = f"{iv.mean:.2f}" + (f" [{iv.lo:.2f}, {iv.hi:.2f}]" if iv.n > 1 else "")
            label = r["arm"].replace("|", "\\|")
            lines.append(f"| {label} | {r['steps']} | {r['updates']:.0f} | {_num(r['best_lr'], 'g')} | "
                         f"{_num(final.mean if final else None, '.4f')} | {dtext} | {div} | "
                         f"{_num(r['target'], '.4f')} | {_seed_steps(r['steps_to_target'])} | {ratio} |")
        lines.append("")
        lines += shorter_horizon_lines(study)
    return lines


def draw(problems, path):
    """horizon.png: Δ against updates per coordinate and against steps, one line per arm with its
    95% interval; False when there is nothing to draw."""
    found = studies(problems)
    if not found:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for study in found:
        by_arm = defaultdict(list)
        for r in rows_of(study):
            if not r["reference"] and r["delta"] is not None and r["delta"].n > 0:
                by_arm[r["arm"]].append(r)
        for label, rs in by_arm.items():
            for ax, key in zip(axes, ("updates", "steps")):
                x = [r[key] for r in rs]
                y = [r["delta"].mean for r in rs]
                err = [[r["delta"].mean - r["delta"].lo if r["delta"].n > 1 else 0 for r in rs],
                       [r["delta"].hi - r["delta"].mean if r["delta"].n > 1 else 0 for r in rs]]
                ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)
    for ax, title in zip(axes, ("updates per coordinate (≈ steps × density)", "steps")):
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
