"""The netlab's measured study (docs/NETLAB.md): tables and figures from the steps.csv files of
`scripts/netlab bench` (repeated runs) and `scripts/netlab strong-scaling`; its command is
`scripts/netlab tables` (`/usr/bin/python3 -m netlab.tables` with the repository root on
PYTHONPATH; Debian's matplotlib).

A cell is (runtime, rate, workers, method). Over the repeated bench runs a cell reports the
median of the runs' measured steps with [min, max], the median predicted step and its error
against that median, the median exposed communication and the bytes a rank sends per step,
and the speedup of its median step against the same runtime's dense AdamS in the same setting.
"""

import argparse
import statistics
import sys
from pathlib import Path

from netlab import steps_csv

DENSE = {"adams", "dense"}
PAPER_EFFICIENCY_64 = {"dense": 0.176, "scape": 0.55}  # arXiv 2607.01678, 64 GPUs (docs/REPRODUCING.md)


def read_rows(paths):
    """Every row of the given steps.csv files, each tagged with the index of its file (its run)."""
    rows = []
    for run, path in enumerate(paths):
        for row in steps_csv.read(path):
            row["run"] = run
            rows.append(row)
    return rows


def _number(text):
    return float(text) if text not in ("", None) else None


def cells(rows):
    """The cells in first-seen order, each with its aggregates over the runs that measured it."""
    grouped = {}
    for r in rows:
        key = (r["runtime"], float(r["rate_mbit"]), int(r["workers"]), r["method"])
        grouped.setdefault(key, []).append(r)
    out = []
    for (runtime, rate, workers, method), rs in grouped.items():
        steps = [float(r["measured_step_ms"]) for r in rs]
        predicted = [p for p in (_number(r.get("predicted_step_ms")) for r in rs) if p is not None]
        step = statistics.median(steps)
        cell = {"runtime": runtime, "rate_mbit": rate, "workers": workers, "method": method, "runs": len(rs),
                "step_ms": step, "step_min_ms": min(steps), "step_max_ms": max(steps),
                "exposed_ms": statistics.median(float(r["exposed_comm_ms"]) for r in rs),
                "bytes_per_step": statistics.median(float(r["bytes_per_step"]) for r in rs),
                "predicted_ms": statistics.median(predicted) if predicted else None}
        cell["error"] = cell["predicted_ms"] / step - 1 if predicted else None
        out.append(cell)
    for c in out:
        dense = [d for d in out if d["method"] in DENSE and
                 (d["runtime"], d["rate_mbit"], d["workers"]) == (c["runtime"], c["rate_mbit"], c["workers"])]
        c["speedup"] = dense[0]["step_ms"] / c["step_ms"] if dense else None
    return out


def markdown(cell_list):
    """One table per (runtime, rate, workers), in first-seen order."""
    lines = []
    settings = list(dict.fromkeys((c["runtime"], c["rate_mbit"], c["workers"]) for c in cell_list))
    for runtime, rate, workers in settings:
        lines += ["", f"**{runtime}, {rate:g} Mbit/s, {workers} nodes**", "",
                  "| method | step ms, median [min, max] | predicted ms (error) | exposed comm ms | bytes/step | "
                  "× dense |", "|---|---|---|---|---|---|"]
        for c in cell_list:
            if (c["runtime"], c["rate_mbit"], c["workers"]) != (runtime, rate, workers):
                continue
            predicted = f"{c['predicted_ms']:.1f} ({100 * c['error']:+.1f}%)" if c["predicted_ms"] else "–"
            speedup = f"{c['speedup']:.2f}" if c["speedup"] else "–"
            lines.append(f"| {c['method']} | {c['step_ms']:.1f} [{c['step_min_ms']:.1f}, {c['step_max_ms']:.1f}] | "
                         f"{predicted} | {c['exposed_ms']:.1f} | {c['bytes_per_step']:,.0f} | {speedup} |")
    return "\n".join(lines[1:]) + "\n"


def efficiency(cell_list):
    """Strong-scaling efficiency T(n0)·n0 / (T(n)·n) per method against its fewest-node cell."""
    out = []
    for c in cell_list:
        same = [d for d in cell_list if (d["runtime"], d["rate_mbit"], d["method"]) ==
                (c["runtime"], c["rate_mbit"], c["method"])]
        base = min(same, key=lambda d: d["workers"])
        value = base["step_ms"] * base["workers"] / (c["step_ms"] * c["workers"]) if len(same) > 1 else None
        out.append(dict(c, efficiency=value))
    return out


def scaling_markdown(cell_list, runs):
    """The strong-scaling table: per (nodes, method) the median step over the runs with [min,
    max], the median predicted step and its error (over the runs that predicted it), the exposed
    communication, the efficiency against the fewest nodes and the speedup against dense."""
    text = (f"\n## Strong scaling ({runs} runs)\n\n| nodes | method | step ms, median [min, max] | "
            "predicted ms (error) | exposed comm ms | efficiency | × dense |\n|---|---|---|---|---|---|---|\n")
    for c in sorted(cell_list, key=lambda c: (c["workers"], c["method"])):
        predicted = f"{c['predicted_ms']:.1f} ({100 * c['error']:+.1f}%)" if c["predicted_ms"] else "–"
        text += (f"| {c['workers']} | {c['method']} | {c['step_ms']:.1f} [{c['step_min_ms']:.1f}, "
                 f"{c['step_max_ms']:.1f}] | {predicted} | {c['exposed_ms']:.1f} | "
                 f"{'–' if c['efficiency'] is None else format(c['efficiency'], '.3f')} | {c['speedup']:.2f} |\n")
    return text


