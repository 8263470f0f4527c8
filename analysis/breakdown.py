"""Measured step time of runs made by the MPI or NCCL runtime, broken into its parts.

A measured run (docs/run-files.md: `compute_wall_time`, `optimizer_wall_time`,
`comm_time_measured_<purpose>`, `mask_wait_exposed` and, for a dense baseline with
`optimizer.overlap_grad_reduce`, `grad_wait_exposed`, which the simulator does not write) spends
each step in forward/backward and then in the optimizer phase; the optimizer phase holds the
blocking collectives, the waits for the asynchronous ones (the lagged mask all-gather, the
gradient buckets), and the optimizer's own kernels (what is left). Per run, the mean over the
steady steps of each part. The step is compute + the optimizer phase; its parts are compute +
optimizer kernels + each blocking collective + the exposed waits. The asynchronous collectives themselves
(`comm_time_measured_async_all_gather`, `comm_time_measured_async_reduce_scatter`) run beside
compute; they are listed apart, and only what the step waited for them counts in the step.

Beside the parts, rank 0's `step_wall_time` (from the start of one step to the start of the next:
the whole step, the diagnostics' gathers to rank 0, evaluation and the run file included) gives the
median step a user waits for, and `diagnostics_time` / `bytes_sent_diagnostics` what the
metrics that read every worker's gradient on rank 0 (`grad_norm`, the oracle metrics) cost:
outside the parts, inside the step wall time. The speedup against the group's dense run is the
ratio of the median step wall times, so it includes the diagnostics; a row whose diagnostics
differ from its dense run's says so (docs/configuration.md, "Diagnostics on real ranks").

Steady steps: from step 4 (the first steps pay one-off allocations and, under lag 1, have no
mask to wait for) to the last but one (the last step waits for every rank to finish). The times
are the slowest rank's: the run file records the maximum over ranks of each column, so in a step
whose ranks are out of balance (one waited in the reduce-scatter while another waited for its
mask) the maxima come from different ranks and the parts need not add up to the step. The
optimizer kernels are therefore each rank's own remainder (`optimizer_kernel_wall_time`, the
slowest rank's), and what the parts miss or overcount is shown as `rank_skew`: the step less
its parts, 0 when one rank is the slowest in every part. Files written before that column
existed take the kernels as the remainder of the maxima (their skew is 0 by construction, and
their kernels can come out negative under imbalance).

Exposed communication, the one definition every table uses (`exposed_comm`; the netlab's
`exposed_comm_ms` is its median): per step, the seconds of the step spent waiting for
communication = every blocking collective's `comm_time_measured_<purpose>` + the waits for the
asynchronous ones, `mask_wait_exposed` (the lagged mask all-gather) and `grad_wait_exposed` (the
gradient buckets); an absent or NaN part counts 0. The asynchronous collectives' own times are
not in it: they run beside compute. Callers choose the steps and the statistic (this section:
the mean over the steady steps, so the parts add up; the netlab: the median).
"""

import csv
import math
from dataclasses import dataclass, field

import numpy as np

MEASURED_PREFIX = "comm_time_measured_"
LAGGED = "async_all_gather"
BUCKETS = "async_reduce_scatter"
EXPOSED_WAITS = ("mask_wait_exposed", "grad_wait_exposed")
FIRST_STEADY_STEP = 4


def is_blocking(name):
    """Whether a run-file column is a blocking collective's measured time, all of it in the step."""
    return name.startswith(MEASURED_PREFIX) and name[len(MEASURED_PREFIX):] not in (LAGGED, BUCKETS)


def exposed_columns(names):
    """The columns whose per-step sum is the step's exposed communication (module docstring)."""
    return sorted(n for n in names if is_blocking(n)) + [w for w in EXPOSED_WAITS if w in names]


def exposed_comm(metrics, rows=None):
    """Exposed communication in seconds, one value a step: `metrics` maps column names to per-step
    series (a Run's `metrics`, a run file's /metrics group) taken at `rows` (an index or slice;
    None: as they are, also scalars such as one step's `last_metrics` of scape.torch)."""
    total = 0.0
    for name in exposed_columns(metrics):
        values = metrics[name] if rows is None else metrics[name][rows]
        total = total + np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0)
    return total


