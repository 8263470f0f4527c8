"""Reading scape run files (docs/run-files.md) into plain Python and numpy objects.

`load_run(path)` is the entry point for notebooks::

    from analysis import load_run
    run = load_run("runs/quickstart-1a2b3c.h5")
    run.config["optimizer"]["type"], run.metrics["train_loss"], run.val_loss

Files are opened plainly first (`open_run_file`); only a file whose plain open fails (its writer
is still running, or was killed before it closed the file) is opened in SWMR mode, with HDF5's
metadata retries bounded so that a damaged file fails in milliseconds instead of hanging.
"""

import contextlib
import ctypes
import functools
import json
import math
import os
import shutil
import socket
import subprocess
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

LAYOUT_VERSION = 1
"""The run-file layout this module reads (the `layout_version` root attribute)."""

DENSE_TYPES = ("adamw", "adams")
SPARSE_TYPES = ("scape", "topk_ef", "randk_ef")

REPO = Path(__file__).resolve().parents[1]
_BUILD_PRESETS = ("release", "cpu-only", "debug")
"""Build folders of this checkout (CMakePresets.json) searched for the scape binary."""


class RunFileError(Exception):
    """A file that cannot be analysed as a run file; the message names the file and says why."""


class ScapeBinaryError(Exception):
    """The scape binary is missing or failed where it was needed: for the optimizer-key table of run
    files without the `optimizer_keys` attribute (`key_types`), or for `report --cluster`."""


def scape_binary():
    """The scape binary: $SCAPE_BINARY, else a build of this checkout, else `scape` on PATH."""
    if os.environ.get("SCAPE_BINARY"):
        return os.environ["SCAPE_BINARY"]
    for preset in _BUILD_PRESETS:
        candidate = REPO / "build" / preset / "apps" / "scape"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("scape")
    if on_path:
        return on_path
    raise ScapeBinaryError("found no scape binary: set SCAPE_BINARY=/path/to/scape, build this checkout "
                           f"(build/{{{','.join(_BUILD_PRESETS)}}}/apps/scape) or put scape on PATH")


@functools.lru_cache(maxsize=None)
def optimizer_key_types():
    """{optimizer key: the optimizer types that read it}, from the "x-applies-to" of `scape schema`.

    Only for run files without the `optimizer_keys` attribute (written before scape recorded it):
    `key_types(run)` reads the file's own table first, so a report of current files never runs
    the binary. Raises ScapeBinaryError when no binary can say.
    """
    binary = scape_binary()
    try:
        proc = subprocess.run([binary, "schema"], capture_output=True, text=True, timeout=60, check=True)
        keys = json.loads(proc.stdout)["properties"]["optimizer"]["properties"]
        return {key: frozenset(spec["x-applies-to"]) for key, spec in keys.items()}
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
        raise ScapeBinaryError(f"`{binary} schema` did not say which optimizer keys apply to which optimizer "
                               f"({type(e).__name__}: {e}); set SCAPE_BINARY to a current scape") from None


