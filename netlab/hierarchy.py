"""`scripts/netlab hierarchy`: nodes of several ranks on the netlab (issue 57, docs/NETLAB.md
"Nodes of several ranks: flat against hierarchical"). Debian's python3 runs this; the torch arms
run under the venv's python through `scripts/netlab run`.

For each layout NxG (N nodes of G ranks) and each rate, in OUT/NxG-RATE/:
  1. the nodes come up (`scripts/netlab up --nodes N --ranks-per-node G --rate RATE`);
  2. `scape bench-comm` times the links over all N·G ranks (a flat ring: a node's port carries
     one flow a direction), for the prediction;
  3. the MPI runtime runs the four arms (dense AdamS and SCAPE at --sparsity, each
     optimizer.hierarchy flat and node, rail_split rows) on the noisy quadratic of --params
     parameters with --compute-s of sleep standing in for a GPU's forward and backward;
  4. the torch runtime times its own collectives over gloo (netlab/gloo_bench_comm.py, the same
     sizes) and runs the same four arms (netlab/hierarchy_torch.py: scape.torch.AdamS, SCAPE,
     and Hierarchical around each), --repeat times each, like the MPI arms, each writing a run
     file beside its JSON.
Then `summarize` (also alone, without root) writes OUT/steps.csv (COLUMNS) and prints the
table. Predicted, each runtime on its own: `scape predict --calibrate --links-from-bench` per
layout and rate, the links from that runtime's bench, the optimizer step and the intra-node link
fitted to its dense arms and flat SCAPE, hierarchical SCAPE held out. Exit status 2: bad
arguments; a failing run's status otherwise, naming the arm."""
import argparse
import csv
import glob
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys

import h5py
import numpy as np

from netlab.mpi_bench import mpirun  # tried again when OpenMPI's launch dies before any rank runs

ROOT = pathlib.Path(__file__).resolve().parents[1]
DRIVER = ROOT / "netlab" / "netlab"
ARMS = (("adams", "flat"), ("adams", "node"), ("scape", "flat"), ("scape", "node"))
FITTED = ("adams-flat", "adams-node", "scape-flat")  # the optimizer step and the node link
COLUMNS = ("runtime", "method", "hierarchy", "nodes", "ranks_per_node", "rate_mbit", "runs", "measured_step_ms",
           "min_step_ms", "max_step_ms", "predicted_step_ms", "role", "bytes_sent_per_step",
           "bytes_sent_inter_per_step", "bytes_sent_intra_per_step")
UNITS = {"kbit": 1e-3, "mbit": 1.0, "gbit": 1e3}
SKIP = 2  # steps left out of the medians: start-up and SCAPE's first lagged mask


def rate_in_mbit(rate):
    for unit, factor in UNITS.items():
        if rate.endswith(unit) and re.fullmatch(r"\d+(\.\d+)?", rate[: -len(unit)]):
            return float(rate[: -len(unit)]) * factor
    raise ValueError(f"--rates: {rate!r} is not a number and kbit, mbit or gbit")


def layout_of(text):
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if not match or int(match.group(1)) < 2 or int(match.group(2)) < 1:
        raise ValueError(f"--layouts: {text!r} is not NODESxRANKS with at least 2 nodes (2x2, 4x2)")
    return int(match.group(1)), int(match.group(2))


def mpi_config(method, hierarchy, nodes, per_node, args):
    optimizer = {"type": "adams", "lr": 1e-3} if method == "adams" else \
        {"type": "scape", "sparsity": args.sparsity, "lr": 1e-3}
    if hierarchy == "node":
        optimizer.update(hierarchy="node", rail_split="rows")
    config = {"name": f"{method}-{hierarchy}", "seed": 1, "workers": nodes * per_node, "steps": args.steps,
              "model": {"type": "quadratic", "size": args.params}, "optimizer": optimizer,
              "compute": {"type": "sleep", "seconds": args.compute_s}, "log": {"flush_interval": args.steps}}
    if per_node > 1:
        config["topology"] = {"ranks_per_node": per_node}
    return config


def checked(command, what, env=None):
    status = subprocess.run(command, env=env, stdin=subprocess.DEVNULL).returncode
    if status != 0:
        print(f"netlab hierarchy: {what} failed with status {status}", file=sys.stderr)
        sys.exit(status)


