"""PNG figures of a Report (analysis/tables.py), drawn with matplotlib's Agg backend.

Every per-step figure has one row of panels per group (the runs that solve the same problem)
and one colour per run label, the same colour in every row and figure, with one legend outside
the panels. Diverged runs are drawn up to the divergence and marked with a cross; failed runs
are not drawn.
"""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402

from .runs import SPARSE_TYPES  # noqa: E402
from .stats import CONFIDENCE, t_critical, tokens_per_step  # noqa: E402
from .tables import MAX_GROUP_ROWS  # noqa: E402  (the summary says when groups were left out)

PANEL_W, PANEL_H = 4.6, 3.0


def _colours(report):
    """One colour per label-in-group, in order of first appearance."""
    cmap = plt.get_cmap("tab10" if len(set(report.labels.values())) <= 10 else "tab20")
    order = []
    for r in report.rows:
        if r.label not in order:
            order.append(r.label)
    return {label: cmap(i % cmap.N) for i, label in enumerate(order)}


def _legend_name(row):
    """Label plus the run's state when it did not complete."""
    run = row.run
    if run.status == "diverged":
        return f"{row.label} (diverged @ {int(run.steps[-1])})"
    if run.status in ("running", "killed", "interrupted"):
        return f"{row.label} ({run.status}, {len(run.steps)} steps)"
    return row.label


def _smooth(y, window):
    """Trailing moving average that ignores non-finite values (NaN where a window has none)."""
    if window <= 1:
        return y
    ok = np.isfinite(y)
    vals = np.where(ok, y, 0.0)
    kernel = np.ones(window)
    num = np.convolve(vals, kernel)[: len(y)]
    den = np.convolve(ok.astype(float), kernel)[: len(y)]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _plot(ax, x, y, row, colour, style="-", marker=None, smooth=1, raw_alpha=0.0):
    """One run's series; a cross marks the last finite point of a diverged run."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if raw_alpha > 0 and smooth > 1:
        ax.plot(x, y, style, color=colour, alpha=raw_alpha, linewidth=0.7)
    ys = _smooth(y, smooth)
    (line,) = ax.plot(x, ys, style, color=colour, marker=marker, markersize=3, linewidth=1.3)
    if row.run.status == "diverged":
        finite = np.flatnonzero(np.isfinite(y))
        if finite.size:
            i = finite[-1]
            ax.plot([x[i]], [y[i]], "x", color=colour, markersize=10, markeredgewidth=2.5)
    return line


def _grid(groups, n_cols, title):
    """A figure with one row per group; returns (fig, axes[rows][cols], group names drawn)."""
    names = list(groups)[:MAX_GROUP_ROWS]
    fig, axes = plt.subplots(len(names), n_cols, figsize=(PANEL_W * n_cols, PANEL_H * len(names) + 0.6),
                             squeeze=False)
    fig.suptitle(title, fontsize=12)
    return fig, axes, names


def _finish(fig, axes, handles, path):
    """Legend outside the panels on the right, grid lines, saved at a small size."""
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
    if handles:
        labels = list(handles)
        fig.legend([handles[k] for k in labels], labels, loc="center left", bbox_to_anchor=(1.0, 0.5),
                   fontsize=8, frameon=False)
    # Fixed spacing (room for two-line panel titles) instead of tight_layout, which costs seconds.
    rows = axes.shape[0]
    fig.subplots_adjust(left=0.09, right=0.98, wspace=0.32, bottom=0.5 / (PANEL_H * rows + 0.6),
                        top=1 - 0.75 / (PANEL_H * rows + 0.6), hspace=0.62)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def _rows_of(report, group, sparse_only=False):
    rows = [r for r in report.rows if r.group == group]
    return [r for r in rows if r.run.optimizer_type in SPARSE_TYPES] if sparse_only else rows


def _panel_title(ax, group, text, n_groups):
    ax.set_title(text if n_groups == 1 else f"{text}\n[{group}]", fontsize=9)


def _loss_unit(rows):
    """Cross-entropy of GPT runs is in nats per token; the quadratic's loss has no unit."""
    kinds = {r.run.config.get("model", {}).get("type") for r in rows}
    return "loss (nats/token)" if kinds <= {"gpt"} else "loss"


def _auto_log(ax):
    """Log y when the drawn positive values span more than two decades (e.g. up to a divergence)."""
    ys = [np.asarray(line.get_ydata(), dtype=float) for line in ax.lines]
    ys = np.concatenate(ys) if ys else np.zeros(0)
    ys = ys[np.isfinite(ys)]
    if ys.size and ys.min() > 0 and ys.max() / ys.min() > 100:
        ax.set_yscale("log")


