"""Command line of the analysis package: `/usr/bin/python3 -m analysis report RUNS... --out DIR`."""

import argparse
import math
import sys
from pathlib import Path

_DESCRIPTION = """\
Analysis of scape run files (HDF5, docs/run-files.md).

  report DIR_OR_FILES... --out OUTDIR
      Reads every *.h5 below the given folders (and the files given), groups the runs by the
      settings that differ between them, writes PNG figures, OUTDIR/summary.md (also printed)
      and OUTDIR/summary.csv; with two or more settings also the equal-bytes comparison,
      OUTDIR/pareto.png and pareto.csv (loss against bytes per worker per step, seeds
      averaged, each method at its best lr chosen as in the seed tables below, Pareto
      front; analysis/pareto.py). Runs still in progress and diverged runs
      are drawn up to their last recorded step; failed runs are listed, not drawn; files that
      are not run files (not HDF5, another layout) are named with the reason.

      Seeds and learning rates: runs equal but for seed and optimizer.lr form an arm (whether
      the sweep used repeat/lr_search or an explicit grid). When an arm holds several runs, the
      summary adds per arm: the best lr (lowest mean final validation loss over the seeds every
      lr ran), mean, std and 95% Student-t interval over seeds, the paired difference from the
      reference arm (same seed) with its interval, and the tokens to reach a target validation loss; also
      OUTDIR/seeds.csv and seeds.png (the band over seeds).
        --reference KEY=VALUE[,KEY=VALUE]  the reference arm (default optimizer.type=adams, at
                                           its best lr; add optimizer.lr=X to pin its lr)
        --target-loss X                    target validation loss (default: the reference's worst
                                           final validation loss over its seeds + --target-margin,
                                           so every reference seed reaches it)
        --target-margin M                  default 0.05 (nats)
        --band ci|minmax                   the band drawn over seeds (default ci: 95% interval)
      Arms at two or more horizons (runs that differ in steps and eval.interval only) add the
      horizon section: per arm and horizon the updates per coordinate (steps x density), the
      paired gap to the reference, the steps to the target, and within the longer runs the steps
      to each shorter horizon's reference loss (analysis/horizon.py); also OUTDIR/horizon.png.
      Runs of the MPI or NCCL runtime (measured columns) add a section with the measured step
      broken into forward/backward, the optimizer's own kernels, each blocking collective and
      the wait for the lagged mask all-gather (means over the steady steps; analysis/breakdown.py),
      OUTDIR/breakdown.csv and breakdown.png.
      --cluster PREDICTION.json (repeatable): the time to the target on that cluster, relative to
      the reference: each arm's measured tokens to target times `scape predict`'s step time for
      its optimizer on the config's model and cluster at its largest worker count, paired by seed
      (analysis/time_to_target.py); also OUTDIR/time_to_target.csv. Needs the scape binary.
      --cluster-overlap: each cluster also with the per-step methods' collectives bucketed into
      the backward and next forward pass (overlap.grad_reduce, param_gather, sparse_reduce on),
      which leaves their arithmetic as it ran; the local-SGD delayed outer step changes the
      arithmetic and is its own arm (optimizer.overlap_outer).
      --no-figures writes summary.md and the CSV files only.

  archive DIR_OR_FILES... --out OUTDIR [--block-steps K] [--keep-tensors]
      Compact copies of ended run files, to keep or publish a sweep (analysis/archive.py,
      docs/run-files.md "Archives"): the same layout and file names, root attributes and
      validation curve as they are, every per-step series as its mean over blocks of K steps
      (default 50; means over all steps stay exact when K divides the steps), the per-tensor
      tables dropped unless --keep-tensors, everything compressed: a 16000-step run of sweep 16
      goes from about 10 MB to tens of kilobytes. `report` reads archives as run files. Files still
      running, archives and existing non-archive targets are refused with the reason; an
      archive already up to date is left as it is. Exit 0 when every file was archived or up
      to date, 1 when some could not be, 2 for bad arguments.

Exit status (report): 0 when at least one run file was read, 1 when none was (nothing usable),
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
    r.add_argument("--reference", default="optimizer.type=adams", metavar="KEY=VALUE[,KEY=VALUE]",
                   help="the arm each arm is compared with, seed by seed (default: %(default)s, at its best lr; "
                        "optimizer.lr=X in it pins the lr)")
    r.add_argument("--target-loss", type=float, default=None, metavar="X",
                   help="target validation loss of 'tokens to target' (default: the reference's worst final "
                        "validation loss over its seeds + --target-margin)")
    r.add_argument("--target-margin", type=float, default=0.05, metavar="M",
                   help="added to the reference's worst final validation loss for the default target "
                        "(default: %(default)s nats)")
    r.add_argument("--band", choices=("ci", "minmax"), default="ci",
                   help="band over seeds in seeds.png: 95%% Student-t interval (ci, default) or min-max")
    r.add_argument("--cluster", action="append", default=[], metavar="PREDICTION.json",
                   help="a scape predict config (experiments/configs/predict/): add the predicted time to the "
                        "target on its cluster, relative to the reference (repeatable)")
    r.add_argument("--cluster-overlap", action="store_true",
                   help="predict each --cluster also with bucketed overlap on (overlap.grad_reduce, "
                        "param_gather, sparse_reduce)")
    r.add_argument("--no-figures", action="store_true",
                   help="write summary.md and the CSV files only (drawing takes seconds per figure)")
    a = sub.add_parser("archive", help="compact copies of ended run files (block means, compressed)",
                       description="Compact copies of ended run files: root attributes and the validation curve "
                                   "as they are, per-step series as means over blocks of steps, compressed.")
    a.add_argument("inputs", nargs="+", metavar="DIR_OR_FILE", help="run files or folders holding them (*.h5)")
    a.add_argument("--out", required=True, metavar="OUTDIR", help="folder for the archives (same file names)")
    a.add_argument("--block-steps", type=int, default=50, metavar="K",
                   help="steps averaged into one row (default: %(default)s)")
    a.add_argument("--keep-tensors", action="store_true",
                   help="keep the per-tensor tables (as block means); dropped by default")
    return p


def archive_main(args):
    """`archive`: 2 for bad arguments, 1 when some file could not be archived, else 0."""
    from .archive import archive_runs
    if args.block_steps < 1:
        print(f"analysis: archive: --block-steps {args.block_steps}: expected a positive number of steps",
              file=sys.stderr)
        return 2
    done, problems = archive_runs(args.inputs, args.out, args.block_steps, args.keep_tensors)
    for item in done:
        if item.outcome == "up to date":
            print(f"{item.target}: up to date")
        else:
            print(f"{item.target}: {item.rows_before} rows -> {item.rows_after}, "
                  f"{item.bytes_before / 1e6:.2f} MB -> {item.bytes_after / 1e6:.3f} MB")
    for _, msg in problems:
        print(f"analysis: archive: {msg}", file=sys.stderr)
    if not done and not problems:
        print(f"analysis: archive: no run file in {', '.join(args.inputs)}", file=sys.stderr)
        return 1
    return 1 if problems else 0


def main(argv=None):
    """Runs the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # a summary with µ and × must not crash on an ASCII terminal
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    if args.command == "archive":
        return archive_main(args)
    from .report import write_report  # heavy imports after argument parsing (fast --help)
    from .runs import ScapeBinaryError
    from .stats import parse_reference

    try:
        parse_reference(args.reference)
        if args.cluster_overlap and not args.cluster:
            raise ValueError("--cluster-overlap: give the clusters with --cluster")
        for cluster in args.cluster:
            if not Path(cluster).is_file():
                raise ValueError(f"--cluster {cluster}: no such file")
        for name, value in (("--target-loss", args.target_loss), ("--target-margin", args.target_margin)):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} {value}: expected a finite number")
    except ValueError as e:
        print(f"analysis: {e}", file=sys.stderr)
        return 2
    try:
        report, text = write_report(args.inputs, args.out, args.reference, args.target_loss, args.target_margin,
                                    args.band, figures=not args.no_figures, clusters=args.cluster,
                                    cluster_overlap=args.cluster_overlap)
    except (ScapeBinaryError, ValueError) as e:
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