@dataclass
class Breakdown:
    """The mean parts of one measured run's step, in seconds."""

    label: str
    file: str
    workers: int
    optimizer: str
    steps_used: int
    compute: float
    optimizer_phase: float                            # optimizer_wall_time: kernels, collectives, waits
    optimizer_kernels: float
    mask_wait: float
    grad_wait: float = 0.0                            # the wait for the gradient buckets
    collectives: dict = field(default_factory=dict)  # blocking purpose -> mean seconds
    lagged_all_gather: float = math.nan               # beside compute, not part of the step
    gradient_buckets: float = math.nan                # beside the backward pass, not part of the step
    step_wall: float = math.nan        # median step_wall_time (rank 0), diagnostics included; NaN in older files
    diagnostics: float = math.nan      # mean diagnostics_time over the steady steps (outside the parts)
    diagnostic_bytes: float = math.nan  # mean bytes_sent_diagnostics per step, over every step
    diagnostics_taken: str = ""        # what the run's diagnostics were (diagnostics_text)
    speedup: float = math.nan          # the dense run's median step wall / this run's
    speedup_note: str = ""             # set when this run's diagnostics differ from that dense run's

    @property
    def step(self):
        """The mean measured step: forward/backward plus the whole optimizer phase."""
        return self.compute + self.optimizer_phase

    @property
    def rank_skew(self):
        """The step less its parts: 0 when one rank is the slowest in every part (module docstring)."""
        return self.step - (self.compute + self.optimizer_kernels + self.exposed_comm)

    @property
    def exposed_comm(self):
        """The mean of `exposed_comm` over the steady steps, as the sum of its parts' means."""
        return self.mask_wait + self.grad_wait + sum(self.collectives.values())


def is_measured(run):
    """Whether the run file holds the measured columns of the MPI/NCCL runtime."""
    return "compute_wall_time" in run.metrics and "optimizer_wall_time" in run.metrics and any(
        name.startswith(MEASURED_PREFIX) for name in run.metrics)


def steady_rows(run):
    """Indices of the steady steps (step 4 to the last but one) with finite wall times."""
    steps = run.steps
    if len(steps) == 0:
        return np.zeros(0, dtype=np.int64)
    keep = (steps >= FIRST_STEADY_STEP) & (steps < steps.max())
    keep &= np.isfinite(run.metric("compute_wall_time")) & np.isfinite(run.metric("optimizer_wall_time"))
    return np.nonzero(keep)[0]


def diagnostics_text(run):
    """What a run's rank-0 diagnostics took, from its recorded config: 'grad_norm every k steps', plus
    the oracle where it sends a_i (a sparse optimizer with `log.oracle`)."""
    log = run.config.get("log", {})
    every = int(log.get("gradient_metrics_interval", 1))
    text = "grad_norm every step" if every == 1 else f"grad_norm every {every} steps"
    opt = run.config.get("optimizer", {})
    # The oracle is defined (and a_i sent for it) for top-k/random-k EF and SCAPE's frozen_momentum.
    scored = run.optimizer_type in ("topk_ef", "randk_ef") or (
        run.optimizer_type == "scape" and opt.get("formulation") == "frozen_momentum")
    if log.get("oracle", True) and scored:
        text += " + oracle"
    return text


def _median_of(run, name, rows):
    if name not in run.metrics:
        return math.nan
    values = run.metric(name)[rows]
    values = values[np.isfinite(values)]
    return float(np.median(values)) if values.size else math.nan


def _mean_of(run, name, rows=None):
    if name not in run.metrics:
        return math.nan
    values = run.metric(name) if rows is None else run.metric(name)[rows]
    values = values[np.isfinite(values)]
    return float(np.mean(values)) if values.size else math.nan


