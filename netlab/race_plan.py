"""The race's plan and its CSV (issue 60, docs/NETLAB.md "The race"): the arms, how many steps an
arm gets in the wall-clock budget, its learning-rate schedule over that count, its evaluation
steps, the columns of race-*.csv and their reader. Plain Python, no torch: the driver and the
analysis (Debian's python3) and the nodes (the venv's) share this one definition.

Equal wall clock, not equal steps: the budget B is DDP AdamW's wall time for its own S steps;
every other arm measures its steady step time on the same link and gets floor(B / step) steps,
with its warm-up + cosine schedule stretched over that count."""
import csv
import hashlib
import math
import pathlib

# arm: (what runs, its learning-rate grid of 3). The grids sit around the rates the example and
# torch_bench use (AdamW 1e-3, SCAPE 3e-3); a local-SGD arm's rate is its inner optimizer's.
# SCAPE 90%'s grid sits one step lower than 99%'s: the pilot (docs/NETLAB.md) chose 1e-3, the
# lower edge of 1e-3, 3e-3, 6e-3.
ARMS = {
    "ddp-adamw": ("DDP + torch.optim.AdamW", (5e-4, 1e-3, 2e-3)),
    "ddp-powersgd-r1": ("DDP + torch's PowerSGD comm hook, rank 1, + AdamW", (5e-4, 1e-3, 2e-3)),
    "ddp-powersgd-r4": ("DDP + torch's PowerSGD comm hook, rank 4, + AdamW", (5e-4, 1e-3, 2e-3)),
    "torchft-diloco": ("torchft.local_sgd.DiLoCo, H = 10, AdamW inner, Nesterov SGD outer", (5e-4, 1e-3, 2e-3)),
    "adams": ("scape.torch.AdamS (dense)", (5e-4, 1e-3, 2e-3)),
    "scape-90": ("scape.torch.SCAPE, sparsity 0.9", (5e-4, 1e-3, 2e-3)),
    "scape-99": ("scape.torch.SCAPE, sparsity 0.99", (1e-3, 3e-3, 6e-3)),
    "diloco-h10": ("scape.torch.DiLoCo, H = 10", (5e-4, 1e-3, 2e-3)),
    "diloco-h50": ("scape.torch.DiLoCo, H = 50", (5e-4, 1e-3, 2e-3)),
    "diloco-streaming": ("scape.torch.DiLoCo, H = 50, 5 streaming fragments", (5e-4, 1e-3, 2e-3)),
    "sparseloco": ("scape.torch.SparseLoCo, H = 10, sparsity 0.99, 2-bit", (5e-4, 1e-3, 2e-3)),
}
BASELINE = "ddp-adamw"
# The steps between an arm's syncs: its evaluation steps fall on them, where every rank holds
# the synced parameters (streaming syncs a fragment at a time, so only H is a whole round).
SYNC_EVERY = {"torchft-diloco": 10, "diloco-h10": 10, "diloco-h50": 50, "diloco-streaming": 50, "sparseloco": 10}

COLUMNS = ["rate_mbit", "arm", "seed", "lr", "planned_steps", "budget_s", "step", "wall_s", "val_loss",
           "bytes_sent"]


def corpus_paths(root):
    """The race's char-level corpus: the repository's own prose, README.md and docs/*.md sorted
    (text every checkout has, so every node reads the same corpus with no download)."""
    root = pathlib.Path(root)
    return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def corpus_digest(root):
    """sha256 of the corpus: the docs change with the commits, so a race records what it read."""
    digest = hashlib.sha256()
    for path in corpus_paths(root):
        digest.update(path.read_bytes())
    return digest.hexdigest()


class RaceInputError(ValueError):
    """A race CSV or plan argument that cannot be used; the message names the file or column."""


def check_arm(name, where="--arms"):
    if name not in ARMS:
        raise RaceInputError(f"{where}: unknown arm '{name}' (arms: {', '.join(ARMS)})")
    return name


def steps_in_budget(budget_s, step_s, every=1):
    """The whole steps of `step_s` seconds that fit in `budget_s`, rounded down to a multiple of
    `every` (a local-SGD arm's sync interval: its last evaluation, the one read at B, then falls
    on a sync, where every rank holds the synced parameters; at least `every`: an arm slower than
    the whole budget still shows its first evaluation)."""
    if not step_s > 0 or not math.isfinite(step_s):
        raise RaceInputError(f"step time: must be a positive number of seconds, got {step_s!r}")
    if not budget_s > 0:
        raise RaceInputError(f"budget: must be a positive number of seconds, got {budget_s!r}")
    fit = math.floor(budget_s / step_s + 1e-9)
    return max(every, fit - fit % every)


