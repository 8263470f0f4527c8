"""Compact copies of ended run files, to keep or publish a sweep's results (docs/run-files.md, "Archives").

A 16000-step run of the small GPT records 34 per-step series and three per-tensor tables: about
10 MB. An archive keeps what the analysis of a sweep reads and shrinks the rest:

- the root attributes (config, status, steps_completed, ...) and the whole `eval` group as they are;
- every per-step series as its mean over blocks of `block_steps` steps (NaN entries, "does not
  apply", left out of a block's mean; a block of NaN stays NaN), the row's `step` being the last
  step of its block. A mean over all steps (bytes per step, the modelled step time) is therefore
  exact when `block_steps` divides the run's steps, and a sum (`Run.wall_clock`) is exact always;
- the per-tensor tables dropped, or kept as block means with `keep_tensors`;
- every dataset compressed (gzip with the shuffle filter).

The archive is a run file of the same layout with the root attribute `archive_block_steps`, so
`load_run` and `report` read it as they read the original.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from .runs import RunFileError, _text, find_run_files, load_run, open_run_file

ARCHIVE_ATTR = "archive_block_steps"
"""Root attribute of an archive: the steps each per-step row stands for."""

DEFAULT_BLOCK_STEPS = 50


class ArchiveError(Exception):
    """A file that cannot be archived; the message names it and says why."""


@dataclass
class Archived:
    """What `archive_run` did with one file."""

    source: Path
    target: Path
    outcome: str  # "archived" or "up to date"
    rows_before: int = 0
    rows_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def block_means(steps, values, block_steps):
    """(last step of each block, mean of each block's finite-or-infinite entries) over blocks of
    steps ((b-1)K, bK]. `values` is [rows] or [rows x columns]; NaN entries do not count."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if steps.size == 0:
        return steps.copy(), values.copy()
    block = (steps - 1) // block_steps
    starts = np.flatnonzero(np.concatenate([[True], block[1:] != block[:-1]]))
    present = ~np.isnan(values)
    sums = np.add.reduceat(np.where(present, values, 0.0), starts, axis=0)
    counts = np.add.reduceat(present.astype(np.int64), starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    last = np.concatenate([starts[1:], [steps.size]]) - 1
    return steps[last], means


def _is_archive(path):
    with open_run_file(path) as f:
        return ARCHIVE_ATTR in f.attrs


def _same_run_ended_alike(source_attrs, target):
    """True when `target` is an archive of a run with the same config, status and step count."""
    with open_run_file(target) as f:
        return all(key in f.attrs and _text(f.attrs[key]) == _text(source_attrs[key])
                   for key in ("config", "status", "steps_completed") if key in source_attrs)


def _write_compressed(group, name, data):
    data = np.asarray(data)
    if data.size == 0 or data.dtype.kind in "OSU":
        group.create_dataset(name, data=data)
    else:
        group.create_dataset(name, data=data, compression="gzip", compression_opts=9, shuffle=True)


def _copy_archive(src, tmp, block_steps, keep_tensors):
    """Writes the archive of `src` to `tmp`; returns (rows before, rows after)."""
    # The 1.10 file format (compact groups, version-2 B-trees) stores small chunked datasets in a
    # quarter of the space of the earliest format; HDF5 1.10, the version scape builds with, reads it.
    with open_run_file(src) as f, h5py.File(tmp, "w", libver=("v110", "v110")) as out:
        for key, value in f.attrs.items():
            if key != "checksums":  # of the original's tables, not the archive's block means
                out.attrs[key] = value
        out.attrs[ARCHIVE_ATTR] = np.int64(block_steps)
        out.attrs["archive_source"] = Path(src).name
        out.attrs["archive_tensors"] = "block means" if keep_tensors else "dropped"
        rows_before = rows_after = 0
        if "metrics" in f:
            group = f["metrics"]
            names = [n for n in group if isinstance(group[n], h5py.Dataset)]
            n = min(len(group[name]) for name in names) if names else 0
            steps = group["step"][:n].astype(np.int64) if "step" in group else np.arange(1, n + 1)
            metrics = out.create_group("metrics")
            for name in names:
                if name == "step":
                    continue
                last, means = block_means(steps, group[name][:n], block_steps)
                _write_compressed(metrics, name, means)
            last, _ = block_means(steps, np.zeros(n), block_steps)
            _write_compressed(metrics, "step", last)
            rows_before, rows_after = n, len(last)
            if keep_tensors and "tensors" in f and "names" in f["tensors"]:
                tensors = out.create_group("tensors")
                tensors.create_dataset("names", data=f["tensors"]["names"][()])
                for name in f["tensors"]:
                    if name != "names":
                        _write_compressed(tensors, name, block_means(steps, f["tensors"][name][:n], block_steps)[1])
        if "eval" in f:
            evals = out.create_group("eval")
            for name in f["eval"]:
                _write_compressed(evals, name, f["eval"][name][()])
    return rows_before, rows_after


def archive_run(src, out_dir, block_steps=DEFAULT_BLOCK_STEPS, keep_tensors=False):
    """Archives one run file into `out_dir` (same file name). Raises ArchiveError when `src` is not
    an ended run file, is an archive itself, or the target exists and is not an archive; an up-to-date
    archive (same config, status and steps) is left as it is."""
    src, out_dir = Path(src), Path(out_dir)
    if block_steps < 1:
        raise ArchiveError(f"block_steps {block_steps}: expected a positive number of steps")
    try:
        run = load_run(src)
    except RunFileError as e:
        raise ArchiveError(str(e)) from None
    if run.status == "running":
        raise ArchiveError(f"{src}: status 'running': its run is still writing it, or was killed (then "
                           "`scape repair` marks it 'killed'); archive it once its run has ended")
    if _is_archive(src):
        raise ArchiveError(f"{src}: already an archive ({ARCHIVE_ATTR} attribute); archive the original run file")
    target = out_dir / src.name
    if target.exists() and target.resolve() == src.resolve():
        raise ArchiveError(f"{src}: --out is the file's own folder; an archive never replaces its run file")
    with open_run_file(src) as f:
        source_attrs = dict(f.attrs)
    if target.exists():
        try:
            archive = _is_archive(target)
        except OSError as e:
            raise ArchiveError(f"{target}: exists and cannot be read ({e}); not overwritten") from None
        if not archive:
            raise ArchiveError(f"{target}: exists and is not an archive; not overwritten")
        if _same_run_ended_alike(source_attrs, target):
            return Archived(src, target, "up to date")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    try:
        rows_before, rows_after = _copy_archive(src, tmp, block_steps, keep_tensors)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return Archived(src, target, "archived", rows_before, rows_after, src.stat().st_size, target.stat().st_size)


def archive_runs(inputs, out_dir, block_steps=DEFAULT_BLOCK_STEPS, keep_tensors=False):
    """Archives every *.h5 below `inputs`; returns (done, problems), problems as (path, message)."""
    files, problems = find_run_files(inputs)
    done = []
    for path in files:
        try:
            done.append(archive_run(path, out_dir, block_steps, keep_tensors))
        except ArchiveError as e:
            problems.append((path, str(e)))
    return done, problems
