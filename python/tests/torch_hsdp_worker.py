"""One torchrun rank of test_torch_hsdp.py: scape.torch.SCAPE as the replicate-dimension
optimizer of FSDP2 sharded inside the node, on a recorded gradient trace. W ranks form a
(W/G) × G mesh ("inter", "intra"); the trace's tensors live in a module sharded by
fully_shard(module, mesh=mesh["intra"]) whose forward is sum(p · g_r), so that backward hands
FSDP2 rank r's own gradient row and FSDP2's reduce-scatter leaves each rank the node mean of its
dim-0 slice. Each case runs twice:

- "fsdp": SCAPE(..., mesh=mesh) on the DTensor shards, FSDP2 doing the node's collectives;
- "manual": the identity's other side, plain tensors of the same slices whose gradients are the
  node means taken here (the node's rows gathered, summed in rank order, halved), SCAPE over the
  same rail group mesh["inter"] as a flat optimizer.

- "hier-rows", "hier-tensors": scape.torch.Hierarchical around SCAPE on the whole tensors, the
  node's reduce-scatter and all-gather its own, under either rail split; with --device cuda the
  tensors live on the GPU, which the W ranks share (gloo stages them through host memory), for
  test_torch_scape_device.py to hold to the same run on the CPU.

Rank r writes <out>/<case>.<mode>.rank<r>.npz: the rail's mask at every step, its final fp32
parameters, and the full model's final parameters in trace order."""
import argparse
import json
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import scape.torch as st
from torch_scape_worker import DENSE, core_lr, read_trace


class TraceModel(torch.nn.Module):
    """The trace's tensors as parameters; forward(g) = Σ sum(p · g[p]), whose gradient is g."""

    def __init__(self, names, tensors):
        super().__init__()
        self.keys = [name.replace(".", "__") for name in names]
        self.tensors = torch.nn.ParameterDict({k: torch.nn.Parameter(t) for k, t in zip(self.keys, tensors)})

    def forward(self, grads):
        return sum((self.tensors[k] * g).sum() for k, g in zip(self.keys, grads))


def groups_of(names, decay, params, weight_decay=0.1):
    """Runs of consecutive tensors sharing (dense, decayed), as torch_scape_worker's param_groups."""
    groups = []
    for name, dec, p in zip(names, decay, params):
        dense = any(d in name for d in DENSE)
        if not groups or groups[-1]["key"] != (dense, dec):
            groups.append({"key": (dense, dec), "params": []})
        groups[-1]["params"].append((name, p))
    out = []
    for g in groups:
        dense, dec = g["key"]
        entry = {"params": g["params"], "weight_decay": weight_decay if dec else 0.0}
        if dense:
            entry["sparsity"] = 0.0
        out.append(entry)
    return out


