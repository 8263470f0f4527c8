"""One node of `scripts/netlab race` (the venv's python, `-m netlab.race_node`, launched on every
node by `scripts/netlab run`, which sets torchrun's variables and pins the node to a core).

    --mode measure   the arm's steady step time on this link: a few warm-up steps, then whole
                     sync rounds of steps timed end to end; rank 0 writes {"step_s", "compute_s"}
                     (compute_s: forward + backward of the model alone, no communication) to --out
    --mode train     the arm for --steps steps at peak rate --lr (warm-up + cosine over that
                     count); rank 0 appends one race CSV row an evaluation step to --out

The wall clock counts training only: it starts after the process group, model and arm are built,
and stops while rank 0 evaluates (both ranks wait at a barrier on either side of an evaluation).
Validation: the loss of rank 0's parameters on fixed held-out batches (the last 10% of the
corpus, the same batches for every arm and seed); a local-SGD arm is evaluated at its syncs."""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from netlab import race_arms, race_plan
from netlab.gloo_bench_comm import leave_process_group

sys.path.insert(0, os.path.join(race_arms.ROOT, "examples"))
from tiny_gpt import CorpusBatches, TinyGPT, cross_entropy  # noqa: E402


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=("measure", "train"), required=True)
    p.add_argument("--arm", required=True, help="one of: " + ", ".join(race_plan.ARMS))
    p.add_argument("--out", required=True, help="measure: a JSON file; train: the race CSV to append to")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--seed", type=int, default=1, help="seed of the model's initialisation and the batch order")
    p.add_argument("--steps", type=int, default=100, help="train: the arm's step count (its schedule's length)")
    p.add_argument("--measure-steps", type=int, default=20, help="measure: at least this many timed steps")
    p.add_argument("--eval-points", type=int, default=20, help="train: evaluations over the run")
    p.add_argument("--rate-mbit", type=float, default=0.0, help="the link's rate, for the CSV")
    p.add_argument("--budget-s", type=float, default=0.0, help="the race's budget B, for the CSV")
    p.add_argument("--width", type=int, default=128, help="the GPT's width (n_embd)")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--block", type=int, default=64, help="characters per sequence")
    p.add_argument("--val-sequences", type=int, default=64, help="held-out sequences per evaluation")
    args = p.parse_args(argv)
    try:
        race_plan.check_arm(args.arm, where="--arm")
    except race_plan.RaceInputError as e:
        p.error(str(e))  # exit 2, naming the arm
    return args


class Data:
    """The char corpus split 90/10: training batches by (seed, step), fixed validation batches."""

    def __init__(self, args, world):
        tokens, self.vocab = race_arms.char_corpus()
        split = int(0.9 * len(tokens))
        self.train = CorpusBatches(tokens[:split], world, args.batch, args.block, seed=args.seed)
        self.val = CorpusBatches(tokens[split:], 1, args.val_sequences, args.block, seed=10_007)


def model_for(args, vocab):
    return TinyGPT(vocab=vocab, block=args.block, n_embd=args.width, n_head=4, n_layer=args.layers, seed=args.seed)


def compute_time(model, data, rank, repeats=8):
    """Median forward + backward of the model alone (a copy; nothing communicated)."""
    times = []
    for t in range(1, repeats + 3):
        x, y = data.train(t)
        began = time.perf_counter()
        model.zero_grad(set_to_none=True)
        cross_entropy(model(x[rank]), y[rank]).backward()
        times.append(time.perf_counter() - began)
    return sorted(times[2:])[len(times[2:]) // 2]


def measure(args, data, rank, world):
    model = model_for(args, data.vocab)
    compute = compute_time(model_for(args, data.vocab), data, rank)
    every = race_plan.SYNC_EVERY.get(args.arm, 1)
    timed = -(-args.measure_steps // every) * every  # whole sync rounds: a round's sync is in the mean
    warm = max(3, every)  # one round before timing, so each timed round holds exactly one sync
    arm = race_arms.build(args.arm, model, args.lr, warm + timed, world)
    for t in range(1, warm + 1):
        x, y = data.train(t)
        arm.step(t, x[rank], y[rank], cross_entropy)
    dist.barrier()
    began = time.perf_counter()
    for t in range(warm + 1, warm + timed + 1):
        x, y = data.train(t)
        arm.step(t, x[rank], y[rank], cross_entropy)
    dist.barrier()
    step_s = (time.perf_counter() - began) / timed
    arm.finish()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"arm": args.arm, "step_s": step_s, "compute_s": compute, "timed_steps": timed}, f)
        print(f"{args.arm}: {step_s * 1e3:.1f} ms a step over {timed} steps; compute {compute * 1e3:.1f} ms",
              flush=True)


def validation_loss(model, data):
    x, y = data.val(1)
    with torch.no_grad():
        return float(cross_entropy(model(x[0]), y[0]))


def train(args, data, rank, world):
    model = model_for(args, data.vocab)
    arm = race_arms.build(args.arm, model, args.lr, args.steps, world)
    warmup = race_plan.warmup_steps(args.steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        arm.opt, lambda k: race_plan.lr_factor(k + 1, args.steps, warmup))  # k: steps taken so far
    evals = set(race_plan.eval_steps(args.steps, args.eval_points, race_plan.SYNC_EVERY.get(args.arm, 1)))
    rows, wall, sent = [], 0.0, 0.0
    dist.barrier()
    began = time.perf_counter()
    for t in range(1, args.steps + 1):
        x, y = data.train(t)
        _, step_bytes = arm.step(t, x[rank], y[rank], cross_entropy)
        sched.step()
        sent += step_bytes
        if t in evals:
            dist.barrier()
            wall += time.perf_counter() - began
            if rank == 0:
                rows.append(row(args, t, wall, validation_loss(model, data), sent))
                print(f"{args.arm} lr {args.lr:g} seed {args.seed}: step {t}/{args.steps} {wall:.1f} s "
                      f"val {rows[-1]['val_loss']}", flush=True)
            dist.barrier()
            began = time.perf_counter()
    arm.finish()
    if rank == 0:
        race_plan.append(args.out, rows)


def row(args, step, wall, loss, sent):
    return {"rate_mbit": f"{args.rate_mbit:g}", "arm": args.arm, "seed": args.seed, "lr": f"{args.lr:g}",
            "planned_steps": args.steps, "budget_s": f"{args.budget_s:.3f}", "step": step,
            "wall_s": f"{wall:.3f}", "val_loss": f"{loss:.5f}", "bytes_sent": f"{sent:.0f}"}


def main(argv=None):
    args = arguments(argv)
    race_arms.threads()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = Data(args, world)
    (measure if args.mode == "measure" else train)(args, data, rank, world)
    leave_process_group()


if __name__ == "__main__":
    main()
