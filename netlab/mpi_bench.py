"""The MPI runtime's part of `scripts/netlab bench`, and the row of one MPI run file that it and
`scripts/netlab strong-scaling` report (Debian's python3 with h5py; docs/NETLAB.md). Run as
`/usr/bin/python3 -m netlab.mpi_bench` with the repository root on PYTHONPATH.

At one rate, on the nodes `scripts/netlab up` made, it:
1. times the links with `scape bench-comm` through `scripts/netlab mpirun` (16 KiB to 16 MiB),
   back to back and after --idle-gap-ms of idle link (the link's busy and idle regimes);
2. runs the GPT of `experiments/configs/calibrate/` (3.3M parameters) under each method;
3. fits `scape predict --calibrate --links-from-bench`: the links to the bench-comm file alone,
   compute and the optimizer step to the runs of dense AdamS and SCAPE 90%; it predicts every
   run, the others held out (not fitted on);
4. appends one row a method to DIR/steps.csv with the measured and predicted step.

With `--from-fastest-rate` (run by `scripts/netlab bench` once every rate has run) it predicts
each slower rate again, every run there held out: compute and the optimizer step fitted to the
fastest rate's dense AdamS and SCAPE 90% runs, where the optimizer's own time is not the small
difference of two large measured times, and the links to the slower rate's bench-comm file. The
MPI rows of the slower rates in steps.csv get these predictions. A rate named by `--held-out-rate`
is predicted without any of its own measurements: its links are another slower rate's bench-comm
file (the nearest) scaled to it (`scape predict --link-rate-scale`), written to
mpi-RATEmbit/held-out-rate.{txt,csv}.
"""
import argparse
import csv
import os
import subprocess
import sys
import time

import h5py
import numpy as np

from analysis.breakdown import exposed_comm
from netlab import steps_csv

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DENSE = "experiments/configs/calibrate/mpi-dense.json"
SCAPE = "experiments/configs/calibrate/mpi-scape.json"
# method: (config, overrides, role in the calibration: fitted on, held out, or not predicted)
METHODS = {
    "adams": (DENSE, [], "fitted"),
    # Bucketed reduce-scatter beside backward: measured only; --calibrate neither fits nor
    # predicts a run whose collectives wait for the gradient (docs/PREDICTING.md).
    "adams-overlap": (DENSE, ["optimizer.overlap_grad_reduce=true"], None),
    "scape-90": (SCAPE, [], "fitted"),
    "scape-99": (SCAPE, ["optimizer.sparsity=0.99"], "held_out"),
    "scape-99-lag0": (SCAPE, ["optimizer.sparsity=0.99", "optimizer.mask_lag=0"], "held_out"),
}


def run_row(path, skip=2):
    """Medians over a run's steps past the first `skip` (start-up and SCAPE's first lagged mask):
    the wall step, the communication it waited for (analysis.breakdown.exposed_comm: every blocking
    collective and the waits for the lagged mask and the gradient buckets), the bytes one rank sent,
    and its forward/backward."""
    with h5py.File(path, "r") as f:
        m = f["metrics"]
        keep = slice(skip, None)
        exposed = exposed_comm(m, keep)
        return {"measured_step_ms": 1e3 * float(np.median(m["step_wall_time"][keep])),
                "exposed_comm_ms": 1e3 * float(np.median(exposed)),
                "bytes_per_step": float(np.median(m["bytes_sent"][keep])),
                "compute_ms": 1e3 * float(np.median(m["compute_wall_time"][keep]))}


