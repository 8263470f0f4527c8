#!/usr/bin/python3
"""The torch runtime's predicted steps in `scripts/netlab bench` (docs/NETLAB.md), filled into
DIR/steps.csv once every rate has run (Debian's python3; the scape binary).

The torch runtime is not a `scape run`, so `scape predict --calibrate` cannot fit its compute.
What it can fit is its links: `python/bench/gloo_bench_comm.py` times scape.torch's own
collectives over gloo at each rate, and `scape predict --calibrate --links-from-bench` turns that
file into a hardware description (the MPI runtime's dense AdamS and SCAPE 90% runs at the same
rate stand in for the compute and optimizer fits, which are not used here). A torch row at a slower rate is then predicted, not
fitted, as

    the same method's step less its exposed communication at the fastest rate measured
    + calls · alpha + bytes sent per step / bandwidth   (the gloo link's combined fit)

where calls are the blocking collectives a step issues: 2 for dense AdamS (the reduce-scatter
and the all-gather of its rank-order all-reduce) and 2 for SCAPE (its payload exchange and the
parameter all-gather; 3 at mask lag 0, whose mask all-gather blocks). The bytes include SCAPE's
mask, which lag 1 hides: an upper bound by the mask's share (a third of SCAPE 99%'s bytes here).
DDP rows (their all-reduce runs inside backward, with no separate compute to add it to) and the
fastest rate's own rows are not predicted.
"""
import argparse
import csv
import json
import os
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BLOCKING_CALLS = {"adams": 2, "scape-90": 2, "scape-99": 2, "scape-99-lag0": 3, "scape-99-overlap": 2}


def gloo_link(scape, folder, mpi_runs):
    """(alpha seconds, bandwidth B/s) fitted by scape predict to the gloo bench-comm file, or None
    with the reason printed."""
    hardware = os.path.join(folder, "gloo-hardware.json")
    with open(os.path.join(folder, "gloo-calibration.txt"), "w") as report:
        done = subprocess.run([scape, "predict", "--calibrate", os.path.join(folder, "bench-comm-gloo.h5")] + mpi_runs +
                              ["--links-from-bench", "--out", hardware], stdout=report, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        print(f"netlab_torch_predict: {folder}: the calibration failed: {done.stderr.strip()}", file=sys.stderr)
        return None
    inter = json.load(open(hardware))["network"]["inter"]
    return inter["alpha_us"] * 1e-6, inter["bandwidth_GBps"] * 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the bench folder (steps.csv, torch-RATE/, mpi-RATE/)")
    args = parser.parse_args()
    scape = os.environ.get("SCAPE_BINARY", f"{ROOT}/build/release/apps/scape")
    path = os.path.join(args.out, "steps.csv")
    rows = list(csv.DictReader(open(path)))
    torch_rates = sorted({float(r["rate_mbit"]) for r in rows if r["runtime"] == "torch"})
    if len(torch_rates) < 2:
        print("netlab_torch_predict: one rate only: nothing to predict the torch rows from", file=sys.stderr)
        return
    fastest = torch_rates[-1]
    base = {r["method"]: float(r["measured_step_ms"]) - float(r["exposed_comm_ms"])
            for r in rows if r["runtime"] == "torch" and float(r["rate_mbit"]) == fastest}
    for rate in torch_rates[:-1]:
        folder = os.path.join(args.out, f"torch-{rate:g}mbit")
        mpi_runs = [os.path.join(args.out, f"mpi-{rate:g}mbit", f"{m}.h5") for m in ("adams", "scape-90")]
        needed = [os.path.join(folder, "bench-comm-gloo.h5")] + mpi_runs
        if not all(os.path.exists(f) for f in needed):
            print(f"netlab_torch_predict: {rate:g} Mbit/s: needs {', '.join(needed)}", file=sys.stderr)
            continue
        link = gloo_link(scape, folder, mpi_runs)
        if link is None:
            continue
        alpha, bandwidth = link
        print(f"torch at {rate:g} Mbit/s: gloo link alpha {alpha * 1e6:.1f} us, {bandwidth / 1e6:.2f} MB/s")
        for r in rows:
            if r["runtime"] != "torch" or float(r["rate_mbit"]) != rate or r["method"] not in BLOCKING_CALLS:
                continue
            if r["method"] not in base:
                continue
            comm = BLOCKING_CALLS[r["method"]] * alpha + float(r["bytes_per_step"]) / bandwidth
            r["predicted_step_ms"] = f"{base[r['method']] + 1e3 * comm:.2f}"
            error = float(r["predicted_step_ms"]) / float(r["measured_step_ms"]) - 1
            print(f"torch {r['method']:18} step {float(r['measured_step_ms']):8.2f} ms, predicted "
                  f"{r['predicted_step_ms']:>8} ms ({100 * error:+.1f}%)")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
