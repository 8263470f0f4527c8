"""The netlab's tests import `netlab` and `analysis` from the repository root, and find the scape
binary in SCAPE_BINARY (ctest sets it); a test that needs it skips without it, saying so."""
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `python3 -m pytest netlab/tests` from anywhere
    sys.path.insert(0, str(REPO))


@pytest.fixture(scope="session")
def scape():
    """Path of the scape binary, or skip."""
    path = os.environ.get("SCAPE_BINARY")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"SCAPE_BINARY={path!r} is not an executable scape (ctest sets it)")
    return path
