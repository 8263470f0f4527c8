"""Damaged run files are named and skipped within seconds (issue 55): the analysis opens a file
plainly first, in SWMR mode only when the plain open is refused, and then with HDF5's metadata
retries bounded (analysis.runs.open_run_file). Before, an SWMR open of a file with flipped bytes
waited on HDF5's doubling retries for hours.
"""

import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time

import h5py
import pytest

from conftest import REPO

REPORT_LIMIT_S = 30


def damaged_copies(src, folder, seed, flips=8):
    """`flips` copies of src with 40 bytes flipped in the first 4 KiB, and three truncated copies."""
    data = src.read_bytes()
    rng = random.Random(seed)
    names = []
    for i in range(flips):
        b = bytearray(data)
        for _ in range(40):
            b[rng.randrange(4096)] ^= rng.randrange(1, 256)
        path = folder / f"{src.stem}-flip{i}.h5"
        path.write_bytes(bytes(b))
        names.append(path.name)
    truncated = []
    for n in (100, 4096, len(data) // 3):
        path = folder / f"{src.stem}-trunc{n}.h5"
        path.write_bytes(data[:n])
        truncated.append(path.name)
    return names, truncated


def test_report_names_damaged_files_and_goes_on(mixed_dir, tmp_path):
    """Copies of a closed and of a killed run file (which needs SWMR), damaged: the report ends
    within 30 s, names each damaged file it could not read, and still reports both originals."""
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copyfile(mixed_dir / "q-adams.h5", folder / "q-adams.h5")
    shutil.copyfile(mixed_dir / "q-killed.h5", folder / "q-killed.h5")
    flipped, truncated = [], []
    for seed, name in enumerate(("q-adams.h5", "q-killed.h5")):
        f, t = damaged_copies(folder / name, folder, seed)
        flipped += f
        truncated += t
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "analysis", "report", str(folder), "--out", str(tmp_path / "rep")],
                          capture_output=True, text=True, timeout=REPORT_LIMIT_S + 30, cwd=REPO)
    elapsed = time.monotonic() - start
    assert elapsed < REPORT_LIMIT_S, f"report took {elapsed:.1f} s"
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    named = set(re.findall(r"warning: \S*/([^/\s]+\.h5):", proc.stderr))
    summary = (tmp_path / "rep" / "summary.md").read_text(encoding="utf-8")
    read = int(re.search(r"(\d+) run file\(s\) read, (\d+) unreadable", summary).group(1))
    assert "q-adams.h5" not in named and "q-killed.h5" not in named
    # A cut at 100 bytes or 4 KiB leaves no root group to read.
    for name in truncated:
        if "trunc100" in name or "trunc4096" in name:
            assert name in named
    assert named <= set(flipped) | set(truncated)
    # Every file is either read or named; most flipped copies cannot be read at all.
    assert read + len(named) == 2 + len(flipped) + len(truncated)
    assert len(named & set(flipped)) >= len(flipped) // 2
    for name in ("q-adams.h5", "q-killed.h5"):
        assert name in summary


def test_open_run_file_reads_a_killed_file_and_fails_fast_on_a_damaged_one(mixed_dir, tmp_path):
    from analysis.runs import open_run_file

    killed = tmp_path / "k.h5"
    shutil.copyfile(mixed_dir / "q-killed.h5", killed)
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(killed, "r")
    with open_run_file(killed) as f:
        assert f.attrs["status"] == "running"
        assert f["metrics/step"].shape[0] >= 5
    # A damaged copy on which h5py's own SWMR open (HDF5's default 100 attempts) is still waiting
    # after 3 s, checked in a child; open_run_file gives it up within 2 s.
    flipped, _ = damaged_copies(killed, tmp_path, seed=1, flips=4)
    hangs = None
    for name in flipped:
        probe = "import h5py, sys\nwith h5py.File(sys.argv[1], 'r', swmr=True) as f: f.visit(lambda n: f[n])"
        try:
            subprocess.run([sys.executable, "-c", probe, str(tmp_path / name)], capture_output=True, timeout=3)
        except subprocess.TimeoutExpired:
            hangs = tmp_path / name
            break
    assert hangs is not None, "no damaged copy hangs an unbounded SWMR open"
    start = time.monotonic()
    with pytest.raises((OSError, RuntimeError, KeyError)):
        with open_run_file(hangs) as f:
            f.visit(lambda n: f[n])
    assert time.monotonic() - start < 2