@dataclass
class Run:
    """One run file: its resolved config, root attributes and recorded series.

    `metrics` maps each /metrics/<name> to a float array aligned with `metrics["step"]`; NaN
    means "does not apply". `eval_step`/`val_loss` are empty for models without validation
    (quadratic, replay). `tensors` maps a per-tensor metric to a [steps x tensors] array whose
    columns are named by `tensor_names`.
    """

    path: Path
    config: dict
    status: str
    steps_completed: int
    error: str
    scape_version: str
    git_sha: str
    metrics: dict = field(default_factory=dict)
    eval_step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    val_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tensor_names: list = field(default_factory=list)
    tensors: dict = field(default_factory=dict)
    optimizer_keys: dict = None
    """{optimizer key: frozenset of the optimizer types that read it}: the file's `optimizer_keys`
    attribute, None when it has none (files written before it existed, and RunFileWriter's)."""
    config_as_given: bool = False
    """The `config_as_given` attribute: the config is as its writer gave it, not resolved by scape
    (scape.run_file.RunFileWriter), so it holds no default its optimizer does not read."""
    archive_block_steps: int = 1
    """Steps each per-step row stands for: 1 in a run file, K in an archive (analysis/archive.py),
    whose rows are means over blocks of K steps."""

    @property
    def name(self):
        """The config's run name (several runs of a sweep usually share it)."""
        return self.config.get("name", self.path.stem)

    @property
    def optimizer_type(self):
        return self.config.get("optimizer", {}).get("type", "?")

    @property
    def is_dense(self):
        return self.optimizer_type in DENSE_TYPES

    @property
    def steps(self):
        """Recorded step numbers (int)."""
        return self.metrics.get("step", np.zeros(0, dtype=np.int64))

    def metric(self, name):
        """The series `name`, or an all-NaN array of the right length when the file lacks it."""
        if name in self.metrics:
            return self.metrics[name]
        return np.full(len(self.steps), np.nan)

    def wall_clock(self):
        """Modelled wall-clock time in seconds at the end of each recorded step (cumsum of
        step_time_model, each row weighted by the steps it stands for: 1, or its block in an archive)."""
        steps = self.steps
        weights = np.diff(np.concatenate([[0], steps])) if self.archive_block_steps > 1 else np.ones(len(steps))
        return np.cumsum(np.nan_to_num(self.metric("step_time_model"), nan=0.0) * weights)


def _text(value):
    """HDF5 string attributes come back as str or bytes depending on how they were written."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value[()])
    return str(value)


def _check_layout(path, attrs):
    """Refuses files of another layout with a message that says which layout they have."""
    if "layout_version" not in attrs:
        raise RunFileError(f"{path}: older run-file layout (no 'layout_version' attribute); "
                           f"this analysis reads layout {LAYOUT_VERSION} — re-run it with the current scape")
    version = int(np.asarray(attrs["layout_version"]).reshape(-1)[0])
    if version != LAYOUT_VERSION:
        raise RunFileError(f"{path}: run-file layout_version {version}; this analysis reads layout "
                           f"{LAYOUT_VERSION} — use the analysis scripts of the scape that wrote it")
    if "config" not in attrs or "status" not in attrs:
        raise RunFileError(f"{path}: HDF5 file without the 'config'/'status' attributes of a scape run file")


def _read_key_types(path, attrs):
    """The `optimizer_keys` attribute as {key: frozenset(types)}, None when the file has none."""
    if "optimizer_keys" not in attrs:
        return None
    try:
        table = json.loads(_text(attrs["optimizer_keys"]))
        if not isinstance(table, dict) or not all(isinstance(v, list) for v in table.values()):
            raise ValueError("expected a JSON object of lists")
        return {str(key): frozenset(str(t) for t in types) for key, types in table.items()}
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise RunFileError(f"{path}: the 'optimizer_keys' attribute is not {{key: [optimizer types]}} ({e})") from None


def _read_series(group, length_from="step"):
    """Reads every 1-D dataset of `group`, cut to a common length.

    A file whose writer is running can be read between the extension of two datasets; cutting
    to the shortest keeps the rows aligned.
    """
    series = {name: group[name][()] for name in group if isinstance(group[name], h5py.Dataset)}
    if not series:
        return {}
    n = min(len(v) for v in series.values())
    out = {}
    for name, values in series.items():
        values = values[:n]
        out[name] = values.astype(np.int64) if name == length_from else values.astype(np.float64)
    return out


def _read_tensors(group):
    """Per-tensor metrics: names plus [steps x tensors] arrays (empty when absent)."""
    if group is None or "names" not in group:
        return [], {}
    names = [_text(n) for n in group["names"][()]]
    tensors = {k: group[k][()].astype(np.float64) for k in group if k != "names"}
    return names, tensors


SWMR_READ_ATTEMPTS = 24
"""HDF5's metadata read attempts for an SWMR open (its default is 100). HDF5 sleeps between
attempts, doubling from 1 ns up to an hour, so 100 attempts on a damaged file take hours; 24 take
at most 2^24 ns (17 ms) per damaged block, which is still time for a live writer to finish one."""

SWMR_OPEN_TRIES = 10
SWMR_RETRY_SLEEP_S = 0.2
"""A file whose writer is alive (`writer_alive`) is opened up to this many times, this far apart,
before it is given up: its writer can be between two metadata writes."""


def lock_holder(path):
    """(pid, host) written in the `<run file>.lock` of a scape writer, or None when there is none."""
    try:
        words = Path(str(path) + ".lock").read_text(errors="replace").split()
        return int(words[0]), words[1]
    except (OSError, ValueError, IndexError):
        return None


def writer_alive(path):
    """True when `<path>.lock` names a writer that is alive: a live pid on this host, or any pid on
    another host (which this process cannot check)."""
    holder = lock_holder(path)
    if holder is None:
        return False
    pid, host = holder
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


@functools.lru_cache(maxsize=None)
def _hdf5_library():
    """The libhdf5 that h5py uses (found among the loaded libraries), or None where it cannot be
    found (no /proc/self/maps); its H5Pset_metadata_read_attempts bounds an SWMR open."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libhdf5" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if "_hl" in Path(path).name:
            continue
        try:
            lib = ctypes.CDLL(path)
            lib.H5Pset_metadata_read_attempts.argtypes = [ctypes.c_int64, ctypes.c_uint]
            lib.H5Pset_metadata_read_attempts.restype = ctypes.c_int
            return lib
        except (OSError, AttributeError):
            continue
    return None