def run_cell(args, nodes, per_node, rate, here):
    here.mkdir(parents=True, exist_ok=True)
    checked([str(DRIVER), "up", "--nodes", str(nodes), "--ranks-per-node", str(per_node), "--rate", rate,
             "--prefix", args.prefix, "--subnet", args.subnet], f"up {nodes}x{per_node} at {rate}")
    if "mpi" in args.runtimes:
        print(f"== {nodes}x{per_node} at {rate}: the links (scape bench-comm)", flush=True)
        mpirun(nodes, [args.scape, "bench-comm", "--backend", "mpi", "--out", str(here / "bench-comm.h5"),
                       "--min-bytes", "16384", "--max-bytes", str(args.bench_max_bytes), "--factor", "4", "--iters", "3",
                       "--warmup", "1"], prefix=args.prefix)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=f"{ROOT / 'python'}:{ROOT}" + (f":{os.environ['PYTHONPATH']}"
                                                        if os.environ.get("PYTHONPATH") else ""))
    if "torch" in args.runtimes:
        print(f"== {nodes}x{per_node} at {rate}: the links over gloo (netlab/gloo_bench_comm.py)", flush=True)
        checked([str(DRIVER), "run", "--prefix", args.prefix, "--nodes", str(nodes), "--port", str(args.port),
                 "--", args.python, "-m", "netlab.gloo_bench_comm", "--out", str(here / "bench-comm-gloo.h5"),
                 "--min-bytes", "16384", "--max-bytes", str(args.bench_max_bytes), "--factor", "4", "--iters", "3",
                 "--warmup", "1"],
                "gloo bench-comm", env)
    for repeat in range(1, args.repeat + 1):
        for method, hierarchy in ARMS:
            name = f"{method}-{hierarchy}"
            if "mpi" in args.runtimes:
                print(f"== {nodes}x{per_node} at {rate}: MPI {name} (run {repeat})", flush=True)
                config = here / f"{name}.json"
                config.write_text(json.dumps(mpi_config(method, hierarchy, nodes, per_node, args), indent=1))
                mpirun(nodes, [args.scape, "run", str(config), "--backend", "mpi", "--quiet", "--force",
                               "--out", str(here / f"{name}.run{repeat}.h5")], prefix=args.prefix)
            if "torch" in args.runtimes:
                print(f"== {nodes}x{per_node} at {rate}: torch {name} (run {repeat})", flush=True)
                checked([str(DRIVER), "run", "--prefix", args.prefix, "--nodes", str(nodes), "--port", str(args.port),
                         "--", args.python, "-m", "netlab.hierarchy_torch", "--method", method, "--hierarchy",
                         hierarchy, "--sparsity", str(args.sparsity), "--params", str(args.params), "--steps",
                         str(args.steps), "--compute-s", str(args.compute_s),
                         "--out", str(here / f"torch-{name}.run{repeat}.json"),
                         "--run-file", str(here / f"torch-{name}.run{repeat}.h5")], f"torch {name}", env)


def mpi_medians(path):
    """Medians over a run's steps past SKIP: the wall step and the bytes by link class."""
    with h5py.File(path, "r") as f:
        m = f["metrics"]
        keep = slice(SKIP, None)
        wall = np.asarray(m["step_wall_time"][keep]) * 1e3
        out = {"step_ms": float(np.median(wall)), "min": float(wall.min()), "max": float(wall.max()),
               "bytes": float(np.median(m["bytes_sent"][keep]))}
        for cls in ("inter", "intra"):
            key = f"bytes_sent_{cls}"
            out[cls] = float(np.median(m[key][keep])) if key in m else (out["bytes"] if cls == "inter" else 0.0)
        return out


def torch_medians(path):
    record = json.load(open(path))
    return {"step_ms": record["measured_step_ms"], "min": record["min_step_ms"], "max": record["max_step_ms"],
            "bytes": record["bytes_sent"], "inter": record["bytes_sent_inter"], "intra": record["bytes_sent_intra"]}


def combine(medians):
    """Over repeated runs: the median of the runs' medians, the extremes of every run's steps."""
    return {"step_ms": statistics.median(m["step_ms"] for m in medians), "min": min(m["min"] for m in medians),
            "max": max(m["max"] for m in medians), "bytes": medians[0]["bytes"], "inter": medians[0]["inter"],
            "intra": medians[0]["intra"], "runs": len(medians)}


