"""Fixtures: small run files made by real `scape run` / `scape sweep` calls.

The scape binary comes from the SCAPE_BINARY environment variable (ctest sets it); without it
every test that needs run files is skipped with that reason.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `python3 -m pytest analysis/tests` from anywhere
    sys.path.insert(0, str(REPO))

import h5py  # noqa: E402

QUADRATIC = {"name": "quad", "seed": 3, "workers": 4, "steps": 30,
             "model": {"type": "quadratic", "size": 4096, "noise": 0.5},
             "optimizer": {"lr": 0.01}, "log": {"flush_interval": 5}}
TINY_GPT = {"name": "gpt", "seed": 1, "workers": 4, "steps": 10,
            "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "vocab_size": 32},
            "data": {"type": "synthetic", "batch_size": 2, "tokens": 20000},
            "optimizer": {"lr": 3e-3}, "eval": {"interval": 5, "batches": 2}, "log": {"flush_interval": 2}}
DIVERGING_LR = 1e10
"""AdamW on the quadratic with this learning rate overflows after a few steps (exit status 3)."""


@pytest.fixture(scope="session")
def scape():
    """Path of the scape binary, or skip."""
    path = os.environ.get("SCAPE_BINARY")
    if not path:
        pytest.skip("SCAPE_BINARY is not set (ctest sets it to the built scape; export it to run these tests)")
    if not os.access(path, os.X_OK):
        pytest.skip(f"SCAPE_BINARY={path} is not an executable file")
    return path


def run_scape(scape, config, out, *sets, expect=0):
    """`scape run` of `config` (a dict) into `out`; checks the exit status."""
    cfg_path = out.with_suffix(".json")
    cfg_path.write_text(json.dumps(config))
    cmd = [scape, "run", str(cfg_path), "--out", str(out), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == expect, f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    cfg_path.unlink()
    return out


def start_and_kill(scape, config, out, min_steps, timeout=60):
    """Starts a long run, waits until at least `min_steps` rows are flushed, kills it with SIGKILL.

    Leaves a run file whose status is still 'running', as a crashed or live run looks.
    """
    from analysis import load_run

    cfg_path = out.with_suffix(".json")
    cfg_path.write_text(json.dumps(config))
    proc = subprocess.Popen([scape, "run", str(cfg_path), "--out", str(out), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if out.exists():
                try:
                    if len(load_run(out).steps) >= min_steps:  # also: a live file reads
                        break
                except Exception:  # noqa: BLE001  the file may be between creation and first flush
                    pass
            assert proc.poll() is None, "the long run ended before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail(f"{out}: fewer than {min_steps} steps flushed after {timeout} s")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    cfg_path.unlink()
    return out


def set_attrs(src, dst, **attrs):
    """Copies a finished run file and edits root attributes (None deletes one)."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        for key, value in attrs.items():
            if value is None:
                del f.attrs[key]
            else:
                f.attrs[key] = value
    return dst


@pytest.fixture(scope="session")
def mixed_dir(scape, tmp_path_factory):
    """A folder as real folders are: completed, diverged, running (killed), failed, old and junk files."""
    d = tmp_path_factory.mktemp("mixed")
    run_scape(scape, QUADRATIC, d / "q-adams.h5", "optimizer.type=adams")
    run_scape(scape, QUADRATIC, d / "q-scape99.h5", "optimizer.type=scape", "optimizer.sparsity=0.99")
    run_scape(scape, QUADRATIC, d / "q-scape90.h5", "optimizer.type=scape", "optimizer.sparsity=0.9")
    run_scape(scape, QUADRATIC, d / "q-diverged.h5", "optimizer.type=adamw", f"optimizer.lr={DIVERGING_LR}", expect=3)
    run_scape(scape, TINY_GPT, d / "g-adams.h5", "optimizer.type=adams")
    run_scape(scape, TINY_GPT, d / "g-scape99.h5", "optimizer.type=scape", "optimizer.sparsity=0.99")
    long_run = dict(QUADRATIC, steps=1000000, log={"flush_interval": 1}, model=dict(QUADRATIC["model"], size=65536))
    long_run["optimizer"] = {"lr": 0.01, "type": "scape", "sparsity": 0.99}
    start_and_kill(scape, long_run, d / "q-killed.h5", min_steps=5)
    # A run that failed midway cannot be provoked from a valid config: take a real file and
    # mark it failed the way the recorder does (status and error attributes).
    set_attrs(d / "q-scape90.h5", d / "q-failed.h5", status="failed", error="step 7: simulated failure")
    bad = d / "bad"
    bad.mkdir()
    set_attrs(d / "q-adams.h5", bad / "old-layout.h5", layout_version=None)
    set_attrs(d / "q-adams.h5", bad / "future-layout.h5", layout_version=2)
    (bad / "notes.h5").write_text("this is not an HDF5 file\n")
    return d


