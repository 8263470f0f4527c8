"""`scripts/netlab race`: the wall-clock race (issue 60, docs/NETLAB.md "The race") on N netlab
nodes at each rate given. Debian's python3 runs this; every training run is
`scripts/netlab run -- <venv python> -m netlab.race_node ...` on the nodes.

At each rate:
  1. the nodes come up at that rate (`scripts/netlab up`);
  2. DDP AdamW trains its own S steps (--ddp-steps) at each rate of its grid of 3 on the first
     seed (and up to --grid-extensions rates past the grid's edge while the best lies there);
     the budget B is that run's wall time at the best rate;
  3. every other arm measures its steady step time on the same link (--measure-steps), gets
     floor(B / step) steps, and trains them at each rate of its grid on the first seed (widened
     the same way);
  4. every arm trains its other seeds at its best rate.
Each run's evaluations are appended to OUT/race-DATE-RATE.csv (race_plan.COLUMNS), with B in
budget_s; the measured step times and plans go to OUT/race-DATE-RATE.plan.json. Then the table
(`scripts/netlab race tables`) is printed.

With --extend the race of that --out, --date and rate already ran: every arm whose chosen rate
lies at the edge of the rates it tried (--arms) trains past it on the first seed at its planned
count and its B (DDP AdamW's too: B stays the plan's), up to --grid-extensions more rates, and,
when the best rate moved (also where race_plan.best_lr, loss at B, now picks another rate than
the plan holds), its other seeds at the new one; the rows are appended to the CSV and
the plan's rate updated (its "extended" lists what was tried). The model, seeds and corpus are
the plan's; a corpus that changed since is refused.

Exit status 2: bad arguments; a failing run's status otherwise, naming the arm."""
import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile

from netlab import race_plan

ROOT = pathlib.Path(__file__).resolve().parents[1]
DRIVER = ROOT / "netlab" / "netlab"


def arguments(argv=None):
    p = argparse.ArgumentParser(prog="scripts/netlab race", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", required=True, help="tc rates, comma-separated (100mbit,1gbit,10gbit)")
    p.add_argument("--ddp-steps", type=int, help="S: DDP AdamW's steps, whose wall time is B (not with --extend)")
    p.add_argument("--arms", default=",".join(race_plan.ARMS), help="comma-separated; ddp-adamw always runs")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated; the grid runs on the first")
    p.add_argument("--out", default=str(ROOT / "experiments" / "measured" / "netlab"), help="folder of the CSVs")
    p.add_argument("--date", default=datetime.date.today().isoformat(), help="in the file names")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--measure-steps", type=int, default=30, help="timed steps of each arm's step-time run")
    p.add_argument("--eval-points", type=int, default=20, help="evaluations a run")
    p.add_argument("--prefix", default="snl", help="the netlab's prefix (scripts/netlab --help)")
    p.add_argument("--subnet", default="10.77.0", help="the netlab's subnet A.B.C (scripts/netlab --help)")
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--target-margin", type=float, default=0.02, help="for the table printed at the end")
    p.add_argument("--extend", action="store_true",
                   help="widen the grids of a race that already ran (OUT/race-DATE-RATE.csv and its plan; see below)")
    p.add_argument("--grid-extensions", type=int, default=2,
                   help="rates tried past the grid's edge while the best lies there (x2 or /2 each)")
    for flag, default in (("--width", 128), ("--layers", 4), ("--batch", 8), ("--block", 64)):
        p.add_argument(flag, type=int, default=default, help="the model and batch (race_node.py --help)")
    args = p.parse_args(argv)
    try:
        args.arms = [race_plan.check_arm(a) for a in args.arms.split(",")]
        args.seeds = [int(s) for s in args.seeds.split(",")]
        args.rates = [(r, rate_in_mbit(r)) for r in args.rate.split(",")]
    except (race_plan.RaceInputError, ValueError) as e:
        p.error(str(e))
    if args.extend and args.ddp_steps is not None:
        p.error("--ddp-steps: --extend takes S and B from the race's plan")
    if not args.extend and args.ddp_steps is None:
        p.error("--ddp-steps: required (S, DDP AdamW's steps, whose wall time is B)")
    if not args.extend and args.ddp_steps < 1:
        p.error(f"--ddp-steps: at least 1, got {args.ddp_steps}")
    if args.grid_extensions < 0:
        p.error(f"--grid-extensions: at least 0, got {args.grid_extensions}")
    args.arms = [race_plan.BASELINE] + [a for a in args.arms if a != race_plan.BASELINE]
    return args


def fail(message, status=2):
    """Stops the race: exit 2 for what the user gave, a failing run's own status otherwise."""
    print(f"netlab race: {message}", file=sys.stderr)
    sys.exit(status)


def python():
    path = os.environ.get("SCAPE_PYTHON", os.path.expanduser("~/.cache/scape/venv/bin/python"))
    if not os.access(path, os.X_OK):
        fail(f"no python with torch at {path} (scripts/setup-python makes it; or set SCAPE_PYTHON)")
    return path


def node_env():
    """A node process's environment: one thread, the repository's packages importable."""
    return dict(os.environ, OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "python"), str(ROOT), os.environ.get("PYTHONPATH")])))


