#!/usr/bin/env python3
"""Speed of the torch-native scape.torch.SCAPE step, all in one run and as ratios:

1. one rank, N parameters in 16 tensors: SCAPE.step against the C++ core's SCAPE step on the same
   gradients (scape.Simulator, W = 1, timed inside C++), against torch.optim.AdamW(foreach=True),
   and each against the machine's own yardstick measured here: one fused pass over the state
   (torch.add of two N-float tensors into a third, 12 bytes a parameter);
2. two gloo ranks (spawned here), a model's real backward pass with a sleep in each layer's
   backward standing in for a GPU's time (the CPU free meanwhile): the exposed seconds of the
   mask all-gather under mask lag 0 (inside the step) against lag 1 (behind the next forward and
   backward pass), and of the payload's collective with overlap_backward off and on. Over
   loopback both are small; a link of chosen bandwidth is scripts/netlab's (issue of the netlab);
3. (--layouts) one rank, real model layouts with norms and biases in the dense group (named so
   that SCAPE's default dense_tensors catches them): SCAPE 99% and 90% (and with
   parameters_as_views, the parameters views of its flat buffer, and the copies in and out of
   the flat buffer alone that it saves) against
   torch.optim.AdamW(fused=True) and (foreach=True) on the same parameters, medians of the step,
   and the aten ops one step dispatches and runs, counted with torch.profiler; --device cuda
   adds the kernels a step launches (scripts/device-check.sh torch runs it on the GPU machine).

    PYTHONPATH=build/release/python ~/.cache/scape/venv/bin/python python/bench/bench_torch_scape.py
    ... bench_torch_scape.py --layouts [gpt2-1/4 llama16-1/4 gpt2-small llama16-full] [--threads 1] [--compile]
"""
import argparse
import os
import socket
import statistics
import tempfile
import time

import torch

TENSORS = 16
REPEATS = 5


def best_of(fn, repeats=REPEATS, inner=3):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def one_rank(n, sparsity):
    import scape
    import scape.torch as st
    size = n // TENSORS
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(size, generator=gen) * 0.02) for _ in range(TENSORS)]
    grads = [torch.randn(size, generator=gen) * 1e-3 for _ in range(TENSORS)]
    opt = st.SCAPE(params, lr=1e-3, sparsity=sparsity)
    for p, g in zip(params, grads):
        p.grad = g
    opt.step()  # step 1 selects its own mask; the timed steps receive theirs
    torch_scape = best_of(opt.step)
    adamw = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    adamw.step()
    torch_adamw = best_of(adamw.step)
    layout = [(f"w{i}", (size,), True) for i in range(TENSORS)]
    flat = torch.cat(grads).numpy()[None, :].copy()
    with tempfile.TemporaryDirectory() as folder:
        with scape.Simulator(layout, 1, {"type": "scape", "sparsity": sparsity, "lr": 1e-3, "sharded": False},
                             log=os.path.join(folder, "core.h5"), steps=10_000,
                             log_options={"oracle": False, "gradient_metrics_interval": 1000000}) as sim:
            sim.step(flat)
            core = min(sim._sim.step_repeated(flat, 3) / 3 for _ in range(REPEATS))
    a, b = torch.randn(size * TENSORS), torch.randn(size * TENSORS)
    out = torch.empty_like(a)
    stream = best_of(lambda: torch.add(a, b, out=out))
    return {"torch_scape": torch_scape, "core": core, "adamw": torch_adamw, "stream": stream,
            "threads": torch.get_num_threads()}


def gpt2_layout(n_layer=12, d=192, vocab=50257, block=1024):
    """GPT-2 (tied head): at d = 192 (1/4 width) 148 tensors, 15.2M parameters; d = 768 is GPT-2 small."""
    shapes = [("wte.weight", (vocab, d)), ("wpe.weight", (block, d))]
    for i in range(n_layer):
        for name, shape in (("norm_1.weight", (d,)), ("norm_1.bias", (d,)), ("attn.c_attn.weight", (d, 3 * d)),
                            ("attn.c_attn.bias", (3 * d,)), ("attn.c_proj.weight", (d, d)),
                            ("attn.c_proj.bias", (d,)), ("norm_2.weight", (d,)), ("norm_2.bias", (d,)),
                            ("mlp.c_fc.weight", (d, 4 * d)), ("mlp.c_fc.bias", (4 * d,)),
                            ("mlp.c_proj.weight", (4 * d, d)), ("mlp.c_proj.bias", (d,))):
            shapes.append((f"h.{i}.{name}", shape))
    return shapes + [("norm_f.weight", (d,)), ("norm_f.bias", (d,))]


