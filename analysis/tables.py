"""The run table: groups, labels, the summary-table rows, their Markdown table and summary.csv.

Runs are compared on the settings that differ between them. Settings outside `optimizer.*`
(workers, model, data, network, seed) define *groups*: runs of one group saw the same problem,
so each sparse run is compared with a dense run of its own group. Optimizer settings define the
run's *label* inside its group. Keys that do not apply to a run's optimizer are ignored
(`runs.effective_config`, from each run file's `optimizer_keys` attribute), so a dense AdamS run
is not "sparsity 0.99" because the resolved config of an older scape filled that default in.
"""

import csv
import math
from dataclasses import dataclass, field

import numpy as np

from .runs import SPARSE_TYPES, check_key_types, effective_config, finite_mean, load_runs
from .stats import DEFAULT_REFERENCE, final_train_loss, first_train_loss

MAX_GROUP_ROWS = 8
"""Per-step figures draw at most this many groups (one row of panels each)."""

_MISSING = object()


@dataclass
class Row:
    """The summary-table figures of one run (NaN where they do not apply)."""

    run: object
    label: str
    group: str
    status: str
    final_val: float = math.nan
    best_val: float = math.nan
    final_train: float = math.nan
    first_train: float = math.nan  # the first finite train loss: where the run started
    delta: float = math.nan
    delta_on: str = ""
    bytes_per_step: float = math.nan
    comm_reduction: float = math.nan
    step_time: float = math.nan
    exposed_comm: float = math.nan
    speedup: float = math.nan
    baseline: str = ""
    notes: list = field(default_factory=list)


@dataclass
class Report:
    """Everything the Markdown summary and the figures are made from."""

    runs: list
    failed: list
    empty: list
    problems: list
    varying: dict
    groups: dict
    labels: dict
    rows: list
    problems_over_seeds: list = field(default_factory=list)
    reference: str = DEFAULT_REFERENCE


