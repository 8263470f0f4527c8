"""Reading and comparing run files in the tests."""
import math

import h5py
import numpy as np

# Datasets measured on this machine (seconds, wall or CPU): never bit-reproducible.
TIMING_MARKERS = ("time", "wait", "cost", "_s")


def deterministic_metrics(path):
    with h5py.File(path, "r") as f:
        return {name: f["metrics"][name][()] for name in f["metrics"]
                if not any(m in name for m in TIMING_MARKERS)}


def final_params(path):
    with h5py.File(path, "r") as f:
        return f["final/params"][()]


def status(path):
    with h5py.File(path, "r") as f:
        value = f.attrs["status"]
        return value.decode() if isinstance(value, bytes) else str(value)


def assert_same_metrics(got_path, want_path, at_least=8):
    got, want = deterministic_metrics(got_path), deterministic_metrics(want_path)
    assert len(want) >= at_least, sorted(want)
    assert sorted(got) == sorted(want)
    for name, values in want.items():
        other = got[name]
        assert other.shape == values.shape, name
        same = (other == values) | (np.isnan(other) & np.isnan(values))
        assert same.all(), f"{name}: first difference at row {int(np.argmin(same))}: {other[~same][:3]} vs {values[~same][:3]}"