def llama_layout(n_layer=16, d=256, kv=64, ffn=683, vocab=32000):
    """Llama (untied head, grouped KV, SwiGLU of 8d/3): at d = 256 147 tensors, 27.4M parameters."""
    shapes = [("embed.weight", (vocab, d))]
    for i in range(n_layer):
        for name, shape in (("attn_norm.weight", (d,)), ("q.weight", (d, d)), ("k.weight", (kv, d)),
                            ("v.weight", (kv, d)), ("o.weight", (d, d)), ("mlp_norm.weight", (d,)),
                            ("gate.weight", (ffn, d)), ("up.weight", (ffn, d)), ("down.weight", (d, ffn))):
            shapes.append((f"layers.{i}.{name}", shape))
    return shapes + [("norm.weight", (d,)), ("lm_head.weight", (vocab, d))]


LAYOUTS = {"gpt2-1/4": lambda: gpt2_layout(), "llama16-1/4": lambda: llama_layout(),
           "gpt2-small": lambda: gpt2_layout(d=768), "llama16-full": lambda: llama_layout(d=1024, kv=256, ffn=2731)}


def ops_per_step(step, device):
    """aten ops one call of step dispatches from Python (top level) and runs in all (nested ones
    included), counted with torch.profiler on the CPU; on CUDA also the kernels it launches."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    events = prof.events()
    aten = [e for e in events if e.name.startswith("aten::")]
    top = [e for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA) if device.type == "cuda" else 0
    return len(top), len(aten), kernels


def median_ms(step, repeats, device):
    """Median wall ms of a step, its spread (max - min), and the median process CPU ms (on a shared
    machine the CPU time is the steadier figure: waiting for a core is not counted)."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall) * 1e3, (max(wall) - min(wall)) * 1e3, statistics.median(cpu) * 1e3


def layout_rank(shapes, repeats, device, compiled=False):
    """SCAPE 99% and 90% and AdamW fused and foreach on the same named parameters and gradients."""
    import scape.torch as st
    gen = torch.Generator(device=device).manual_seed(0)
    named = [(name, torch.nn.Parameter(torch.randn(shape, generator=gen, device=device) * 0.02))
             for name, shape in shapes]
    for _, p in named:
        p.grad = torch.randn(p.shape, generator=gen, device=device) * 1e-3
    params = [p for _, p in named]
    makers = {"SCAPE 99%": lambda: st.SCAPE(named, lr=1e-3, sparsity=0.99),
              "SCAPE 90%": lambda: st.SCAPE(named, lr=1e-3, sparsity=0.9),
              # the parameters as views of the flat buffer: no copies in and out (mirror.py)
              "SCAPE 99% view": lambda: st.SCAPE(named, lr=1e-3, sparsity=0.99, parameters_as_views=True),
              "SCAPE 90% view": lambda: st.SCAPE(named, lr=1e-3, sparsity=0.9, parameters_as_views=True),
              "AdamW fused": lambda: torch.optim.AdamW(params, lr=1e-3, fused=True),
              "AdamW foreach": lambda: torch.optim.AdamW(params, lr=1e-3, foreach=True)}
    if compiled:  # the candidate fused by torch.compile (its first step compiles it, untimed)
        makers["SCAPE 99% comp"] = lambda: st.SCAPE(named, lr=1e-3, sparsity=0.99, compile=True)
        makers["SCAPE 90% comp"] = lambda: st.SCAPE(named, lr=1e-3, sparsity=0.9, compile=True)
    out = {}
    for label, make in makers.items():
        opt = make()
        opt.step()  # SCAPE's step 1 selects its own mask; the timed steps receive theirs (lag 1)
        opt.step()
        out[label] = (*median_ms(opt.step, repeats, device), *ops_per_step(opt.step, device))
        del opt
    # what parameters_as_views saves: the parameters copied into the flat buffer and out of it
    from scape.optim.mirror import ParamMirror
    for label, bind in (("copies in+out", False), ("  as views", True)):
        mirror = ParamMirror([p.detach().clone().requires_grad_() for p in params], device, bind=bind)
        copies = lambda: (mirror.pull(), mirror.push())  # noqa: E731
        out[label] = (*median_ms(copies, repeats, device), *ops_per_step(copies, device))
    return len(params), sum(p.numel() for p in params), out


def layouts(names, repeats, device, compiled=False):
    print(f"3. one rank, real layouts (norms and biases dense), {device}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; median wall ms of {repeats} steps (max - min), median CPU ms, "
          f"aten ops per step (top level / all), CUDA kernels per step")
    print(f"   {'layout':14} {'tensors':>7} {'params':>8} {'optimizer':14} {'ms':>8} {'spread':>7} {'cpu ms':>8} "
          f"{'× fused':>8} {'cpu×fused':>9} {'ops':>11} {'kernels':>7}")
    for name in names:
        tensors, n, r = layout_rank(LAYOUTS[name](), repeats, device, compiled)
        fused, fused_cpu = r["AdamW fused"][0], r["AdamW fused"][2]
        for label, (ms, spread, cpu, top, ops, kernels) in r.items():
            print(f"   {name:14} {tensors:7d} {n / 1e6:7.1f}M {label:14} {ms:8.1f} {spread:7.1f} {cpu:8.1f} "
                  f"{ms / fused:8.1f} {cpu / fused_cpu:9.1f} {f'{top}/{ops}':>11} {kernels:7d}", flush=True)