def _log_if_positive(ax):
    """Log y when some drawn value is positive (a W = 1 run sends no bytes: a log axis of zeros fails)."""
    ys = [np.asarray(line.get_ydata(), dtype=float) for line in ax.lines]
    if any((y[np.isfinite(y)] > 0).any() for y in ys):
        ax.set_yscale("log")


def _no_data(ax, text):
    """Replaces an empty panel by a short note."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _time_unit(report):
    """(factor, unit) that puts the longest modelled run between 1 and 1000 units: s, ms or µs."""
    longest = max((r.run.wall_clock()[-1] for r in report.rows if len(r.run.steps)), default=1.0)
    for factor, unit in ((1.0, "s"), (1e3, "ms"), (1e6, "µs")):
        if longest * factor >= 1:
            return factor, unit
    return 1e6, "µs"


def _loss_figure(report, path, against_time):
    """Train (smoothed, raw faint) and validation loss against step or modelled wall-clock time."""
    colours = _colours(report)
    has_val = any(len(r.run.val_loss) for r in report.rows)
    fig, axes, names = _grid(report.groups, 2 if has_val else 1,
                             "Loss against modelled wall-clock time" if against_time else "Loss against step")
    handles = {}
    scale, unit = _time_unit(report) if against_time else (1.0, "")
    xlabel = f"modelled wall-clock time ({unit})" if against_time else "step"
    for gi, group in enumerate(names):
        rows = _rows_of(report, group)
        for row in rows:
            run, c = row.run, colours[row.label]
            x = run.wall_clock() * scale if against_time else run.steps
            window = max(1, len(run.steps) // 40)
            handles[_legend_name(row)] = _plot(axes[gi][0], x, run.metric("train_loss"), row, c,
                                               smooth=window, raw_alpha=0.2)
            if has_val and len(run.val_loss):
                vx = np.interp(run.eval_step, run.steps, run.wall_clock() * scale) if against_time else run.eval_step
                _plot(axes[gi][1], vx, run.val_loss, row, c, marker="o")
        _panel_title(axes[gi][0], group, f"train loss (global batch, {max(1, len(rows[0].run.steps) // 40)}-step mean)"
                     if rows and len(rows[0].run.steps) >= 80 else "train loss (global batch)", len(names))
        for ax in axes[gi][: 2 if has_val else 1]:
            ax.set_xlabel(xlabel)
            ax.set_ylabel(_loss_unit(rows))
            _auto_log(ax)
        if has_val:
            _panel_title(axes[gi][1], group, "validation loss", len(names))
            if not axes[gi][1].lines:
                _no_data(axes[gi][1], "no validation set\n(only GPT runs evaluate)")
    _finish(fig, axes, handles, path)


def _series_figure(report, path, title, panels, sparse_only):
    """Generic per-step figure: panels is a list of (panel title, y label, fn(run)->y, log y)."""
    colours = _colours(report)
    fig, axes, names = _grid(report.groups, len(panels), title)
    handles = {}
    for gi, group in enumerate(names):
        for row in _rows_of(report, group, sparse_only):
            for pi, (_, _, fn, _) in enumerate(panels):
                y = fn(row.run)
                if np.isfinite(y).any():
                    handles[_legend_name(row)] = _plot(axes[gi][pi], row.run.steps, y, row, colours[row.label])
        for pi, (ptitle, ylabel, _, logy) in enumerate(panels):
            ax = axes[gi][pi]
            _panel_title(ax, group, ptitle, len(names))
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            if logy and any(line.get_ydata().size and np.nanmax(line.get_ydata()) > 0 for line in ax.lines):
                ax.set_yscale("log")
    _finish(fig, axes, handles, path)


def _bytes_figure(report, path):
    """Bytes sent per worker per step and their cumulative total; dense runs dashed."""
    colours = _colours(report)
    fig, axes, names = _grid(report.groups, 2, "Communication volume per worker (dense runs dashed)")
    handles = {}
    for gi, group in enumerate(names):
        for row in _rows_of(report, group):
            b = np.nan_to_num(row.run.metric("bytes_sent"), nan=0.0)
            style = "--" if row.run.is_dense else "-"
            handles[_legend_name(row)] = _plot(axes[gi][0], row.run.steps, b, row, colours[row.label], style)
            _plot(axes[gi][1], row.run.steps, np.cumsum(b), row, colours[row.label], style)
        for ax, t, yl in ((axes[gi][0], "bytes sent per worker per step", "bytes (B, log)"),
                          (axes[gi][1], "cumulative bytes sent per worker", "bytes (B, log)")):
            _panel_title(ax, group, t, len(names))
            ax.set_xlabel("step")
            ax.set_ylabel(yl)
            _log_if_positive(ax)
    _finish(fig, axes, handles, path)


def _fill_in_figure(report, path):
    """Mean fill-in and mean bytes per worker per step against the number of workers (sparse runs)."""
    colours = _colours(report)
    series = {}
    for row in report.rows:
        if row.run.optimizer_type not in SPARSE_TYPES:
            continue
        rest = [p for p in row.group.split(", ") if not p.startswith("workers=") and p != "all runs"]
        key = " ".join([row.label] + rest)
        w = row.run.config.get("workers", 0)
        fill = row.run.metric("fill_in")
        series.setdefault(key, (row.label, []))[1].append(
            (w, np.nanmean(fill) if np.isfinite(fill).any() else np.nan, row.bytes_per_step))
    dense = {}
    for row in report.rows:
        if row.run.is_dense:
            dense.setdefault(row.run.config.get("workers", 0), []).append(row.bytes_per_step)
    fig, axes = plt.subplots(1, 2, figsize=(PANEL_W * 2, PANEL_H + 0.6), squeeze=False)
    fig.suptitle("Fill-in and volume against the number of workers", fontsize=12)
    handles = {}
    for key, (label, points) in series.items():
        points.sort()
        w = [p[0] for p in points]
        (handles[key],) = axes[0][0].plot(w, [p[1] for p in points], "o-", color=colours[label])
        axes[0][1].plot(w, [p[2] for p in points], "o-", color=colours[label])
    if dense:
        ws = sorted(dense)
        (handles["dense (mean of dense runs)"],) = axes[0][1].plot(ws, [np.mean(dense[w]) for w in ws], "k--")
    axes[0][0].set_title("mask fill-in |M| / K (mean over steps)", fontsize=9)
    axes[0][0].set_ylabel("fill-in (×)")
    axes[0][1].set_title("bytes sent per worker per step (mean)", fontsize=9)
    axes[0][1].set_ylabel("bytes (B, log)")
    _log_if_positive(axes[0][1])
    for ax in axes[0]:
        ax.set_xlabel("workers W (log₂)")
        ax.set_xscale("log", base=2)
    _finish(fig, axes, handles, path)


def _seed_curves(runs, smooth_train):
    """(x, [seeds x points] y, x label) of the runs' validation losses at their common evaluation
    steps (x in training tokens for gpt), or of their smoothed train losses without validation."""
    runs = [r for r in runs if r.status == "completed"]
    if not runs:
        return None, None, ""
    if all(len(r.val_loss) for r in runs):
        steps = sorted(set.intersection(*(set(int(s) for s in r.eval_step) for r in runs)))
        ys = np.array([[r.val_loss[list(r.eval_step).index(s)] for s in steps] for r in runs])
        per_step = tokens_per_step(runs[0])
        if np.isfinite(per_step):
            return np.asarray(steps) * per_step, ys, "training tokens"
        return np.asarray(steps), ys, "step"
    n = min(len(r.steps) for r in runs)
    window = max(1, n // 40) if smooth_train else 1
    return runs[0].steps[:n], np.array([_smooth(r.metric("train_loss")[:n], window) for r in runs]), "step"


def _band(ys, band):
    """(mean, low, high) over the seeds (rows): the 95% Student-t interval ("ci") or min-max."""
    mean = ys.mean(axis=0)
    if band == "minmax":
        return mean, ys.min(axis=0), ys.max(axis=0)
    if ys.shape[0] < 2:
        return mean, mean, mean
    half = t_critical(ys.shape[0] - 1, CONFIDENCE) * ys.std(axis=0, ddof=1) / np.sqrt(ys.shape[0])
    return mean, mean - half, mean + half


def _seed_figure(problems, path, band):
    """Per problem: loss of each arm at its best lr with the band over seeds, and final loss against lr."""
    labels = list(dict.fromkeys(a.label for p in problems for a in p.arms))
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    colours = {label: cmap(i % cmap.N) for i, label in enumerate(labels)}
    names = {p.label: p for p in problems}
    band_text = "95% interval over seeds" if band == "ci" else "min–max over seeds"
    fig, axes, drawn = _grid(names, 2, f"Seeds and learning rates (band: {band_text})")
    handles = {}
    for gi, name in enumerate(drawn):
        problem = names[name]
        x_label = "step"
        for arm in problem.arms:
            c = colours[arm.label]
            if np.isfinite(arm.best_lr):
                x, ys, x_label = _seed_curves(list(arm.runs[arm.best_lr].values()), smooth_train=True)
                if ys is not None and ys.size:
                    mean, lo, hi = _band(ys, band)
                    (handles[arm.label],) = axes[gi][0].plot(x, mean, "-", color=c, linewidth=1.3)
                    axes[gi][0].fill_between(x, lo, hi, color=c, alpha=0.2, linewidth=0)
            lrs = [lr for lr in arm.lrs if arm.at_lr.get(lr) is not None and arm.at_lr[lr].n]
            if lrs:
                means = [arm.at_lr[lr].mean for lr in lrs]
                err = [arm.at_lr[lr].half_width if arm.at_lr[lr].n > 1 else 0.0 for lr in lrs]
                handles.setdefault(arm.label, axes[gi][1].errorbar(lrs, means, yerr=err, fmt="o-", color=c,
                                                                   capsize=3, markersize=4)[0])
                bad = [(lr, m) for lr, m in zip(lrs, means) if arm.diverged.get(lr)]
                if bad:  # a seed diverged there: the mean is over the others, and the lr cannot win
                    axes[gi][1].plot(*zip(*bad), "x", color=c, markersize=10, markeredgewidth=2.5)
        if np.isfinite(problem.target):
            axes[gi][0].axhline(problem.target, color="0.4", linestyle=":", linewidth=1)
        _panel_title(axes[gi][0], name, f"loss at each arm's best lr ({band_text}; dotted: target)", len(drawn))
        axes[gi][0].set_xlabel(x_label)
        axes[gi][0].set_ylabel("loss")
        _panel_title(axes[gi][1], name, "final loss against lr (mean ± 95% interval; ×: a seed diverged)",
                     len(drawn))
        axes[gi][1].set_xlabel("learning rate (log)")
        axes[gi][1].set_ylabel("final loss")
        axes[gi][1].set_xscale("log")
    _finish(fig, axes, handles, path)


def make_figures(report, out_dir, band="ci"):
    """Draws every figure that has data; returns [(file name, title)] in reading order."""
    made = []
    if report.problems_over_seeds:
        _seed_figure(report.problems_over_seeds, out_dir / "seeds.png", band)
        made.append(("seeds.png", "loss at each arm's best lr with the band over seeds, and final loss against lr"))
    sparse = any(r.run.optimizer_type in SPARSE_TYPES for r in report.rows)
    _loss_figure(report, out_dir / "loss_vs_step.png", against_time=False)
    made.append(("loss_vs_step.png", "train and validation loss against step"))
    _loss_figure(report, out_dir / "loss_vs_time.png", against_time=True)
    made.append(("loss_vs_time.png", "train and validation loss against modelled wall-clock time"))
    _bytes_figure(report, out_dir / "bytes.png")
    made.append(("bytes.png", "bytes sent per worker per step and cumulative, against dense"))
    if sparse:
        _series_figure(report, out_dir / "mask.png", "Mask stability and quality (sparse runs)", [
            ("mask Jaccard with the previous step", "Jaccard |M_t ∩ M_t−1| / |M_t ∪ M_t−1|",
             lambda r: r.metric("mask_jaccard"), False),
            ("overlap with the same-statistic oracle O (worker average)", "overlap |M ∩ O| / K",
             lambda r: r.metric("mask_oracle_overlap"), False),
            ("energy capture of the mean gradient", "Σ_M ā² / Σ_O' ā²",
             lambda r: r.metric("mask_energy_capture"), False)], sparse_only=True)
        made.append(("mask.png", "mask Jaccard with the previous step, overlap with the same-statistic oracle "
                                 "and energy capture"))
        _series_figure(report, out_dir / "residual.png", "Error-feedback residual (mean over workers; max: max)", [
            ("residual norm ‖e_i‖₂", "norm (gradient units, log)", lambda r: r.metric("residual_norm"), True),
            ("residual max |e_i|", "max (gradient units, log)", lambda r: r.metric("residual_max"), True)],
            sparse_only=True)
        made.append(("residual.png", "residual norm and max against step"))
        _series_figure(report, out_dir / "staleness.png", "Staleness: steps since a coordinate was last delivered", [
            ("staleness mean", "steps", lambda r: r.metric("staleness_mean"), False),
            ("staleness p99", "steps", lambda r: r.metric("staleness_p99"), False),
            ("staleness max", "steps", lambda r: r.metric("staleness_max"), False)], sparse_only=True)
        made.append(("staleness.png", "staleness mean, p99 and max against step"))
        _fill_in_figure(report, out_dir / "fill_in.png")
        made.append(("fill_in.png", "fill-in and bytes against number of workers"))
    return made
