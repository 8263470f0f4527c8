"""tests/layers_check.py finds what it is for: upward and peer includes and imports, named by
file and line, in a planted tree; and passes a tree that keeps the order."""
import pathlib
import subprocess
import sys

import pytest

CHECK = pathlib.Path(__file__).resolve().parent / "layers_check.py"

ARCHITECTURE = """# Architecture

```layers
apps
sim runtime
optimizers
optimizers/scape
core
util
```

```python-layers
scape
scape.engine scape.optim
scape._layout
```
"""


def plant(root: pathlib.Path, files: dict) -> None:
    (root / "docs").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "ARCHITECTURE.md").write_text(ARCHITECTURE)
    (root / "README.md").write_text("| folder | responsibility |\n|---|---|\n" + "".join(
        f"| `{top}/` | ... |\n" for top in ("apps", "sim", "runtime", "optimizers", "core", "util")))
    base = {
        "util/fnv.hpp": "#pragma once\n#include <cstdint>\n",
        "core/layout.hpp": '#pragma once\n#include "util/fnv.hpp"\n',
        "optimizers/scape/step.cpp": '#include "core/layout.hpp"\n#include "optimizers/scape/step.hpp"\n',
        "optimizers/scape/step.hpp": "#pragma once\n",
        "optimizers/factory.cpp": '#include "optimizers/scape/step.hpp"\n#include "core/layout.hpp"\n',
        "sim/run.cpp": '#include "optimizers/factory.hpp"\n',
        "runtime/mpi.cpp": '#include "core/layout.hpp"\n#include <mpi.h>\n',
        "apps/main.cpp": '#include "sim/run.hpp"\n#include "runtime/mpi.hpp"\n',
        "python/scape/__init__.py": "from .engine import Simulator\n",
        "python/scape/_layout.py": "import dataclasses\n",
        "python/scape/engine.py": "from ._layout import Layout\n",
        "python/scape/optim/__init__.py": "",
        "python/scape/optim/step.py": "import torch\nfrom .arith import f32\n",
        "python/scape/optim/arith.py": "",
    }
    base.update(files)
    for name, text in base.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run(root: pathlib.Path):
    return subprocess.run([sys.executable, str(CHECK), "--root", str(root)], capture_output=True, text=True)


def test_a_tree_that_keeps_the_order_passes(tmp_path):
    plant(tmp_path, {})
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


PLANTED = [
    # (file, its text, what the report must say)
    ("core/layout.hpp", '#pragma once\n#include "util/fnv.hpp"\n#include "optimizers/scape/step.hpp"\n',
     ['core/layout.hpp:3: includes "optimizers/scape/step.hpp"', "above it)"]),
    ("optimizers/scape/step.hpp", '#pragma once\n#include "optimizers/factory.hpp"\n',
     ["optimizers/scape/step.hpp:2"]),
    ("runtime/mpi.cpp", '#include "sim/run.hpp"\n', ["runtime/mpi.cpp:1", "a peer)"]),
    ("python/scape/optim/step.py", "import torch\n\nfrom .. import engine\n",
     ["python/scape/optim/step.py:3: imports scape.engine"]),
    ("python/scape/engine.py", "from . import Simulator\n", ["python/scape/engine.py:1"]),
]


@pytest.mark.parametrize("name,text,said", PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_include_against_the_order_fails_naming_file_and_line(tmp_path, name, text, said):
    """Upward, into the folder above a nested one, between peers, and the same for Python
    imports (the package facade imported from below included)."""
    plant(tmp_path, {name: text})
    done = run(tmp_path)
    assert done.returncode == 1, done.stdout
    for words in said:
        assert words in done.stdout


def test_a_layer_missing_from_the_readme_fails(tmp_path):
    plant(tmp_path, {})
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("| `runtime/` | ... |\n", ""))
    done = run(tmp_path)
    assert done.returncode == 1
    assert "README.md: the layout table has no row | `runtime/` |" in done.stdout


def test_this_checkout_keeps_the_order():
    done = run(CHECK.parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr
