"""The equal-bytes comparison: loss against mean bytes sent per worker per step, and its Pareto front.

Every completed run of a report is one observation. Runs whose settings differ only in `seed` are
one *point*: the mean over their seeds of the final loss (the last validation loss; the mean train
loss of the last steps for models without validation) and of the mean bytes sent per worker per
step, with the spread over seeds kept for error bars. Points that differ only in `optimizer.lr` are
one *method*; each method is compared at its own best learning rate: the point with the lowest mean
final loss, over the seeds every candidate rate ran, among those whose every seed completed (a rate
at which a seed diverged or failed is never chosen; the seed tables use the same rule). A chosen
point is on the *front* when no other chosen point has both fewer (or equal) bytes and a lower (or
equal) loss, one of them strictly.

A completed run whose final loss ends above the first train loss it recorded did not train (a
finite blow-up, which the run's NaN/Inf check does not catch); it counts as a failed seed like a
diverged run.

Tokens-to-target: the training tokens (workers x batch_size x block_size per step) until the first
evaluation whose validation loss is at most the target. The default target is the reference's
(`--reference`, dense AdamS unless told otherwise) worst final loss over its seeds at its best rate
plus `--target-margin` (0.05), as in the seed tables, so that it asks "how soon does a method reach
the dense optimizer's quality"; without a reference among the methods, the loosest target every
method reaches at its best rate (the largest mean best validation loss). A point whose seeds do not
all reach the target has no tokens-to-target.
"""

import csv
import math
from dataclasses import dataclass, field

import numpy as np

from .runs import effective_config
from .stats import DEFAULT_REFERENCE, DEFAULT_TARGET_MARGIN, lowest_on_common_seeds, parse_reference


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
    lr: float = math.nan  # optimizer.lr of the point (NaN when the config has none)
    lrs_tried: list = field(default_factory=list)  # every rate of its method, ascending
    best_lr: bool = False  # the method's best rate: the point it is compared at
    seeds_failed: int = 0  # runs of this setting that did not complete (diverged, failed, killed)
    method: tuple = ()  # the settings without seed and lr: points of one method differ only in lr
    members: list = field(default_factory=list, repr=False)  # the report rows, one per seed

    @property
    def at_edge(self):
        """The best rate is the smallest or the largest of several tried."""
        return self.best_lr and len(self.lrs_tried) > 1 and self.lr in (self.lrs_tried[0], self.lrs_tried[-1])


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


def _method_key(setting_key):
    """The settings that make a method: a point's settings without its learning rate."""
    return tuple(kv for kv in setting_key if kv[0] != "optimizer.lr")


def _lr_of(setting_key):
    for k, v in setting_key:
        if k == "optimizer.lr":
            try:
                return float(v)
            except ValueError:
                return math.nan
    return math.nan


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


def _did_not_train(row, loss):
    """A finite loss that ended above where the run started."""
    first = getattr(row, "first_train", math.nan)
    return math.isfinite(first) and loss > first


def _matches(method, spec):
    """The method's settings hold every KEY=VALUE of a parsed --reference spec (lr aside)."""
    settings = dict(method)
    return all(settings.get(k) == repr(v) for k, v in spec.items() if k != "optimizer.lr")


def _default_target(chosen, reference, margin):
    """(target loss, where it comes from) of the module docstring."""
    spec = parse_reference(reference) if reference else {}
    refs = [p for p in chosen if spec and _matches(p.method, spec)]
    if refs:
        worst = max(max(_row_loss(r)[0] for r in p.members) for p in refs)
        return worst + margin, f"the reference's ({reference}) worst final loss over seeds + {margin:g}"
    bests = [p.best_val for p in chosen if math.isfinite(p.best_val)]
    return (max(bests) if bests else math.nan), "the loosest every method reaches (no reference among them)"


