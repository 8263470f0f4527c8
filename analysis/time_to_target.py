"""The report's "Time to target on a cluster" section (`report --cluster PREDICTION.json`).

The paper's end-to-end claim is wall-clock time to a loss. Here it is tested with laptop token
efficiency: for each arm (at its best lr) the measured tokens to the problem's target validation
loss, seed by seed (analysis/stats.py), times `scape predict`'s step time for the same optimizer
on the prediction config's model and cluster, at the config's largest worker count. Both
quantities are taken relative to the reference arm (dense), so the cluster's tokens per step
cancel:

    time ratio (seed s) = (tokens_arm[s] / tokens_ref[s]) · (step_arm / step_ref)

reported as its mean and 95% Student-t interval over the seeds both reached the target with. An
arm with a seed that never reaches the target is reported as such, not extrapolated. An arm of
the type of the config's dense baseline (AdamS by default) is predicted as that baseline row;
every other arm, the reference included when `--reference` names another, as the config's
optimizer with the arm's optimizer.type, sparsity and formulation set on it. So an arm's step is
the same whichever arm is the reference.
"""

import csv
import json
import math
import subprocess
import tempfile
from pathlib import Path

from .stats import interval

# The keys of an arm's optimizer that carry over to the cluster's prediction: those that decide
# its bytes and its overlap as it trained (the local-SGD period, fragments, outer wire and
# delayed outer step; SparseLoCo's chunk and value bits; DeMo's chunk and top-k). The rest (wire
# and parameter dtypes, sharding, offload, bucketed overlap) are the prediction config's: the
# cluster's setup, which leave the arm's arithmetic as it ran.
TRANSFERRED = ("optimizer.type", "optimizer.sparsity", "optimizer.formulation", "optimizer.inner",
               "optimizer.inner_steps", "optimizer.streaming_fragments", "optimizer.outer_wire",
               "optimizer.overlap_outer", "optimizer.chunk", "optimizer.quant_bits", "optimizer.demo_chunk",
               "optimizer.demo_topk")

BUCKETED_OVERLAP = {"overlap.grad_reduce": True, "overlap.param_gather": True, "overlap.sparse_reduce": True}
"""`report --cluster-overlap`: the per-step methods' collectives bucketed into the backward and the
next forward pass (docs/PREDICTING.md, "Step time and overlap"), as DDP and Megatron do. Their
arithmetic is unchanged, so the measured tokens stand; the local-SGD methods' own overlap, the
delayed outer step, changes the arithmetic and is an arm of its own (`optimizer.overlap_outer`)."""


