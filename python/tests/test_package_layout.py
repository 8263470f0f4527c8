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


def test_the_writers_run_without_torch_or_the_extension(tmp_path):
    """scape.trace and scape.run_file under Debian's /usr/bin/python3 (h5py and numpy, no torch),
    from a copy of the package without `_core`: the trace demo is written and reads back."""
    debian = Path("/usr/bin/python3")
    if not debian.exists():
        pytest.skip("no /usr/bin/python3 here")
    shutil.copytree(Path(scape.__file__).parent, tmp_path / "scape",
                    ignore=shutil.ignore_patterns("_core*", "__pycache__"))
    out = tmp_path / "demo.h5"
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    demo = subprocess.run([str(debian), "-m", "scape.trace", "--demo", str(out), "--steps", "3", "--workers", "2"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    if demo.returncode != 0 and "No module named 'h5py'" in demo.stderr:
        pytest.skip("/usr/bin/python3 has no h5py")
    assert demo.returncode == 0, demo.stderr
    assert demo.stdout.strip() == f"wrote {out}: 3 steps x 2 workers"
    code = ("import sys, h5py, scape.run_file, scape.trace\n"
            f"f = h5py.File({str(out)!r}, 'r')\n"
            "print(f['grads'].shape, list(f['layout/sizes'][()]), 'torch' in sys.modules, 'scape._core' in sys.modules)\n")
    check = subprocess.run([str(debian), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert check.stdout.split() == ["(3,", "2,", "208)", "[64,", "128,", "16]", "False", "False"]