def draw_steps(cell_list, path):
    """Step time per method, split into exposed communication and the rest (compute and the
    optimizer's own work), one panel per (runtime, rate), each on its own linear axis (a stacked
    bar on a log axis would misstate the shares); the predicted step as a marker and the spread
    over runs as an error bar."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    settings = list(dict.fromkeys((c["runtime"], c["rate_mbit"], c["workers"]) for c in cell_list))
    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 4.2), squeeze=False)
    for ax, (runtime, rate, workers) in zip(axes[0], settings):
        cs = [c for c in cell_list if (c["runtime"], c["rate_mbit"], c["workers"]) == (runtime, rate, workers)]
        x = range(len(cs))
        exposed = [min(c["exposed_ms"], c["step_ms"]) for c in cs]
        rest = [c["step_ms"] - e for c, e in zip(cs, exposed)]
        ax.bar(x, rest, color="#7a9cc6", label="compute + optimizer")
        ax.bar(x, exposed, bottom=rest, color="#d9534f", label="exposed communication")
        ax.errorbar(x, [c["step_ms"] for c in cs], yerr=[[c["step_ms"] - c["step_min_ms"] for c in cs],
                                                         [c["step_max_ms"] - c["step_ms"] for c in cs]],
                    fmt="none", ecolor="black", capsize=3, label="min–max over runs")
        px = [i for i, c in zip(x, cs) if c["predicted_ms"]]
        if px:
            ax.scatter(px, [cs[i]["predicted_ms"] for i in px], marker="D", color="black", zorder=3,
                       label="predicted (scape predict --calibrate)")
        ax.set_xticks(list(x), [c["method"] for c in cs], rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("step (ms)")
        ax.set_title(f"{runtime}, {rate:g} Mbit/s, {workers} nodes", fontsize=10)
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_scaling(cell_list, path):
    """Strong-scaling efficiency per method against nodes, with the paper's 64-GPU figures."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for method in dict.fromkeys(c["method"] for c in cell_list):
        cs = sorted((c for c in cell_list if c["method"] == method), key=lambda c: c["workers"])
        ax.plot([c["workers"] for c in cs], [c["efficiency"] for c in cs], marker="o", label=method)
    top = max(c["workers"] for c in cell_list)
    for name, value in PAPER_EFFICIENCY_64.items():
        ax.scatter([top], [value], marker="*", s=120, color="black" if name == "dense" else "grey", zorder=3,
                   label=f"paper at 64 GPUs, {name}")
    ax.set_xlabel("nodes (each standing for 8 GPUs)")
    ax.set_ylabel("strong-scaling efficiency")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(steps_files, scaling_files, out_dir, figures=True):
    """Writes OUTDIR/netlab.md (and netlab-steps.png, netlab-scaling.png) and returns the text."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = ""
    if steps_files:
        bench = cells(read_rows(steps_files))
        text += f"## Measured steps ({len(steps_files)} runs)\n\n" + markdown(bench)
        if figures:
            draw_steps(bench, out_dir / "netlab-steps.png")
    if scaling_files:
        scaling = efficiency(cells(read_rows(scaling_files)))
        text += scaling_markdown(scaling, len(scaling_files))
        if figures:
            draw_scaling([c for c in scaling if c["efficiency"] is not None],
                         out_dir / "netlab-scaling.png")
    (out_dir / "netlab.md").write_text(text)
    return text


def main(argv=None):
    """`scripts/netlab tables`: 2 for a missing or unreadable file, else 0."""
    parser = argparse.ArgumentParser(
        prog="scripts/netlab tables",
        description="Tables and figures of the netlab's measured study (docs/NETLAB.md): the steps.csv files of "
                    "repeated `scripts/netlab bench` runs give per runtime, rate and method the median step with "
                    "[min, max] over the runs, the predicted step and its error, the exposed communication, the "
                    "bytes and the speedup against dense AdamS; those of `scripts/netlab strong-scaling` the "
                    "strong-scaling efficiency. Writes OUTDIR/netlab.md (also printed), netlab-steps.png and "
                    "netlab-scaling.png.")
    parser.add_argument("--steps", nargs="*", default=[], metavar="STEPS.csv", help="steps.csv of repeated bench runs")
    parser.add_argument("--scaling", nargs="*", default=[], metavar="STEPS.csv",
                        help="steps.csv of repeated strong-scaling runs")
    parser.add_argument("--out", required=True, metavar="OUTDIR", help="folder for netlab.md and the figures")
    parser.add_argument("--no-figures", action="store_true", help="write netlab.md only")
    args = parser.parse_args(argv)
    if not args.steps and not args.scaling:
        print("netlab tables: give --steps or --scaling files", file=sys.stderr)
        return 2
    for path in args.steps + args.scaling:
        if not Path(path).is_file():
            print(f"netlab tables: {path}: no such file", file=sys.stderr)
            return 2
    try:
        print(report(args.steps, args.scaling, args.out, figures=not args.no_figures), end="")
    except (KeyError, ValueError) as e:
        print(f"netlab tables: not a steps.csv of the netlab ({e})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