def _value_text(value):
    """Compact text of a config value for labels."""
    if isinstance(value, tuple):
        return "[" + ",".join(_value_text(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _sort_key(value):
    """Numbers in numeric order before text, so workers sort 2, 4, 8, 16, 32."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return (1, 0.0, _value_text(value))
    return (0, float(value), "")


def varying_keys(runs):
    """{key: sorted distinct values} of the effective-config keys that differ between runs.

    A key missing from some runs (it does not apply to them) varies only if the runs that have
    it disagree.
    """
    configs = [effective_config(r) for r in runs]
    keys = sorted(set().union(*configs)) if configs else []
    out = {}
    for key in keys:
        values = {c[key] for c in configs if key in c}
        if len(values) > 1:
            out[key] = sorted(values, key=_sort_key)
    return out


def group_keys(varying):
    """The varying settings that define the problem a run solves (everything but optimizer.*)."""
    return [k for k in varying if not k.startswith("optimizer.")]


def group_label(run, keys):
    """'workers=8, seed=2' for the group keys the run has, or 'all runs' when only the optimizer varies."""
    cfg = effective_config(run)
    parts = [f"{k}={_value_text(cfg[k])}" for k in keys if k in cfg]
    return ", ".join(parts) if parts else "all runs"


def optimizer_name(run):
    """'AdamS', 'SCAPE(adams) s=0.99', 'top-k EF(adamw) s=0.9'."""
    opt = run.config.get("optimizer", {})
    kind = opt.get("type", "?")
    if kind == "adamw":
        return "AdamW"
    if kind == "adams":
        return "AdamS"
    if kind == "onebit_adam":
        return f"1-bit Adam F={opt.get('freeze_step', '?')} C={opt.get('sign_chunk', '?')}"
    if kind == "powersgd":
        return f"PowerSGD({opt.get('inner', '?')}) r={opt.get('powersgd_rank', '?')}"
    if kind == "demo":
        return f"DeMo C={opt.get('demo_chunk', '?')} k={opt.get('demo_topk', '?')}"
    if kind == "diloco":
        fragments = opt.get("streaming_fragments", 1)
        name = "Streaming DiLoCo" if isinstance(fragments, int) and fragments > 1 else "DiLoCo"
        extra = f" F={fragments}" if name.startswith("Streaming") else ""
        return f"{name}({opt.get('inner', '?')}) H={opt.get('inner_steps', '?')}{extra} {opt.get('outer_wire', '?')}"
    if kind == "sparseloco":
        return (f"SparseLoCo({opt.get('inner', '?')}) H={opt.get('inner_steps', '?')} "
                f"s={_value_text(opt.get('sparsity', '?'))} q={opt.get('quant_bits', '?')}")
    title = {"scape": "SCAPE", "topk_ef": "top-k EF", "randk_ef": "random-k EF"}.get(kind, kind)
    return f"{title}({opt.get('inner', '?')}) s={_value_text(opt.get('sparsity', '?'))}"


def run_label(run, varying):
    """Optimizer name plus the other optimizer settings in `varying` that apply to this run."""
    cfg = effective_config(run)
    extra = [f"{k.split('.', 1)[1]}={_value_text(cfg[k])}" for k in varying
             if k.startswith("optimizer.") and k not in ("optimizer.type", "optimizer.inner", "optimizer.sparsity")
             and k in cfg]
    return " ".join([optimizer_name(run)] + extra)


def group_labels(members):
    """Labels of one group's runs, from the optimizer settings that vary inside the group.

    Identical labels (re-runs of one config) get the file stem appended.
    """
    varying = varying_keys(members)
    labels = {r.path: run_label(r, varying) for r in members}
    counts = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    return {path: label + (f" [{path.stem}]" if counts[label] > 1 else "") for path, label in labels.items()}


def pick_baseline(run, candidates):
    """The dense run to compare `run` with: same inner optimizer, same sharding, most settings alike.

    A sparse run with inner AdamW is compared with dense AdamW and one with inner AdamS with
    dense AdamS; a dense run is its own baseline. Between dense runs equally alike (say two learning
    rates, neither the sparse run's), a completed one is preferred to one still running. Returns
    None when the group has no dense run.
    """
    if not candidates:
        return None
    opt = run.config.get("optimizer", {})
    inner_rule = run.optimizer_type in SPARSE_TYPES or run.optimizer_type == "powersgd"
    target = opt.get("inner", "adams") if inner_rule else run.optimizer_type
    mine = effective_config(run)

    def score(c):
        theirs = effective_config(c)
        alike = sum(1 for k, v in theirs.items() if k.startswith("optimizer.") and mine.get(k, _MISSING) == v)
        return (c is run, c.optimizer_type == target,
                c.config["optimizer"].get("sharded") == opt.get("sharded"), alike, c.status == "completed")

    return max(candidates, key=score)


def diverged_at(run):
    """The last recorded step of a diverged run (the step with the non-finite loss or gradient)."""
    return int(run.steps[-1]) if len(run.steps) else run.steps_completed


def status_text(run):
    """Status column: completed, 'diverged at step N', 'running (N/T steps)', 'killed (N/T steps)',
    'interrupted (N/T steps)' (a stop signal ended it at a step boundary)."""
    total = run.config.get("steps", "?")
    if run.status == "diverged":
        return f"**diverged** at step {diverged_at(run)}"
    if run.status == "running":
        # A killed run's file says running until `scape repair FILE` marks it killed.
        return f"running ({len(run.steps)}/{total} steps)"
    if run.status in ("killed", "interrupted"):
        return f"{run.status} ({len(run.steps)}/{total} steps)"
    if run.status == "completed" and len(run.steps) < run.steps_completed:
        return f"completed ({len(run.steps)} rows)"
    return run.status


def ranks_per_node(run):
    """G of a run's topology (1 where the file records none)."""
    return int(run.config.get("topology", {}).get("ranks_per_node", 1))


def headline_bytes(run):
    """A worker's mean bytes a step, as the table heads them: the inter-node part
    (`bytes_sent_inter`) where nodes hold several ranks, whose dense collectives inside the node
    ride links 100-1000 times faster; every byte otherwise."""
    return finite_mean(run.metric("bytes_sent_inter" if ranks_per_node(run) > 1 else "bytes_sent"))


def make_row(run, label, group, baseline):
    """Fills one summary-table row; comparisons against `baseline` (None: not available)."""
    row = Row(run=run, label=label, group=group, status=status_text(run))
    val = run.val_loss[np.isfinite(run.val_loss)] if len(run.val_loss) else np.zeros(0)
    row.best_val = float(val.min()) if val.size else math.nan
    row.bytes_per_step = headline_bytes(run)
    row.step_time = finite_mean(run.metric("step_time_model"))
    row.exposed_comm = finite_mean(run.metric("comm_time_exposed"))
    if run.status != "diverged":
        row.final_val = float(val[-1]) if val.size else math.nan
        row.final_train = final_train_loss(run)
    row.first_train = first_train_loss(run)
    if baseline is None:
        row.notes.append("no dense run in this group")
        return row
    row.baseline = baseline.path.name
    base_bytes = headline_bytes(baseline)
    base_time = finite_mean(baseline.metric("step_time_model"))
    row.comm_reduction = base_bytes / row.bytes_per_step if row.bytes_per_step > 0 else math.nan
    row.speedup = base_time / row.step_time if row.step_time > 0 else math.nan
    base_val = baseline.val_loss[np.isfinite(baseline.val_loss)] if len(baseline.val_loss) else np.zeros(0)
    if run.status == "diverged" or baseline.status == "diverged":
        row.delta_on = ""
    elif val.size and base_val.size:
        row.delta, row.delta_on = row.final_val - float(base_val[-1]), "val"
    else:
        row.delta, row.delta_on = row.final_train - final_train_loss(baseline), "train"
    return row


_TYPE_ORDER = {"adamw": 0, "adams": 1, "scape": 2, "topk_ef": 3, "randk_ef": 4, "onebit_adam": 5, "powersgd": 6,
               "demo": 7, "diloco": 8, "sparseloco": 9}


def row_order(run, label):
    """Table order: dense runs first, then SCAPE, then top-k; by sparsity, then by label."""
    opt = run.config.get("optimizer", {})
    sparsity = opt.get("sparsity", 0.0) if run.optimizer_type in SPARSE_TYPES else 0.0
    return (_TYPE_ORDER.get(run.optimizer_type, 9), sparsity, label, str(run.path))


def build_report(inputs):
    """Loads the runs under `inputs`, groups and labels them, and computes the table rows."""
    runs, problems = load_runs(inputs)
    failed = [r for r in runs if r.status == "failed"]
    empty = [r for r in runs if r.status != "failed" and len(r.steps) == 0]
    usable = [r for r in runs if r.status != "failed" and len(r.steps) > 0]
    check_key_types(usable)  # one error naming every file that lacks its key table, if any must
    varying = varying_keys(usable)
    gkeys = group_keys(varying)
    groups = {}
    for r in sorted(usable, key=lambda u: tuple(_sort_key(effective_config(u).get(k, "")) for k in gkeys)):
        groups.setdefault(group_label(r, gkeys), []).append(r)
    labels, rows = {}, []
    for gname, members in groups.items():
        labels.update(group_labels(members))
        dense = [m for m in members if m.is_dense and m.status in ("completed", "running")]
        for r in sorted(members, key=lambda m: row_order(m, labels[m.path])):
            rows.append(make_row(r, labels[r.path], gname, pick_baseline(r, dense)))
    return Report(runs=runs, failed=failed, empty=empty, problems=problems, varying=varying,
                  groups=groups, labels=labels, rows=rows)


def _fmt(value, spec, suffix=""):
    """Formats a number, '—' for NaN."""
    return "—" if value is None or not math.isfinite(value) else f"{value:{spec}}{suffix}"


TABLE_HEADER = ["run", "status", "final val", "best val", "Δ vs dense", "final train",
                "bytes/worker/step", "comm. reduction", "exposed comm (µs)", "step time (ms, modelled)",
                "speedup", "file"]


def table_cells(row):
    """One Markdown table row as a list of cell strings (the order of TABLE_HEADER)."""
    delta = _fmt(row.delta, "+.4f") + (f" ({row.delta_on})" if row.delta_on == "train" else "")
    return [row.label, row.status, _fmt(row.final_val, ".4f"), _fmt(row.best_val, ".4f"), delta,
            _fmt(row.final_train, ".4f"), _fmt(row.bytes_per_step, ".4g"), _fmt(row.comm_reduction, ".2f", "×"),
            _fmt(row.exposed_comm * 1e6, ".4g"), _fmt(row.step_time * 1e3, ".4g"), _fmt(row.speedup, ".2f", "×"), row.run.path.name]


def markdown_table(rows):
    """A GitHub Markdown table of `rows`."""
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in table_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def network_text(run):
    """'ib_ndr400 (5 µs, 50 GB/s)' of a run's network."""
    net = run.config.get("network", {})
    return f"{net.get('preset', '?')} (α {_value_text(net.get('alpha_us', '?'))} µs, " \
           f"{_value_text(net.get('bandwidth_GBps', '?'))} GB/s)"


def compute_text(run):
    """What a run's modelled step time takes as compute (the run's `compute` section)."""
    compute = run.config.get("compute", {})
    if compute.get("type") == "flops":
        return f"FLOPs of one worker's micro-batch on {compute.get('device', '?')} at MFU " \
               f"{_value_text(compute.get('mfu', '?'))}"
    return "measured CPU time of one simulated worker"


def write_csv(report, path):
    """summary.csv: the table at full precision, for scripts and tests."""
    fields = ["file", "group", "label", "status", "final_val", "best_val", "delta", "delta_on", "final_train",
              "bytes_per_step", "comm_reduction", "exposed_comm", "step_time", "speedup", "baseline"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for r in report.rows:
            w.writerow([r.run.path.name, r.group, r.label, r.run.status, r.final_val, r.best_val, r.delta,
                        r.delta_on, r.final_train, r.bytes_per_step, r.comm_reduction, r.exposed_comm, r.step_time, r.speedup,
                        r.baseline])