SWMR_PROBE_TIMEOUT_S = 10.0
"""Where h5py's HDF5 library cannot be found to bound its retries: the seconds a child process
gets to read the whole file in SWMR mode before this process opens it so."""


def _swmr_reads_in_time(path):
    """Whether a child process reads every dataset of `path` in SWMR mode within SWMR_PROBE_TIMEOUT_S."""
    import sys
    probe = ("import h5py, sys\nwith h5py.File(sys.argv[1], 'r', swmr=True) as f:\n"
             "    f.visititems(lambda n, o: o[()] if isinstance(o, h5py.Dataset) else None)")
    try:
        return subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True,
                              timeout=SWMR_PROBE_TIMEOUT_S).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _open_swmr_bounded(path):
    """An SWMR open whose metadata reads give up after SWMR_READ_ATTEMPTS attempts (where the
    library is not found: after a child read the whole file in time)."""
    lib = _hdf5_library()
    if lib is None:
        if not _swmr_reads_in_time(path):
            raise OSError(f"an SWMR read did not end within {SWMR_PROBE_TIMEOUT_S:g} s (a damaged file)")
        return h5py.File(path, "r", swmr=True)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)
    if lib.H5Pset_metadata_read_attempts(fapl.id, SWMR_READ_ATTEMPTS) < 0:
        raise OSError("H5Pset_metadata_read_attempts failed")
    fid = h5py.h5f.open(os.fsencode(str(path)), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl=fapl)
    return h5py.File(fid)


@contextlib.contextmanager
def open_run_file(path):
    """Opens a run file for reading without ever waiting on HDF5's retries.

    First a plain open, which HDF5 never retries. A file whose writer's flags are set (a live or
    killed writer) refuses it and is opened in SWMR mode with bounded retries; one whose writer is
    alive (`writer_alive`) is tried SWMR_OPEN_TRIES times. Raises OSError when it cannot be opened.
    The body runs outside the retry loop: an error reading the file is raised as it is.
    """
    try:
        f = h5py.File(path, "r")
    except OSError as plain_error:
        f = None
        tries = SWMR_OPEN_TRIES if writer_alive(path) else 1
        for attempt in range(tries):
            try:
                f = _open_swmr_bounded(path)
                break
            except OSError as e:
                if attempt + 1 == tries:
                    raise (plain_error if str(e) == str(plain_error) else OSError(f"{plain_error}; in SWMR mode: {e}")) from None
                time.sleep(SWMR_RETRY_SLEEP_S)
    with f:
        yield f


