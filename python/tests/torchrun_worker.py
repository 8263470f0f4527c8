"""One torchrun rank of the tests: trains tiny_problem's model with scape.torch.DistributedOptimizer
on this rank's own batches, then saves its final parameters (params-rank<r>.npy in --out).
--fail-at S makes rank 1 raise before its step S (the failure test)."""
import argparse
import json
import os
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scape.torch as st  # noqa: E402
from tiny_problem import batch, loss_of, make_model  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--optimizer", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--fail-at", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    model = make_model()
    opt = st.DistributedOptimizer(model.named_parameters(), json.loads(args.optimizer), steps=args.steps,
                                  log=os.path.join(args.out, "run.h5"), name="torchrun-test")
    for t in range(1, args.steps + 1):
        if rank == 1 and t == args.fail_at:
            raise RuntimeError(f"injected failure on rank 1 before step {t}")
        opt.zero_grad()
        x, y = batch(t, rank)
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step(loss.item())
    outcome = opt.close()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(os.path.join(args.out, f"params-rank{rank}.npy"), flat)
    if rank == 0:
        print(json.dumps(outcome))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
