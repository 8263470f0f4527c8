"""Statistics over seeds and the learning-rate search: intervals, paired differences, best lr.

Runs whose effective configs (`runs.effective_config`) are equal once `seed` and `optimizer.lr`
are removed form an *arm*; arms that agree on every setting outside `optimizer.*` solve the same
*problem*. This works whether the seeds and rates came from a sweep's `repeat`/`lr_search` or
from an explicit grid: only the resolved configs are read.

Per arm: the final loss of each completed run (the last validation loss, on the held-out split;
models without validation use the mean train loss of the last `TRAIN_TAIL` steps), its
mean over seeds at each learning rate, the *best lr* (lowest mean over the seeds every lr ran, so
a grid searched on one seed is judged seed against seed; an lr at which a seed diverged is never
best), and at the best lr: mean, standard deviation (n−1) and the 95% Student-t interval over
seeds; the *paired* difference from the problem's reference arm at its best lr (same seed, arm
minus reference) with its own mean and interval; and the tokens each seed takes to reach a target
validation loss.

The report's tables (analysis/tables.py, analysis/seeds.py), figures and summary are built on
this module; it imports only analysis/runs.py.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from .runs import effective_config

TRAIN_TAIL = 10
"""Final train loss = mean of the last TRAIN_TAIL finite values (one step is one noisy micro-batch)."""

CONFIDENCE = 0.95
DEFAULT_REFERENCE = "optimizer.type=adams"
DEFAULT_TARGET_MARGIN = 0.05
"""Default target loss: the reference arm's worst final validation loss over its seeds (at its
best lr) plus this (nats), so that every seed of the reference reaches it."""

_SPLIT_OFF = ("seed", "optimizer.lr")


# ---- Student-t interval -----------------------------------------------------------------------

def _t_abs_cdf(t, df):
    """P(|T| <= t) for Student's t with integer df (Abramowitz & Stegun 26.7.3 and 26.7.4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    term = total = 1.0
    if df % 2 == 1:
        if df == 1:
            return 2 / math.pi * theta
        for k in range(1, (df - 3) // 2 + 1):
            term *= 2 * k / (2 * k + 1) * c2
            total += term
        return 2 / math.pi * (theta + s * math.cos(theta) * total)
    for k in range(1, (df - 2) // 2 + 1):
        term *= (2 * k - 1) / (2 * k) * c2
        total += term
    return s * total


def t_critical(df, confidence=CONFIDENCE):
    """t with P(|T| <= t) = confidence, T Student-t with df degrees of freedom (t_{0.975,2} = 4.3027)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a positive integer, got {df}")
    lo, hi = 0.0, 1.0
    while _t_abs_cdf(hi, int(df)) < confidence:
        hi *= 2
    for _ in range(200):  # bisection to the last bit
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if _t_abs_cdf(mid, int(df)) < confidence else (lo, mid)
    return (lo + hi) / 2


@dataclass
class Interval:
    """Mean, sample standard deviation and the Student-t interval of n values (NaN where n is too small)."""

    n: int
    mean: float
    std: float
    lo: float
    hi: float

    @property
    def half_width(self):
        return (self.hi - self.lo) / 2


def interval(values, confidence=CONFIDENCE):
    """Interval of the finite `values`: mean ± t_{(1+c)/2, n−1} · s / √n (std and bounds NaN for n < 2)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    n = int(v.size)
    if n == 0:
        return Interval(0, math.nan, math.nan, math.nan, math.nan)
    mean = float(v.mean())
    if n == 1:
        return Interval(1, mean, math.nan, math.nan, math.nan)
    std = float(v.std(ddof=1))
    half = t_critical(n - 1, confidence) * std / math.sqrt(n)
    return Interval(n, mean, std, mean - half, mean + half)


# ---- train loss of one run -------------------------------------------------------------------

def final_train_loss(run):
    """Mean of the last TRAIN_TAIL finite train losses."""
    loss = run.metric("train_loss")
    loss = loss[np.isfinite(loss)]
    return float(loss[-TRAIN_TAIL:].mean()) if loss.size else math.nan


def first_train_loss(run):
    """The first finite train loss: where the run started (NaN without one)."""
    loss = run.metric("train_loss")
    loss = loss[np.isfinite(loss)]
    return float(loss[0]) if loss.size else math.nan


# ---- arms, best lr, pairing, tokens ------------------------------------------------------------

def final_loss(run):
    """(loss, on) of a finished run: the last validation loss ("val"), else the train tail ("train").

    A diverged run counts as +inf (its lr must not win), and so does a completed run whose loss
    ended above the first train loss it recorded (a finite blow-up the run's NaN/Inf check does
    not catch; analysis/pareto.py applies the same rule); runs not completed give NaN.
    """
    if run.status == "diverged":
        return math.inf, "val" if len(run.val_loss) else "train"
    if run.status != "completed":
        return math.nan, ""
    val = run.val_loss[np.isfinite(run.val_loss)] if len(run.val_loss) else np.zeros(0)
    loss, on = (float(val[-1]), "val") if val.size else (final_train_loss(run), "train")
    if loss > first_train_loss(run):  # False when there is no first loss (NaN)
        return math.inf, on
    return loss, on


def tokens_per_step(run):
    """Training tokens per optimizer step (all workers): workers × batch_size × block_size (gpt only)."""
    cfg = run.config
    if cfg.get("model", {}).get("type") != "gpt":
        return math.nan
    return float(cfg.get("workers", 0) * cfg.get("data", {}).get("batch_size", 0) *
                 cfg.get("model", {}).get("block_size", 0))


def first_step_at_or_below(run, target):
    """The first evaluation step whose validation loss is <= target; inf when none is; NaN without evals."""
    if not len(run.val_loss) or not math.isfinite(target):
        return math.nan
    hit = np.flatnonzero(np.isfinite(run.val_loss) & (run.val_loss <= target))
    return float(run.eval_step[hit[0]]) if hit.size else math.inf


def tokens_to_target(run, target):
    """Tokens seen at the first evaluation whose validation loss is <= target; inf when none is; NaN without evals."""
    steps = first_step_at_or_below(run, target)
    return steps if math.isnan(steps) or math.isinf(steps) else steps * tokens_per_step(run)


def parse_reference(spec):
    """'optimizer.type=adams,optimizer.sharded=true' -> {key: value}; values as JSON when they parse."""
    import json

    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, text = part.partition("=")
        if not sep or not key:
            raise ValueError(f"--reference {spec}: expected KEY=VALUE[,KEY=VALUE...], e.g. {DEFAULT_REFERENCE}")
        try:
            out[key.strip()] = json.loads(text)
        except ValueError:
            out[key.strip()] = text
    if not out:
        raise ValueError(f"--reference {spec!r}: empty; e.g. {DEFAULT_REFERENCE}")
    return out


def _same(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-12)
    return a == b


@dataclass
class Arm:
    """One arm: its runs by lr and seed, the lr search and the statistics at the best (or pinned) lr."""

    label: str
    config: dict                                  # effective config without seed and lr
    runs: dict = field(default_factory=dict)      # lr -> {seed: run}
    loss_on: str = ""
    best_lr: float = math.nan
    at_lr: dict = field(default_factory=dict)     # lr -> Interval of the final losses
    diverged: dict = field(default_factory=dict)  # lr -> seeds that diverged
    final: Interval = None
    delta: Interval = None
    delta_pairs: int = 0
    tokens: dict = field(default_factory=dict)    # seed -> tokens to target (inf: never)
    notes: list = field(default_factory=list)

    @property
    def lrs(self):
        return sorted(self.runs)

    def losses(self, lr):
        """{seed: final loss} of the completed and diverged runs at lr."""
        out = {}
        for seed, run in self.runs.get(lr, {}).items():
            loss, on = final_loss(run)
            if not math.isnan(loss):
                out[seed] = loss
                self.loss_on = self.loss_on or on
        return out


@dataclass
class Problem:
    """The arms that solve one problem, its reference arm and its target loss."""

    label: str
    arms: list
    reference: Arm = None
    target: float = math.nan
    target_from: str = ""
    notes: list = field(default_factory=list)


def choose_best_lr(arm, pinned=None):
    """Fills arm.at_lr and arm.best_lr: the lowest mean final loss among the lrs no seed diverged at,
    compared on the seeds every such lr finished. A pruned grid (rates searched on seed 1, the best
    one then run on every seed) is thus judged seed against seed, not one seed against a mean of three."""
    unfinished = sum(1 for runs in arm.runs.values() for r in runs.values() if r.status not in ("completed", "diverged"))
    if unfinished:
        arm.notes.append(f"{unfinished} unfinished run(s) left out")
    finished = {}
    for lr in arm.lrs:
        losses = arm.losses(lr)
        arm.diverged[lr] = sorted(s for s, v in losses.items() if math.isinf(v))
        finished[lr] = {s: v for s, v in losses.items() if math.isfinite(v)}
        arm.at_lr[lr] = interval(list(finished[lr].values()))
    eligible = [lr for lr in arm.lrs if not arm.diverged[lr] and finished[lr]]
    best = _lowest_on_common_seeds(arm, eligible, finished)
    if pinned is not None:
        match = [lr for lr in arm.lrs if _same(lr, pinned)]
        if not match:
            arm.notes.append(f"pinned lr {pinned:g} was not run")
            return
        best = match[0]
    if best is None:
        arm.notes.append("no lr without a diverged or unfinished seed")
        return
    arm.best_lr = best
    if len(arm.lrs) > 1 and pinned is None and best in (arm.lrs[0], arm.lrs[-1]):
        arm.notes.append("best lr at the edge of the search")
    most = max(iv.n for iv in arm.at_lr.values())
    if arm.at_lr[best].n < most:  # a pruned grid: a rate tried on fewer seeds can win by luck
        arm.notes.append(f"best lr rests on {arm.at_lr[best].n} seed(s), other rates on up to {most}")
    arm.final = arm.at_lr[best]


def lowest_on_common_seeds(losses_by_key):
    """The key of lowest mean loss over the seeds every key shares, and those seeds.

    losses_by_key: key -> {seed: finite final loss}. With no seed in common the mean over each key's
    own seeds decides and the seeds returned are empty. Used for every "best learning rate" choice,
    so that a rate run on seed 1 only is judged against the others' seed 1, not their mean.
    """
    if not losses_by_key:
        return None, []
    common = set.intersection(*(set(v) for v in losses_by_key.values()))
    if not common:
        return min(losses_by_key, key=lambda k: sum(losses_by_key[k].values()) / len(losses_by_key[k])), []
    best = min(losses_by_key, key=lambda k: sum(losses_by_key[k][s] for s in common) / len(common))
    return best, sorted(common)


def _lowest_on_common_seeds(arm, eligible, finished):
    """The eligible lr of lowest mean over the seeds all eligible lrs share (noted when some lr ran more)."""
    if not eligible:
        return None
    best, common = lowest_on_common_seeds({lr: finished[lr] for lr in eligible})
    if not common and len(eligible) > 1:
        arm.notes.append("no seed common to every lr: best lr by each lr's own mean")
    if common and any(len(finished[lr]) > len(common) for lr in eligible):
        arm.notes.append(f"best lr chosen on the seeds every lr ran ({', '.join(map(str, common))})")
    return best


def _best_losses(arm):
    return {} if math.isnan(arm.best_lr) else arm.losses(arm.best_lr)


def pair_with(arm, reference):
    """Paired difference arm − reference over the seeds both finished at their best lrs."""
    mine, theirs = _best_losses(arm), _best_losses(reference)
    seeds = sorted(s for s in mine if s in theirs and math.isfinite(mine[s]) and math.isfinite(theirs[s]))
    arm.delta_pairs = len(seeds)
    arm.delta = interval([mine[s] - theirs[s] for s in seeds])
    unpaired = sorted(set(mine) ^ set(theirs))
    if unpaired:
        arm.notes.append(f"seeds without a partner: {', '.join(map(str, unpaired))}")


def fill_tokens(arm, target):
    """Tokens to `target` of each seed at the arm's best lr."""
    if math.isnan(arm.best_lr):
        return
    for seed, run in arm.runs[arm.best_lr].items():
        if run.status == "completed":
            arm.tokens[seed] = tokens_to_target(run, target)


def _arm_key(cfg):
    return tuple(sorted((k, v) for k, v in cfg.items() if k not in _SPLIT_OFF))


def build_problems(runs, arm_label, problem_label, reference=DEFAULT_REFERENCE, target_loss=None,
                   target_margin=DEFAULT_TARGET_MARGIN):
    """Problems (with their arms filled in) of the completed, diverged and running runs in `runs`.

    arm_label(run) and problem_label(run) name an arm and a problem (the report's labels);
    `reference` is a KEY=VALUE[,...] spec matched against the arms' settings (an
    optimizer.lr in it pins the reference's lr instead of its best); target_loss overrides
    reference mean + target_margin.
    """
    spec = parse_reference(reference)
    pinned = spec.pop("optimizer.lr", None)
    problems, arms = {}, {}
    for run in runs:
        cfg = effective_config(run)
        key = _arm_key(cfg)
        if key not in arms:
            arms[key] = Arm(label=arm_label(run), config={k: v for k, v in cfg.items() if k not in _SPLIT_OFF})
            problems.setdefault(problem_label(run), Problem(label=problem_label(run), arms=[])).arms.append(arms[key])
        lr, seed = cfg.get("optimizer.lr", math.nan), cfg.get("seed", 0)
        arms[key].runs.setdefault(lr, {})[seed] = run
    for problem in problems.values():
        matches = [a for a in problem.arms if all(k in a.config and _same(a.config[k], v) for k, v in spec.items())]
        for arm in problem.arms:
            choose_best_lr(arm, pinned if matches and arm is matches[0] else None)
        if len(matches) > 1:
            problem.notes.append(f"{len(matches)} arms match the reference {reference}; using {matches[0].label}")
        problem.reference = matches[0] if matches else None
        if problem.reference is None:
            problem.notes.append(f"no arm matches the reference {reference}: no paired differences")
        for arm in problem.arms:
            if problem.reference is not None and arm is not problem.reference:
                pair_with(arm, problem.reference)
        ref_final = problem.reference.final if problem.reference is not None else None
        if target_loss is not None:
            problem.target, problem.target_from = float(target_loss), "--target-loss"
        elif ref_final is not None and problem.reference.loss_on == "val":
            finals = [v for v in _best_losses(problem.reference).values() if math.isfinite(v)]
            problem.target = max(finals) + target_margin
            problem.target_from = f"the reference's worst final val loss over seeds + {target_margin:g}"
        for arm in problem.arms:
            fill_tokens(arm, problem.target)
    return list(problems.values())
