"""scape for PyTorch training loops: `simulate` trains any torch.nn.Module on W simulated
workers (per-worker gradients by torch.func, a vmap over workers), and `DistributedOptimizer`
runs one torchrun rank whose communication is the optimizer core's, over torch.distributed
(gloo on CPU, NCCL on GPU). docs/python.md has examples."""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterable, Mapping, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.func import functional_call, grad, vmap

from . import Layout, Simulator, _config_json, _core, failure_text, run_config

__all__ = ["simulate", "DistributedOptimizer", "TorchTransport", "flat_views"]


def _tensor_view(array: np.ndarray) -> torch.Tensor:
    # The core hands out read-only numpy views; torch reads them without a copy and never
    # writes them here (the forward and backward passes are functional).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def flat_views(flat: torch.Tensor, layout: Layout) -> Dict[str, torch.Tensor]:
    """Each tensor of the layout as a view of the flat buffer, by name."""
    out = {}
    for spec, at in zip(layout.tensors, layout.offsets()):
        out[spec.name] = flat[at:at + spec.numel].view(spec.shape)
    return out


def _flat_params(module: torch.nn.Module, layout: Layout) -> np.ndarray:
    named = dict(module.named_parameters())
    parts = [named[t.name].detach().to(torch.float32).reshape(-1).cpu() for t in layout.tensors]
    return torch.cat(parts).numpy()


def _stacked_flat(grads: Dict[str, torch.Tensor], layout: Layout, workers: int) -> torch.Tensor:
    return torch.cat([grads[t.name].reshape(workers, -1) for t in layout.tensors], dim=1).contiguous()


def _batch_source(batches):
    if callable(batches):
        return batches
    iterator = iter(batches)
    return lambda step: next(iterator)


def simulate(model: torch.nn.Module, loss_fn: Callable, batches, *, workers: int = 4,
             optimizer: Optional[Mapping[str, Any]] = None, steps: int = 200,
             eval: Optional[Callable[[torch.nn.Module], float]] = None, eval_interval: int = 50,
             network: Optional[Mapping[str, Any]] = None, log: str = "run.h5", seed: int = 1,
             name: str = "torch-simulate", quiet: bool = False) -> dict:
    """Trains `model` for `steps` steps on `workers` simulated workers.

    batches   a callable(step) -> (inputs, targets), or an iterable of them, each with a leading
              dimension of `workers` (worker w trains on inputs[w], targets[w]); step is 1-based
    loss_fn   loss_fn(model(inputs[w]), targets[w]) -> scalar tensor
    eval      a callable(model) -> float: the validation loss, every `eval_interval` steps and at
              the last step, with the model holding rank 0's parameters
    Returns the run's outcome (status, final losses, bytes per step, ...); the run file `log`
    has every step's metrics, compute_time being the vmap's wall time divided by `workers`. At
    the end the model holds the trained parameters.
    """
    layout = Layout.from_module(model)
    next_batch = _batch_source(batches)
    buffers = {k: v for k, v in model.named_buffers()}

    def worker_loss(params, x, y):
        out = functional_call(model, (params, buffers), (x,))
        loss = loss_fn(out, y)
        return loss, loss.detach()

    per_worker = vmap(grad(worker_loss, has_aux=True), in_dims=(None, 0, 0), randomness="different")

    def load_into_model(flat: np.ndarray):
        views = flat_views(_tensor_view(flat), layout)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in views:
                    p.copy_(views[n])

    def validation(flat: np.ndarray) -> float:
        load_into_model(flat)
        return float(eval(model))

    first = next_batch(1)
    tokens = float(first[0].numel())
    sim = Simulator(layout, workers, optimizer, network, log, steps=steps, seed=seed,
                    params=_flat_params(model, layout), eval=validation if eval is not None else None,
                    eval_interval=eval_interval if eval is not None else None, name=name,
                    quiet=quiet, tokens_per_step=tokens)
    # Rank 0's parameters, updated in place by every step: viewed once, per tensor.
    params = flat_views(_tensor_view(sim.params), layout)
    failure = ""
    try:
        batch = first
        for t in range(1, steps + 1):
            if t > 1:
                batch = next_batch(t)
            x, y = batch
            if x.shape[0] != workers or y.shape[0] != workers:
                raise ValueError(f"batches: step {t}: a leading dimension of {x.shape[0]} and {y.shape[0]}, "
                                 f"expected workers = {workers}")
            start = time.perf_counter()
            grads, losses = per_worker(params, x, y)
            flat = _stacked_flat(grads, layout, workers).to(torch.float32)
            # One vmap computes every worker's pass: each is charged its share of the time.
            compute = (time.perf_counter() - start) / workers
            _, metrics = sim.step(flat, losses.tolist(), compute)
            if metrics["diverged"]:
                break
    except BaseException as error:  # the run file records the caller's error, then it propagates
        failure = failure_text(sim.steps_done, error)
        raise
    finally:
        outcome = sim.close(failure)
    load_into_model(sim.params)
    return outcome


