#!/usr/bin/env python3
"""Trains a small GPT (plain PyTorch) with scape.torch.SCAPE, or dense scape.torch.AdamS, in an
ordinary nanoGPT-style loop on real ranks: param groups, a learning-rate scheduler, optional
GradScaler, a checkpoint, and a run file that `python3 -m analysis report` reads.

    torchrun --nproc_per_node 2 examples/torch_nanogpt.py                 # 2 ranks (gloo on CPU)
    torchrun --nproc_per_node 8 examples/torch_nanogpt.py --device cuda   # NCCL, one GPU a rank
    python examples/torch_nanogpt.py                                      # one process

with scape importable (PYTHONPATH=build/release/python:. or `pip install ./python`; the
optimizers need no compiled extension). The process group's backend follows the device: gloo
on the CPU, NCCL on CUDA. Each rank trains on its own batches; SCAPE does all the
communication. The run file is <out>/<name>.h5 (rank 0 writes it), the checkpoints
<out>/<name>.rank<r>.pt (every rank keeps its own optimizer state)."""
import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scape.torch as st  # noqa: E402
from scape.run_file import RunFileWriter  # noqa: E402
from tiny_gpt import CorpusBatches, TinyGPT, cross_entropy, markov_corpus  # noqa: E402


def arguments():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--optimizer", choices=("scape", "adams"), default="scape", help="SCAPE or dense AdamS")
    p.add_argument("--sparsity", type=float, default=0.9, help="SCAPE's sparsity (0.9: 10%% of the first moment sent)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (cosine to lr/10 after a warm-up)")
    p.add_argument("--warmup", type=int, default=20, help="warm-up steps of the learning rate")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    p.add_argument("--block", type=int, default=64, help="tokens per sequence")
    p.add_argument("--width", type=int, default=64, help="embedding width (n_embd)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--device", default="cpu", help="cpu, cuda (each rank takes cuda:LOCAL_RANK)")
    p.add_argument("--amp", action="store_true", help="float16 autocast with a GradScaler (CUDA)")
    p.add_argument("--overlap-backward", action="store_true", help="SCAPE's sparse reduce during backward")
    p.add_argument("--sharded", action="store_true", help="SCAPE's first moment sharded over the ranks (ZeRO-1)")
    p.add_argument("--eval-interval", type=int, default=100, help="steps between validation losses")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: none)")
    p.add_argument("--resume", action="store_true", help="continue from this run's checkpoints")
    p.add_argument("--seed", type=int, default=1, help="seed of the model and the batches")
    p.add_argument("--out", default="runs/torch-nanogpt", help="folder of the run file and checkpoints")
    p.add_argument("--name", default=None, help="run name (default: from the optimizer and sparsity)")
    return p.parse_args()


def setup(device_name):
    """The process group torchrun describes (none without torchrun): NCCL on CUDA, else gloo."""
    if "WORLD_SIZE" not in os.environ:
        return 0, 1, torch.device(device_name)
    local = int(os.environ.get("LOCAL_RANK", 0))
    if device_name == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device(device_name)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def lr_factor(step, warmup, total):
    """The core's schedule as a LambdaLR factor: linear warm-up, cosine to 1/10 of the peak."""
    t = step + 1
    if t <= warmup:
        return t / warmup
    progress = (t - warmup) / max(1, total - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))


def main():
    args = arguments()
    rank, world, device = setup(args.device)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    name = args.name or (f"torch-nanogpt-{args.optimizer}" + (f"-{args.sparsity:g}" if args.optimizer == "scape" else ""))
    tokens = markov_corpus(vocab=64, successors=3, concentration=0.9, seed=args.seed, tokens=200_000)
    split = int(0.9 * len(tokens))
    batches = CorpusBatches(tokens[:split], world, args.batch, args.block, seed=args.seed)
    val_batches = CorpusBatches(tokens[split:], 1, 16, args.block, seed=args.seed + 1000)
    model = TinyGPT(vocab=64, block=args.block, n_embd=args.width, n_head=4, n_layer=args.layers, seed=args.seed)
    model.to(device)

    # nanoGPT's groups: matrices decayed; biases and LayerNorm gains undecayed and, for SCAPE, sent dense.
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for n, p in named if p.dim() < 2], "weight_decay": 0.0, "sparsity": 0.0}]
    if args.optimizer == "scape":
        opt = st.SCAPE(groups, lr=args.lr, sparsity=args.sparsity, sharded=args.sharded,
                       overlap_backward=args.overlap_backward)
    else:
        groups[1].pop("sparsity")
        opt = st.AdamS(groups, lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, args.warmup, args.steps))
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp)

    os.makedirs(args.out, exist_ok=True)
    checkpoint = os.path.join(args.out, f"{name}.rank{rank}.pt")
    first = 1
    if args.resume:
        state = torch.load(checkpoint, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        first = state["step"] + 1
    config = {"name": name, "seed": args.seed, "workers": world, "steps": args.steps,
              "model": {"type": "external"}, "optimizer": opt.config(),
              "description": f"examples/torch_nanogpt.py: TinyGPT width {args.width}, {args.layers} blocks, "
                             f"{world} ranks on {device.type}"}
    log = RunFileWriter(os.path.join(args.out, f"{name}.h5"), config=config, rank=rank, world_size=world,
                        tensors=[(n, p.numel()) for n, p in named], overwrite=True)

    def evaluate():
        x, y = val_batches(1)
        with torch.no_grad():
            return cross_entropy(model(x[0].to(device)), y[0].to(device)).item()

    start = time.time()
    with log:
        for t in range(first, args.steps + 1):
            x, y = batches(t)
            x, y = x[rank].to(device), y[rank].to(device)
            opt.zero_grad(set_to_none=True)
            began = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.float16, enabled=args.amp):
                loss = cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            compute = time.perf_counter() - began
            scaler.step(opt)
            scaler.update()
            sched.step()
            row = dict(opt.last_metrics, train_loss=loss.item(), compute_wall_time=compute,
                       optimizer_wall_time=time.perf_counter() - began - compute)
            row.pop("step", None)
            if t % args.eval_interval == 0 or t == args.steps:
                row["val_loss"] = evaluate()
            log.write_step(t, row)
            if rank == 0 and (t % 50 == 0 or t == args.steps):
                print(f"step {t}/{args.steps}: train loss {row['train_loss']:.4f}"
                      + (f", val loss {row['val_loss']:.4f}" if "val_loss" in row else "")
                      + f", {row.get('bytes_sent', 0):.0f} bytes sent, {time.time() - start:.1f} s", flush=True)
            if args.checkpoint_every and t % args.checkpoint_every == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": t,
                            "scheduler": sched.state_dict(), "scaler": scaler.state_dict()}, checkpoint)
        opt.finish()  # the lagged mask all-gather after the last step, before the group goes
        summary = log.close("completed", final_params=opt.flat_params().detach().cpu().numpy())
    if rank == 0:
        print(f"{name}: {summary['status']} after {summary['steps_completed']} steps in {time.time() - start:.1f} s; "
              f"final val loss {summary['final_val_loss']:.4f}; run file {summary['path']}")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
