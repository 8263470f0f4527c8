"""scape for Python.

Entry points (docs/python.md):
  scape.torch.SCAPE, scape.torch.AdamS  torch-native optimizers for real training loops, on
                                    any device and torch.distributed group (torch only: no
                                    extension module needed);
  scape.Simulator                   W emulated workers of the C++ core stepping on gradients
                                    you supply (the research engine; needs the extension);
  scape.torch.simulate              trains a torch.nn.Module on W simulated workers (extension).

Package layout, top first (a module imports only its own layer or lower ones; docs/python.md):
  scape                   this facade: re-exports the public names below
  scape.torch             the torch entry point: scape.optim's optimizers and the torch helpers
                          that drive the engine (simulate)
  scape.engine            bindings of the C++ engine (Simulator; loads the extension scape._core)
  scape.optim             the torch-native optimizers (imports nothing else of the package)
  scape._layout           Layout, TensorSpec, as_layout
  scape.run_file          RunFileWriter: the run file of a loop scape does not drive (h5py)
  scape.trace             TraceWriter: gradient traces for `model.type = "replay"` (h5py)

`import scape` needs only numpy; the extension `scape._core` is loaded when first used, so the
writers (scape.run_file, scape.trace) run under a Python without torch or the extension.
"""
from __future__ import annotations

from . import engine as _engine
from ._layout import Layout, TensorSpec
from .engine import Simulator, failure_text, run_config, synthetic_corpus

__all__ = ["Simulator", "Layout", "TensorSpec", "run_config", "synthetic_corpus", "failure_text", "cuda_built",
           "__version__"]


def __getattr__(name):
    # The extension's names, loaded on first use (scape.engine imports scape._core lazily).
    if name in ("__version__", "cuda_built"):
        return getattr(_engine, name)
    raise AttributeError(f"module 'scape' has no attribute {name!r}")
