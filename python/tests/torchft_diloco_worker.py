"""One torchrun rank of test_torch_vs_torchft.py: the same small GPT, data order and seed trained
by scape.torch.DiLoCo and by torchft's own DiLoCo (torchft.local_sgd.DiLoCo, its code as shipped),
writing <out>/rank<r>.json with both loss curves and final parameters' relative difference.

torchft's DiLoCo talks to a torchft Manager, which needs a lighthouse server and a quorum; the
algorithm needs only the Manager's all-reduce (the mean over replicas), so a shim stands in for
it: all_reduce(SUM) over this gloo group, divided by W, and commit always granted (no failures
are injected): netlab/race_arms.py's CountingManager, which the race's torchft arm uses too.
torchft's inner optimizer is scape.torch.AdamS on a group of this rank alone (so it communicates
nothing), its outer optimizer torch's SGD(nesterov=True), as torchft's examples use it. With
--inner torch-adamw both take torch.optim.AdamW's inner steps: scape.torch.DiLoCo as
DiLoCo(params, inner=torch.optim.AdamW(...)), torchft's with the same optimizer."""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path[:0] = [os.path.join(REPO, "examples"), REPO]
import scape.torch as st  # noqa: E402
from netlab.race_arms import CountingManager as ManagerShim  # noqa: E402
from tiny_gpt import CorpusBatches, TinyGPT, cross_entropy, markov_corpus  # noqa: E402


def run(kind, rank, world, steps, inner_steps, alone, inner):
    torch.manual_seed(0)
    model = TinyGPT(vocab=32, block=16, n_embd=32, n_head=4, n_layer=2, seed=1)
    batches = CorpusBatches(markov_corpus(vocab=32, tokens=20_000), world, 2, 16, seed=3)
    torch_adamw = inner == "torch-adamw"
    if kind == "scape":
        rule = torch.optim.AdamW(model.parameters(), lr=3e-3) if torch_adamw else "adams"
        opt = st.DiLoCo(model.parameters(), lr=3e-3, inner=rule, inner_steps=inner_steps, outer_lr=0.7,
                        outer_momentum=0.9)
        diloco = None
    else:
        from torchft.local_sgd import DiLoCo
        opt = (torch.optim.AdamW(model.parameters(), lr=3e-3) if torch_adamw else
               st.AdamS(model.parameters(), lr=3e-3, group=alone, broadcast_params=False))
        outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        diloco = DiLoCo(ManagerShim(world), [model], opt, outer, sync_every=inner_steps)
        diloco.__enter__()
    losses = []
    for t in range(1, steps + 1):
        x, y = batches(t)
        opt.zero_grad(set_to_none=True)
        loss = cross_entropy(model(x[rank]), y[rank])
        loss.backward()
        opt.step()
        losses.append(float(loss))
    if diloco is not None:
        diloco.__exit__(None, None, None)
    return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--inner-steps", type=int, default=10)
    parser.add_argument("--inner", choices=("adams", "torch-adamw"), default="adams")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    alone = [dist.new_group([r]) for r in range(world)][rank]  # every rank creates every group
    ours, ours_params = run("scape", rank, world, args.steps, args.inner_steps, alone, args.inner)
    theirs, theirs_params = run("torchft", rank, world, args.steps, args.inner_steps, alone, args.inner)
    gap = ours_params - theirs_params
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"scape": ours, "torchft": theirs,
                   "params_max_relative": float(gap.abs().max() / ours_params.abs().max()),
                   "params_l2_relative": float(gap.norm() / ours_params.norm())}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
