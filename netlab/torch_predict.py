"""The torch runtime's predicted steps in `scripts/netlab bench` (docs/NETLAB.md), filled into
DIR/steps.csv once every rate has run (Debian's python3 with the repository root on PYTHONPATH,
`-m netlab.torch_predict`; the scape binary).

The torch runtime is not a `scape run`, so `scape predict --calibrate` cannot fit its compute.
What it can fit is its links: `netlab/gloo_bench_comm.py` times scape.torch's own collectives over
gloo at each rate, and `scape predict --calibrate --links-from-bench` turns that file into a
hardware description (the MPI runtime's dense AdamS and SCAPE 90% runs at the same rate give its
compute and optimizer fits, which here only set how much of the lagged mask all-gather compute
hides). A torch row at a slower rate is then predicted, not fitted, as

    the same method's step less its exposed communication at the fastest rate measured
    + the exposed communication `scape predict` gives the method on that hardware

where the method is described to `scape predict` as torch_bench runs it (its GPT, W ranks of
TORCH_SEQUENCES sequences, the optimizer section below, no overlap but the lagged mask's and
`overlap_backward`'s): the collectives, their bytes and the α-β link are scape predict's. What is
kept here is the one thing scape predict cannot give: the torch runtime's own compute and
optimizer time, taken from the fastest rate's measurement. DDP rows (their all-reduce runs inside
backward, with no separate compute to add it to) and the fastest rate's own rows are not predicted.
With `--held-out-rate R` the rows at R use none of R's measurements: the gloo bench-comm file and
MPI runs of the nearest other slower rate, its links scaled to R (`scape predict
--link-rate-scale`).
"""
import argparse
import csv
import json
import os
import subprocess
import sys

from netlab import steps_csv
from netlab.mpi_bench import link_donor

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# torch_bench's model (examples/tiny_gpt.py's TinyGPT: GPT-2 blocks, untied head) and a rank's batch.
TORCH_MODEL = {"family": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 64, "context": 64,
               "tied_embeddings": False}
TORCH_SEQUENCES = 4
_SCAPE = {"type": "scape", "sharded": False, "formulation": "paper", "mask_lag": 1}  # scape.torch.SCAPE's defaults
# method: (optimizer section of scape.torch's optimizer as torch_bench builds it, overlap switches)
METHODS = {
    "adams": ({"type": "adams", "sharded": False}, {}),
    "scape-90": (dict(_SCAPE, sparsity=0.9), {}),
    "scape-99": (dict(_SCAPE, sparsity=0.99), {}),
    "scape-99-lag0": (dict(_SCAPE, sparsity=0.99, mask_lag=0), {}),
    "scape-99-overlap": (dict(_SCAPE, sparsity=0.99), {"sparse_reduce": True}),
}


def gloo_hardware(scape, folder, bench, mpi_runs, scale=1.0):
    """The hardware description scape predict fits to the gloo bench-comm file (links, scaled by
    `scale`) and the MPI runs (compute), or None with the reason printed."""
    hardware = os.path.join(folder, "gloo-hardware.json")
    extra = ["--link-rate-scale", f"{scale:.12g}"] if scale != 1 else []
    with open(os.path.join(folder, "gloo-calibration.txt"), "w") as report:
        done = subprocess.run([scape, "predict", "--calibrate", bench] + mpi_runs +
                              ["--links-from-bench", "--out", hardware] + extra, stdout=report, stderr=subprocess.PIPE,
                              text=True)
    if done.returncode != 0:
        print(f"netlab torch_predict: {folder}: the calibration failed: {done.stderr.strip()}", file=sys.stderr)
        return None
    return hardware


def prediction_config(method, workers, hardware):
    """The `scape predict` config of one torch method on `workers` ranks over `hardware`."""
    optimizer, overlap = METHODS[method]
    return {"name": f"torch-{method}", "workers": [workers], "model": TORCH_MODEL,
            "batch": {"scaling": "strong", "seq_len": TORCH_MODEL["context"],
                      "global_sequences": TORCH_SEQUENCES * workers},
            "overlap": dict({"grad_reduce": False, "param_gather": False, "sparse_reduce": False,
                             "mask_gather": True}, **overlap),
            "optimizer": optimizer, "hardware": os.path.abspath(hardware)}


