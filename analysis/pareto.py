"""The equal-bytes comparison: loss against mean bytes sent per worker per step, and its Pareto front.

Every completed run of a report is one observation. Runs whose settings differ only in `seed` are
one *point*: the mean over their seeds of the final loss (the last validation loss; the mean train
loss of the last steps for models without validation) and of the mean bytes sent per worker per
step, with the spread over seeds kept for error bars. A point is on the *front* when no other point
has both fewer (or equal) bytes and a lower (or equal) loss, one of them strictly.

Tokens-to-target: the training tokens (workers x batch_size x block_size per step) until the first
evaluation whose validation loss is at most the target. The default target is the loosest one
every point reaches: the largest, over points, of the best validation loss averaged over seeds.
A point whose seeds do not all reach the target has no tokens-to-target.
"""

import csv
import math
from dataclasses import dataclass, field

import numpy as np

from .runs import effective_config


@dataclass
class Point:
    """One setting of the comparison, averaged over its seeds."""

    label: str
    optimizer_type: str
    bytes_per_step: float
    loss: float
    loss_min: float
    loss_max: float
    loss_kind: str  # "val" or "train"
    best_val: float = math.nan
    tokens_to_target: float = math.nan
    files: list = field(default_factory=list)
    on_front: bool = False
    members: list = field(default_factory=list, repr=False)  # the report rows, one per seed


def pareto_front(xs, ys):
    """Indices of the non-dominated (x, y) pairs, lower is better in both, ordered by x.

    A pair is dominated when another has x' <= x and y' <= y with one of them strictly smaller.
    Pairs with a NaN are never on the front; equal pairs are both on it.
    """
    pts = [(x, y, i) for i, (x, y) in enumerate(zip(xs, ys)) if math.isfinite(x) and math.isfinite(y)]
    front = []
    for x, y, i in pts:
        dominated = any(x2 <= x and y2 <= y and (x2 < x or y2 < y) for x2, y2, _ in pts)
        if not dominated:
            front.append((x, y, i))
    return [i for _, _, i in sorted(front)]


def tokens_per_step(config):
    """Training tokens one step consumes over all workers (NaN unless the model is a GPT)."""
    model, data = config.get("model", {}), config.get("data", {})
    if model.get("type") != "gpt":
        return math.nan
    return float(config.get("workers", 1) * data.get("batch_size", 0) * model.get("block_size", 0))


def tokens_to_target(run, target):
    """Tokens until the first evaluation with validation loss <= target (NaN when never reached)."""
    if not math.isfinite(target) or len(run.val_loss) == 0:
        return math.nan
    reached = np.nonzero(np.asarray(run.val_loss) <= target)[0]
    if reached.size == 0:
        return math.nan
    return float(run.eval_step[reached[0]]) * tokens_per_step(run.config)


def _setting_key(config):
    """The settings that make a point: everything but the seed."""
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k != "seed"))


def _labels(keys):
    """A short label per key: the optimizer type, then the settings that vary between the points
    of that type (keys a point lacks, such as another type's switches, are left out)."""
    dicts = {key: {k: v.strip("'") for k, v in key} for key in keys}
    labels = {}
    for key, d in dicts.items():
        same = [e for e in dicts.values() if e.get("optimizer.type") == d.get("optimizer.type")]
        varying = sorted(k for k in d if k != "optimizer.type" and len({e.get(k) for e in same}) > 1)
        parts = [d.get("optimizer.type", "?")] + [f"{k.removeprefix('optimizer.')}={d[k]}" for k in varying]
        labels[key] = ", ".join(parts)
    return labels


def _row_loss(row):
    if math.isfinite(row.final_val):
        return row.final_val, "val"
    return row.final_train, "train"


def collect_points(rows, target=None, config_of=effective_config):
    """The points of the comparison from report rows; returns (points, target, left_out).

    Only completed runs with a finite loss and byte count count; `left_out` names the others.
    `target` None: the default target of the module docstring.
    """
    groups, left_out = {}, []
    for row in rows:
        loss, _ = _row_loss(row)
        if row.run.status != "completed" or not math.isfinite(loss) or not math.isfinite(row.bytes_per_step):
            left_out.append(f"{row.run.path.name} ({row.run.status})")
            continue
        groups.setdefault(_setting_key(config_of(row.run)), []).append(row)
    labels = _labels(list(groups))
    points = []
    for key, members in groups.items():
        losses = [_row_loss(r)[0] for r in members]
        best = [r.best_val for r in members]
        points.append(Point(
            label=labels[key], optimizer_type=members[0].run.optimizer_type,
            bytes_per_step=float(np.mean([r.bytes_per_step for r in members])),
            loss=float(np.mean(losses)), loss_min=float(min(losses)), loss_max=float(max(losses)),
            loss_kind=_row_loss(members[0])[1], best_val=float(np.mean(best)),
            files=[r.run.path.name for r in members], members=members))
    if target is None:
        bests = [p.best_val for p in points if math.isfinite(p.best_val)]
        target = max(bests) if bests else math.nan
    for p in points:
        tokens = [tokens_to_target(r.run, target) for r in p.members]
        p.tokens_to_target = float(np.mean(tokens)) if tokens and all(math.isfinite(t) for t in tokens) else math.nan
    for i in pareto_front([p.bytes_per_step for p in points], [p.loss for p in points]):
        points[i].on_front = True
    points.sort(key=lambda p: (p.bytes_per_step, p.loss))
    return points, target, left_out


