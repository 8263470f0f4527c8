"""One rank of `scripts/netlab hierarchy`'s torch arms (docs/NETLAB.md, "Nodes of several
ranks"), started by `netlab run` G times a node: the torch side of the MPI runs beside it.

The model is the MPI runs' noisy quadratic reduced to what the step sees: one tensor of --params
parameters (rows of 1000, named "weight", so that SCAPE sends it sparse and both rail splits cut
it into the halves the core's one tensor is cut into) and, each step, a gradient of this rank's own (drawn once at start-up from a
seed of the rank, scaled by the step, so that making it costs no time inside the step). A GPU's
forward and backward is stood in for by sleeping out --compute-s less what setting the gradient
took, as the core's `compute.type = "sleep"` does. Arms:

  adams  flat  scape.torch.AdamS over the world group;
  adams  node  scape.torch.Hierarchical around AdamS (rail_split "rows");
  scape  flat  scape.torch.SCAPE at --sparsity over the world group;
  scape  node  scape.torch.Hierarchical around SCAPE (rail_split "rows").

A step is timed on every rank from a barrier to the end of step(); rank 0 writes --out (JSON):
its step times, the median over the steps past the first two, and the bytes it sent a step
(last_metrics: bytes_sent, and under the hierarchy bytes_sent_intra and bytes_sent_inter).

With --run-file, rank 0 also writes a run file (scape.run_file) that `scape predict --calibrate`
reads as it reads the MPI runtime's: the config is the MPI arm's (the quadratic of --params, the
slept compute, the topology) with this optimizer's own section (`opt.config()`: unsharded, the
mask as a bitmap), and each step's compute_wall_time (the gradient and the sleep),
optimizer_wall_time (step()), mask_wait_exposed and comm_time_measured_<purpose> (the wall time
of each blocking collective, last_metrics). The lagged mask all-gather runs behind the sleep
untimed: its column, comm_time_measured_async_all_gather, is NaN (only compared, never fitted)."""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import scape.torch as st
from scape.run_file import RunFileWriter

SKIP = 2  # start-up and SCAPE's first lagged mask, as the MPI rows skip them
GRADIENTS = 4  # distinct gradients a rank cycles through
ROW = 1000


def make_optimizer(param, method, hierarchy, sparsity, lr, mesh):
    options = {"lr": lr} if method == "adams" else {"lr": lr, "sparsity": sparsity}
    kind = st.AdamS if method == "adams" else st.SCAPE
    named = [("weight", param)]
    if hierarchy == "node":
        return st.Hierarchical(named, mesh, kind, rail_split="rows", **options)
    return kind(named, **options)


def run_config(optimizer, args, world, per_node):
    """The MPI arm's run config (netlab/hierarchy.py, mpi_config) with this optimizer's section."""
    config = {"name": f"torch-{args.method}-{args.hierarchy}", "seed": 1, "workers": world, "steps": args.steps,
              "model": {"type": "quadratic", "size": args.params}, "optimizer": optimizer.config(),
              "compute": {"type": "sleep", "seconds": args.compute_s}}
    if per_node > 1:
        config["topology"] = {"ranks_per_node": per_node}
    return config


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=("adams", "scape"), required=True)
    parser.add_argument("--hierarchy", choices=("flat", "node"), required=True)
    parser.add_argument("--sparsity", type=float, default=0.99)
    parser.add_argument("--params", type=int, required=True, help="parameters of the one tensor")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--compute-s", type=float, required=True, help="the slept forward and backward")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--ranks-per-node", type=int, default=0,
                        help="G (default: LOCAL_WORLD_SIZE, which netlab run sets)")
    parser.add_argument("--out", required=True, help="rank 0's JSON")
    parser.add_argument("--run-file", help="rank 0's run file for scape predict --calibrate (see above)")
    args = parser.parse_args()
    if args.params % ROW or args.params <= 0:
        parser.error(f"--params: a positive multiple of {ROW}, got {args.params}")
    if args.steps <= SKIP:
        parser.error(f"--steps: more than {SKIP}, the steps left out of the median")

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = args.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if per_node < 1 or world % per_node:
        raise SystemExit(f"--ranks-per-node: {per_node} does not divide the world size {world}")
    mesh = init_device_mesh("cpu", (world // per_node, per_node), mesh_dim_names=("inter", "intra"))
    torch.manual_seed(1)
    shape = (args.params // ROW, ROW)
    param = torch.nn.Parameter(torch.randn(shape) * 0.02)
    generator = torch.Generator().manual_seed(1000 + rank)
    gradients = [torch.randn(shape, generator=generator) for _ in range(GRADIENTS)]
    optimizer = make_optimizer(param, args.method, args.hierarchy, args.sparsity, args.lr, mesh)

    log = None
    if args.run_file:
        config = run_config(optimizer, args, world, per_node)
        log = RunFileWriter(args.run_file, config=config, tensors=[("weight", args.params)], rank=rank,
                            world_size=world, flush_interval=args.steps, overwrite=True)
    times, sent = [], []
    for step in range(args.steps):
        dist.barrier()
        start = time.perf_counter()
        param.grad = gradients[step % GRADIENTS] * (1.0 + 1e-3 * step)
        time.sleep(max(0.0, args.compute_s - (time.perf_counter() - start)))
        computed = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        times.append(end - start)
        sent.append(dict(optimizer.last_metrics))
        if log is not None:
            row = {k: v for k, v in sent[-1].items() if k != "step"}
            log.write_step(step + 1, dict(row, step_wall_time=end - start, compute_wall_time=computed - start,
                                          optimizer_wall_time=end - computed,
                                          comm_time_measured_async_all_gather=float("nan")))
    getattr(optimizer, "finish", lambda: None)()
    if log is not None:
        log.close("completed")
    if rank == 0:
        kept = sent[SKIP:]

        def median_of(key):
            values = [m[key] for m in kept if key in m]
            return float(statistics.median(values)) if values else None

        steady = times[SKIP:]
        record = {"method": args.method, "hierarchy": args.hierarchy, "sparsity": args.sparsity,
                  "nodes": world // per_node, "ranks_per_node": per_node, "params": args.params,
                  "steps": args.steps, "compute_s": args.compute_s,
                  "step_ms": [1e3 * t for t in times],
                  "measured_step_ms": 1e3 * statistics.median(steady),
                  "min_step_ms": 1e3 * min(steady), "max_step_ms": 1e3 * max(steady),
                  "bytes_sent": median_of("bytes_sent"),
                  "bytes_sent_inter": median_of("bytes_sent_inter"),
                  "bytes_sent_intra": median_of("bytes_sent_intra"),
                  "torch": torch.__version__}
        if record["bytes_sent_inter"] is None:  # a flat arm: one group, every byte on the link between nodes
            record["bytes_sent_inter"], record["bytes_sent_intra"] = record["bytes_sent"], 0.0
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