def rank_main(rank, world, port, n, sparsity, compute_ms, results):
    import torch.distributed as dist
    import scape.torch as st
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    width = int((n / 8) ** 0.5)
    out = {}
    for label, options in (("lag0", {"mask_lag": 0}), ("lag1", {"mask_lag": 1}),
                           ("lag1+overlap", {"mask_lag": 1, "overlap_backward": True, "bucket_bytes": 200_000})):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)])
        for layer in model:  # a GPU's backward time, layer by layer, during which the CPU is free
            layer.register_full_backward_hook(lambda *unused: time.sleep(compute_ms / 8e3))
        opt = st.SCAPE(model.parameters(), lr=1e-3, sparsity=sparsity, **options)
        x = torch.randn(16, width)
        mask_wait, grad_wait, steps = [], [], []
        for t in range(12):
            began = time.perf_counter()
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            if t >= 2:
                m = opt.last_metrics
                # the lagged mask waited for, or the mask gathered inside the step (lag 0)
                mask_wait.append(m["mask_wait_exposed"] + m.get("comm_time_measured_mask_all_gather", 0.0))
                # the payload's buckets waited for (overlap_backward), or its blocking collective
                grad_wait.append(m["grad_wait_exposed"] + sum(v for k, v in m.items() if k in (
                    "comm_time_measured_grad_all_reduce", "comm_time_measured_grad_reduce_scatter")))
                steps.append(time.perf_counter() - began)
        out[label] = (statistics.median(mask_wait), statistics.median(grad_wait), statistics.median(steps),
                      m["bytes_sent_mask_all_gather"] if "bytes_sent_mask_all_gather" in m else 0)
    if rank == 0:
        results.update(out)
        results["params"] = sum(p.numel() for p in model.parameters())
    dist.destroy_process_group()


def two_ranks(n, sparsity, compute_ms):
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(rank_main, args=(2, port, n, sparsity, compute_ms, results), nprocs=2, join=True)
    return dict(results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16 * 2 ** 20, help="parameters of part 1 (default %(default)s)")
    parser.add_argument("--sparsity", type=float, default=0.99, help="SCAPE's sparsity (default %(default)s)")
    parser.add_argument("--gloo-n", type=int, default=2 * 2 ** 20, help="parameters of part 2 (default %(default)s)")
    parser.add_argument("--compute-ms", type=float, default=20.0,
                        help="part 2: sleep spread over the layers' backward, standing in for a GPU's "
                             "(default %(default)s)")
    parser.add_argument("--compile", action="store_true",
                        help="part 3: also SCAPE(compile=True), the candidate fused by torch.compile")
    parser.add_argument("--layouts", nargs="*", choices=sorted(LAYOUTS),
                        help="run part 3 only, on these layouts (none named: the two at 1/4 width)")
    parser.add_argument("--repeats", type=int, default=7, help="part 3: timed steps (default %(default)s)")
    parser.add_argument("--device", default="cpu", help="part 3: the device (default %(default)s)")
    parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.layouts is not None:
        layouts(args.layouts or ["gpt2-1/4", "llama16-1/4"], args.repeats, torch.device(args.device), args.compile)
        return
    r = one_rank(args.n, args.sparsity)
    print(f"1. one rank, N = {args.n} in {TENSORS} tensors, sparsity {args.sparsity}, {r['threads']} threads; "
          f"yardstick: one pass over 12 B a parameter = {r['stream'] * 1e3:.2f} ms")
    print(f"   {'step':34} {'ms':>8} {'× yardstick':>12}")
    for label, key in (("scape.torch.SCAPE", "torch_scape"), ("C++ core SCAPE (Simulator, W = 1)", "core"),
                       ("torch.optim.AdamW(foreach=True)", "adamw")):
        print(f"   {label:34} {r[key] * 1e3:8.2f} {r[key] / r['stream']:12.2f}")
    print(f"   SCAPE.step / core step = {r['torch_scape'] / r['core']:.2f} (target <= 2); "
          f"SCAPE.step / AdamW(foreach) = {r['torch_scape'] / r['adamw']:.2f}")
    g = two_ranks(args.gloo_n, args.sparsity, args.compute_ms)
    print(f"2. two gloo ranks, an 8-layer MLP of {g['params']} parameters, sparsity {args.sparsity}, "
          f"{args.compute_ms:g} ms of sleep spread over each backward pass; medians over 10 steps of the time exposed in step()")
    print(f"   {'setting':14} {'mask wait ms':>13} {'payload wait ms':>16} {'iteration ms':>13}")
    for label in ("lag0", "lag1", "lag1+overlap"):
        mask_wait, grad_wait, step, _ = g[label]
        print(f"   {label:14} {mask_wait * 1e3:13.3f} {grad_wait * 1e3:16.3f} {step * 1e3:13.2f}")


if __name__ == "__main__":
    main()