@pytest.fixture(scope="session")
def mixed_report(mixed_dir, tmp_path_factory):
    """The report of mixed_dir, built in-process (figures included)."""
    from analysis.report import write_report

    out = tmp_path_factory.mktemp("mixed-report")
    report, text = write_report([mixed_dir], out)
    return report, text, out


@pytest.fixture(scope="session")
def sweep_dir(scape, tmp_path_factory):
    """A `scape sweep` over workers {2, 4} with dense, partitioned and local-union points."""
    d = tmp_path_factory.mktemp("sweep")
    base = dict(QUADRATIC, steps=12, optimizer={"lr": 0.01, "sharded": False})
    sweep = {"base": base, "grid": {"workers": [2, 4]},
             "points": [{"optimizer.type": "adams"},
                        {"optimizer.type": "scape", "optimizer.sparsity": 0.99},
                        {"optimizer.type": "scape", "optimizer.sparsity": 0.99, "optimizer.mask_partition": "local_union"}]}
    (d / "sweep.json").write_text(json.dumps(sweep))
    proc = subprocess.run([scape, "sweep", str(d / "sweep.json"), "--out", str(d / "runs"), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return d / "runs"


def write_run_file(path, config, val_loss=(), eval_step=(), train_loss=None, status="completed"):
    """A run file of layout 1 written directly with h5py (for statistics known in advance).

    `config` is the resolved config (the analysis reads only what it is given); train_loss
    defaults to one row per step equal to the last validation loss; eval steps default to
    evenly spaced steps ending at config["steps"].
    """
    steps = int(config["steps"])
    val_loss = list(val_loss)
    if val_loss and not eval_step:
        eval_step = [round(steps * (i + 1) / len(val_loss)) for i in range(len(val_loss))]
    if train_loss is None:
        train_loss = [val_loss[-1] if val_loss else 1.0] * steps
    with h5py.File(path, "w") as f:
        f.attrs["layout_version"] = 1
        f.attrs["config"] = json.dumps(config)
        f.attrs["status"] = status
        f.attrs["steps_completed"] = len(train_loss)
        f.attrs["error"] = ""
        m = f.create_group("metrics")
        m["step"] = list(range(1, len(train_loss) + 1))
        m["train_loss"] = [float(x) for x in train_loss]
        if val_loss:
            e = f.create_group("eval")
            e["step"] = [int(s) for s in eval_step]
            e["val_loss"] = [float(x) for x in val_loss]
    return path


def gpt_config(optimizer, seed, lr, **extra):
    """A resolved-looking GPT config for synthetic run files: 2 workers × 4 sequences × 16 tokens a step."""
    config = {"name": "syn", "seed": seed, "workers": 2, "steps": 100,
              "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "vocab_size": 32},
              "data": {"type": "synthetic", "batch_size": 4},
              "optimizer": dict({"type": optimizer, "lr": lr, "sparsity": 0.9, "inner": "adams"}, **extra)}
    return config