def mpirun(nodes, args, prefix="snl", tries=3):
    """`scripts/netlab mpirun` on the nodes named `prefix` (the driver's --prefix), retried when
    OpenMPI's launch fails before any rank ran."""
    for attempt in range(1, tries + 1):
        done = subprocess.run([f"{ROOT}/netlab/netlab", "mpirun", "--prefix", prefix, "--nodes", str(nodes), "--"]
                              + args,
                              stdin=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if done.returncode == 0:
            return
        print(f"netlab mpi_bench: mpirun failed with status {done.returncode} (try {attempt} of {tries})", file=sys.stderr)
        time.sleep(2 * attempt)  # OpenMPI's daemon has died at start-up several times in a row here
    sys.exit(f"netlab mpi_bench: {' '.join(args[:3])} failed {tries} times")


def calibrate(scape, here, fit, held_out, name, extra=()):
    """`scape predict --calibrate --links-from-bench` into here/NAME.{txt,csv} and
    here/NAME-hardware.json; returns the CSV's rows by the run file's absolute path."""
    table = os.path.join(here, f"{name}.csv")
    with open(os.path.join(here, f"{name}.txt"), "w") as report:
        subprocess.run([scape, "predict", "--links-from-bench", "--calibrate"] + fit +
                       (["--held-out"] + held_out if held_out else []) +
                       ["--out", os.path.join(here, f"{name}-hardware.json"), "--csv", table] + list(extra),
                       check=True, stdout=report)
    return {os.path.abspath(r["file"]): r for r in csv.DictReader(open(table))}


def link_donor(rate, rates, held_out_rate):
    """The rate whose bench-comm file gives `rate`'s links: its own, or for the held-out rate the
    nearest other rate below the fastest."""
    if held_out_rate is None or rate != held_out_rate:
        return rate
    donors = [r for r in rates[:-1] if r != rate]
    if not donors:
        sys.exit(f"netlab: --held-out-rate {rate:g}: no other rate below the fastest to take the links from")
    return min(donors, key=lambda r: abs(r - rate))


def from_fastest_rate(scape, out, held_out_rate=None):
    """Predicts every MPI run at each slower rate from the fastest rate's compute and optimizer
    fit and the slower rate's links (the held-out rate: another rate's, scaled); rewrites those
    rows of out/steps.csv."""
    path = os.path.join(out, "steps.csv")
    rows = steps_csv.read(path)
    rates = sorted({float(r["rate_mbit"]) for r in rows if r["runtime"] == "mpi"})
    if len(rates) < 2:
        print("netlab mpi_bench: one MPI rate only: its own calibration stands", file=sys.stderr)
        return
    fastest = os.path.join(out, f"mpi-{rates[-1]:g}mbit")
    fit_runs = [os.path.join(fastest, f"{m}.h5") for m, spec in METHODS.items() if spec[2] == "fitted"]
    missing = [f for f in fit_runs if not os.path.exists(f)]
    if missing:
        sys.exit(f"netlab mpi_bench: --from-fastest-rate needs {', '.join(missing)}")
    for rate in rates[:-1]:
        here = os.path.join(out, f"mpi-{rate:g}mbit")
        runs = [os.path.join(here, f"{m}.h5") for m, spec in METHODS.items()
                if spec[2] and os.path.exists(os.path.join(here, f"{m}.h5"))]
        donor = link_donor(rate, rates, held_out_rate)
        bench = os.path.join(out, f"mpi-{donor:g}mbit", "bench-comm.h5")
        scale = ["--link-rate-scale", f"{rate / donor:.12g}"] if donor != rate else []
        name = "held-out-rate" if donor != rate else "from-fastest-rate"
        predicted = calibrate(scape, here, fit_runs + [bench], runs, name, scale)
        for r in rows:
            p = predicted.get(os.path.abspath(os.path.join(here, f"{r['method']}.h5")))
            if r["runtime"] != "mpi" or float(r["rate_mbit"]) != rate or p is None:
                continue
            r["measured_step_ms"], r["predicted_step_ms"] = p["measured_step_ms"], p["predicted_step_ms"]
            print(f"mpi {r['method']:14} at {rate:g} Mbit/s: step {float(p['measured_step_ms']):9.2f} ms, predicted "
                  f"{float(p['predicted_step_ms']):9.2f} ms ({100 * float(p['error']):+.1f}%; compute and optimizer "
                  f"from {rates[-1]:g} Mbit/s, links from {donor:g} Mbit/s)", flush=True)
    steps_csv.rewrite(path, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the bench folder: steps.csv is appended to, runs go to mpi-RATE/")
    parser.add_argument("--from-fastest-rate", action="store_true",
                        help="instead: predict every slower rate's runs again from the fastest rate's fit (see above)")
    parser.add_argument("--held-out-rate", type=float, help="with --from-fastest-rate: this rate (Mbit/s) is "
                        "predicted with another rate's links, scaled (see above)")
    parser.add_argument("--idle-gap-ms", type=float, default=35, help="bench-comm's idle gap before each idle-regime "
                        "call: the calibration GPT's forward and backward on one core here (default %(default)s; 0: "
                        "back-to-back calls only)")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--prefix", default="snl", help="the netlab's name prefix, as `scripts/netlab up` made it "
                        "(default snl)")
    parser.add_argument("--rate-mbit", type=float, help="the link rate now up, for the CSV")
    parser.add_argument("--steps", type=int, default=16, help="steps a run (default 16)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"default {','.join(METHODS)}")
    args = parser.parse_args()
    scape = os.environ.get("SCAPE_BINARY", f"{ROOT}/build/release/apps/scape")
    if not os.access(scape, os.X_OK):
        sys.exit(f"netlab mpi_bench: no scape binary at {scape} (set SCAPE_BINARY)")
    if args.from_fastest_rate:
        from_fastest_rate(scape, args.out, args.held_out_rate)
        return
    if args.nodes is None or args.rate_mbit is None:
        sys.exit("netlab mpi_bench: --nodes and --rate-mbit are required (or --from-fastest-rate)")
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        sys.exit(f"netlab mpi_bench: unknown method(s) {','.join(unknown)}; known: {','.join(METHODS)}")
    here = os.path.join(args.out, f"mpi-{args.rate_mbit:g}mbit")
    os.makedirs(here, exist_ok=True)
    bench = os.path.join(here, "bench-comm.h5")
    mpirun(args.nodes, [scape, "bench-comm", "--backend", "mpi", "--out", bench, "--min-bytes", "16384",
                        "--max-bytes", "16777216", "--factor", "4", "--iters", "3", "--warmup", "1", "--idle-gap-ms", f"{args.idle_gap_ms:g}"],
           args.prefix)
    fit, held_out = [bench], []
    for method in methods:
        config, overrides, role = METHODS[method]
        run = os.path.join(here, f"{method}.h5")
        sets = [a for o in overrides + [f"steps={args.steps}", f"workers={args.nodes}"] for a in ("--set", o)]
        mpirun(args.nodes, [scape, "run", f"{ROOT}/{config}", "--backend", "mpi", "--quiet", "--force",
                            "--out", run] + sets, args.prefix)
        if role:
            (fit if role == "fitted" else held_out).append(run)
    if len(fit) == 1:
        sys.exit("netlab mpi_bench: --methods needs adams or scape-90, the runs the calibration fits")
    predicted = calibrate(scape, here, fit, held_out, "calibration")
    rows = []
    for method in methods:
        row = run_row(os.path.join(here, f"{method}.h5"))
        # The calibration's measured step (steps past the optimizer's steady-state start) is the
        # one its prediction is compared with; an unpredicted run gives its own median.
        p = predicted.get(os.path.abspath(os.path.join(here, f"{method}.h5")), {"measured_step_ms": f"{row['measured_step_ms']:.3f}",
                                           "predicted_step_ms": "", "role": "not predicted"})
        rows.append({"runtime": "mpi", "method": method, "workers": args.nodes, "rate_mbit": args.rate_mbit,
                     "measured_step_ms": p["measured_step_ms"], "predicted_step_ms": p["predicted_step_ms"],
                     "exposed_comm_ms": f"{row['exposed_comm_ms']:.2f}", "bytes_per_step": f"{row['bytes_per_step']:.0f}"})
        if p.get("cpu_share") and float(p["cpu_share"]) < 0.9:
            print(f"netlab mpi_bench: warning: {method}'s forward/backward had {float(p['cpu_share']):.2f} of a core: "
                  "something else ran on the cores, and its measured step is the wall step scaled by that share "
                  "(rerun on quiet cores)", file=sys.stderr)
        error = f"{100 * float(p['error']):+.1f}%, " if p["predicted_step_ms"] else ""
        print(f"mpi {method:14} step {float(p['measured_step_ms']):9.2f} ms, predicted {p['predicted_step_ms'] or '-':>9} "
              f"ms ({error}{p['role']}), exposed {row['exposed_comm_ms']:8.2f} ms", flush=True)
    steps_csv.append(os.path.join(args.out, "steps.csv"), rows)


if __name__ == "__main__":
    main()
