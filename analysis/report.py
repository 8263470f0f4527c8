"""The Markdown report of scape runs: summary.md, the CSV files and the figures of a folder of runs.

What it is made of comes from the modules below it: the run table (groups, labels, rows;
analysis/tables.py), the statistics over seeds (analysis/stats.py) and their section
(analysis/seeds.py), the gap against the horizon (analysis/horizon.py), the equal-bytes
comparison (analysis/pareto.py), the measured step breakdown (analysis/breakdown.py) and the
figures (analysis/figures.py). The names of the run
table stay importable from here.
"""

from pathlib import Path

from . import breakdown, horizon, seeds
from .stats import DEFAULT_REFERENCE, DEFAULT_TARGET_MARGIN, TRAIN_TAIL, build_problems
from .stats import final_train_loss, first_train_loss  # noqa: F401  (re-exported)
from .tables import (  # noqa: F401  (re-exported: code and tests import these from analysis.report)
    MAX_GROUP_ROWS, TABLE_HEADER, Report, Row, _value_text, build_report, compute_text, diverged_at, group_keys,
    group_label, group_labels, make_row, markdown_table, network_text, optimizer_name, pick_baseline, ranks_per_node,
    row_order, run_label, status_text, table_cells, varying_keys, write_csv)


def markdown_summary(report, inputs, figures):
    """The whole summary.md text."""
    out = ["# scape run report", ""]
    out.append(f"Inputs: {', '.join(str(i) for i in inputs)} — {len(report.runs)} run file(s) read, "
               f"{len(report.problems)} unreadable, {len(report.failed)} failed.")
    out.append("")
    if report.problems:
        out += ["## Files that could not be read", ""]
        out += [f"- {msg}" for _, msg in report.problems] + [""]
    if report.failed:
        out += ["## Failed runs (listed, not plotted)", ""]
        out += [f"- `{r.path.name}` ({r.name}, {r.optimizer_type}): {r.error or 'no error recorded'}"
                for r in report.failed] + [""]
    if report.empty:
        out += ["## Runs with no recorded step yet", ""]
        out += [f"- `{r.path.name}` ({r.name}): status {r.status}" for r in report.empty] + [""]
    if report.varying:
        out += ["## Settings that differ between runs", ""]
        out += [f"- `{k}`: {', '.join(_value_text(v) for v in vals)}" for k, vals in report.varying.items()] + [""]
    for gname, members in report.groups.items():
        rows = [r for r in report.rows if r.group == gname]
        out += [f"## Group: {gname}", "", f"Network: {network_text(members[0])}. Compute of the modelled step: "
                f"{compute_text(members[0])}.", "", markdown_table(rows), ""]
        nodes = sorted({ranks_per_node(m) for m in members if ranks_per_node(m) > 1})
        if nodes:
            out += [f"Runs with nodes of {', '.join(map(str, nodes))} ranks (`topology.ranks_per_node`): their "
                    "*bytes/worker/step* and *comm. reduction* count the bytes sent between nodes "
                    "(`bytes_sent_inter`); the node's own collectives are `bytes_sent_intra`.", ""]
    out += ["Columns: *final val* is the last validation loss, *best val* its minimum; *Δ vs dense* the final",
            "validation loss minus that of the group's dense run with the same inner optimizer (marked *(train)*",
            f"when the runs have no validation set: then the mean train loss of the last {TRAIN_TAIL} steps);",
            "*comm. reduction* = mean bytes sent per worker per step of that dense run / this run's; *exposed comm*",
            "the mean alpha-beta time of the collectives not hidden behind compute; *step time* the mean modelled",
            "step time (the group's compute, named under its title, plus that communication on its network)",
            "and *speedup* the dense run's mean step time / this run's. Both are modelled from the optimizer's",
            "collectives and never include the diagnostics a multi-process run sends to rank 0 (`grad_norm`, the",
            "oracle metrics; the measured section's step wall time does). Final values of diverged runs are left",
            "out; their curves stop at the divergence (marked ×).", ""]
    if report.problems_over_seeds:
        out += [seeds.markdown_section(report.problems_over_seeds, report.reference), ""]
    if figures:
        out += ["## Figures", ""]
        if len(report.groups) > MAX_GROUP_ROWS:
            out += [f"Per-step figures show the first {MAX_GROUP_ROWS} of the {len(report.groups)} groups; "
                    "report fewer runs at a time to see the others.", ""]
        out += [f"- {title}: [{name}]({name})" for name, title in figures] + [""]
    return "\n".join(out)