def row_slice(t, local, ranks_per_node):
    """Slice `local` of t on dim 0 as torch.chunk (and FSDP2) cut it: ceil(d0/G) rows a slice."""
    chunk = -(-t.shape[0] // ranks_per_node)
    return t[local * chunk:(local + 1) * chunk]


def node_mean(full_grad, node_group, ranks_per_node):
    """The node's mean of a gradient, its ranks' rows summed in rank order, then halved or
    divided by G (the core's mean_in_rank_order)."""
    rows = [torch.empty_like(full_grad) for _ in range(ranks_per_node)]
    dist.all_gather(rows, full_grad, group=node_group)
    total = rows[0].clone()
    for r in rows[1:]:
        total.add_(r)
    return total.div_(float(ranks_per_node))


def run_case(case, trace, mesh, node_group, ranks_per_node, mode, out_dir, device="cpu"):
    names, sizes, decay, init, grads = trace
    rank, local = dist.get_rank(), mesh.get_local_rank("intra")
    steps, lr = grads.shape[0], case["lr"]
    full = []
    offset = 0
    for size in sizes:
        full.append(torch.from_numpy(init[offset:offset + size].copy()))
        offset += size
    kind = case.get("type", "scape")
    if kind == "adams":
        method, options = st.AdamS, dict(lr=lr)
    elif kind == "diloco":
        method, options = st.DiLoCo, dict(lr=lr, inner_steps=case["inner_steps"], total_steps=steps)
    else:
        method = st.SCAPE
        options = dict(lr=lr, sparsity=case["sparsity"], mask_lag=case["mask_lag"], sharded=case.get("sharded", False))
    if mode == "fsdp":
        model = TraceModel(names, full)
        fully_shard(model, mesh=mesh["intra"])
        params = [model.tensors[k] for k in model.keys]
        opt = st.SCAPE(groups_of(names, decay, params), mesh=mesh, **options)
    elif mode == "manual":
        params = [torch.nn.Parameter(row_slice(t, local, ranks_per_node).clone()) for t in full]
        opt = st.SCAPE(groups_of(names, decay, params), group=mesh["inter"].get_group(), **options)
    else:  # Hierarchical around SCAPE on the whole (unsharded) tensors, rail_split "rows" or "tensors"
        params = [torch.nn.Parameter(t.clone().to(device)) for t in full]
        opt = st.Hierarchical(groups_of(names, decay, params), mesh, method, rail_split=mode.split("-")[1],
                              **options)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: core_lr(lr, k + 1, steps) / lr)
    masks = []
    for t in range(steps):
        row, offset = [], 0
        for size in sizes:
            row.append(torch.from_numpy(grads[t, rank, offset:offset + size].copy()))
            offset += size
        opt.zero_grad(set_to_none=True)
        if mode == "fsdp":
            model(row).backward()
        elif mode != "manual":
            for p, g in zip(params, row):
                p.grad = g.to(p.device).view_as(p)
        else:
            for p, g in zip(params, row):
                p.grad = row_slice(node_mean(g, node_group, ranks_per_node), local, ranks_per_node).clone()
        opt.step()
        sched.step()
        scape = opt.inner if mode.startswith("hier") else opt
        if kind == "scape":
            masks.append(np.packbits(scape.mask_bits().cpu().numpy(), bitorder="little"))
    opt.finish()
    if mode == "fsdp":
        whole = torch.cat([p.detach().full_tensor().reshape(-1) for p in params])
    elif mode == "manual":
        whole = torch.cat([gathered_rows(p.detach(), node_group, ranks_per_node) for p in params])
    else:
        whole = torch.cat([p.detach().reshape(-1) for p in params])
    np.savez(os.path.join(out_dir, f"{case['name']}.{mode}.rank{rank}.npz"), masks=np.array(masks),
             params=scape.flat_params().cpu().numpy(), model=whole.cpu().numpy(),
             last_metrics=json.dumps(opt.last_metrics))


def gathered_rows(slice_, node_group, ranks_per_node):
    """The node's slices of a tensor back to the whole tensor (uneven slices padded to gather)."""
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(ranks_per_node)]
    dist.all_gather(sizes, torch.tensor([slice_.numel()]), group=node_group)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest)
    padded[:slice_.numel()] = slice_.reshape(-1)
    parts = [torch.empty(longest) for _ in range(ranks_per_node)]
    dist.all_gather(parts, padded, group=node_group)
    return torch.cat([p[:int(s.item())] for p, s in zip(parts, sizes)])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ranks-per-node", type=int, required=True)
    parser.add_argument("--modes", default="fsdp,manual,hier-rows,hier-tensors",
                        help="comma-separated; fsdp and manual run for SCAPE's cases only")
    parser.add_argument("--device", default="cpu", help="the hier modes' device (cpu, cuda)")
    args = parser.parse_args()
    modes = args.modes.split(",")
    dist.init_process_group("gloo")
    g = args.ranks_per_node
    mesh = init_device_mesh("cpu", (dist.get_world_size() // g, g), mesh_dim_names=("inter", "intra"))
    node_group = mesh["intra"].get_group()
    trace = read_trace(args.trace)
    for case in json.loads(open(args.cases).read()):
        scape_modes = ("fsdp", "manual") if case.get("type", "scape") == "scape" else ()
        for mode in (*scape_modes, "hier-rows", "hier-tensors"):
            if mode in modes:
                run_case(case, trace, mesh, node_group, g, mode, args.out, args.device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