def breakdown(run, label):
    """The Breakdown of a measured run, or None when it is not measured or has no steady step."""
    if not is_measured(run):
        return None
    rows = steady_rows(run)
    if rows.size == 0:
        return None
    zero_nan = lambda name: np.nan_to_num(run.metric(name)[rows], nan=0.0)  # noqa: E731  absent part: 0 s
    collectives = {}
    for name in sorted(run.metrics):
        if is_blocking(name):
            collectives[name[len(MEASURED_PREFIX):]] = zero_nan(name)
    wait = zero_nan("mask_wait_exposed")
    grad_wait = zero_nan("grad_wait_exposed") if "grad_wait_exposed" in run.metrics else np.zeros(rows.size)
    optimizer_phase = run.metric("optimizer_wall_time")[rows]
    if "optimizer_kernel_wall_time" in run.metrics:
        kernels = run.metric("optimizer_kernel_wall_time")[rows]
    else:
        kernels = optimizer_phase - wait - grad_wait - sum(collectives.values(), np.zeros(rows.size))

    def beside(purpose):
        name = MEASURED_PREFIX + purpose
        values = run.metric(name)[rows] if name in run.metrics else None
        return float(np.mean(values)) if values is not None and np.any(values > 0) else math.nan

    return Breakdown(label=label, file=run.path.name, workers=int(run.config.get("workers", 0)),
                     optimizer=run.optimizer_type, steps_used=int(rows.size),
                     compute=float(np.mean(run.metric("compute_wall_time")[rows])),
                     optimizer_phase=float(np.mean(optimizer_phase)),
                     optimizer_kernels=float(np.mean(kernels)), mask_wait=float(np.mean(wait)),
                     grad_wait=float(np.mean(grad_wait)),
                     collectives={p: float(np.mean(v)) for p, v in collectives.items() if np.any(v > 0)},
                     lagged_all_gather=beside(LAGGED), gradient_buckets=beside(BUCKETS),
                     step_wall=_median_of(run, "step_wall_time", rows),
                     diagnostics=_mean_of(run, "diagnostics_time", rows),
                     diagnostic_bytes=_mean_of(run, "bytes_sent_diagnostics"),
                     diagnostics_taken=diagnostics_text(run))


def breakdowns(report):
    """The Breakdown of every measured run of a Report, in table order, each with its speedup
    against its row's dense run when that run is measured too."""
    out, by_file, baseline_of = [], {}, {}
    for row in report.rows:
        b = breakdown(row.run, row.label if len(report.groups) == 1 else f"{row.group}: {row.label}")
        if b is not None:
            out.append(b)
            by_file[row.run.path.name] = b
            baseline_of[row.run.path.name] = row.baseline
    for b in out:
        dense = by_file.get(baseline_of.get(b.file) or "")
        if dense is None or not (b.step_wall > 0 and math.isfinite(dense.step_wall)):
            continue
        b.speedup = dense.step_wall / b.step_wall
        if dense.diagnostics_taken != b.diagnostics_taken:
            b.speedup_note = f"diagnostics differ: {b.diagnostics_taken} against the dense run's {dense.diagnostics_taken}"
    return out


def _ms(seconds):
    return "" if not math.isfinite(seconds) else f"{1e3 * seconds:.3f}"


