"""The Python of `scripts/netlab strong-scaling` (netlab/strong-scaling; docs/NETLAB.md, "Strong
scaling with a GPU stand-in"), under Debian's /usr/bin/python3 with the repository root on
PYTHONPATH:

  plan       the run configs of every (node count, method), scaled down from the artifact's
             Llama-500M on TACC Vista (bytes by --scale, compute by the link ratio), and
             OUT/plan.txt, one "nodes method compute_s" line each, for the driver's loop;
  summarize  OUT/steps.csv and the printed table from the run files in OUT: mpi_bench.run_row's
             medians, `scape predict --calibrate --links-from-bench` per node count, the
             efficiency against the fewest nodes and the speedup against dense.
"""
import argparse
import csv
import glob
import json
import os
import re
import sys

from netlab import steps_csv
from netlab.mpi_bench import calibrate, run_row  # the same medians and calibration as `bench`

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
FITTED = ("dense", "scape90")  # the optimizer step is fitted to these at each node count


def rate_bits(rate):
    """Bits per second of a tc rate with a unit (100mbit, 1gbit, 500kbit)."""
    for unit, factor in UNITS.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * factor
    sys.exit(f"netlab scaling: --rate {rate}: a number and kbit, mbit or gbit")


def methods_at(n, ablations):
    """(name, optimizer section) of every method run on n nodes; the ablations at 4 nodes only."""
    scape99 = {"type": "scape", "sparsity": 0.99, "formulation": "artifact", "sharded": False, "param_dtype": "bf16"}
    methods = [("dense", {"type": "adams", "sharded": True, "param_dtype": "bf16"}),
               ("scape90", dict(scape99, sparsity=0.9)),
               ("scape99", scape99)]
    if ablations and n == 4:
        methods += [("scape99_lag0", dict(scape99, mask_lag=0)),
                    ("scape99_union", dict(scape99, mask_partition="local_union")),
                    ("scape99_frozen_one_buffer", dict(scape99, formulation="frozen_momentum")),
                    ("scape99_frozen_two_collectives", dict(scape99, formulation="frozen_momentum",
                                                            second_moment="two_collectives"))]
    return methods


def plan(out, rate, scale, steps, nodes, ablations):
    """Writes OUT/<method>-n<N>.json and OUT/plan.txt from OUT/vista-prediction.{csv,txt}."""
    hardware = json.load(open(f"{ROOT}/experiments/hardware/tacc-vista-measured.json"))
    there_Bps = hardware["network"]["inter"]["bandwidth_GBps"] * 1e9
    bits = rate_bits(rate)
    time_factor = there_Bps / (bits / 8) / scale
    with open(f"{out}/vista-prediction.csv", newline="") as f:
        rows = {int(r["workers"]): r for r in csv.DictReader(f) if r["config"] == "baseline"}
    # N of the model preset, as scape predict states it ("N = 513,590,784 parameters").
    n_there = int(re.search(r"N = ([\d,]+) parameters", open(f"{out}/vista-prediction.txt").read())
                  .group(1).replace(",", ""))
    n_params = round(n_there / scale)
    lines = []
    for n in nodes:
        compute_s = float(rows[8 * n]["compute_s"]) * time_factor
        for method, optimizer in methods_at(n, ablations):
            config = {"name": f"{method}-n{n}", "seed": 1, "workers": n, "steps": steps,
                      "model": {"type": "quadratic", "size": n_params},
                      "optimizer": dict(optimizer, lr=1e-3),
                      "compute": {"type": "sleep", "seconds": compute_s},
                      "log": {"flush_interval": steps}}
            json.dump(config, open(f"{out}/{method}-n{n}.json", "w"), indent=1)
            lines.append(f"{n} {method} {compute_s:.6f}")
    open(f"{out}/plan.txt", "w").write("\n".join(lines) + "\n")
    print(f"N = {n_params} parameters (Llama-500M's {n_there} / {scale:g}); time factor {time_factor:.4f} "
          f"(Vista {there_Bps / 1e9:.3f} GB/s over {bits / 1e6:g} Mbit/s / {scale:g})")


