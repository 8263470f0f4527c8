#!/usr/bin/env python3
"""The binding's overhead per step: scape.Simulator.step called from Python (array checks,
GIL release, the metrics dict) against the core's own step on the same buffers, timed inside
C++ (Simulator.step_repeated), in the same run. Reports the overhead as a fraction of the core's
step; the target is under 5% at N = 16M.

    PYTHONPATH=build/release/python ~/.cache/scape/venv/bin/python python/bench/bench_binding.py
"""
import argparse
import os
import tempfile
import time

import numpy as np

import scape

STEPS = 8    # steps per timing
REPEATS = 5  # timings of each, the best kept


def measure(n, workers, steps, repeats, optimizer, folder):
    rng = np.random.default_rng(0)
    grads = (rng.standard_normal((workers, n), dtype=np.float32) * 1e-3)
    layout = [("w", (n,), True)]
    total = steps * repeats * 2 + 2
    with scape.Simulator(layout, workers, optimizer, log=os.path.join(folder, f"b{n}.h5"), steps=total,
                         log_options={"oracle": False, "gradient_metrics_interval": 1000000}) as sim:
        sim.step(grads)  # warm-up: buffers touched, pages mapped
        python_best, core_best = float("inf"), float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(steps):
                sim.step(grads)
            python_best = min(python_best, (time.perf_counter() - start) / steps)
            core_best = min(core_best, sim._sim.step_repeated(grads, steps) / steps)
    return python_best, core_best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1048576,16777216", help="N values (default %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="simulated workers (default %(default)s)")
    args = parser.parse_args()
    optimizer = {"type": "scape", "sparsity": 0.99, "lr": 1e-3}
    print(f"{'N':>10} {'W':>3} {'python step':>12} {'core step':>11} {'overhead':>9}")
    with tempfile.TemporaryDirectory() as folder:
        for n in (int(s) for s in args.sizes.split(",")):
            py, core = measure(n, args.workers, STEPS, REPEATS, optimizer, folder)
            print(f"{n:>10} {args.workers:>3} {py * 1e3:9.2f} ms {core * 1e3:8.2f} ms {100 * (py / core - 1):8.2f}%")


if __name__ == "__main__":
    main()