def on_nodes(args, node_args):
    """One run of netlab.race_node on every node; a failure stops the race naming the arm."""
    env = node_env()
    model = ["--width", str(args.width), "--layers", str(args.layers), "--batch", str(args.batch),
             "--block", str(args.block)]
    command = [str(DRIVER), "run", "--prefix", args.prefix, "--nodes", str(args.nodes), "--port", str(args.port),
               "--", python(), "-m", "netlab.race_node"] + node_args + model
    status = subprocess.run(command, env=env).returncode
    if status != 0:
        arm = node_args[node_args.index("--arm") + 1]
        fail(f"the {arm} run failed (exit {status}): {' '.join(command)}", status)


def measure(args, arm, scratch):
    out = os.path.join(scratch, f"{arm}.json")
    on_nodes(args, ["--mode", "measure", "--arm", arm, "--out", out, "--lr", str(race_plan.ARMS[arm][1][1]),
                    "--measure-steps", str(args.measure_steps)])
    with open(out) as f:
        return json.load(f)


def train(args, ctx, arm, lr, seed, steps):
    """One run; its rows appended to the rate's CSV with the budget filled in, and returned."""
    scratch = os.path.join(ctx["scratch"], f"{arm}-{lr:g}-{seed}.csv")
    on_nodes(args, ["--mode", "train", "--arm", arm, "--lr", f"{lr:g}", "--seed", str(seed), "--steps", str(steps),
                    "--eval-points", str(args.eval_points), "--rate-mbit", f"{ctx['rate_mbit']:g}", "--out", scratch])
    rows = race_plan.read(scratch)
    if "budget" in ctx:  # written at once, so a failing later run loses nothing before it
        race_plan.append(ctx["csv"], [dict(r, budget_s=f"{ctx['budget']:.3f}") for r in rows])
        # as the CSV reads them back: best_lr reads each run at B
        rows = [dict(r, budget_s=float(f"{ctx['budget']:.3f}")) for r in rows]
    else:  # DDP AdamW's grid, before B is known
        ctx["pending"].append(rows)
    return rows


def grid(args, ctx, arm, steps):
    """The arm's grid on the first seed, widened past its edge while the best lies there (at most
    --grid-extensions more rates); its best rate."""
    rows = []
    lrs = list(race_plan.ARMS[arm][1])
    for lr in lrs:
        rows += train(args, ctx, arm, lr, args.seeds[0], steps)
    best = race_plan.best_lr(rows, ctx["rate_mbit"], arm, args.seeds[0])
    for _ in range(args.grid_extensions):
        beyond = race_plan.widened(lrs, best)
        if beyond is None:
            break
        print(f"netlab race: {arm}'s best rate {best:g} is at the edge of {lrs}: trying {beyond:g}", file=sys.stderr)
        lrs.append(beyond)
        rows += train(args, ctx, arm, beyond, args.seeds[0], steps)
        best = race_plan.best_lr(rows, ctx["rate_mbit"], arm, args.seeds[0])
    if race_plan.widened(lrs, best) is not None:  # the issue asks for the best inside: say when it is not
        print(f"netlab race: warning: {arm}'s best rate {best:g} is at the edge of the rates tried {sorted(lrs)}",
              file=sys.stderr)
    return best


def race_at(args, rate):
    rate_mbit = rate_in_mbit(rate)
    subprocess.run([str(DRIVER), "up", "--nodes", str(args.nodes), "--rate", rate, "--prefix", args.prefix,
                    "--subnet", args.subnet], check=True)
    csv_path = os.path.join(args.out, f"race-{args.date}-{rate}.csv")
    if os.path.exists(csv_path):
        fail(f"{csv_path} exists; give another --out or --date (a race is never appended to another)")
    plan = {"rate": rate, "ddp_steps": args.ddp_steps, "corpus_sha256": race_plan.corpus_digest(ROOT),
            "settings": {k: getattr(args, k) for k in ("nodes", "seeds", "width", "layers", "batch", "block",
                                                       "eval_points", "measure_steps")}, "arms": {}}
    with tempfile.TemporaryDirectory(prefix="race-") as scratch:
        ctx = {"scratch": scratch, "rate_mbit": rate_mbit, "pending": [], "csv": csv_path}
        best = grid(args, ctx, race_plan.BASELINE, args.ddp_steps)
        budget = [c for c in ctx["pending"] if c[0]["lr"] == best][0][-1]["wall_s"]
        plan["budget_s"] = ctx["budget"] = budget
        for rows in ctx.pop("pending"):
            race_plan.append(csv_path, [dict(r, budget_s=f"{budget:.3f}") for r in rows])
        plan["arms"][race_plan.BASELINE] = {"steps": args.ddp_steps, "lr": best}
        for arm in args.arms[1:]:
            measured = measure(args, arm, scratch)
            steps = race_plan.steps_in_budget(budget, measured["step_s"], race_plan.SYNC_EVERY.get(arm, 1))
            plan["arms"][arm] = dict(measured, steps=steps, lr=grid(args, ctx, arm, steps))
            warn_fast(arm, measured)
        for arm in args.arms:
            for seed in args.seeds[1:]:
                train(args, ctx, arm, plan["arms"][arm]["lr"], seed, plan["arms"][arm]["steps"])
    with open(csv_path.replace(".csv", ".plan.json"), "w") as f:
        json.dump(plan, f, indent=1)
    return csv_path