class TorchTransport(_core.Transport):
    """The optimizer core's process group over torch.distributed (an initialized group: gloo
    moves host tensors, NCCL copies through the current CUDA device)."""

    def __init__(self, group=None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("scape.torch: call torch.distributed.init_process_group first")
        self.group = group
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)
        self._cuda = dist.get_backend(group) == "nccl"

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def _dev(self, t: torch.Tensor) -> torch.Tensor:
        return t.cuda() if self._cuda else t

    def all_gather(self, send, recv, counts):
        widest = max(counts)
        if widest == 0:
            return
        s = torch.from_numpy(send)
        padded = torch.zeros(widest, dtype=torch.uint8)
        padded[:s.numel()] = s
        gathered = self._dev(torch.empty(widest * self._size, dtype=torch.uint8))
        dist.all_gather(list(gathered.split(widest)), self._dev(padded), group=self.group)
        gathered = gathered.cpu()
        r = torch.from_numpy(recv)
        at = 0
        for q, c in enumerate(counts):
            r[at:at + c] = gathered[q * widest:q * widest + c]
            at += c

    def all_to_all(self, send, send_counts, recv, recv_counts):
        s = self._dev(torch.from_numpy(send))
        r = torch.from_numpy(recv)
        out = self._dev(torch.empty_like(r)) if self._cuda else r
        dist.all_to_all_single(out, s, output_split_sizes=list(recv_counts), input_split_sizes=list(send_counts),
                               group=self.group)
        if self._cuda:
            r.copy_(out.cpu())

    def all_reduce_sum(self, data):
        d = torch.from_numpy(data)
        t = self._dev(d)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        if self._cuda:
            d.copy_(t.cpu())

    def barrier(self):
        dist.barrier(group=self.group)


class DistributedOptimizer:
    """One torchrun rank of an optimizer of the core: the model's parameters become views of
    the core's flat buffer, each rank keeps its local gradient, and step() does all the
    communication the optimizer needs (SCAPE's sparse payload and lagged mask, or the dense
    baselines' own all-reduce or reduce-scatter). Rank 0 writes the run file `log`.

    params         model.named_parameters() (names land in the run file) or model.parameters()
    optimizer      the optimizer section of a run config
    steps          T of the learning-rate schedule (and the steps the run may take)
    deterministic  reduce in rank order (bit-identical to scape.Simulator and the MPI runtime's
                   --deterministic); False uses the group's own all-reduce
    """

    def __init__(self, params: Iterable, optimizer: Optional[Mapping[str, Any]] = None, *, steps: int,
                 network: Optional[Mapping[str, Any]] = None, log: str = "run.h5", seed: int = 1,
                 deterministic: bool = True, group=None, name: str = "torchrun", quiet: bool = False,
                 tokens_per_step: float = 0.0):
        items = list(params)
        if items and isinstance(items[0], tuple):
            named = [(n, p) for n, p in items]
        else:
            named = [(f"param{i}", p) for i, p in enumerate(items)]
        for n, p in named:
            if p.dtype != torch.float32:
                raise ValueError(f"params: {n} is {p.dtype}; the optimizer core keeps float32 parameters")
            if p.device.type != "cpu":
                raise ValueError(f"params: {n} is on {p.device}; keep the model on the CPU (the core's flat buffer "
                                 f"is host memory)")
        self._params = [p for _, p in named]
        self.layout = Layout((n, tuple(p.shape), p.dim() >= 2) for n, p in named)
        self.transport = TorchTransport(group)
        # Every replica starts from rank 0's parameters.
        init = torch.cat([p.detach().reshape(-1) for p in self._params]).contiguous()
        if self.transport._cuda:
            on_device = init.cuda()
            dist.broadcast(on_device, src=0, group=group)
            init = on_device.cpu()
        else:
            dist.broadcast(init, src=0, group=group)
        config = run_config(workers=self.transport.size(), steps=steps, optimizer=optimizer, network=network,
                            seed=seed, name=name)
        self._rank = _core.SteppedRank(_config_json(config), self.layout.specs(), init.numpy(), self.transport,
                                       deterministic, str(log), quiet, float(tokens_per_step))
        flat = torch.from_numpy(self._rank.params)
        self._grad_flat = torch.empty(self.layout.size, dtype=torch.float32)  # step()'s gradient, reused
        with torch.no_grad():
            for p, view in zip(self._params, flat_views(flat, self.layout).values()):
                p.data = view
        self.metrics: dict = {}
        self._pass_started = None
        # torchrun stops the other ranks with SIGTERM when one fails: record it in the run file
        # (rank 0's says `failed`) instead of dying with the file open.
        self._previous_sigterm = None
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        self._rank.abort(f"step {self._rank.steps_done + 1}: terminated by signal {signum} "
                         f"(a peer rank failed, or the job was stopped)")
        raise SystemExit(128 + signum)

    def _restore_sigterm(self):
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def zero_grad(self, set_to_none: bool = True):
        """Clears the gradients, and starts the clock of this step's forward and backward pass
        (the run file's compute_time when step() is not told it)."""
        self._pass_started = time.perf_counter()
        for p in self._params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self, loss: Optional[float] = None, compute_seconds: Optional[float] = None) -> bool:
        """Collective: one optimizer step on this rank's local gradients (a missing .grad counts
        as zeros). `compute_seconds` defaults to the time since zero_grad(). Returns True when
        the run diverged. Rank 0's row of the run file is in self.metrics."""
        if compute_seconds is None and self._pass_started is not None:
            compute_seconds = time.perf_counter() - self._pass_started
        self._pass_started = None
        parts = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel()) for p in self._params]
        flat = torch.cat(parts, out=self._grad_flat)
        value = float("nan") if loss is None else float(loss)
        seconds = float("nan") if compute_seconds is None else float(compute_seconds)
        diverged = self._rank.step(flat.numpy(), value, seconds)
        self.metrics = self._rank.last_row()
        return bool(diverged)

    def close(self, failure: str = "") -> dict:
        """Collective: ends the run and returns its outcome (rank 0's run file gets the status:
        failed, with `failure` as its error, when given)."""
        self._restore_sigterm()
        return self._rank.close(failure)
