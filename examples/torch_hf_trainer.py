"""scape.torch.SCAPE as the optimizer of a Hugging Face Trainer: a small GPT-2 (built from a
config, nothing downloaded) on a synthetic Markov corpus, under torchrun. The Trainer wraps the
model in DDP; the callback registers scape.torch.local_gradients_hook on it before the first
backward, so DDP sends nothing and SCAPE sends its sparse payload. With --resume the run is
stopped at half its steps and resumed from the Trainer's checkpoint (its per-process
optimizer.pt is SCAPE's state_dict).

    torchrun --nproc_per_node 2 examples/torch_hf_trainer.py --out /tmp/hf-run [--resume]

Needs `transformers` and `accelerate` (not in the tests' venv; docs/python.md says what ran)."""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_gpt import markov_corpus  # noqa: E402

import scape.torch as st  # noqa: E402


def dataset(tokens, block, count, seed):
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, tokens.numel() - block - 1, (count,), generator=gen)
    return [{"input_ids": tokens[s:s + block], "labels": tokens[s:s + block]} for s in starts.tolist()]


def main():
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--no-residual", action="store_true", help="SCAPE without error feedback (state the same "
                        "on every rank, so the Trainer's rank-0 save holds all of it)")
    parser.add_argument("--resume", action="store_true", help="stop at half the steps, resume from the checkpoint")
    args = parser.parse_args()
    torch.set_num_threads(1)

    class LocalGradients(TrainerCallback):
        def on_train_begin(self, targs, state, control, model=None, **kwargs):
            wrapped = trainer.model_wrapped
            if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
                wrapped.register_comm_hook(None, st.local_gradients_hook)

    def run(max_steps, resume):
        nonlocal trainer
        # TrainingArguments initializes torch.distributed: build the optimizer after it, or it
        # would be a group of one on every rank (scape.torch.SCAPE refuses that under torchrun).
        targs = TrainingArguments(output_dir=args.out, max_steps=max_steps, per_device_train_batch_size=4,
                                  logging_steps=10, save_steps=args.steps // 2, save_strategy="steps",
                                  report_to=[], seed=1, data_seed=1, use_cpu=True, dataloader_num_workers=0)
        _ = targs.device  # the process group is set up on first use of the device
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=32, n_embd=64, n_layer=2, n_head=4))
        opt = st.SCAPE(model.named_parameters(), lr=3e-3, sparsity=args.sparsity, residual=not args.no_residual)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
        trainer = Trainer(model=model, args=targs, train_dataset=data, optimizers=(opt, sched),
                          callbacks=[LocalGradients()])
        trainer.train(resume_from_checkpoint=resume)
        opt.finish()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), opt

    trainer = None
    data = dataset(torch.from_numpy(markov_corpus(vocab=32, tokens=20_000).astype("int64")), 32, 4000, seed=3)
    whole, opt = run(args.steps, None)
    found = {"steps": opt.steps_done, "bytes_sent_last_step": opt.last_metrics.get("bytes_sent"),
             "mask_density": opt.last_metrics.get("mask_density"),
             "loss_history": [h["loss"] for h in trainer.state.log_history if "loss" in h]}
    if args.resume:
        checkpoint = os.path.join(args.out, f"checkpoint-{args.steps // 2}")
        resumed, opt = run(args.steps, checkpoint)
        found["resume_bit_identical"] = bool(torch.equal(whole, resumed))
        found["steps_after_resume"] = opt.steps_done
    rank = dist.get_rank() if dist.is_initialized() else 0
    print(json.dumps({"rank": rank, **found}))


if __name__ == "__main__":
    main()