def extend_at(args, rate):
    """--extend: the grids of the race at `rate` widened past their edges (module docstring)."""
    rate_mbit = rate_in_mbit(rate)
    csv_path = os.path.join(args.out, f"race-{args.date}-{rate}.csv")
    plan_path = csv_path.replace(".csv", ".plan.json")
    if not (os.path.exists(csv_path) and os.path.exists(plan_path)):
        fail(f"--extend: {csv_path} and its plan must both exist (the race to extend)")
    with open(plan_path) as f:
        plan = json.load(f)
    if plan["corpus_sha256"] != race_plan.corpus_digest(ROOT):
        fail(f"--extend: {plan_path}: the race read another corpus (sha256 {plan['corpus_sha256'][:12]}…) than this "
             "checkout's README.md and docs/*.md: extend it from a checkout of the commit it ran from")
    for key in ("width", "layers", "batch", "block", "eval_points", "nodes"):
        setattr(args, key, plan["settings"][key])
    seeds = plan["settings"]["seeds"]
    subprocess.run([str(DRIVER), "up", "--nodes", str(args.nodes), "--rate", rate, "--prefix", args.prefix,
                    "--subnet", args.subnet], check=True)
    rows = race_plan.read(csv_path)
    with tempfile.TemporaryDirectory(prefix="race-") as scratch:
        ctx = {"scratch": scratch, "rate_mbit": rate_mbit, "csv": csv_path, "budget": plan["budget_s"]}
        for arm in [a for a in args.arms if a in plan["arms"]]:
            chosen, steps = plan["arms"][arm]["lr"], plan["arms"][arm]["steps"]
            lrs = sorted({r["lr"] for r in rows if (r["rate_mbit"], r["arm"], r["seed"]) == (rate_mbit, arm, seeds[0])})
            # the rule's choice, which a race picked under an earlier rule may not hold
            best = race_plan.best_lr(rows, rate_mbit, arm, seeds[0])
            for _ in range(args.grid_extensions):
                beyond = race_plan.widened(lrs, best)
                if beyond is None:
                    break
                print(f"netlab race --extend: {arm}'s best rate {best:g} is at the edge of {lrs}: trying {beyond:g}",
                      file=sys.stderr)
                rows += train(args, ctx, arm, beyond, seeds[0], steps)
                lrs.append(beyond)
                best = race_plan.best_lr(rows, rate_mbit, arm, seeds[0])
            if best != chosen:
                have = {s for (r, a, s, lr) in race_plan.runs(rows) if (r, a, lr) == (rate_mbit, arm, best)}
                for seed in [s for s in seeds[1:] if s not in have]:  # a rate the race chose before has them
                    rows += train(args, ctx, arm, best, seed, steps)
                plan["arms"][arm]["lr"] = best
            plan.setdefault("extended", {})[arm] = {"rates_tried": sorted(lrs), "lr_before": chosen, "lr": best}
    with open(plan_path, "w") as f:
        json.dump(plan, f, indent=1)
    return csv_path


def warn_fast(arm, measured):
    # The race is about communication against compute: the issue asks for >= 20 ms of compute a step.
    if measured["compute_s"] < 0.020:
        print(f"netlab race: warning: {arm}'s compute is {measured['compute_s'] * 1e3:.1f} ms a step, under the "
              f"20 ms the race asks for (--width)", file=sys.stderr)


def rate_in_mbit(rate):
    units = {"kbit": 1e-3, "mbit": 1.0, "gbit": 1e3}
    for unit, scale in units.items():
        if rate.lower().endswith(unit) and rate[:-len(unit)].isdigit():
            return int(rate[:-len(unit)]) * scale
    raise race_plan.RaceInputError(f"--rate: a number and kbit, mbit or gbit (e.g. 100mbit), got '{rate}'")


def main(argv=None):
    args = arguments(argv)
    os.makedirs(args.out, exist_ok=True)
    paths = [(extend_at if args.extend else race_at)(args, rate) for rate, _ in args.rates]
    from netlab import race
    return race.main(paths + ["--target-margin", str(args.target_margin)])


if __name__ == "__main__":
    sys.exit(main())
