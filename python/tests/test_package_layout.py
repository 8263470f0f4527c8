"""The package's layers (docs/python.md, "Package layout"): the facade `scape` re-exports the
engine's and the layout's names without loading torch or the extension, `scape.torch` re-exports
the optimizers of `scape.optim`, and a copy of the package without `_core` imports and says what
is missing only when the engine is used."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import scape


def run_python(code, pythonpath):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(pythonpath)))
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_importing_the_facade_loads_neither_torch_nor_the_extension():
    code = ("import sys, scape; before = ('torch' in sys.modules, 'scape._core' in sys.modules);"
            "scape.Simulator, scape.Layout, scape.TensorSpec, scape.run_config, scape.synthetic_corpus;"
            "print(*before, 'torch' in sys.modules, 'scape._core' in sys.modules)")
    assert run_python(code, Path(scape.__file__).parent.parent) == ["False", "False", "False", "False"]


def test_the_facade_re_exports_the_layers_names():
    import scape._layout
    import scape.engine
    assert scape.Simulator is scape.engine.Simulator
    assert scape.run_config is scape.engine.run_config
    assert scape.synthetic_corpus is scape.engine.synthetic_corpus
    assert scape.failure_text is scape.engine.failure_text
    assert scape.Layout is scape._layout.Layout and scape.TensorSpec is scape._layout.TensorSpec
    assert scape.__version__ == scape.engine.__version__
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        scape.nope  # noqa: B018


def test_scape_torch_re_exports_the_optimizers():
    st = pytest.importorskip("scape.torch")
    from scape.optim.adams import AdamS
    from scape.optim.ddp import local_gradients_hook
    from scape.optim.scape_optimizer import SCAPE, NonFiniteGradient
    assert (st.SCAPE, st.AdamS, st.NonFiniteGradient, st.local_gradients_hook) == \
        (SCAPE, AdamS, NonFiniteGradient, local_gradients_hook)
    assert st.Simulator is scape.Simulator


def test_without_the_extension_the_engine_says_so_when_used(tmp_path):
    shutil.copytree(Path(scape.__file__).parent, tmp_path / "scape",
                    ignore=shutil.ignore_patterns("_core*", "__pycache__"))
    code = ("import scape\n"
            "try:\n"
            "    scape.Simulator([('w', (4,), True)], workers=2)\n"
            "except ImportError as error:\n"
            "    print('scape._core' in str(error))\n")
    assert run_python(code, tmp_path) == ["True"]