def _verify_checksums(path, f):
    """Checks the tables against the `checksums` root attribute scape writes when it closes a run
    file (docs/run-files.md, "Checksums"): CRC-32 of each table's values as little-endian float64
    (int64 for integer tables). Raises RunFileError naming the first table that differs."""
    text = _text(f.attrs.get("checksums", ""))
    if not text:
        return
    try:
        sums = json.loads(text)
        if not isinstance(sums, dict):
            raise ValueError("expected a JSON object")
    except ValueError as e:
        raise RunFileError(f"{path}: the 'checksums' attribute is not {{table: CRC-32}} ({e})") from None
    for name, stored in sums.items():
        if name not in f:
            raise RunFileError(f"{path}: checksum mismatch: '{name}' is missing")
        values = f[name][()]
        values = values.astype("<i8" if values.dtype.kind in "iu" else "<f8")
        if zlib.crc32(np.ascontiguousarray(values).tobytes()) != stored:
            raise RunFileError(f"{path}: checksum mismatch in '{name}': its values differ from those scape wrote "
                               "when it closed the file")


def load_run(path):
    """Reads one run file; raises RunFileError (with the file name and the reason) when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise RunFileError(f"{path}: no such file")
    try:
        if not h5py.is_hdf5(str(path)):
            raise RunFileError(f"{path}: not an HDF5 file")
        with open_run_file(path) as f:
            attrs = f.attrs
            _check_layout(path, attrs)
            _verify_checksums(path, f)
            try:
                config = json.loads(_text(attrs["config"]))
            except json.JSONDecodeError as e:
                raise RunFileError(f"{path}: the 'config' attribute is not valid JSON ({e})") from None
            if not isinstance(config, dict):
                raise RunFileError(f"{path}: the 'config' attribute is not a JSON object "
                                   f"(a {type(config).__name__})")
            metrics = _read_series(f["metrics"]) if "metrics" in f else {}
            evals = _read_series(f["eval"]) if "eval" in f else {}
            names, tensors = _read_tensors(f.get("tensors"))
            n = len(metrics.get("step", []))
            tensors = {k: v[:n] for k, v in tensors.items()}
            return Run(path=path, config=config, status=_text(attrs["status"]),
                       steps_completed=int(np.asarray(attrs.get("steps_completed", n)).reshape(-1)[0]),
                       error=_text(attrs.get("error", "")), scape_version=_text(attrs.get("scape_version", "")),
                       git_sha=_text(attrs.get("git_sha", "")), metrics=metrics,
                       eval_step=evals.get("step", np.zeros(0, dtype=np.int64)),
                       val_loss=evals.get("val_loss", np.zeros(0)), tensor_names=names, tensors=tensors,
                       optimizer_keys=_read_key_types(path, attrs),
                       config_as_given=bool(np.asarray(attrs.get("config_as_given", 0)).reshape(-1)[0]),
                       archive_block_steps=int(np.asarray(attrs.get("archive_block_steps", 1)).reshape(-1)[0]))
    except RunFileError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, IndexError, AttributeError) as e:
        # IndexError: an attribute that is an empty array where scape writes one number
        raise RunFileError(f"{path}: cannot be read as a run file ({type(e).__name__}: {e})") from None


def find_run_files(inputs):
    """Expands folders (every *.h5 below them, sorted) and keeps files as given.

    Returns (files, problems) where problems lists (path, reason) for inputs that do not exist.
    Checkpoints (`RUN.h5.ckpt`) do not end in .h5 and are skipped.
    """
    files, problems = [], []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files.extend(sorted(q for q in p.rglob("*.h5") if q.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            problems.append((p, f"{p}: no such file or folder"))
    seen, unique = set(), []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, problems


def load_runs(inputs):
    """Loads every run file under `inputs`; returns (runs, problems) and never raises for a bad file."""
    files, problems = find_run_files(inputs)
    runs = []
    for f in files:
        try:
            runs.append(load_run(f))
        except RunFileError as e:
            problems.append((f, str(e)))
    return runs, problems


def flatten(config, prefix=""):
    """{"optimizer": {"lr": 1}} -> {"optimizer.lr": 1}; lists become tuples (hashable)."""
    out = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, dotted + "."))
        elif isinstance(value, list):
            out[dotted] = tuple(value)
        else:
            out[dotted] = value
    return out


_MAX_NAMED_FILES = 10
"""An error about run files names at most this many of them."""


def _lacking_table_error(paths, cause):
    """ScapeBinaryError naming the run files that need `scape schema`, which `cause` says failed."""
    names = ", ".join(str(p) for p in paths[:_MAX_NAMED_FILES])
    if len(paths) > _MAX_NAMED_FILES:
        names += f" and {len(paths) - _MAX_NAMED_FILES} more"
    return ScapeBinaryError(
        f"{len(paths)} run file(s) lack the 'optimizer_keys' attribute (written by a scape from before it "
        f"recorded which optimizer types read which optimizer key): {names}. For those files the analysis asks "
        f"`scape schema` instead, and that failed: {cause}. Otherwise leave these files out of the report "
        "(files written by a current scape carry the attribute and need no binary).")


def key_types(run):
    """{optimizer key: the optimizer types that read it} for `run`, or None when nothing is to be dropped.

    The file's `optimizer_keys` attribute (scape writes it from its key table); None for a config
    as given (`config_as_given`); for older files `scape schema` (`optimizer_key_types`), raising
    ScapeBinaryError naming the file when no binary can say.
    """
    if run.optimizer_keys is not None:
        return run.optimizer_keys
    if run.config_as_given:
        return None
    try:
        return optimizer_key_types()
    except ScapeBinaryError as e:
        raise _lacking_table_error([run.path], e) from None


def check_key_types(runs):
    """Makes sure `key_types` can answer for every run: raises ScapeBinaryError naming every file
    that lacks the `optimizer_keys` attribute when `scape schema` cannot stand in for it. Runs the
    binary only when some file lacks the attribute."""
    lacking = [r.path for r in runs if r.optimizer_keys is None and not r.config_as_given]
    if lacking:
        try:
            optimizer_key_types()
        except ScapeBinaryError as e:
            raise _lacking_table_error(lacking, e) from None


# Optimizer keys a run file records only away from their defaults (so that older runs keep their
# ids): a run without one ran at the default, which a comparison must see as a value of its own,
# for the types that read the key. (topology.ranks_per_node is not among them: a flat run's
# training does not depend on it, so a run without it still compares with one of nodes of G.)
RECORDED_WHEN_NOT_DEFAULT = {"optimizer.hierarchy": "flat", "optimizer.overlap_grad_reduce": False}


def effective_config(run):
    """The flattened config without keys that do not apply to the run's optimizer or model.

    Optimizer keys go when the run's optimizer type does not read them (`key_types`: the run
    file's `optimizer_keys` attribute, or `scape schema` for older files); the resolved config
    of a run written before such keys were left out still carries every default (a dense AdamS
    run says `sparsity: 0.99`), and comparing runs on keys their optimizer does not read would
    invent differences (and labels) that do not exist. Raw-gradient top-k is always replicated,
    so its `sharded` is no choice either; `name` and `description` are labels and `log.*` says
    what is recorded, not settings of the training; `optimizer.min_lr` is dropped when it is the
    default lr/10. Raises ScapeBinaryError when the run's file lacks the table and no scape
    binary can say which keys apply.
    """
    flat = flatten(run.config)
    kind = run.optimizer_type
    types_of = key_types(run) or {}
    for key, default in RECORDED_WHEN_NOT_DEFAULT.items():
        if kind in types_of.get(key.removeprefix("optimizer."), ()):
            flat.setdefault(key, default)
    if kind in types_of.get("type", ()):
        for key, types in types_of.items():
            if kind not in types:
                flat.pop(f"optimizer.{key}", None)
    if kind in ("topk_ef", "randk_ef", "powersgd", "demo", "diloco", "sparseloco"):
        flat.pop("optimizer.sharded", None)  # always replicated: not a choice, so not a difference
    for key in ("name", "description"):
        flat.pop(key, None)
    for key in [k for k in flat if k.startswith("log.")]:  # what is recorded, not how it trains
        flat.pop(key)
    lr, min_lr = flat.get("optimizer.lr"), flat.get("optimizer.min_lr")
    if isinstance(lr, (int, float)) and isinstance(min_lr, (int, float)) and math.isclose(min_lr, lr / 10,
                                                                                          rel_tol=1e-9):
        flat.pop("optimizer.min_lr")  # the default lr/10 follows lr: not a setting of its own
    return flat


def finite_mean(values):
    """Mean of the finite entries (NaN when there are none)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else math.nan
