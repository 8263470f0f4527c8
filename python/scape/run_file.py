"""scape.run_file: the run file (docs/run-files.md) of a training loop scape does not drive, e.g.
a PyTorch loop stepping scape.torch.SCAPE, for `python3 -m analysis report` to read as it reads
`scape run`'s:

    with RunFileWriter("runs/gpt.h5", config=config, tensors=[(n, p.numel()) for n, p in named]) as log:
        for t in range(1, T + 1):
            log.write_step(t, {"train_loss": loss, "lr": lr, "bytes_sent": sent, "mask_density": d})
        log.close("completed", final_params=flat_params)

The layout is run_file/recorder.cpp's (layout_version 1); as there, the file is in SWMR-write mode
between flushes, so a killed loop leaves every flushed step readable with h5py.File(path, "r",
swmr=True), status "running". Unlike `scape run`, it stores the config as given: filling in the
defaults needs the C++ extension, and this module imports only h5py and numpy. So it marks the
file `config_as_given` instead of writing scape's `optimizer_keys` table: the table tells the
analysis which keys of a resolved config the run's optimizer does not read, and a config as
given holds only the keys its loop gave (scape.torch's `opt.config()` gives those it reads).
"""
from __future__ import annotations

import fcntl
import importlib.metadata
import json
import math
import operator
import os
import socket
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence, Tuple

import h5py
import numpy as np

LAYOUT_VERSION = 1
STATUSES = ("completed", "diverged", "failed")  # what close() records; an unclosed file says "running"
ALIASES = {"loss": "train_loss", "density": "mask_density", "jaccard": "mask_jaccard"}

_ROW_CHUNK = 512              # rows per chunk of a step table, as the C++ recorder's
_TENSOR_CHUNK_VALUES = 8192   # 64 KiB of float64 per /tensors chunk
_PARAM_CHUNK = 1 << 20        # 4 MiB of float32 per /final/params chunk

# name:unit:combine of train/metric_table.cpp's columns, in its order. Every file has those `scape run`
# writes for every optimizer (NaN where not given); the others only when a loop logs them.
_COLUMNS = [tuple(c.split(":")) for c in (
    "train_loss:1:mean lr:1:worker0 grad_norm:1:rank0 bytes_sent:bytes:worker0 comm_time_model:s:worker0 "
    "comm_time_exposed:s:worker0 compute_time:s:mean compute_time_model:s:rank0 step_time_model:s:rank0 "
    "target_density:1:worker0 mask_density:1:worker0 mask_jaccard:1:worker0 mask_oracle_overlap:1:rank0 "
    "mask_energy_capture:1:rank0 fill_in:1:worker0 residual_norm:1:mean residual_max:1:max "
    "residual_to_param:1:mean residual_clipped_norm:1:mean staleness_mean:steps:mean staleness_p99:steps:max "
    "staleness_max:steps:max update_norm:1:worker0 update_max:1:worker0 update_sign_flip:1:worker0 "
    "nonfinite_grads:count:sum mask_codec_time:s:mean optimizer_time:s:mean compute_wall_time:s:max "
    "optimizer_wall_time:s:max aggregate_time:s:rank0 record_time:s:rank0").split()]
_OPTIONAL = [tuple(c.split(":")) for c in "compute_device_time:s:max mask_wait_exposed:s:max "
             "grad_wait_exposed:s:max bytes_sent_:bytes:worker0 comm_time_measured_:s:max".split()]
_TENSOR_METRICS = [("residual_norm", "1", "mean"), ("mask_density", "1", "worker0"), ("mask_jaccard", "1", "worker0")]


def _describe(dataset, name: str, table=None) -> None:
    """The unit and combine attributes of scape's columns (their doc is docs/run-files.md's)."""
    for n, unit, combine in table or _COLUMNS + _OPTIONAL:
        if n == name or n[-1] == "_" and name.startswith(n):
            dataset.attrs["unit"], dataset.attrs["combine"] = unit, combine.replace("0", " 0")
            return


def _scape_version() -> str:
    try:  # the extension's when the loop loaded it (never imported here), else the package's
        return str(getattr(sys.modules.get("scape._core"), "version", None) or importlib.metadata.version("scape"))
    except importlib.metadata.PackageNotFoundError:  # a source checkout on PYTHONPATH
        return "unknown"


def _git_sha() -> str:
    # As the C++ build records it (12 digits, -dirty when tracked files differ); unknown outside
    # scape's own checkout, since an installed copy may sit in some other repository.
    def git(*args):
        return subprocess.run(["git", "--no-optional-locks", "-C", str(Path(__file__).resolve().parent), *args],
                              capture_output=True, text=True, timeout=20, check=True).stdout.splitlines()
    try:
        top, sha = git("rev-parse", "--show-toplevel", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, ValueError, subprocess.SubprocessError):
        return "unknown"
    return sha + "-dirty" * bool(dirty) if (Path(top) / "run_file" / "recorder.cpp").is_file() else "unknown"


