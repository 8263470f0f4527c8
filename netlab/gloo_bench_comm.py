"""`scape bench-comm` for the torch runtime: times the collectives `scape.torch`'s optimizers
issue (scape.optim.comm.Group: the rank-order reduce-scatter, all-gather and all-reduce, and the
all-to-all under them) over a range of sizes, on the process group torchrun's (or
`scripts/netlab run`'s) variables describe, and writes the rows in bench-comm's format
("scape-bench-comm-1") for `scape predict --calibrate` (docs/NETLAB.md, docs/PREDICTING.md).

    PYTHONPATH=python:. scripts/netlab run -- python -m netlab.gloo_bench_comm --out gloo.h5

Each size: --warmup untimed calls, then --iters timed ones (--small-iters up to 1 MiB) after a
barrier; the time is the slowest rank's mean. With --idle-gap-ms G > 0 every size is timed again, each call alone after a
barrier and G ms of idle link, those rows marked "idle" in /regime (the others "busy"): a
collective that follows compute rather than another collective (docs/PREDICTING.md, "A link's
load"). Columns as `scape bench-comm`: the ledger's ring bytes sent per worker and
latency steps, algbw = size / time, busbw as nccl-tests. With --native-all-reduce only the
all-reduce is timed, and as torch.distributed's own `all_reduce` (gloo's ring: what DDP, its
PowerSGD hook and torchft call) instead of scape.torch's rank-order mean."""
import argparse
import os
import sys
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist

from scape.optim.comm import Group, _split