def _choose_best_lr(points, rates_tried):
    """Marks each method's best learning rate: among points with no failed seed, the lowest mean
    loss over the seeds all of them ran (`stats.lowest_on_common_seeds`, the seed tables' rule).

    rates_tried: method -> every rate run, those where no seed completed included.
    """
    methods = {}
    for p in points:
        methods.setdefault(p.method, []).append(p)
    for method, members in methods.items():
        rates = sorted(r for r in rates_tried.get(method, ()) if math.isfinite(r))
        for p in members:
            p.lrs_tried = rates
        eligible = sorted((p for p in members if p.seeds_failed == 0 and math.isfinite(p.loss)),
                          key=lambda p: p.lr if math.isfinite(p.lr) else 0.0)
        if eligible:
            best, _ = lowest_on_common_seeds({i: _loss_by_seed(p) for i, p in enumerate(eligible)})
            eligible[best].best_lr = True


def _loss_by_seed(point):
    return {r.run.config.get("seed", i): _row_loss(r)[0] for i, r in enumerate(point.members)}


def collect_points(rows, target=None, config_of=effective_config, reference=DEFAULT_REFERENCE,
                   margin=DEFAULT_TARGET_MARGIN):
    """The points of the comparison from report rows; returns (points, target, left_out).

    Every setting with a completed run is a point; the front and the default target use only each
    method's best-rate point (`best_lr`). Only completed runs with a finite loss and byte count
    that trained count; `left_out` names the others, and they count as failed seeds of their
    setting. `target` None: the default target of the module docstring (from `reference`, a
    KEY=VALUE[,...] spec, and `margin`).
    """
    groups, failed, left_out = {}, {}, []
    for row in rows:
        loss, _ = _row_loss(row)
        key = _setting_key(config_of(row.run))
        if row.run.status != "completed" or not math.isfinite(loss) or not math.isfinite(row.bytes_per_step):
            left_out.append(f"{row.run.path.name} ({row.run.status})")
            failed[key] = failed.get(key, 0) + 1
            continue
        if _did_not_train(row, loss):
            left_out.append(f"{row.run.path.name} (did not train: final loss {loss:.4g} above its first "
                            f"{row.first_train:.4g})")
            failed[key] = failed.get(key, 0) + 1
            continue
        groups.setdefault(key, []).append(row)
    labels = _labels(list({_method_key(k) for k in groups}))
    points = []
    for key, members in groups.items():
        losses = [_row_loss(r)[0] for r in members]
        best = [r.best_val for r in members]
        points.append(Point(
            label=labels[_method_key(key)], optimizer_type=members[0].run.optimizer_type,
            bytes_per_step=float(np.mean([r.bytes_per_step for r in members])),
            loss=float(np.mean(losses)), loss_min=float(min(losses)), loss_max=float(max(losses)),
            loss_kind=_row_loss(members[0])[1], best_val=float(np.mean(best)),
            files=[r.run.path.name for r in members], members=members, lr=_lr_of(key),
            seeds_failed=failed.get(key, 0), method=_method_key(key)))
    rates_tried = {}
    for key in list(groups) + list(failed):
        rates_tried.setdefault(_method_key(key), set()).add(_lr_of(key))
    _choose_best_lr(points, rates_tried)
    chosen = [p for p in points if p.best_lr]
    if target is None:
        target = _default_target(chosen, reference, margin)[0]
    for p in points:
        tokens = [tokens_to_target(r.run, target) for r in p.members]
        p.tokens_to_target = float(np.mean(tokens)) if tokens and all(math.isfinite(t) for t in tokens) else math.nan
    for i in pareto_front([p.bytes_per_step for p in chosen], [p.loss for p in chosen]):
        chosen[i].on_front = True
    points.sort(key=lambda p: (p.bytes_per_step, p.label, p.lr if math.isfinite(p.lr) else 0.0))
    return points, target, left_out