def _take_lock(path: Path, error):
    """The run file's lock, as `scape run` takes it (run_file/run_lock.hpp): flock(2) on
    `<file>.lock`, which holds "pid host" so that a refused writer can name the holder. The
    kernel drops it when its holder exits, so a lock file a killed writer left is taken over."""
    lock = Path(str(path) + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode(errors="replace").split()
        os.close(fd)
        named = f"pid {holder[0]} on host {holder[1]}" if len(holder) >= 2 else "another process"
        raise error(f"another writer holds it ({named}, {lock.name}); one writer per run file") from None
    except OSError:  # a filesystem without flock: write on, unguarded, as scape run does
        pass
    left = os.pread(fd, 256, 0).decode(errors="replace").split()
    if len(left) >= 2:
        print(f"{lock.name}: took over the lock of pid {left[0]} on host {left[1]}, which ended without "
              f"releasing it", file=sys.stderr)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    return fd


def _release_lock(path: Path, fd):
    if fd is not None:
        try:
            os.unlink(str(path) + ".lock")
        except OSError:
            pass
        os.close(fd)
    return None


def _write_checksums(path: Path) -> None:
    """The `checksums` root attribute `scape run` writes at close (docs/run-files.md, "Checksums"):
    the CRC-32 of every /metrics, /tensors and /eval table as little-endian int64 or float64."""
    with h5py.File(path, "r+") as f:
        sums = {}
        for group in ("metrics", "tensors", "eval"):
            if group not in f:
                continue
            for name, table in f[group].items():
                if isinstance(table, h5py.Dataset) and not (group == "tensors" and name == "names"):
                    values = table[()].astype("<i8" if table.dtype.kind in "iu" else "<f8")
                    sums[f"{group}/{name}"] = zlib.crc32(np.ascontiguousarray(values).tobytes())
        f.attrs["checksums"] = json.dumps(sums, sort_keys=True)


class RunFileWriter:
    """Writes one run file, buffering rows and flushing them every `flush_interval` steps.

    path     the .h5 file: its folder must exist; an existing one is refused unless `overwrite`
    config   the run config (name, seed, workers, steps, model, optimizer, ...), the `config`
             attribute; model defaults to {"type": "external"}, workers to world_size. The analysis
             compares runs on it: give every key they differ in, and none their optimizer does
             not read (the file says config_as_given, so the analysis keeps every key given).
    tensors  the flat layout as (name, numel) pairs, N their total
    rank     only rank 0 writes; on the others every method returns without touching the file
             system, and close() returns a summary without values (path None)
    As a context manager, an exception leaving the block closes the file as "failed" (the
    exception its error); a normal exit closes it as close() does.
    """

    def __init__(self, path, *, config: Mapping[str, Any], tensors: Sequence[Tuple[str, int]], rank: int = 0,
                 world_size: int = 1, flush_interval: int = 10, overwrite: bool = False):
        self.path = Path(path)
        if not 0 <= rank < world_size or flush_interval < 1:
            raise self._error(f"need 0 <= rank < world_size and flush_interval >= 1, not rank {rank}, "
                              f"world_size {world_size}, flush_interval {flush_interval}")
        self.writes, self.flush_interval = rank == 0, int(flush_interval)
        try:
            self._config_json = json.dumps({"model": {"type": "external"}, "workers": world_size, **config},
                                           indent=2, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise self._error(f"config not representable as JSON: {e}") from None
        self._tensor_names, sizes = [str(t[0]) for t in tensors], [operator.index(t[1]) for t in tensors]
        if not sizes or min(sizes) < 1 or len(set(self._tensor_names)) != len(sizes):
            raise self._error("tensors must be one or more (name, numel) pairs, names distinct, numel >= 1")
        self.n_params, self._columns = sum(sizes), [c[0] for c in _COLUMNS]
        self._rows, self._last_step, self._last_eval, self._diverged_at = 0, -1, -1, None
        self._pending, self._pending_eval, self._summary, self._file = [], [], None, None
        self._lock = None
        self._totals = {"bytes_sent": [0.0, 0], "mask_jaccard": [0.0, 0], "step_time_model": [0.0, 0]}
        self._last = {"train_loss": math.nan, "val_loss": math.nan}
        if not self.writes:
            return
        if not self.path.parent.is_dir():
            raise self._error(f"its folder '{self.path.parent}' does not exist")
        if self.path.is_dir() or (self.path.exists() and not overwrite):
            raise self._error("is a folder" if self.path.is_dir() else
                              "the file exists; choose another path, or pass overwrite=True to replace it")
        self._lock = _take_lock(self.path, self._error)
        try:
            self._create()
        except BaseException:
            self._lock = _release_lock(self.path, self._lock)
            raise

    def _error(self, problem: str) -> ValueError:
        return ValueError(f"run file '{self.path}': {problem}")

    def _create(self) -> None:
        f = h5py.File(self.path, "w", libver="latest")
        try:
            # SWMR-write mode cannot be trusted to create objects: all of the layout is made before
            # it starts, and columns a loop adds later after a reopen (_flush).
            for key, value in (("config", self._config_json), ("status", "running"), ("steps_completed", 0),
                               ("error", ""), ("scape_version", _scape_version()), ("git_sha", _git_sha()),
                               ("layout_version", LAYOUT_VERSION), ("config_as_given", 1)):
                f.attrs[key] = np.int64(value) if isinstance(value, int) else value
            for group in ("metrics", "eval"):
                f.create_dataset(f"{group}/step", (0,), maxshape=(None,), chunks=(_ROW_CHUNK,), dtype="<i8")
            for name in self._columns:
                self._new_column(f, name)
            f.create_dataset("eval/val_loss", (0,), maxshape=(None,), chunks=(_ROW_CHUNK,), dtype="<f8")
            f.create_dataset("tensors/names", data=self._tensor_names, dtype=h5py.string_dtype())
            count = len(self._tensor_names)
            rows = min(max(_TENSOR_CHUNK_VALUES // count, 1), _ROW_CHUNK)
            for name, _, _ in _TENSOR_METRICS:
                _describe(f.create_dataset(f"tensors/{name}", (0, count), maxshape=(None, count), dtype="<f8",
                                           chunks=(rows, count), fillvalue=np.nan), name, _TENSOR_METRICS)
            f.flush()
            f.swmr_mode = True
        except BaseException:
            f.close()
            raise
        self._file = f

    def _new_column(self, f, name: str) -> None:
        # NaN-filled: the rows written before a column existed read "does not apply".
        _describe(f.create_dataset(f"metrics/{name}", (self._rows,), maxshape=(None,), chunks=(_ROW_CHUNK,),
                                   dtype="<f8", fillvalue=np.nan), name)

    def _reopen(self) -> h5py.File:  # closed and opened plainly, where datasets can be created
        self._file, file = None, self._file
        file.close()
        self._file = h5py.File(self.path, "r+", libver="latest")
        return self._file

    def _live(self) -> bool:  # whether this rank writes; raises once the file is closed
        if self.writes and self._file is None:
            raise self._error("already closed")
        return self.writes

    def _number(self, key: str, value: Any) -> float:
        try:
            return math.nan if value is None else float(value)
        except (TypeError, ValueError, RuntimeError):  # RuntimeError: a torch tensor of several values
            raise self._error(f"metric {key!r}: {value!r} is not a number") from None

    def write_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Adds the row of `step` (increasing; scape counts from 1); flushes every `flush_interval` rows.

        `metrics` maps docs/run-files.md's column names (train_loss, lr, bytes_sent, mask_density,
        mask_jaccard, residual_norm, bytes_sent_<purpose>, ...; or ALIASES) to numbers; None and NaN
        are written as NaN, and so are columns not given; other names get a column of their own.
        `val_loss` goes to write_eval. A true `diverged`, a non-finite train_loss or nonfinite_grads
        > 0 marks the run diverged (see close). The /tensors rows are NaN.
        """
        if not self._live():
            return
        step = operator.index(step)
        if step < 0 or step <= self._last_step:
            raise self._error(f"steps must be non-negative and increase: step {step} after {self._last_step}")
        row, val_loss, diverged = {}, None, False
        for key, value in metrics.items():
            if key in ("diverged", "val_loss"):
                diverged = diverged or (key == "diverged" and bool(value))
                val_loss = self._number(key, value) if key == "val_loss" else val_loss
                continue
            name = ALIASES.get(key, key)
            if not isinstance(name, str) or name in ("", ".", "step") or "/" in name or name in row:
                raise self._error(f"metric name {key!r} is empty, 'step', contains '/' or names a column twice")
            row[name] = self._number(key, value)
            # None says "no loss"; NaN or inf says it blew up, as scape run reads it.
            diverged = diverged or (name == "train_loss" and value is not None and not math.isfinite(row[name]))
        if val_loss is not None:  # before the row is taken, as it may refuse the step
            self.write_eval(step, val_loss)
        if (diverged or row.get("nonfinite_grads", 0) > 0) and self._diverged_at is None:
            self._diverged_at = step
        self._pending.append((step, row))
        self._last_step, self._last["train_loss"] = step, row.get("train_loss", math.nan)
        for name, total in self._totals.items():
            if math.isfinite(row.get(name, math.nan)):
                total[0], total[1] = total[0] + row[name], total[1] + 1
        if len(self._pending) >= self.flush_interval:
            self._flush()

    def write_eval(self, step: int, val_loss: float) -> None:
        """Adds a validation loss at `step` (increasing), written with the next flush."""
        if not self._live():
            return
        step = operator.index(step)
        if step < 0 or step <= self._last_eval:
            raise self._error(f"eval steps must be non-negative and increase: step {step} after {self._last_eval}")
        self._last_eval, self._last["val_loss"] = step, self._number("val_loss", val_loss)
        self._pending_eval.append((step, self._last["val_loss"]))

    def _flush(self) -> None:
        new = list(dict.fromkeys(n for _, row in self._pending for n in row if n not in self._columns))
        if new:
            f = self._reopen()
            for name in new:
                self._new_column(f, name)
            self._columns += new
            f.flush()
            f.swmr_mode = True
        f, k, r0 = self._file, len(self._pending), self._rows
        if k:
            for name in self._columns:
                f[f"metrics/{name}"].resize((r0 + k,))
                f[f"metrics/{name}"][r0:] = [row.get(name, math.nan) for _, row in self._pending]
            for name, _, _ in _TENSOR_METRICS:  # NaN-filled, as a dense optimizer's
                f[f"tensors/{name}"].resize(r0 + k, axis=0)
            f["metrics/step"].resize((r0 + k,))  # last: its length counts complete rows
            f["metrics/step"][r0:] = [s for s, _ in self._pending]
        if self._pending_eval:
            e0 = f["eval/step"].shape[0]
            for name, column in (("val_loss", 1), ("step", 0)):
                f[f"eval/{name}"].resize((e0 + len(self._pending_eval),))
                f[f"eval/{name}"][e0:] = [e[column] for e in self._pending_eval]
            self._pending_eval = []
        f.flush()
        if k:
            # Rewritten only once the rows are on the file: steps_completed promises them.
            f.attrs.modify("steps_completed", np.int64(self._pending[-1][0]))
            f.flush()
            self._rows, self._pending = r0 + k, []

    def close(self, status: str = "completed", error: str = "", final_params=None) -> dict:
        """Flushes, records `status` (completed, diverged or failed) and `error`, writes `final_params`
        (N float32 values, a CPU array) as /final/params and closes. A run a step marked diverged
        that closes as "completed" is recorded as `scape run` records it: "diverged", no final params.
        Returns scape.Simulator.close's summary (status, error, steps_completed, final_val_loss,
        final_train_loss, bytes_per_step, mean_mask_jaccard, step_time_model, n_params) and path.
        """
        if self._summary is not None:
            return self._summary
        if status not in STATUSES:
            raise self._error(f"status {status!r} is not one of {', '.join(STATUSES)}")
        if status == "completed" and self._diverged_at is not None:
            status, error = "diverged", f"non-finite loss or gradient at step {self._diverged_at}"
        if self._live():
            keep = final_params is not None and status != "diverged"  # a CUDA tensor raises TypeError here
            params = np.asarray(final_params, dtype=np.float32).reshape(-1) if keep else None
            if params is not None and params.size != self.n_params:
                raise self._error(f"final_params has {params.size} values, the layout {self.n_params}")
            try:
                self._flush()
                if params is not None:
                    self._reopen().create_dataset("final/params", data=params, fillvalue=np.float32(np.nan),
                                                  chunks=(min(params.size, _PARAM_CHUNK),))
                self._file.attrs.modify("status", status)
                self._file.attrs.modify("error", str(error))
                self._file.flush()
            finally:
                if self._file is not None:
                    self._file.close()  # leaves SWMR-write mode: from now on the file opens plainly
                    self._file = None
            _write_checksums(self.path)
            self._lock = _release_lock(self.path, self._lock)
        mean = {name: (t[0] / t[1] if t[1] else math.nan) for name, t in self._totals.items()}
        self._summary = {"status": status, "error": str(error), "steps_completed": max(self._last_step, 0),
                         "final_val_loss": self._last["val_loss"], "final_train_loss": self._last["train_loss"],
                         "bytes_per_step": mean["bytes_sent"], "mean_mask_jaccard": mean["mask_jaccard"],
                         "step_time_model": mean["step_time_model"], "n_params": self.n_params,
                         "path": str(self.path) if self.writes else None}
        return self._summary

    def __enter__(self) -> "RunFileWriter":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if self._summary is None and (self._file is not None or not self.writes):
            self.close(*(("failed", f"{kind.__name__}: {exc}" if str(exc) else kind.__name__) if exc else ()))
        return False