# runtime: (its bench-comm file, the prefix of its arms' run files, the suffix of its calibration's files)
CALIBRATION = {"mpi": ("bench-comm.h5", "", ""), "torch": ("bench-comm-gloo.h5", "torch-", "-torch")}


def predicted_cells(scape, here, runtime):
    """{arm name: (predicted ms, role)} of one runtime, from calibrating on the first run of each
    fitted arm of that runtime with its own bench."""
    bench_name, prefix, suffix = CALIBRATION[runtime]
    bench = here / bench_name
    fit = [here / f"{prefix}{name}.run1.h5" for name in FITTED]
    held = [here / f"{prefix}{m}-{h}.run1.h5" for m, h in ARMS if f"{m}-{h}" not in FITTED]
    if not bench.exists() or not all(p.exists() for p in fit + held):
        print(f"netlab hierarchy: {here.name}, {runtime} not predicted: needs {bench_name} and every arm's "
              f"{prefix}ARM.run1.h5", file=sys.stderr)
        return {}
    table = here / f"calibration{suffix}.csv"
    with open(here / f"calibration{suffix}.txt", "w") as report:
        done = subprocess.run([scape, "predict", "--links-from-bench", "--calibrate", str(bench)] +
                              [str(p) for p in fit] + ["--held-out"] + [str(p) for p in held] +
                              ["--out", str(here / f"calibration{suffix}-hardware.json"), "--csv", str(table)],
                              stdout=report, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:  # the measured table stands without its predicted column
        print(f"netlab hierarchy: {here.name}, {runtime} not predicted: {done.stderr.strip()}", file=sys.stderr)
        return {}
    out = {}
    for row in csv.DictReader(open(table)):
        name = pathlib.Path(row["file"]).name.split(".run")[0][len(prefix):]
        out[name] = (float(row["predicted_step_ms"]), row["role"])
    return out


def summarize(out, scape):
    rows = []
    for here in sorted(p for p in out.glob("*x*-*") if p.is_dir()):
        nodes, per_node, rate = re.fullmatch(r"(\d+)x(\d+)-(.+)", here.name).groups()
        runs = {"mpi": [p for p in here.glob("*.run*.h5") if not p.name.startswith("torch-")],
                "torch": list(here.glob("torch-*.run*.h5"))}
        if any(runs.values()) and not scape:
            print(f"netlab hierarchy: {here.name} not predicted: no scape binary (set SCAPE_BINARY)", file=sys.stderr)
        predicted = {runtime: predicted_cells(scape, here, runtime) if files and scape else {}
                     for runtime, files in runs.items()}
        for method, hierarchy in ARMS:
            name = f"{method}-{hierarchy}"
            for runtime, pattern, read in (("mpi", f"{name}.run*.h5", mpi_medians),
                                           ("torch", f"torch-{name}.run*.json", torch_medians)):
                files = sorted(glob.glob(str(here / pattern)))
                if not files:
                    continue
                cell = combine([read(f) for f in files])
                guess = predicted[runtime].get(name)
                rows.append({"runtime": runtime, "method": method, "hierarchy": hierarchy, "nodes": int(nodes),
                             "ranks_per_node": int(per_node), "rate_mbit": rate_in_mbit(rate), "runs": cell["runs"],
                             "measured_step_ms": round(cell["step_ms"], 2), "min_step_ms": round(cell["min"], 2),
                             "max_step_ms": round(cell["max"], 2),
                             "predicted_step_ms": round(guess[0], 2) if guess else "",
                             "role": guess[1] if guess else "", "bytes_sent_per_step": round(cell["bytes"]),
                             "bytes_sent_inter_per_step": round(cell["inter"]),
                             "bytes_sent_intra_per_step": round(cell["intra"])})
    if not rows:
        sys.exit(f"netlab hierarchy: no run in {out}/NxG-RATE/")
    with open(out / "steps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print_table(rows)


def print_table(rows):
    print("| nodes x G | Mbit/s | runtime | method | hierarchy | step ms, median [min, max] | predicted (error, role) "
          "| inter-node bytes | intra-node bytes |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pred = "-"
        if r["predicted_step_ms"] != "":
            error = 100 * (r["predicted_step_ms"] / r["measured_step_ms"] - 1)
            pred = f"{r['predicted_step_ms']:.1f} ({error:+.1f}%, {r['role']})"
        print(f"| {r['nodes']}x{r['ranks_per_node']} | {r['rate_mbit']:g} | {r['runtime']} | {r['method']} | "
              f"{r['hierarchy']} | {r['measured_step_ms']:.1f} [{r['min_step_ms']:.1f}, {r['max_step_ms']:.1f}] | "
              f"{pred} | {r['bytes_sent_inter_per_step']:,} | {r['bytes_sent_intra_per_step']:,} |")


def arguments(argv=None):
    p = argparse.ArgumentParser(prog="scripts/netlab hierarchy", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the study's folder")
    p.add_argument("--layouts", default="2x2,4x2", help="NODESxRANKS, comma-separated")
    p.add_argument("--rates", default="100mbit,1gbit", help="tc rates, comma-separated")
    p.add_argument("--runtimes", default="mpi,torch", help="mpi, torch or both, comma-separated")
    p.add_argument("--steps", type=int, default=30, help="steps a run (the first 2 left out of the medians)")
    p.add_argument("--repeat", type=int, default=1, help="runs of every arm and runtime")
    p.add_argument("--params", type=int, default=2_000_000, help="parameters (a multiple of 1000)")
    p.add_argument("--sparsity", type=float, default=0.99, help="SCAPE's")
    p.add_argument("--compute-s", type=float, default=0.05, help="the slept forward and backward a step")
    p.add_argument("--bench-max-bytes", type=int, default=16 << 20,
                   help="the benches' largest payload (from 16 KiB, factor 4; default %(default)s)")
    p.add_argument("--summarize", action="store_true", help="only the table, from the files already in OUT")
    p.add_argument("--prefix", default="snl", help="the netlab's prefix (scripts/netlab --help)")
    p.add_argument("--subnet", default="10.77.0", help="the netlab's subnet A.B.C")
    p.add_argument("--port", type=int, default=29500)
    args = p.parse_args(argv)
    try:
        args.layouts = [layout_of(t) for t in args.layouts.split(",")]
        args.rate_list = [(r, rate_in_mbit(r)) for r in args.rates.split(",")]
    except ValueError as e:
        p.error(str(e))
    args.runtimes = args.runtimes.split(",")
    if not args.runtimes or any(r not in ("mpi", "torch") for r in args.runtimes):
        p.error(f"--runtimes: mpi, torch or both, not {','.join(args.runtimes)!r}")
    for flag, value, low in (("--steps", args.steps, SKIP + 1), ("--repeat", args.repeat, 1),
                             ("--params", args.params, 1000), ("--bench-max-bytes", args.bench_max_bytes, 65536)):
        if value < low:
            p.error(f"{flag}: at least {low}, got {value}")
    if args.params % 1000:
        p.error(f"--params: a multiple of 1000, got {args.params}")
    if not 0 < args.sparsity < 1:
        p.error(f"--sparsity: in (0, 1), got {args.sparsity}")
    if not args.compute_s > 0:
        p.error(f"--compute-s: > 0, got {args.compute_s}")
    args.scape = os.environ.get("SCAPE_BINARY", str(ROOT / "build" / "release" / "apps" / "scape"))
    args.python = os.environ.get("SCAPE_PYTHON", str(pathlib.Path.home() / ".cache/scape/venv/bin/python"))
    return p, args


def main(argv=None):
    parser, args = arguments(argv)
    out = pathlib.Path(args.out).resolve()
    has_scape = os.access(args.scape, os.X_OK)
    if not args.summarize and "mpi" in args.runtimes and not has_scape:
        parser.error(f"no scape binary at {args.scape} (an MPI build; set SCAPE_BINARY)")
    if not args.summarize:
        if "torch" in args.runtimes and not os.access(args.python, os.X_OK):
            parser.error(f"no python with torch at {args.python} (scripts/setup-python; or set SCAPE_PYTHON)")
        for nodes, per_node in args.layouts:
            for rate, _ in args.rate_list:
                run_cell(args, nodes, per_node, rate, out / f"{nodes}x{per_node}-{rate}")
    summarize(out, args.scape if has_scape else None)


if __name__ == "__main__":
    main()
