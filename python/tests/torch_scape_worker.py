"""One torchrun rank of test_torch_scape_vs_core.py: steps scape.torch.SCAPE (or AdamS) on a
recorded gradient trace, each rank setting p.grad from its own row of the trace, for every case
of a JSON list, and saves per case the masks of every step and the final fp32 parameters
(rank r writes <out>/<case>.rank<r>.npz)."""
import argparse
import json
import math
import os

import h5py
import numpy as np
import torch
import torch.distributed as dist

import scape.torch as st

DENSE = ("norm", "bias")


def read_trace(path):
    with h5py.File(path, "r") as f:
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in f["layout/names"][()]]
        return (names, [int(s) for s in f["layout/sizes"][()]], [bool(d) for d in f["layout/decay"][()]],
                f["init/params"][()], f["grads"][()])


def core_lr(lr, t, total, warmup=0):
    """The core's schedule (core/schedule.cpp): warm-up, then cosine to lr/10."""
    min_lr = lr / 10
    if t <= warmup:
        return lr * t / warmup
    progress = (t - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def param_groups(names, sizes, decay, init, dtype, weight_decay, device):
    """Runs of consecutive tensors sharing (dense, decayed): the trace's layout order."""
    groups, offset = [], 0
    for name, size, dec in zip(names, sizes, decay):
        dense = any(p in name for p in DENSE)
        p = torch.nn.Parameter(torch.from_numpy(init[offset:offset + size].copy()).to(device=device, dtype=dtype))
        offset += size
        key = (dense, dec)
        if not groups or groups[-1]["key"] != key:
            groups.append({"key": key, "params": [], "sparsity_dense": dense, "decayed": dec})
        groups[-1]["params"].append((name, p))
    out = []
    for g in groups:
        entry = {"params": g["params"], "weight_decay": weight_decay if g["decayed"] else 0.0}
        if g["sparsity_dense"]:
            entry["sparsity"] = 0.0
        out.append(entry)
    return out


def run_case(case, trace, rank, world, out_dir, device):
    names, sizes, decay, init, grads = trace
    steps = grads.shape[0] if "steps" not in case else case["steps"]
    dtype = torch.bfloat16 if case.get("dtype") == "bf16" else torch.float32
    lr = case["lr"]
    groups = param_groups(names, sizes, decay, init, dtype, 0.1, device)
    tensors = [p for g in groups for _, p in g["params"]]
    if case["type"] == "adams":
        opt = st.AdamS(groups, lr=lr)
    elif case["type"] == "diloco":
        opt = st.DiLoCo(groups, lr=lr, inner=case.get("inner", "adams"), inner_steps=case["inner_steps"], outer_wire=case.get("outer_wire", "fp32"),
                        streaming_fragments=case.get("streaming_fragments", 1),
                        overlap_outer=case.get("overlap_outer", False), total_steps=steps)
    elif case["type"] == "demo":
        opt = st.DeMo(groups, lr=lr, chunk=case["chunk"], topk=case["topk"])
    elif case["type"] == "sparseloco":
        opt = st.SparseLoCo(groups, lr=lr, inner=case.get("inner", "adams"), inner_steps=case["inner_steps"], sparsity=case["sparsity"],
                            chunk=case["chunk"], quant_bits=case["quant_bits"], wire_dtype=case.get("wire_dtype", "fp32"),
                            overlap_outer=case.get("overlap_outer", False), total_steps=steps)
    else:
        opt = st.SCAPE(groups, lr=lr, sparsity=case["sparsity"], sharded=case["sharded"], mask_lag=case["mask_lag"],
                       clip_grad=case.get("clip_grad", 0.0), density_warmup=case.get("density_warmup", 0),
                       overlap_backward=case.get("overlap_backward", False), total_steps=case.get("total_steps"),
                       wire_dtype=case.get("wire_dtype", "fp32"))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: core_lr(lr, k + 1, steps) / lr)
    masks = []
    for t in range(steps):
        offset = 0
        for p in tensors:
            p.grad = torch.from_numpy(grads[t, rank, offset:offset + p.numel()].copy()).to(device=device, dtype=dtype).view_as(p)
            offset += p.numel()
        opt.step()
        sched.step()
        if case["type"] == "scape":
            masks.append(np.packbits(opt.mask_bits().cpu().numpy(), bitorder="little"))
    opt.finish()
    np.savez(os.path.join(out_dir, f"{case['name']}.rank{rank}.npz"), params=opt.flat_params().cpu().numpy(),
             masks=np.array(masks), model=torch.cat([p.detach().float().reshape(-1) for p in tensors]).cpu().numpy())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (every rank on cuda:0 over gloo, or "
                        "cuda:LOCAL_RANK over nccl)")
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    device = torch.device(args.device)
    if args.device == "cuda" and args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    trace = read_trace(args.trace)
    for case in json.loads(open(args.cases).read()):
        run_case(case, trace, rank, world, args.out, device)
    # Every rank past its last collective before any tears the group down. A rank aborted once at
    # W = 3 at exit ("terminate called without an active exception", not reproduced since), as the
    # FSDP2 worker's did before its barrier: a peer closing its gloo pairs early is the likely cause.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