def warmup_steps(total, fraction=0.05):
    """The warm-up is a fixed share of the arm's own count, so a faster arm warms up for as many
    more steps as it gets (at least 1)."""
    return max(1, round(fraction * total))


def lr_factor(step, total, warmup):
    """The multiplier of the peak rate at optimizer step `step` (1-based) of `total`: linear from
    1/warmup up to 1 over the warm-up, then a cosine from 1 down to 0.1 at `total`."""
    if step <= warmup:
        return step / warmup
    done = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * done))


def eval_steps(total, points, every=1):
    """About `points` evaluation steps spread over 1..total, each rounded up to a multiple of
    `every` (the arm's sync interval) and never past total; the last step always evaluated."""
    if points < 1:
        raise RaceInputError(f"--eval-points: at least 1, got {points}")
    chosen = set()
    for k in range(1, points + 1):
        step = math.ceil(k * total / points / every) * every
        chosen.add(min(step, total))
    return sorted(chosen)


def read(path):
    """The rows of a race CSV with numbers as numbers; a missing column, an unknown arm or a cell
    that is not a number is a RaceInputError naming the file (and the column or line)."""
    try:
        f = open(path, newline="")
    except OSError as e:
        raise RaceInputError(f"{path}: cannot read it ({e.strerror})") from None
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise RaceInputError(f"{path}: missing column(s) {', '.join(missing)} (a race CSV has {', '.join(COLUMNS)})")
        return [_parsed(path, line, row) for line, row in enumerate(reader, start=2)]


def _parsed(path, line, row):
    check_arm(row["arm"], where=f"{path}:{line}: arm")
    out = {"arm": row["arm"]}
    for column, kind in (("rate_mbit", float), ("seed", int), ("lr", float), ("planned_steps", int),
                         ("budget_s", float), ("step", int), ("wall_s", float), ("val_loss", float),
                         ("bytes_sent", float)):
        try:
            out[column] = kind(row[column])
        except (TypeError, ValueError):
            raise RaceInputError(f"{path}:{line}: column {column}: not a number: {row[column]!r}") from None
    return out


def append(path, rows):
    """Appends rows (dicts with COLUMNS) to a race CSV, with the header when the file is new."""
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if f.tell() == 0:
            writer.writeheader()
        writer.writerows(rows)


def runs(rows):
    """{(rate, arm, seed, lr): [rows by step]}: one run's evaluation curve. Two runs of the same
    rate, arm, seed and learning rate in the rows (a step evaluated twice) are a RaceInputError:
    merged they would read as one curve."""
    out = {}
    for r in rows:
        out.setdefault((r["rate_mbit"], r["arm"], r["seed"], r["lr"]), []).append(r)
    for (rate, arm, seed, lr), curve in out.items():
        steps = [r["step"] for r in curve]
        if len(set(steps)) != len(steps):
            raise RaceInputError(f"{arm} at {rate:g} Mbit/s, seed {seed}, lr {lr:g}: two runs in the rows (step "
                                 f"{next(s for s in steps if steps.count(s) > 1)} evaluated twice); keep one")
    return {k: sorted(v, key=lambda r: r["step"]) for k, v in out.items()}


def widened(lrs, best):
    """The next rate to try when `best` lies at the edge of the rates tried: twice the largest or
    half the smallest; None when it lies inside (the comparison is at each arm's best rate, and
    a best at the edge is only a bound)."""
    if best == max(lrs):
        return best * 2
    if best == min(lrs):
        return best / 2
    return None


def at_budget(curve):
    """The run's last evaluation within its wall-clock budget B, or None when none is (its first
    came after B: nothing was measured at B): a run whose planned step count overshot B is read
    at B, not at its end. A run without a budget (budget_s 0, as race_node writes it, or
    missing: DDP AdamW's grid, whose winner's wall time becomes B) is read at its end."""
    budgets = [float(r.get("budget_s", math.nan)) for r in curve]
    if not all(math.isfinite(b) and b > 0 for b in budgets):
        return curve[-1]
    within = [r for r in curve if r["wall_s"] <= r["budget_s"]]
    return within[-1] if within else None


def best_lr(rows, rate, arm, seed=1):
    """The grid's winner: the rate whose seed-`seed` run has the lowest validation loss at B
    (at_budget: the figure the race compares, so that a run whose planned count overshot B is
    not chosen for steps past it; the driver picks with this and the analysis finds the same
    choice from the CSV alone)."""
    at_b = {lr: at_budget(curve) for (r, a, s, lr), curve in runs(rows).items() if (r, a, s) == (rate, arm, seed)}
    # A run with no evaluation within B, or whose loss there is not finite (diverged), is not chosen.
    at_b = {lr: row["val_loss"] for lr, row in at_b.items() if row is not None and math.isfinite(row["val_loss"])}
    return min(at_b, key=lambda lr: (at_b[lr], lr)) if at_b else None