FORMAT = "scape-bench-comm-1"
# name: (ledger kind, the call on a float tensor of n elements)
COLLECTIVES = {
    "all_reduce": ("all_reduce", lambda g, x: g.all_reduce_mean(x, "bench")),
    "reduce_scatter": ("reduce_scatter", lambda g, x: g.reduce_scatter_mean(x, _split(x.numel(), g.size), "bench")),
    "all_gather": ("all_gather", lambda g, x: g.all_gather_uneven(x[: x.numel() // g.size],
                                                                  [x.numel() // g.size] * g.size, "bench")),
    "all_to_all": ("all_to_all", lambda g, x: g.all_to_all(x, _split(x.numel(), g.size),
                                                           _split(x.numel(), g.size), "bench")),
}


NATIVE_ALL_REDUCE = {"all_reduce": ("all_reduce", lambda g, x: dist.all_reduce(x))}


def leave_process_group():
    """Ends the process group and the process once every result is written, without running
    gloo's thread destructors, which sometimes abort at interpreter exit ("terminate called
    without an active exception", exit 134)."""
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def ring_bytes_sent_per_worker(kind, workers, payload):
    fraction = (workers - 1) / workers
    return 2 * fraction * payload if kind == "all_reduce" else fraction * payload


def ring_latency_steps(kind, workers):
    return 2 * (workers - 1) if kind == "all_reduce" else workers - 1


def bus_factor(kind, workers):
    return (2.0 if kind == "all_reduce" else 1.0) * (workers - 1) / workers


def time_calls(group, call, x, iters, warmup):
    for _ in range(warmup):
        call(group, x)
    dist.barrier()
    began = time.perf_counter()
    for _ in range(iters):
        call(group, x)
    mean = torch.tensor([(time.perf_counter() - began) / iters], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    return float(mean)


def time_idle_calls(group, call, x, iters, gap_s):
    """Seconds per call on the slowest rank, each call timed alone after `gap_s` of idle link."""
    total = 0.0
    for _ in range(iters):
        dist.barrier()
        time.sleep(gap_s)
        began = time.perf_counter()
        call(group, x)
        total += time.perf_counter() - began
    mean = torch.tensor([total / iters], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    return float(mean)


def sizes(min_bytes, max_bytes, factor):
    b = float(min_bytes)
    while b <= max_bytes * (1 + 1e-9):
        yield b
        b *= factor


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-comm-gloo.h5", help="HDF5 file of the rows (rank 0; default %(default)s)")
    parser.add_argument("--min-bytes", type=int, default=16384, help="payload of the smallest size (default %(default)s)")
    parser.add_argument("--max-bytes", type=int, default=16 << 20, help="payload of the largest size (default %(default)s)")
    parser.add_argument("--factor", type=float, default=4, help="ratio between sizes (default %(default)s)")
    parser.add_argument("--iters", type=int, default=3, help="timed calls per size (default %(default)s)")
    parser.add_argument("--small-iters", type=int, default=12,
                        help="timed calls per size up to 1 MiB, where a call costs little and gloo's times scatter "
                             "most (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per size (default %(default)s)")
    parser.add_argument("--idle-gap-ms", type=float, default=0,
                        help="> 0: time every size again, each call after this many ms of idle link (rows marked "
                             "idle; default %(default)s: back-to-back calls only)")
    parser.add_argument("--native-all-reduce", action="store_true",
                        help="time only the all-reduce, as torch.distributed.all_reduce (see above)")
    args = parser.parse_args()
    if args.min_bytes < 8 or args.max_bytes < args.min_bytes:
        parser.error("--min-bytes must be >= 8 and <= --max-bytes")
    if args.factor <= 1 or args.iters < 1 or args.small_iters < 1 or args.warmup < 0 or not args.idle_gap_ms >= 0:
        parser.error("--factor must be > 1, --iters and --small-iters >= 1, --warmup >= 0 and --idle-gap-ms >= 0")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    group = Group()
    w = group.size
    rows = []
    if group.rank == 0:
        print(f"# gloo bench-comm, {w} ranks, {args.iters} iterations ({args.small_iters} up to 1 MiB; "
              f"{args.warmup} warm-up) per size; "
              "time of the slowest rank")
    regimes = ["busy"] + (["idle"] if args.idle_gap_ms > 0 else [])
    for regime in regimes:
        if regime == "idle" and group.rank == 0:
            print(f"# each call after {args.idle_gap_ms:g} ms of idle link", flush=True)
        for name, (kind, call) in (NATIVE_ALL_REDUCE if args.native_all_reduce else COLLECTIVES).items():
            for size in sizes(args.min_bytes, args.max_bytes, args.factor):
                n = max(w, int(size) // 4 // w * w)  # a multiple of W floats: equal shares
                payload = 4.0 * n
                x = torch.ones(n)
                iters = args.small_iters if payload <= 1 << 20 else args.iters
                t = (time_idle_calls(group, call, x, iters, args.idle_gap_ms / 1e3) if regime == "idle"
                     else time_calls(group, call, x, iters, args.warmup))
                algbw = payload / t / 1e9
                rows.append((name, kind, w, payload, ring_latency_steps(kind, w),
                             ring_bytes_sent_per_worker(kind, w, payload), t, algbw, algbw * bus_factor(kind, w), regime))
                if group.rank == 0:
                    print(f" {name:>17} {payload:14.0f} {t * 1e6:12.2f} us {algbw:10.4f} GB/s {rows[-1][-2]:10.4f} GB/s "
                          f"bus {regime}", flush=True)
    if group.rank == 0:
        with h5py.File(args.out, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["backend"] = "gloo"
            f.attrs["collectives"] = "torch.distributed" if args.native_all_reduce else "scape.torch"
            f.create_dataset("collective", data=[r[0] for r in rows], dtype=h5py.string_dtype())
            f.create_dataset("kind", data=[r[1] for r in rows], dtype=h5py.string_dtype())
            f.create_dataset("regime", data=[r[9] for r in rows], dtype=h5py.string_dtype())
            for i, column in enumerate(["workers", "payload_bytes", "latency_steps", "bytes_sent_per_worker", "time_s",
                                        "algbw_GBps", "busbw_GBps"], start=2):
                f.create_dataset(column, data=np.array([r[i] for r in rows], dtype=np.float64))
        print(f"gloo bench-comm: {len(rows)} rows -> {args.out}")
    leave_process_group()


if __name__ == "__main__":
    main()