def seed_problems(report, reference=DEFAULT_REFERENCE, target_loss=None,
                  target_margin=DEFAULT_TARGET_MARGIN):
    """The report's runs as problems and arms over seeds and lrs (analysis/stats.py); [] when every
    arm holds a single run (nothing to add to the table)."""
    varying = {k: v for k, v in report.varying.items() if k != "optimizer.lr"}
    pkeys = [k for k in group_keys(varying) if k != "seed"]
    problems = build_problems([r.run for r in report.rows], lambda r: run_label(r, varying),
                              lambda r: group_label(r, pkeys), reference, target_loss, target_margin)
    return problems if any(len(a.runs) > 1 or len(next(iter(a.runs.values()))) > 1
                           for p in problems for a in p.arms) else []


def write_report(inputs, out_dir, reference=DEFAULT_REFERENCE, target_loss=None,
                 target_margin=DEFAULT_TARGET_MARGIN, band="ci", figures=True, clusters=(),
                 cluster_overlap=False):
    """Builds the report of `inputs` into `out_dir` (figures unless figures=False, summary.md,
    summary.csv and, with several seeds or lrs per arm, seeds.csv; with `clusters`, prediction
    configs, the time-to-target section and time_to_target.csv); returns (report, text)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from .pareto import pareto_section

    report = build_report(inputs)
    report.problems_over_seeds = seed_problems(report, reference, target_loss, target_margin)
    report.reference = reference
    draw = figures
    if figures and report.rows:
        from .figures import make_figures  # matplotlib only when figures are wanted

        figures = make_figures(report, out_dir, band)
    else:
        figures = []
    pareto_figures, pareto_lines = (pareto_section(report, out_dir, draw, reference, target_loss, target_margin)
                                    if report.rows else ([], []))
    measured = breakdown.breakdowns(report)
    breakdown_figures = []
    if measured:
        breakdown.write_csv(measured, out_dir / "breakdown.csv")
        if draw:
            breakdown.draw(measured, out_dir / "breakdown.png")
            breakdown_figures.append(("breakdown.png", "measured step time by part (MPI and NCCL runs)"))
    horizon_lines = horizon.markdown_section(report.problems_over_seeds) if report.problems_over_seeds else []
    horizon_figures = []
    if horizon_lines and draw and horizon.draw(report.problems_over_seeds, out_dir / "horizon.png"):
        horizon_figures.append(("horizon.png", "the gap to the reference against steps and updates per coordinate"))
    text = markdown_summary(report, inputs, figures + pareto_figures + breakdown_figures + horizon_figures)
    if horizon_lines:
        text += "\n" + "\n".join(horizon_lines)
    if pareto_lines:
        text += "\n" + "\n".join(pareto_lines)
    if measured:
        text += "\n" + "\n".join(breakdown.markdown_section(measured)) + "\n"
    if report.problems_over_seeds:
        seeds.write_seeds_csv(report.problems_over_seeds, out_dir / "seeds.csv")
    if clusters and report.problems_over_seeds:
        from . import time_to_target
        from .runs import scape_binary

        lines, rows = time_to_target.cluster_section(report.problems_over_seeds, clusters, scape_binary(),
                                                    bucketed_overlap=cluster_overlap)
        text += "\n" + "\n".join(lines) + "\n"
        time_to_target.write_csv(rows, out_dir / "time_to_target.csv")
    (out_dir / "summary.md").write_text(text + "\n", encoding="utf-8")
    write_csv(report, out_dir / "summary.csv")
    return report, text