def summarize(out, rate, scape):
    """Writes OUT/steps.csv (steps_csv.SCALING_COLUMNS) and prints the table."""
    mbit = rate_bits(rate) / 1e6
    rows = []
    for path in sorted(glob.glob(f"{out}/*-n*.h5")):
        if os.path.basename(path).startswith("bench-comm-"):
            continue  # the links, not a run
        method, n = re.match(r"(\w+)-n(\d+)\.h5", os.path.basename(path)).groups()
        row = run_row(path)
        rows.append({"runtime": "mpi", "method": method, "workers": int(n), "rate_mbit": mbit,
                     "measured_step_ms": row["measured_step_ms"], "predicted_step_ms": "",
                     "exposed_comm_ms": row["exposed_comm_ms"], "bytes_per_step": row["bytes_per_step"],
                     "compute_ms": row["compute_ms"]})
    if not rows:
        sys.exit(f"netlab scaling: no run file <method>-n<N>.h5 in {out}")
    roles = {}
    # Predicted: per node count, the links from its bench, the optimizer fitted to dense and SCAPE 90%.
    for n in sorted({r["workers"] for r in rows}):
        bench = f"{out}/bench-comm-n{n}.h5"
        fit = [f"{out}/{m}-n{n}.h5" for m in FITTED]
        if not os.path.exists(bench) or not all(map(os.path.exists, fit)):
            print(f"netlab scaling: {n} nodes not predicted: needs {bench} and {', '.join(fit)}", file=sys.stderr)
            continue
        held = [f"{out}/{r['method']}-n{n}.h5" for r in rows if r["workers"] == n and r["method"] not in FITTED]
        predicted = calibrate(scape, out, [bench] + fit, held, f"calibration-n{n}")
        for r in rows:
            p = predicted.get(os.path.abspath(f"{out}/{r['method']}-n{n}.h5")) if r["workers"] == n else None
            if p:
                r["predicted_step_ms"], roles[id(r)] = float(p["predicted_step_ms"]), p["role"]
    base = min(r["workers"] for r in rows)
    for r in rows:
        same = [q for q in rows if q["method"] == r["method"] and q["workers"] == base]
        dense = [q for q in rows if q["method"] == "dense" and q["workers"] == r["workers"]]
        r["efficiency"] = same[0]["measured_step_ms"] * base / (r["measured_step_ms"] * r["workers"]) if same else ""
        r["speedup_vs_dense"] = dense[0]["measured_step_ms"] / r["measured_step_ms"] if dense else ""
    rows.sort(key=lambda r: (r["workers"], r["method"]))
    steps_csv.rewrite(f"{out}/steps.csv", rows, steps_csv.SCALING_COLUMNS)
    print("| nodes | method | step ms | predicted ms (error, role) | compute ms | exposed comm ms | bytes/step | "
          f"efficiency vs {base} nodes | speedup vs dense |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        eff = f"{r['efficiency']:.3f}" if r["efficiency"] != "" else ""
        pred = (f"{r['predicted_step_ms']:.1f} ({100 * (r['predicted_step_ms'] / r['measured_step_ms'] - 1):+.1f}%, "
                f"{roles.get(id(r), '')})" if r["predicted_step_ms"] != "" else "-")
        speedup = f"{r['speedup_vs_dense']:.2f}" if r["speedup_vs_dense"] != "" else ""
        print(f"| {r['workers']} | {r['method']} | {r['measured_step_ms']:.1f} | {pred} | {r['compute_ms']:.1f} | "
              f"{r['exposed_comm_ms']:.1f} | {r['bytes_per_step']:.3g} | {eff} | {speedup} |")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m netlab.scaling", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="the run configs and OUT/plan.txt")
    p.add_argument("--out", required=True, help="the study's folder (holds vista-prediction.{csv,txt})")
    p.add_argument("--rate", required=True, help="the node links' tc rate (100mbit)")
    p.add_argument("--scale", type=float, required=True, help="the model's N divided by this")
    p.add_argument("--steps", type=int, required=True, help="steps a run")
    p.add_argument("--nodes", required=True, help='node counts, space-separated ("2 4 8")')
    p.add_argument("--ablations", action="store_true", help="also SCAPE 99%%'s systems switches at 4 nodes")
    s = sub.add_parser("summarize", help="OUT/steps.csv and the table from the run files in OUT")
    s.add_argument("--out", required=True, help="the study's folder")
    s.add_argument("--rate", required=True, help="the node links' tc rate (100mbit)")
    s.add_argument("--scape", required=True, help="the scape binary (scape predict --calibrate)")
    args = parser.parse_args(argv)
    if args.command == "plan":
        plan(args.out, args.rate, args.scale, args.steps, [int(n) for n in args.nodes.split()], args.ablations)
    else:
        summarize(args.out, args.rate, args.scape)


if __name__ == "__main__":
    main()