def _draw(points, target, path):
    import matplotlib.pyplot as plt

    with_tokens = any(math.isfinite(p.tokens_to_target) for p in points)
    fig, axes = plt.subplots(1, 2 if with_tokens else 1, figsize=(13 if with_tokens else 7, 5), squeeze=False)
    kinds = sorted({p.optimizer_type for p in points})
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
    panels = [("loss", f"final {points[0].loss_kind} loss (mean over seeds; bars: min-max)")]
    if with_tokens:
        panels.append(("tokens_to_target", f"tokens to val loss {target:.4g}"))
    for ax, (attr, ylabel) in zip(axes[0], panels):
        for kind in kinds:
            mine = [p for p in points if p.optimizer_type == kind and math.isfinite(getattr(p, attr))]
            if not mine:
                continue
            x = [p.bytes_per_step for p in mine]
            y = [getattr(p, attr) for p in mine]
            if attr == "loss":
                err = [[p.loss - p.loss_min for p in mine], [p.loss_max - p.loss for p in mine]]
                ax.errorbar(x, y, yerr=err, fmt="o", color=colours[kind], label=kind, capsize=3)
            else:
                ax.plot(x, y, "o", color=colours[kind], label=kind)
        valid = [p for p in points if math.isfinite(getattr(p, attr))]
        front = pareto_front([p.bytes_per_step for p in valid], [getattr(p, attr) for p in valid])
        if front:
            ax.step([valid[i].bytes_per_step for i in front], [getattr(valid[i], attr) for i in front],
                    where="post", color="black", linewidth=1, label="Pareto front")
        xs = [p.bytes_per_step for p in valid if p.bytes_per_step > 0]
        if xs and max(xs) > 10 * min(xs):
            ax.set_xscale("log")
        ax.set_xlabel("mean bytes sent per worker per step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Equal-bytes comparison: loss against communication")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_csv(points, path):
    """pareto.csv: one row per point, at full precision."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["label", "type", "bytes_per_step", "loss", "loss_min", "loss_max", "loss_kind",
                    "tokens_to_target", "on_front", "seeds", "files"])
        for p in points:
            w.writerow([p.label, p.optimizer_type, p.bytes_per_step, p.loss, p.loss_min, p.loss_max, p.loss_kind,
                        p.tokens_to_target, int(p.on_front), len(p.files), " ".join(p.files)])


def pareto_section(report, out_dir, draw=True):
    """Writes pareto.csv and, with draw, pareto.png into out_dir; returns ([(file, title)], Markdown lines).

    Nothing (and no lines) with fewer than two points: there is nothing to compare.
    """
    points, target, left_out = collect_points(report.rows)
    if len(points) < 2:
        return [], []
    if draw:
        _draw(points, target, out_dir / "pareto.png")
    write_csv(points, out_dir / "pareto.csv")
    lines = ["## Equal-bytes comparison (Pareto front)", "",
             f"{len(points)} settings, each averaged over its seeds; on the front (fewest bytes first):", ""]
    lines += ["| setting | type | bytes/worker/step | final loss | tokens to target | seeds |", "|---|---|---|---|---|---|"]
    for p in points:
        if p.on_front:
            tokens = f"{p.tokens_to_target:.4g}" if math.isfinite(p.tokens_to_target) else "—"
            lines.append(f"| {p.label} | {p.optimizer_type} | {p.bytes_per_step:.4g} | {p.loss:.4f} ({p.loss_kind}) "
                         f"| {tokens} | {len(p.files)} |")
    lines.append("")
    if math.isfinite(target):
        lines += [f"Target of tokens-to-target: validation loss {target:.4f}.", ""]
    if left_out:
        lines += [f"Left out (not completed or no loss): {', '.join(left_out)}.", ""]
    lines += ["All points: pareto.csv.", ""]
    figures = [("pareto.png", "loss (and tokens to target) against bytes per worker per step, Pareto front")]
    return (figures if draw else []), lines
