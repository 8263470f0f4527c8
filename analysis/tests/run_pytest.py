"""ctest entry point for the analysis tests (tests/CMakeLists.txt registers it).

Exits 77 (ctest's SKIP_RETURN_CODE) when this Python lacks pytest, h5py, numpy or matplotlib,
with the missing modules named, instead of failing on an ImportError. pytest's exit status 5
("no tests collected") is turned into a failure: a test file that stopped being collected must
not pass silently.
"""

import importlib.util
import sys
from pathlib import Path

SKIP = 77


def main():
    """Runs pytest on this folder; returns the exit status for ctest."""
    missing = [m for m in ("pytest", "h5py", "numpy", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"SKIP: {sys.executable} lacks {', '.join(missing)} "
              "(Debian: python3-pytest python3-h5py python3-numpy python3-matplotlib; scripts/setup-deps)")
        return SKIP
    import pytest

    here = Path(__file__).resolve().parent
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "-rs", str(here)] + sys.argv[1:])
    if rc == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("run_pytest: pytest collected no tests: counted as a failure")
        return 1
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