def _draw(points, target, path):
    """Each method at its best learning rate, with the front of those points."""
    import matplotlib.pyplot as plt

    points = [p for p in points if p.best_lr]
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
    fig.suptitle("Equal-bytes comparison: loss against communication (each method at its best learning rate)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt_lr(lr):
    return f"{lr:g}" if math.isfinite(lr) else "—"


def write_csv(points, path):
    """pareto.csv: one row per point (every learning rate), at full precision."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["label", "type", "lr", "best_lr", "best_lr_at_edge", "lrs_tried", "bytes_per_step", "loss", "loss_min", "loss_max",
                    "loss_kind", "tokens_to_target", "on_front", "seeds", "seeds_failed", "files"])
        for p in points:
            w.writerow([p.label, p.optimizer_type, p.lr, int(p.best_lr), int(p.at_edge), " ".join(_fmt_lr(r) for r in p.lrs_tried),
                        p.bytes_per_step, p.loss, p.loss_min, p.loss_max, p.loss_kind, p.tokens_to_target,
                        int(p.on_front), len(p.files), p.seeds_failed, " ".join(p.files)])


def pareto_section(report, out_dir, draw=True, reference=DEFAULT_REFERENCE, target_loss=None,
                   margin=DEFAULT_TARGET_MARGIN):
    """Writes pareto.csv and, with draw, pareto.png into out_dir; returns ([(file, title)], Markdown lines).

    Nothing (and no lines) with fewer than two methods: there is nothing to compare. target_loss
    overrides the default target of tokens-to-target (module docstring).
    """
    points, target, left_out = collect_points(report.rows, target_loss, reference=reference, margin=margin)
    chosen = [p for p in points if p.best_lr]
    if len({p.method for p in points}) < 2:
        return [], []
    if draw and chosen:
        _draw(points, target, out_dir / "pareto.png")
    write_csv(points, out_dir / "pareto.csv")
    lines = ["## Equal-bytes comparison (Pareto front)", "",
             f"{len({p.method for p in points})} methods, each at its best learning rate (lowest mean final loss "
             "over the seeds every candidate rate ran, among the rates where every seed completed), fewest "
             "bytes first; "
             "loss: mean over seeds [min, max]:", ""]
    lines += ["| setting | type | lr (tried) | bytes/worker/step | final loss | tokens to target | seeds | front |",
              "|---|---|---|---|---|---|---|---|"]
    for p in chosen:
        tokens = f"{p.tokens_to_target:.4g}" if math.isfinite(p.tokens_to_target) else "—"
        tried = ", ".join(_fmt_lr(r) for r in p.lrs_tried)
        edge = " edge" if p.at_edge else ""
        lines.append(f"| {p.label} | {p.optimizer_type} | {_fmt_lr(p.lr)}{edge} ({tried}) | {p.bytes_per_step:.4g} "
                     f"| {p.loss:.4f} [{p.loss_min:.4f}, {p.loss_max:.4f}] ({p.loss_kind}) | {tokens} "
                     f"| {len(p.files)} | {'yes' if p.on_front else ''} |")
    lines.append("")
    unchosen = sorted({p.label for p in points} - {p.label for p in chosen})
    if unchosen:
        lines += [f"No rate of these completed and trained every seed, so they are not compared: "
                  f"{', '.join(unchosen)}.", ""]
    if any(p.at_edge for p in chosen):
        lines += ["`edge`: the best rate is the smallest or largest tried, so a better one may lie beyond; "
                  "extend that method's `lr_search` before reading a ranking from it.", ""]
    if math.isfinite(target):
        source = "--target-loss" if target_loss is not None else _default_target(chosen, reference, margin)[1]
        lines += [f"Target of tokens-to-target: validation loss {target:.4f} ({source}).", ""]
    if left_out:
        lines += [f"Not completed (counted as failed seeds of their setting): {', '.join(left_out)}.", ""]
    lines += ["Every rate of every method: pareto.csv.", ""]
    figures = [("pareto.png", "loss (and tokens to target) against bytes per worker per step, each method at its "
                              "best learning rate, Pareto front")]
    return (figures if draw and chosen else []), lines
