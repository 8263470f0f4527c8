"""scape for PyTorch training loops (docs/python.md): the package's torch entry point.

SCAPE, AdamS, DiLoCo, SparseLoCo and DeMo (and Hierarchical, dense inside the node around any of
them) are torch-native optimizers (torch.optim.Optimizer subclasses in torch ops,
scape.optim, re-exported here): they run in a user's own training loop on any device, over any
torch.distributed process group, and need no extension module. `simulate` trains any
torch.nn.Module on W simulated workers of the C++ core (scape.engine's Simulator; per-worker
gradients by torch.func, a vmap over workers), the research engine that the optimizers are held
to. This module imports scape.engine, scape.optim and scape._layout, never the facade `scape`."""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Dict, Mapping, Optional

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from ._layout import Layout
from .engine import Simulator, failure_text
from .optim.adams import AdamS
from .optim.demo import DeMo
from .optim.diloco import DiLoCo
from .optim.hierarchy import Hierarchical
from .optim.sparseloco import SparseLoCo
from .optim.ddp import local_gradients_hook
from .optim.scape_optimizer import SCAPE, NonFiniteGradient

__all__ = ["SCAPE", "AdamS", "DiLoCo", "SparseLoCo", "DeMo", "Hierarchical", "NonFiniteGradient", "local_gradients_hook", "simulate", "flat_views"]


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