def markdown_section(items):
    """The summary.md section: one row per measured run, times in milliseconds."""
    purposes = sorted({p for b in items for p in b.collectives})
    head = ["run", "W", "optimizer", "steps", "step", "forward/backward", "optimizer kernels"] + purposes + [
        "lagged all-gather wait", "gradient bucket wait", "rank skew", "exposed comm (share of step)",
        "lagged all-gather (beside compute)", "gradient buckets (beside backward)",
        "step wall, rank 0 (median; diagnostics included)", "diagnostics (not in the parts)", "diagnostics taken",
        "speedup vs dense (step wall; diagnostics included)"]
    lines = ["## Measured step time (MPI and NCCL runs)", "",
             "Mean over the steady steps (step 4 to the last but one) of the slowest rank's times, in ms. The",
             "step is forward/backward plus the optimizer phase; its parts are forward/backward, the optimizer's",
             "own kernels, each blocking collective and the waits for the lagged mask all-gather and the gradient",
             "buckets (a dense baseline with `optimizer.overlap_grad_reduce`). Those two collectives themselves",
             "run beside compute. Each part is the slowest rank's, so when the ranks are out of balance the",
             "maxima come from different ranks: *rank skew* is the step less its parts (0 when one rank is the",
             "slowest in every part).",
             "*Step wall* is the median over the same steps of rank 0's `step_wall_time`, from the start of a",
             "step to the start of the next: the whole step, with the gathers of the diagnostics (`grad_norm`,",
             "the oracle metrics) to rank 0, whose mean time is *diagnostics*, and evaluation. *Speedup* is",
             "the dense run's median step wall / this run's; † marks a pair whose diagnostics differ.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for b in items:
        share = b.exposed_comm / b.step if b.step > 0 else math.nan
        speedup = "" if not math.isfinite(b.speedup) else f"{b.speedup:.2f}×" + (" †" if b.speedup_note else "")
        cells = [b.label, str(b.workers), b.optimizer, str(b.steps_used), _ms(b.step), _ms(b.compute),
                 _ms(b.optimizer_kernels)] + [_ms(b.collectives.get(p, 0.0)) for p in purposes] + [
                 _ms(b.mask_wait), _ms(b.grad_wait), _ms(b.rank_skew), f"{_ms(b.exposed_comm)} ({100 * share:.1f}%)",
                 _ms(b.lagged_all_gather), _ms(b.gradient_buckets), _ms(b.step_wall), _ms(b.diagnostics),
                 b.diagnostics_taken, speedup]
        lines.append("| " + " | ".join(cells) + " |")
        if b.speedup_note:
            notes.append(f"- † {b.label}: {b.speedup_note}.")
    if notes:
        lines += [""] + notes
    return lines


def write_csv(items, path):
    """breakdown.csv: every part in seconds, one row per measured run (the parts and rank_skew_s add
    up to step_s); the step wall time and the diagnostics beside them (not parts of step_s)."""
    purposes = sorted({p for b in items for p in b.collectives})
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["file", "label", "workers", "optimizer", "steps_used", "step_s", "compute_s",
                    "optimizer_kernels_s", "mask_wait_s", "grad_wait_s", "rank_skew_s"] + [f"{p}_s" for p in purposes]
                   + ["lagged_all_gather_s", "gradient_buckets_s", "step_wall_median_s", "diagnostics_s",
                      "diagnostic_bytes_per_step", "diagnostics_taken", "speedup_step_wall", "speedup_note"])
        for b in items:
            w.writerow([b.file, b.label, b.workers, b.optimizer, b.steps_used, b.step, b.compute,
                        b.optimizer_kernels, b.mask_wait, b.grad_wait, b.rank_skew]
                       + [b.collectives.get(p, 0.0) for p in purposes]
                       + [b.lagged_all_gather, b.gradient_buckets, b.step_wall, b.diagnostics, b.diagnostic_bytes,
                          b.diagnostics_taken, b.speedup, b.speedup_note])


def draw(items, path):
    """breakdown.png: one stacked horizontal bar per run (ms), a tick at its step (the parts miss it by
    the rank skew), the lagged all-gather or the gradient buckets as a thin bar under it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    purposes = sorted({p for b in items for p in b.collectives})
    parts = [("forward/backward", lambda b: b.compute), ("optimizer kernels", lambda b: b.optimizer_kernels)]
    parts += [(p, lambda b, p=p: b.collectives.get(p, 0.0)) for p in purposes]
    parts += [("lagged all-gather wait", lambda b: b.mask_wait), ("gradient bucket wait", lambda b: b.grad_wait)]
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.55 * len(items)))
    lagged_labelled = False
    for i, b in enumerate(items):
        left = 0.0
        for j, (name, value) in enumerate(parts):
            width = 1e3 * max(value(b), 0.0)
            ax.barh(i, width, left=left, height=0.55, color=colours(j % 10), label=name if i == 0 else None)
            left += width
        ax.plot([1e3 * b.step] * 2, [i - 0.32, i + 0.32], color="black", linewidth=1.2,
                label="step (compute + optimizer phase)" if i == 0 else None)
        beside = b.lagged_all_gather if math.isfinite(b.lagged_all_gather) else b.gradient_buckets
        if math.isfinite(beside):
            ax.barh(i + 0.36, 1e3 * beside, height=0.12, color="black",
                    label=None if lagged_labelled else "asynchronous collective (beside compute)")
            lagged_labelled = True
    ax.set_yticks(range(len(items)))
    ax.set_yticklabels([f"{b.label} (W={b.workers})" for b in items], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("mean measured step time (ms), slowest rank")
    ax.set_title("Measured step time by part (MPI and NCCL runs)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