def predicted_step(binary, cluster, overrides, dense):
    """(step seconds, workers) at the config's largest worker count: the baseline row when
    `dense`, else the optimizer row with `overrides` ({dotted key: value}) set."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [binary, "predict", str(cluster), "--out", str(Path(tmp) / "p.h5"), "--csv", str(Path(tmp) / "p.csv")]
        for key, value in overrides.items():
            command += ["--set", f"{key}={json.dumps(value)}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise ValueError(f"{cluster}: scape predict exited {done.returncode}: {done.stderr.strip()[-500:]}")
        with open(Path(tmp) / "p.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    wanted = "baseline" if dense else "optimizer"
    rows = [r for r in rows if r["config"] == wanted]
    if not rows:
        raise ValueError(f"{cluster}: scape predict wrote no {wanted} row")
    workers = max(int(r["workers"]) for r in rows)
    step = next(float(r["step_s"]) for r in rows if int(r["workers"]) == workers)
    return step, workers


def baseline_type(cluster):
    """The optimizer type of a prediction config's dense baseline row (docs/PREDICTING.md,
    `baseline`: its own section's type, else AdamS, or AdamW when the optimizer's inner is adamw)."""
    try:
        config = json.loads(Path(cluster).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{cluster}: cannot read the prediction config: {e}") from e
    baseline, optimizer = config.get("baseline") or {}, config.get("optimizer") or {}
    if "type" in baseline:
        return baseline["type"]
    if optimizer.get("type") in ("adams", "adamw"):
        return optimizer["type"]  # a dense optimizer is its own baseline
    return "adamw" if optimizer.get("inner") == "adamw" else "adams"


def arm_step(binary, cluster, arm, extra, dense_type):
    """(step seconds, workers) of one arm on the cluster: the baseline row for an arm of the
    baseline's type, else the optimizer row with the arm's TRANSFERRED keys; `extra` set on both."""
    if arm.config.get("optimizer.type") == dense_type:
        return predicted_step(binary, cluster, dict(extra), dense=True)
    return predicted_step(binary, cluster, {**arm_overrides(arm), **extra}, dense=False)


def arm_overrides(arm):
    return {k: arm.config[k] for k in TRANSFERRED if k in arm.config}


def time_ratios(arm, reference, step_ratio):
    """Per seed both ran: the time ratio, or inf where the arm never reached the target."""
    out = {}
    for seed, tokens in arm.tokens.items():
        ref = reference.tokens.get(seed, math.nan)
        if math.isnan(tokens) or not math.isfinite(ref) or ref <= 0:
            continue
        out[seed] = math.inf if math.isinf(tokens) else tokens / ref * step_ratio
    return out


def ratio_text(ratios):
    """'0.62 [0.55, 0.70] (38% less)' over the seeds, or who never reached the target."""
    if not ratios:
        return "—", ""
    never = sum(1 for v in ratios.values() if math.isinf(v))
    if never:
        return f"not reached by {never}/{len(ratios)} seeds", ""
    iv = interval(list(ratios.values()))
    change = (1 - iv.mean) * 100
    text = f"{iv.mean:.3f} ({abs(change):.1f}% {'less' if change >= 0 else 'more'} time)"
    return text, (f"[{iv.lo:.3f}, {iv.hi:.3f}]" if iv.n > 1 else "—")


def cluster_section(problems, clusters, binary, bucketed_overlap=False):
    """The section's Markdown lines and its CSV rows, for every cluster config and problem; with
    `bucketed_overlap` each cluster a second time with BUCKETED_OVERLAP set."""
    lines = ["## Time to target on a cluster", "",
             "Measured tokens to the target validation loss (each arm at its best lr) times `scape predict`'s",
             "step time for the same optimizer on the prediction config's model and cluster at its largest",
             "worker count, relative to the reference arm, paired by seed (mean, 95% Student-t interval over",
             "seeds). Dense arms are predicted as the config's dense baseline; the other arms take the config's",
             "optimizer with their type, sparsity, formulation and what sets their bytes and overlap as they",
             "trained (local-SGD period, fragments, outer wire, delayed outer step; chunks and value bits).",
             "A seed that never reached the target is reported, not extrapolated.", ""]
    rows = []
    variants = [("config", {})] + ([("bucketed", BUCKETED_OVERLAP)] if bucketed_overlap else [])
    for cluster in clusters:
        for overlap, extra in variants:
            heading = f"### {Path(cluster).name}"
            if bucketed_overlap:
                heading += (", the config's overlap" if overlap == "config" else
                            ", bucketed overlap on (" + ", ".join(f"`{k}`" for k in BUCKETED_OVERLAP) + ")")
            lines += [heading, ""]
            lines += _cluster_tables(problems, cluster, binary, overlap, extra, rows)
    return lines, rows


def _cluster_tables(problems, cluster, binary, overlap, extra, rows):
    """One cluster and overlap setting: a table per problem (appending its CSV rows to `rows`)."""
    lines = []
    dense_type = baseline_type(cluster)
    for problem in problems:
        ref = problem.reference
        if ref is None or not math.isfinite(problem.target):
            lines += [f"{problem.label}: no reference with a target validation loss; nothing to compare.", ""]
            continue
        ref_step, workers = arm_step(binary, cluster, ref, extra, dense_type)
        lines += [f"{problem.label}: target {problem.target:.4f}; W = {workers}; reference {ref.label} "
                  f"predicted at {ref_step * 1e3:.1f} ms a step.", "",
                  "| arm | seeds reached | predicted step (ms) | step vs reference | time to target vs reference | 95% interval |",
                  "|---|---|---|---|---|---|"]
        for arm in problem.arms:
            step = ref_step if arm is ref else arm_step(binary, cluster, arm, extra, dense_type)[0]
            ratios = time_ratios(arm, ref, step / ref_step)
            text, iv = ("reference", "") if arm is ref else ratio_text(ratios)
            reached = sum(1 for v in arm.tokens.values() if math.isfinite(v))
            label = arm.label.replace("|", "\\|")
            lines.append(f"| {label} | {reached}/{len(arm.tokens)} | {step * 1e3:.1f} | "
                         f"{step / ref_step:.3f} | {text} | {iv} |")
            finite = [v for v in ratios.values() if math.isfinite(v)]
            rows.append([Path(cluster).name, overlap, problem.label, arm.label, workers, step, step / ref_step,
                         len(ratios), len(finite), float(sum(finite) / len(finite)) if finite else math.nan])
        lines.append("")
    return lines


def write_csv(rows, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["cluster", "overlap", "problem", "arm", "workers", "step_s", "step_ratio", "seeds", "seeds_reached",
                    "time_ratio_mean"])
        w.writerows(rows)
