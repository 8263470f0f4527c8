#!/usr/bin/env python3
"""Trains a tiny GPT (plain PyTorch) on scape's built-in synthetic corpus under SCAPE at 90%
sparsity with 4 simulated workers, through scape.torch.simulate, then prints the quickstart's
summary line for the run: quality, bytes per step and modelled step time.

    PYTHONPATH=build/release/python:. ~/.cache/scape/venv/bin/python examples/simulate_nanogpt.py

(or with the package installed: `pip install ./python`, then `python examples/simulate_nanogpt.py`).
The run file (runs/simulate-nanogpt/run.h5 by default) goes through `python3 -m analysis report`.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scape  # noqa: E402
import scape.torch as st  # noqa: E402
from tiny_gpt import CorpusBatches, TinyGPT, cross_entropy  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/simulate-nanogpt", help="folder of the run file (default %(default)s)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default %(default)s)")
    parser.add_argument("--workers", type=int, default=4, help="simulated workers (default %(default)s)")
    parser.add_argument("--sparsity", type=float, default=0.9, help="SCAPE's sparsity (default %(default)s)")
    parser.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the model and batches (default %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    # The quickstart's corpus (experiments/configs/quickstart.json): vocabulary 64, 3 successors.
    train, val = scape.synthetic_corpus(vocab_size=64, successors=3, concentration=0.9, seed=args.seed,
                                        tokens=400_000)
    batches = CorpusBatches(train, args.workers, 4, 64, seed=args.seed)
    val_batches = CorpusBatches(val, 1, 16, 64, seed=args.seed + 1000)

    def evaluate(model):
        x, y = val_batches(1)
        with torch.no_grad():
            return cross_entropy(model(x[0]), y[0]).item()

    os.makedirs(args.out, exist_ok=True)
    log = os.path.join(args.out, "run.h5")
    model = TinyGPT(vocab=64, block=64, n_embd=64, n_head=4, n_layer=2, seed=args.seed)
    optimizer = {"type": "scape", "sparsity": args.sparsity, "lr": args.lr, "warmup_steps": 20,
                 "dense_tensors": ["ln_", "bias"]}
    start = time.time()
    outcome = st.simulate(model, cross_entropy, batches, workers=args.workers, steps=args.steps,
                          optimizer=optimizer, network={"preset": "ib_ndr400"}, eval=evaluate, eval_interval=100,
                          log=log, seed=args.seed, name=f"torch-nanogpt-scape-{args.sparsity:g}")
    wall = time.time() - start
    print(f"{'run':32} {'status':10} {'val loss':>9} {'bytes/step':>12} {'step (model)':>13}")
    print(f"{outcome_name(args):32} {outcome['status']:10} {outcome['final_val_loss']:9.4f} "
          f"{outcome['bytes_per_step']:12.0f} {outcome['step_time_model'] * 1e3:10.3f} ms")
    print(f"{args.steps} steps in {wall:.1f} s; run file {log}")
    return 0 if outcome["status"] == "completed" else 1


def outcome_name(args):
    return f"scape {args.sparsity:g}, {args.workers} workers"


if __name__ == "__main__":
    sys.exit(main())
