"""One node of `scripts/netlab bench` (the torch runtime; the venv's python, `-m netlab.torch_bench`
with python/ and the repository root on PYTHONPATH, as the driver sets them): trains the example's GPT (examples/tiny_gpt.py) for a few
steps under each method, over the process group the netlab's variables describe, and rank 0
appends one row a method to a CSV: the median measured step (zero_grad to the end of step(),
after warm-up), the seconds step() spent in communication it could not hide (SCAPE's mask and
payload waits, analysis.breakdown.exposed_comm of its `last_metrics`; the others time no
collective of their own: dense AdamS's whole step(), DDP's whole backward, whose all-reduce runs
inside it), and the bytes this rank sent a step.

Methods: dense AdamS (scape.torch.AdamS), DDP with torch's AdamW, DDP with torch's PowerSGD
comm hook (rank chosen so its bytes match SCAPE 99%'s), SCAPE 90% and 99% (mask lag 1), SCAPE
99% with lag 0, SCAPE 99% with overlap_backward."""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import scape.torch as st
from analysis.breakdown import exposed_comm
from netlab import steps_csv
from netlab.gloo_bench_comm import leave_process_group
from netlab.torch_predict import TORCH_MODEL, TORCH_SEQUENCES  # the model torch_predict describes

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "examples"))
from tiny_gpt import CorpusBatches, TinyGPT, cross_entropy, markov_corpus  # noqa: E402


def model_and_groups(width, layers=TORCH_MODEL["n_layer"]):
    model = TinyGPT(vocab=TORCH_MODEL["vocab_size"], block=TORCH_MODEL["context"], n_embd=width,
                    n_head=TORCH_MODEL["n_head"], n_layer=layers, seed=1)
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for n, p in named if p.dim() < 2], "weight_decay": 0.0, "sparsity": 0.0}]
    return model, groups


def measure(method, width, layers, steps, warmup, batches, rank, world):
    model, groups = model_and_groups(width, layers)
    net, sent = model, None
    if method.startswith("ddp"):
        net = torch.nn.parallel.DistributedDataParallel(model)
        if method == "ddp-powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
            state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                           start_powerSGD_iter=2, min_compression_rate=2)
            net.register_comm_hook(state, powersgd.powerSGD_hook)
        for g in groups:
            g.pop("sparsity", None)
        opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95))
    elif method == "adams":
        for g in groups:
            g.pop("sparsity", None)
        opt = st.AdamS(groups, lr=1e-3)
    else:
        sparsity = 0.9 if method.startswith("scape-90") else 0.99
        opt = st.SCAPE(groups, lr=3e-3, sparsity=sparsity, mask_lag=0 if "lag0" in method else 1,
                       overlap_backward="overlap" in method)
    times, exposed, bytes_sent = [], [], []
    for t in range(1, warmup + steps + 1):
        x, y = batches(t)
        dist.barrier()
        began = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        cross_entropy(net(x[rank]), y[rank]).backward()
        backward_done = time.perf_counter()
        opt.step()
        end = time.perf_counter()
        if t > warmup:
            times.append(end - began)
            if hasattr(opt, "last_metrics") and "mask_wait_exposed" in opt.last_metrics:
                m = opt.last_metrics
                exposed.append(float(exposed_comm(m)))
                bytes_sent.append(m["bytes_sent"])
            elif method == "adams":
                exposed.append(end - backward_done)
                bytes_sent.append(opt.last_metrics["bytes_sent"])
            else:  # DDP: its all-reduce runs inside backward; counted below from the no-DDP backward
                exposed.append(backward_done - began)
    if hasattr(opt, "finish"):
        opt.finish()
    if method.startswith("ddp"):
        ring = 2 * (world - 1) / world * 4
        if method == "ddp":
            sent = ring * sum(p.numel() for p in model.parameters())
        else:  # rank-1 P and Q of each matrix worth compressing (rate >= 2), the rest whole
            sent = ring * sum((p.shape[0] + p.numel() // p.shape[0])
                              if p.dim() >= 2 and p.numel() >= 2 * (p.shape[0] + p.numel() // p.shape[0])
                              else p.numel() for p in model.parameters())
    else:
        sent = statistics.median(bytes_sent)
    return statistics.median(times), statistics.median(exposed), sent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="CSV to append to (rank 0)")
    parser.add_argument("--rate-mbit", type=float, required=True, help="the link rate, for the CSV")
    parser.add_argument("--width", type=int, default=TORCH_MODEL["n_embd"],
                        help="the GPT's width (torch_predict describes the default one)")
    parser.add_argument("--layers", type=int, default=TORCH_MODEL["n_layer"],
                        help="the GPT's layers (default %(default)s; 4 at width 256 is the MPI rows' 3.3M-parameter "
                             "GPT, experiments/configs/calibrate)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--methods", default="adams,ddp,ddp-powersgd,scape-90,scape-99,scape-99-lag0,scape-99-overlap")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = CorpusBatches(markov_corpus(vocab=TORCH_MODEL["vocab_size"], tokens=50_000), world, TORCH_SEQUENCES,
                            TORCH_MODEL["context"], seed=1)
    rows = []
    for method in args.methods.split(","):
        step, exposed, sent = measure(method, args.width, args.layers, args.steps, args.warmup, batches, rank, world)
        rows.append({"runtime": "torch", "method": method, "workers": world, "rate_mbit": args.rate_mbit,
                     "measured_step_ms": f"{step * 1e3:.2f}", "predicted_step_ms": "",
                     "exposed_comm_ms": f"{exposed * 1e3:.2f}", "bytes_per_step": f"{sent:.0f}"})
        if rank == 0:
            print(f"{method:18} step {step * 1e3:8.2f} ms, exposed {exposed * 1e3:8.2f} ms, {sent:10.0f} B", flush=True)
    if rank == 0:
        steps_csv.append(args.out, rows)
    leave_process_group()


if __name__ == "__main__":
    main()
