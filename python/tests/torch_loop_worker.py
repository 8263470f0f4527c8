"""One torchrun rank of test_torch_scape.py: a small GPT trained with scape.torch.SCAPE in
ordinary training loops, comparing ways of running one step that must give the same bits.
`--mode checks` writes <out>/rank<r>.json with what each comparison found; `--mode raise`
raises on rank 1 at step 3 (the others must not hang)."""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import scape.torch as st  # noqa: E402
from tiny_gpt import CorpusBatches, TinyGPT, cross_entropy, markov_corpus  # noqa: E402

STEPS = 8
DEVICE = torch.device("cpu")


def make(seed=1, **options):
    model = TinyGPT(vocab=32, block=16, n_embd=32, n_head=4, n_layer=2, seed=seed).to(DEVICE)
    opt = st.SCAPE(model.named_parameters(), lr=3e-3, sparsity=0.9, dense_tensors=("ln_", "bias"), **options)
    return model, opt


def train(model, opt, batches, rank, steps, first=1, sched=None, scaler=None, poison=None, ddp=None):
    net = ddp if ddp is not None else model
    for t in range(first, first + steps):
        x, y = batches(t)
        opt.zero_grad(set_to_none=True)
        loss = cross_entropy(net(x[rank].to(DEVICE)), y[rank].to(DEVICE))
        if scaler is not None:
            scaler.scale(loss).backward()
            if poison is not None and poison(t):
                next(model.parameters()).grad.view(-1)[0] = float("inf")
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if sched is not None:
            sched.step()
    opt.finish()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def bytes_closed_form(opt, rank, world) -> list:
    """(counted, expected) bytes of the last step by purpose, the expected ones by hand: the mask
    all-gather sends this owner's segment to W-1 ranks; the flags (non-finite, and one per tensor)
    ride with every segment; replicated, the payload's K values are cut into near-equal segments
    sent to their owners, whose means then go to the W-1 others; sharded, each shard's values go
    to its owner, and the owners' updated parameters to the W-1 others."""
    m = opt.last_metrics
    k, flags = m["mask_size"], 1 + len(opt._tensors)
    first, end = opt.layout.mask_bytes(rank)
    want = {"mask_all_gather": (world - 1) * (end - first)}
    if opt.sharded:
        counts = opt._owner_k(opt._mask_rho)
        want["grad_reduce_scatter"] = 4 * ((k + world * flags) - (counts[rank] + flags))
        want["param_all_gather"] = 4 * (world - 1) * counts[rank]
    else:
        counts = [k // world + (1 if r < k % world else 0) for r in range(world)]
        want["grad_all_reduce"] = 4 * ((k + world * flags) - (counts[rank] + flags) + (world - 1) * counts[rank])
    got = {purpose: m.get(f"bytes_sent_{purpose}") for purpose in want}
    return [got, want, m["bytes_sent"] == sum(want.values())]


def same(a, b) -> bool:
    return bool(torch.equal(a, b))


def checks(rank, world, out):
    batches = CorpusBatches(markov_corpus(vocab=32, tokens=20_000), world, 2, 16, seed=3)
    found = {}
    for sharded in (False, True):
        model, opt = make(sharded=sharded)
        plain = train(model, opt, batches, rank, STEPS)
        found[f"bytes_match_closed_form_sharded{int(sharded)}"] = bytes_closed_form(opt, rank, world)
        model, opt = make(sharded=sharded, overlap_backward=True, bucket_bytes=2000)
        overlapped = train(model, opt, batches, rank, STEPS)
        found[f"buckets_sharded{int(sharded)}"] = len(opt.overlap.buckets)
        found[f"buckets_in_backward_sharded{int(sharded)}"] = opt.overlap.buckets_in_backward
        found[f"overlap_equals_plain_sharded{int(sharded)}"] = same(plain, overlapped)
        # Resume at step 4 from state_dict (model, optimizer, scheduler) into fresh objects.
        model, opt = make(sharded=sharded)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 - k / (2 * STEPS))
        whole = train(model, opt, batches, rank, STEPS, sched=sched)
        model, opt = make(sharded=sharded)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 - k / (2 * STEPS))
        train(model, opt, batches, rank, 4, sched=sched)
        saved = {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
        model, opt = make(seed=99, sharded=sharded)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 - k / (2 * STEPS))
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        resumed = train(model, opt, batches, rank, STEPS - 4, first=5, sched=sched)
        found[f"resume_bit_identical_sharded{int(sharded)}"] = same(whole, resumed)
        found[f"scheduler_moved_lr_sharded{int(sharded)}"] = abs(opt.param_groups[0]["lr"] - 3e-3 * 0.5) < 1e-12
    # DDP with the package's hook equals no DDP.
    plain = train(*make(), batches, rank, STEPS)
    model, opt = make()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[DEVICE] if DEVICE.type == "cuda" else None)
    ddp.register_comm_hook(None, st.local_gradients_hook)
    found["ddp_hook_equals_plain"] = same(plain, train(model, opt, batches, rank, STEPS, ddp=ddp))
    # GradScaler: an inf on rank 1 alone at step 3 is skipped by every rank.
    model, opt = make()
    scaler = torch.amp.GradScaler(DEVICE.type, init_scale=1024.0)
    params = train(model, opt, batches, rank, STEPS, scaler=scaler, poison=lambda t: rank == 1 and t == 3)
    found["scaler_steps_done"] = opt.steps_done
    found["scaler_skipped"] = opt.skipped_steps
    gathered = [torch.empty_like(params) for _ in range(world)]  # on DEVICE: NCCL gathers CUDA tensors
    dist.all_gather(gathered, params)
    found["scaler_replicas_equal"] = all(same(gathered[0], g) for g in gathered)
    found["bytes_sent_last_step"] = opt.last_metrics["bytes_sent"]
    found["mask_density_last_step"] = opt.last_metrics["mask_density"]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(found, f)


