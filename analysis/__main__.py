"""Command line of the analysis package: `/usr/bin/python3 -m analysis report RUNS... --out DIR`."""

import argparse
import sys

_DESCRIPTION = """\
Analysis of scape run files (HDF5, docs/run-files.md).

  report DIR_OR_FILES... --out OUTDIR
      Reads every *.h5 below the given folders (and the files given), groups the runs by the
      settings that differ between them, writes PNG figures, OUTDIR/summary.md (also printed)
      and OUTDIR/summary.csv; with two or more settings also the equal-bytes comparison,
      OUTDIR/pareto.png and pareto.csv (loss against bytes per worker per step, seeds
      averaged, Pareto front; analysis/pareto.py). Runs still in progress and diverged runs
      are drawn up to their last recorded step; failed runs are listed, not drawn; files that
      are not run files (not HDF5, another layout) are named with the reason.

Exit status: 0 when at least one run file was read, 1 when none was (nothing usable),
2 for bad arguments.
"""


def _parser():
    """argparse parser with the `report` subcommand."""
    p = argparse.ArgumentParser(prog="python3 -m analysis", description=_DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    r = sub.add_parser("report", help="figures and a Markdown summary of run files",
                       description="Figures (PNG), summary.md and summary.csv of scape run files.")
    r.add_argument("inputs", nargs="+", metavar="DIR_OR_FILE", help="run files or folders holding them (*.h5)")
    r.add_argument("--out", required=True, metavar="OUTDIR", help="folder for the figures and summary.md")
    r.add_argument("--quiet", action="store_true", help="do not print summary.md")
    return p


def main(argv=None):
    """Runs the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # a summary with µ and × must not crash on an ASCII terminal
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    from .report import write_report  # heavy imports after argument parsing (fast --help)
    from .runs import ScapeBinaryError

    try:
        report, text = write_report(args.inputs, args.out)
    except ScapeBinaryError as e:
        print(f"analysis: {e}", file=sys.stderr)
        return 1
    if not report.runs:
        for _, msg in report.problems:
            print(f"analysis: {msg}", file=sys.stderr)
        print(f"analysis: no readable run file in {', '.join(args.inputs)}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(text)
    for _, msg in report.problems:
        print(f"analysis: warning: {msg}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
