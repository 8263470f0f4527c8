"""steps.csv, the netlab's table of measured and predicted steps (docs/NETLAB.md): its columns,
one definition for the writers (torch_bench, mpi_bench, torch_predict, scaling) and the reader
(tables). One row per (runtime, method, workers, rate); `exposed_comm_ms` is the median over a
run's steps of analysis.breakdown's exposed communication (the torch runtime measures its own,
torch_bench says how)."""
import csv
import os

COLUMNS = ["runtime", "method", "workers", "rate_mbit", "measured_step_ms", "predicted_step_ms",
           "exposed_comm_ms", "bytes_per_step"]
# `scripts/netlab strong-scaling` adds the compute and the scaling against the fewest nodes and dense.
SCALING_COLUMNS = COLUMNS + ["compute_ms", "efficiency", "speedup_vs_dense"]


def read(path):
    """The rows of a steps.csv as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def append(path, rows):
    """Appends rows (dicts with COLUMNS), with the header when the file is new."""
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def rewrite(path, rows, columns=None):
    """Writes rows anew (predictions filled in), in `columns` or the rows' own order."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns or list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
