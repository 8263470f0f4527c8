"""`scripts/netlab race links --rate R[,R...] --out DIR`: the netlab's link at each rate, timed
the way the race's torch ranks use it, for `scripts/netlab race forecast` (issue 60, docs/NETLAB.md
"Forecasting the race"). Needs root, like the race.

At each rate the nodes come up (`scripts/netlab up`) and netlab/gloo_bench_comm.py times, over
gloo between them, back to back (`busy`) and each after an idle gap of about one step's compute
(`idle`): the collectives scape.torch's optimizers send (DIR/gloo-RATE.h5), and
torch.distributed's own all-reduce, which DDP, its PowerSGD hook and torchft's DiLoCo send
(DIR/gloo-native-RATE.h5). `scape predict --calibrate --links-from-bench` turns each into the
link the forecast predicts those arms with. A file already there is kept (delete it to time
that rate again)."""
import argparse
import os
import subprocess
import sys

from netlab import race_driver

# The race's largest message is DDP's whole fp32 gradient (3.4 MB at the default width): the
# sizes run from 16 KiB past it, by 4.
MAX_BYTES = 8 << 20
# About one step's forward and backward on the race's default model (32-44 ms measured).
IDLE_GAP_MS = 35


def arguments(argv=None):
    p = argparse.ArgumentParser(prog="scripts/netlab race links", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", required=True, help="tc rates, comma-separated (100mbit,1gbit,10gbit)")
    p.add_argument("--out", required=True, help="the folder of the gloo-RATE.h5 files")
    p.add_argument("--nodes", type=int, default=2, help="as the race ran (default %(default)s)")
    p.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="largest payload (default %(default)s)")
    p.add_argument("--idle-gap-ms", type=float, default=IDLE_GAP_MS,
                   help="the idle regime's gap before each call (default %(default)s)")
    p.add_argument("--prefix", default="snl", help="the netlab's prefix (scripts/netlab --help)")
    p.add_argument("--subnet", default="10.77.0", help="the netlab's subnet A.B.C (scripts/netlab --help)")
    p.add_argument("--port", type=int, default=29500)
    args = p.parse_args(argv)
    try:
        args.rates = [(r, race_driver.rate_in_mbit(r)) for r in args.rate.split(",")]
    except ValueError as e:
        p.error(str(e))
    if args.nodes < 2:
        p.error(f"--nodes: at least 2, got {args.nodes}")
    return args


def bench_path(folder, rate, native=False):
    """Where `race links` leaves the gloo bench-comm file of `rate` (a tc rate such as 100mbit):
    scape.torch's collectives, or torch.distributed's all-reduce when `native`."""
    return os.path.join(folder, f"gloo-{'native-' if native else ''}{rate}.h5")


def time_link(args, rate, native):
    out = bench_path(args.out, rate, native)
    if os.path.exists(out):
        print(f"netlab race links: {out} exists: kept", file=sys.stderr)
        return out
    subprocess.run([str(race_driver.DRIVER), "up", "--nodes", str(args.nodes), "--rate", rate, "--prefix", args.prefix,
                    "--subnet", args.subnet], check=True)
    env = race_driver.node_env()
    partial = out + ".partial"
    command = [str(race_driver.DRIVER), "run", "--prefix", args.prefix, "--nodes", str(args.nodes), "--port",
               str(args.port), "--", race_driver.python(), "-m", "netlab.gloo_bench_comm", "--out", partial,
               "--max-bytes", str(args.max_bytes), "--idle-gap-ms", f"{args.idle_gap_ms:g}"]
    command += ["--native-all-reduce"] if native else []
    status = subprocess.run(command, env=env).returncode
    if status != 0:
        race_driver.fail(f"the gloo bench at {rate} failed (exit {status}): {' '.join(command)}", status)
    os.replace(partial, out)  # a killed bench leaves no file the forecast would take for whole
    return out


def main(argv=None):
    args = arguments(argv)
    os.makedirs(args.out, exist_ok=True)
    for rate, _ in args.rates:
        for native in (False, True):
            print(f"netlab race links: {rate}: {time_link(args, rate, native)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