def test_writer_alive_reads_the_lock_files_pid_and_host(tmp_path):
    from analysis.runs import lock_holder, writer_alive

    run = tmp_path / "r.h5"
    assert lock_holder(run) is None and not writer_alive(run)
    lock = tmp_path / "r.h5.lock"
    lock.write_text(f"{os.getpid()} {socket.gethostname()}\n")
    assert lock_holder(run) == (os.getpid(), socket.gethostname())
    assert writer_alive(run)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    lock.write_text(f"{child.pid} {socket.gethostname()}\n")  # a pid that has exited
    assert not writer_alive(run)
    lock.write_text(f"{child.pid} another-host.invalid\n")  # cannot be checked from here: alive
    assert writer_alive(run)
    lock.write_text("")  # a sweep's lock of an older scape says nothing
    assert not writer_alive(run)


def test_a_value_changed_after_close_is_named_by_its_checksum(mixed_dir, tmp_path):
    """scape closes a run file with the CRC-32 of each table (the `checksums` attribute): the
    analysis checks them, so one changed value makes the file unreadable, naming the table."""
    import json
    import zlib

    import numpy as np
    from analysis.runs import RunFileError, load_run

    good = tmp_path / "q-adams.h5"
    shutil.copyfile(mixed_dir / "q-adams.h5", good)
    with h5py.File(good, "r") as f:  # the checksums, computed here with zlib from h5py's values
        sums = json.loads(f.attrs["checksums"])
        assert "metrics/train_loss" in sums and "metrics/step" in sums and "eval/val_loss" in sums
        assert sums["metrics/train_loss"] == zlib.crc32(f["metrics/train_loss"][()].astype("<f8").tobytes())
        assert sums["metrics/step"] == zlib.crc32(f["metrics/step"][()].astype("<i8").tobytes())
    assert len(load_run(good).steps) == 30
    flipped = tmp_path / "q-flipped.h5"
    shutil.copyfile(good, flipped)
    with h5py.File(flipped, "r+") as f:
        loss = f["metrics/train_loss"]
        loss[7] = np.nextafter(loss[7], np.inf)  # one bit of one value
    with pytest.raises(RunFileError, match="checksum mismatch in 'metrics/train_loss'"):
        load_run(flipped)
    proc = subprocess.run([sys.executable, "-m", "analysis", "report", str(tmp_path), "--out", str(tmp_path / "rep")],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "q-flipped.h5: checksum mismatch in 'metrics/train_loss'" in proc.stderr
    assert "1 run file(s) read" in (tmp_path / "rep" / "summary.md").read_text(encoding="utf-8")


def test_foreign_attributes_are_named_not_raised_as_tracebacks(mixed_dir, tmp_path):
    """A file whose attributes scape would not write (a config that is a JSON list, an empty
    array where scape writes one number) is a RunFileError naming the file, which the report
    names and skips, not an IndexError or AttributeError out of the reader."""
    import numpy as np
    from analysis.runs import RunFileError, load_run

    cases = {"config-list.h5": ("config", "[]", r"the 'config' attribute is not a JSON object \(a list\)"),
             "empty-steps.h5": ("steps_completed", np.zeros(0, dtype=np.int64),
                                r"cannot be read as a run file \(IndexError")}
    for name, (attr, value, message) in cases.items():
        path = tmp_path / name
        shutil.copyfile(mixed_dir / "q-adams.h5", path)
        with h5py.File(path, "r+") as f:
            f.attrs[attr] = value
        with pytest.raises(RunFileError, match=re.escape(str(path)) + ": " + message):
            load_run(path)
    proc = subprocess.run([sys.executable, "-m", "analysis", "report", str(tmp_path), "--out", str(tmp_path / "rep")],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in proc.stderr
    assert "config-list.h5: the 'config' attribute is not a JSON object" in proc.stderr


def test_without_the_library_a_child_reads_first(mixed_dir, tmp_path, monkeypatch):
    """Where h5py's libhdf5 cannot be found (no /proc/self/maps), a file that needs SWMR is read
    by a child within a time limit first: a killed file still opens, a damaged one fails in time."""
    from analysis import runs

    monkeypatch.setattr(runs, "_hdf5_library", lambda: None)
    monkeypatch.setattr(runs, "SWMR_PROBE_TIMEOUT_S", 3.0)
    killed = tmp_path / "k.h5"
    shutil.copyfile(mixed_dir / "q-killed.h5", killed)
    with runs.open_run_file(killed) as f:
        assert f.attrs["status"] == "running"
    flipped, _ = damaged_copies(killed, tmp_path, seed=1, flips=4)
    start = time.monotonic()
    failed = 0
    for name in flipped:
        try:
            with runs.open_run_file(tmp_path / name) as f:
                f.visit(lambda n: f[n])
        except (OSError, RuntimeError, KeyError):
            failed += 1
    assert failed >= 3
    assert time.monotonic() - start < 4 * 4