def predicted_exposed_s(scape, folder, method, workers, hardware):
    """scape predict's exposed communication of one step of `method`, in seconds."""
    config = os.path.join(folder, f"predict-{method}.json")
    with open(config, "w") as f:
        json.dump(prediction_config(method, workers, hardware), f, indent=1)
    table = os.path.join(folder, f"predict-{method}.csv")
    with open(os.path.join(folder, f"predict-{method}.txt"), "w") as report:
        done = subprocess.run([scape, "predict", config, "--out", os.path.join(folder, f"predict-{method}.h5"),
                               "--csv", table], stdout=report, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"netlab torch_predict: scape predict {config} failed: {done.stderr.strip()}")
    with open(table, newline="") as f:
        return float(next(r for r in csv.DictReader(f) if r["config"] == "optimizer")["exposed_comm_s"])


def main():
    parser = argparse.ArgumentParser(prog="python3 -m netlab.torch_predict", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the bench folder (steps.csv, torch-RATE/, mpi-RATE/)")
    parser.add_argument("--held-out-rate", type=float, help="this rate (Mbit/s) is predicted from another rate's "
                        "links, scaled (see above)")
    args = parser.parse_args()
    scape = os.environ.get("SCAPE_BINARY", f"{ROOT}/build/release/apps/scape")
    path = os.path.join(args.out, "steps.csv")
    rows = steps_csv.read(path)
    torch_rates = sorted({float(r["rate_mbit"]) for r in rows if r["runtime"] == "torch"})
    if len(torch_rates) < 2:
        print("netlab torch_predict: one rate only: nothing to predict the torch rows from", file=sys.stderr)
        return
    fastest = torch_rates[-1]
    base = {r["method"]: float(r["measured_step_ms"]) - float(r["exposed_comm_ms"])
            for r in rows if r["runtime"] == "torch" and float(r["rate_mbit"]) == fastest}
    for rate in torch_rates[:-1]:
        folder = os.path.join(args.out, f"torch-{rate:g}mbit")
        donor = link_donor(rate, torch_rates, args.held_out_rate)
        bench = os.path.join(args.out, f"torch-{donor:g}mbit", "bench-comm-gloo.h5")
        mpi_runs = [os.path.join(args.out, f"mpi-{donor:g}mbit", f"{m}.h5") for m in ("adams", "scape-90")]
        needed = [bench] + mpi_runs
        if not all(os.path.exists(f) for f in needed):
            print(f"netlab torch_predict: {rate:g} Mbit/s: needs {', '.join(needed)}", file=sys.stderr)
            continue
        hardware = gloo_hardware(scape, folder, bench, mpi_runs, rate / donor)
        if hardware is None:
            continue
        inter = json.load(open(hardware))["network"]["inter"]
        print(f"torch at {rate:g} Mbit/s: gloo link alpha {inter['alpha_us']:.1f} us, "
              f"{inter['bandwidth_GBps'] * 1e3:.2f} MB/s (links from {donor:g} Mbit/s"
              f"{', scaled' if donor != rate else ''}; idle and busy curves: "
              f"{'yes' if 'inter_curves' in json.load(open(hardware))['network'] else 'no'})")
        for r in rows:
            if r["runtime"] != "torch" or float(r["rate_mbit"]) != rate or r["method"] not in METHODS:
                continue
            if r["method"] not in base:
                continue
            exposed = predicted_exposed_s(scape, folder, r["method"], int(r["workers"]), hardware)
            r["predicted_step_ms"] = f"{base[r['method']] + 1e3 * exposed:.2f}"
            error = float(r["predicted_step_ms"]) / float(r["measured_step_ms"]) - 1
            print(f"torch {r['method']:18} step {float(r['measured_step_ms']):8.2f} ms, predicted "
                  f"{r['predicted_step_ms']:>8} ms ({100 * error:+.1f}%; exposed {1e3 * exposed:.2f} ms)")
    steps_csv.rewrite(path, rows)


if __name__ == "__main__":
    main()