def subgroup(rank, world, out):
    """SCAPE on the process group of ranks 1 .. W-1 (ranks 0 .. W-2 inside it), rank 0 outside
    it: parameters broadcast from the group's first rank, replicas equal, bytes counted."""
    members = list(range(1, world))
    group = dist.new_group(members)
    found = {}
    if rank in members:
        batches = CorpusBatches(markov_corpus(vocab=32, tokens=20_000), world, 2, 16, seed=3)
        model = TinyGPT(vocab=32, block=16, n_embd=32, n_head=4, n_layer=2, seed=rank).to(DEVICE)  # differ
        opt = st.SCAPE(model.named_parameters(), lr=3e-3, sparsity=0.9, group=group)
        params = train(model, opt, batches, rank, STEPS)
        gathered = [torch.empty_like(params) for _ in members]
        dist.all_gather(gathered, params, group=group)
        found = {"group_rank": opt.comm.rank, "group_size": opt.comm.size,
                 "replicas_equal": all(same(gathered[0], g) for g in gathered),
                 "bytes_sent": opt.last_metrics["bytes_sent"]}
    dist.barrier()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(found, f)


def raise_at_step_3(rank, world):
    batches = CorpusBatches(markov_corpus(vocab=32, tokens=20_000), world, 2, 16, seed=3)
    model, opt = make()
    for t in range(1, STEPS + 1):
        if rank == 1 and t == 3:
            raise RuntimeError("rank 1 fails at step 3 on purpose")
        train(model, opt, batches, rank, 1, first=t)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("checks", "raise", "subgroup"), required=True)
    parser.add_argument("--out", default=".")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, cuda:LOCAL_RANK)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from datetime import timedelta
    global DEVICE
    if args.device == "cuda":
        DEVICE = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(DEVICE)
    dist.init_process_group("nccl" if DEVICE.type == "cuda" else "gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.mode == "checks":
        checks(rank, world, args.out)
    elif args.mode == "subgroup":
        subgroup(rank, world, args.out)
    else:
        raise_at_step_3(rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
