"""Fixtures of the Python package's tests. ctest runs them with the venv of scripts/setup-python,
PYTHONPATH holding the built package (<build>/python) and the repository root (for `analysis`),
and SCAPE_BINARY set to the built scape command."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
for extra in (REPO, REPO / "examples"):  # analysis, and the example's tiny GPT
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))


@pytest.fixture(scope="session")
def scape_binary():
    path = os.environ.get("SCAPE_BINARY")
    if not path:
        pytest.fail("SCAPE_BINARY is not set: ctest sets it to the built scape command")
    return path


def run_scape(binary, *args, check=True):
    result = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"scape {' '.join(map(str, args))} exited {result.returncode}:\n{result.stderr}")
    return result


def write_json(path, obj):
    Path(path).write_text(json.dumps(obj))
    return path


def process_output(done, head=6000, tail=2500):
    """A failed subprocess's output for an assertion message: the end of stdout and the start and
    end of stderr (torchrun's summary of a failed worker fills the end, the worker's own error,
    with PYTHONFAULTHANDLER's stacks on an abort, comes first)."""
    err = done.stderr or ""
    shown = err if len(err) <= head + tail else err[:head] + "\n[...]\n" + err[-tail:]
    return (done.stdout or "")[-2000:] + shown
