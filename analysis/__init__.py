"""Analysis scripts and helpers for scape run files and gradient traces."""

from .runs import LAYOUT_VERSION, Run, RunFileError, load_run, load_runs  # noqa: E402,F401
