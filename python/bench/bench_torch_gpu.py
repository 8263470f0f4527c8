#!/usr/bin/env python3
"""On one CUDA device: the step time of scape.torch.SCAPE (sparsity 0.9 and 0.99) and of
scape.torch.AdamS against torch.optim.AdamW(fused=True), the fastest Adam torch ships, at 100M and
500M parameters (24 tensors each, fp32), and the device's own yardstick measured in the same
run: one fused pass over 12 bytes a parameter (torch.add of two tensors into a third).

    PYTHONPATH=python python3 python/bench/bench_torch_gpu.py [--sizes 100000000,500000000]
"""
import argparse

import torch

TENSORS = 24


def timed(fn, repeats=10):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def measure(n):
    import scape.torch as st
    size = n // TENSORS
    gen = torch.Generator(device="cuda").manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(size, device="cuda", generator=gen) * 0.02) for _ in range(TENSORS)]
    for p in params:
        p.grad = torch.randn(size, device="cuda", generator=gen) * 1e-3
    out = {}
    fused = torch.optim.AdamW(params, lr=1e-3, fused=True)
    out["AdamW(fused=True)"] = timed(fused.step)
    del fused
    for label, make in (("scape.torch.AdamS", lambda: st.AdamS(params, lr=1e-3)),
                        ("scape.torch.SCAPE 90%", lambda: st.SCAPE(params, lr=1e-3, sparsity=0.9)),
                        ("scape.torch.SCAPE 99%", lambda: st.SCAPE(params, lr=1e-3, sparsity=0.99))):
        opt = make()
        opt.step()  # step 1 chooses its own mask
        out[label] = timed(opt.step)
        del opt
        torch.cuda.empty_cache()
    a = torch.randn(size * TENSORS, device="cuda")
    b = torch.randn_like(a)
    c = torch.empty_like(a)
    out["yardstick"] = timed(lambda: torch.add(a, b, out=c))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000000,500000000", help="parameter counts (default %(default)s)")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for n in (int(s) for s in args.sizes.split(",")):
        r = measure(n)
        print(f"N = {n}: yardstick (one pass over 12 B a parameter) {r['yardstick'] * 1e3:.2f} ms")
        print(f"   {'step':24} {'ms':>9} {'× yardstick':>12} {'× AdamW fused':>14}")
        for label in ("AdamW(fused=True)", "scape.torch.AdamS", "scape.torch.SCAPE 90%", "scape.torch.SCAPE 99%"):
            print(f"   {label:24} {r[label] * 1e3:9.2f} {r[label] / r['yardstick']:12.2f} "
                  f"{r[label] / r['AdamW(fused=True)']:14.2f}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
