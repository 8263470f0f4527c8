"""The bindings of the C++ engine: `Simulator`, W emulated workers of the optimizer core stepping
on gradients you supply (the research engine), and the run-config and corpus helpers over the
compiled extension `scape._core`, which is part of this layer.

Importing this module needs only numpy; `_core` is loaded when first used, so the torch-native
optimizers (scape.optim) run without it. The facade `scape` re-exports these names.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from ._layout import as_layout

# Also __version__ and cuda_built, the extension's, through __getattr__ (they load it).
__all__ = ["Simulator", "run_config", "synthetic_corpus", "failure_text"]


def _extension():
    """The C++ extension, imported on first use so the torch-native optimizers run without it."""
    try:
        from . import _core  # at first use, not at import time
    except ImportError as error:
        raise ImportError("scape._core, the C++ engine behind scape.Simulator and scape.torch.simulate, is not "
                          "built: `pip install ./python`, or build with -DSCAPE_PYTHON=ON and put <build>/python on "
                          "PYTHONPATH (scape.torch.SCAPE and AdamS need none of it)") from error
    return _core


def __getattr__(name):
    if name == "__version__":
        return _extension().version
    if name == "cuda_built":
        return _extension().cuda_built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_config(*, workers: int, steps: int, optimizer: Optional[Mapping[str, Any]] = None,
               network: Optional[Mapping[str, Any]] = None, seed: int = 1, name: str = "python",
               description: str = "", eval_interval: Optional[int] = None,
               log: Optional[Mapping[str, Any]] = None) -> dict:
    """The run config of a model.type "external" run: the optimizer and network sections are
    those of a run config file (docs/configuration.md), validated by the same code."""
    config: dict = {"name": name, "seed": seed, "workers": workers, "steps": steps,
                    "model": {"type": "external"}}
    if description:
        config["description"] = description
    if optimizer is not None:
        config["optimizer"] = dict(optimizer)
    if network is not None:
        config["network"] = dict(network)
    if eval_interval is not None:
        config["eval"] = {"interval": eval_interval}
    if log is not None:
        config["log"] = dict(log)
    return config


def _config_json(config: Mapping[str, Any]) -> str:
    try:
        return json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config: not representable as JSON: {e}") from None


def _check_host(array, argument: str) -> None:
    """A torch tensor off the CPU, named before DLPack sees it (a meta or CUDA tensor)."""
    device = getattr(array, "device", None)
    kind = getattr(device, "type", None)
    if kind is not None and kind != "cpu":
        raise ValueError(f"{argument}: on {device}; the optimizer core's stepped runners read host memory "
                         f"(a CPU tensor or a numpy array)")


def _check_grads(grads) -> None:
    if isinstance(grads, (list, tuple)):
        for w, g in enumerate(grads):
            _check_host(g, f"grads[{w}]")
    else:
        _check_host(grads, "grads")


class Simulator:
    """W workers in this process stepping the optimizer core over emulated collectives that
    count every byte, writing the run file `log` as `scape run` does.

    layout     the parameters: a Layout, a list of (name, shape, decay), or a torch.nn.Module
    workers    W
    optimizer  the optimizer section of a run config ({"type": "scape", "sparsity": 0.9, ...})
    network    the network section ({"preset": "ib_ndr400"} by default)
    log        the run file (HDF5, docs/run-files.md); `python -m analysis report` reads it
    steps      T of the learning-rate schedule, and the steps the run takes (config default 200)
    params     the initial flat parameters (N float32 values; zeros when None)
    eval       a callable(params) -> float giving the validation loss of a flat parameter view,
               called every `eval_interval` steps and at the last step
    """

    def __init__(self, layout, workers: int = 4, optimizer: Optional[Mapping[str, Any]] = None,
                 network: Optional[Mapping[str, Any]] = None, log: str = "run.h5", *, steps: int = 200,
                 seed: int = 1, params=None, eval: Optional[Callable[[np.ndarray], float]] = None,
                 eval_interval: Optional[int] = None, name: str = "python", description: str = "",
                 log_options: Optional[Mapping[str, Any]] = None, quiet: bool = True,
                 tokens_per_step: float = 0.0):
        self.layout = as_layout(layout)
        if eval is not None and eval_interval is None:
            eval_interval = 50
        self.config = run_config(workers=workers, steps=steps, optimizer=optimizer, network=network, seed=seed,
                                 name=name, description=description, eval_interval=eval_interval,
                                 log=log_options)
        self._sim = _extension().Simulator(_config_json(self.config), self.layout.specs(), params, str(log), quiet,
                                    float(tokens_per_step), eval)
        self.log = str(log)

    @property
    def workers(self) -> int:
        return self._sim.workers

    @property
    def size(self) -> int:
        return self._sim.size

    @property
    def steps_done(self) -> int:
        return self._sim.steps_done

    @property
    def params(self) -> np.ndarray:
        """Rank 0's flat parameters: a read-only view, updated in place by every step."""
        return self._sim.params

    @property
    def mask(self) -> np.ndarray:
        """Rank 0's global mask of the last step (uint64 words over N bits; empty when dense)."""
        return self._sim.mask

    def residual(self, worker: int) -> np.ndarray:
        """Worker `worker`'s error-feedback residual (a read-only view; empty when dense)."""
        return self._sim.residual(worker)

    def step(self, grads, losses: Optional[Sequence[float]] = None, compute_seconds=None):
        """One optimizer step. `grads`: W flat float32 arrays (CPU tensors or numpy), or one
        [W, N] array; `losses`: the W training losses (optional); `compute_seconds`: the seconds
        of each worker's forward and backward pass (W values, or one for all; optional), which
        the run file's compute_time and modelled step time take. Returns (params, metrics): the
        parameter view and this step's row of the run file (`diverged` is True when the run
        stopped on a non-finite value)."""
        _check_grads(grads)
        if compute_seconds is not None and not isinstance(compute_seconds, (list, tuple)):
            compute_seconds = [float(compute_seconds)] * self.workers
        diverged = self._sim.step(grads, None if losses is None else [float(x) for x in losses],
                                  None if compute_seconds is None else [float(x) for x in compute_seconds])
        metrics = self._sim.last_row()
        metrics["diverged"] = bool(diverged)
        return self._sim.params, metrics

    def close(self, failure: str = "") -> dict:
        """Ends the run (final status into the run file) and returns its outcome: completed
        after all steps, else failed, with `failure` as its error when given."""
        return self._sim.close(failure)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        self.close(failure_text(self.steps_done, error) if error is not None else "")
        return False


def failure_text(steps_done: int, error: BaseException) -> str:
    """The run file's error for a caller's exception during step steps_done + 1."""
    return f"step {steps_done + 1}: {type(error).__name__}: {error}"


def synthetic_corpus(vocab_size: int = 64, successors: int = 3, concentration: float = 0.9, seed: int = 1,
                     tokens: int = 400_000, val_fraction: float = 0.1):
    """The (train, val) uint16 tokens of scape's built-in synthetic Markov corpus (data.type
    "synthetic"); the defaults are the quickstart's."""
    return _extension().synthetic_corpus(vocab_size, successors, concentration, seed, tokens, val_fraction)
