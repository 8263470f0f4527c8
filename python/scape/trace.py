"""scape.trace: writes gradient traces that the scape simulator replays (run_file/trace.hpp;
`model.type = "replay"`). It imports only h5py and numpy, and `import scape` loads neither torch
nor the extension, so it runs under Debian's /usr/bin/python3 as well as in the venv.

Format: /layout/names (strings), /layout/sizes (int64), /layout/decay (uint8), /init/params
(float32 [N]) and /grads (float32 [T, W, N], one step per chunk [1, W, N]).

Recording a trace from PyTorch, W workers' gradients per step at shared parameters::

    import numpy as np, torch
    from scape.trace import TraceWriter

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    flat = lambda ts: torch.cat([t.detach().reshape(-1) for t in ts]).float().cpu().numpy()
    with TraceWriter("trace.h5", names=[n for n, _ in named],
                     sizes=[p.numel() for _, p in named],
                     decay=[p.ndim >= 2 for _, p in named],
                     init_params=flat(p for _, p in named), workers=W) as trace:
        for step in range(T):
            grads = []
            for batch in worker_batches(step):          # one micro-batch per worker
                model.zero_grad()
                loss_fn(model(batch)).backward()
                grads.append(flat(p.grad for _, p in named))
            trace.append(np.stack(grads))               # [W, N]
            optimizer.step()                            # whatever trajectory to record along

Demo: ``PYTHONPATH=python /usr/bin/python3 -m scape.trace --demo out.h5`` (from the repository
root; or with the package installed, ``python -m scape.trace --demo out.h5``) writes a small
random trace.
"""

import argparse

import h5py
import numpy as np


class TraceWriter:
    """Creates a trace file and appends one step of all workers' gradients at a time."""

    def __init__(self, path, names, sizes, decay, init_params, workers):
        names = [str(n) for n in names]
        sizes = np.asarray(sizes, dtype=np.int64)
        decay = np.asarray(decay, dtype=np.uint8)
        init_params = np.asarray(init_params, dtype=np.float32).reshape(-1)
        if not (len(names) == sizes.shape[0] == decay.shape[0]):
            raise ValueError(f"{path}: names, sizes and decay must have one entry per tensor")
        if (sizes < 0).any() or sizes.sum() == 0:
            raise ValueError(f"{path}: sizes must be non-negative with a positive sum")
        if int(workers) < 1:
            raise ValueError(f"{path}: workers must be at least 1")
        self.size = int(sizes.sum())
        self.workers = int(workers)
        if init_params.shape[0] != self.size:
            raise ValueError(f"{path}: init_params has {init_params.shape[0]} values, sizes sum to {self.size}")

        self.path = str(path)
        self._file = h5py.File(self.path, "w")
        self._file.create_dataset("layout/names", data=names, dtype=h5py.string_dtype())
        self._file.create_dataset("layout/sizes", data=sizes)
        self._file.create_dataset("layout/decay", data=decay)
        self._file.create_dataset("init/params", data=init_params)
        # One step per chunk: a replaying worker reads a contiguous slice of a single chunk.
        self._grads = self._file.create_dataset(
            "grads", shape=(0, self.workers, self.size), maxshape=(None, self.workers, self.size),
            chunks=(1, self.workers, self.size), dtype=np.float32)

    @property
    def steps(self):
        return self._grads.shape[0]

    def append(self, step_grads):
        """Appends the gradients of every worker for the next step, an array [W, N]."""
        grads = np.asarray(step_grads, dtype=np.float32)
        if grads.shape != (self.workers, self.size):
            raise ValueError(f"{self.path}: step gradients must be [{self.workers}, {self.size}], got {grads.shape}")
        t = self._grads.shape[0]
        self._grads.resize(t + 1, axis=0)
        self._grads[t] = grads

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def write_demo(path, steps=5, workers=4, seed=0):
    """A small random trace: three tensors, Gaussian init and gradients."""
    rng = np.random.default_rng(seed)
    names = ["embed.weight", "block0.weight", "block0.bias"]
    sizes = [64, 128, 16]
    decay = [1, 1, 0]
    init = rng.standard_normal(sum(sizes)).astype(np.float32)
    with TraceWriter(path, names, sizes, decay, init, workers) as trace:
        for _ in range(steps):
            trace.append(rng.standard_normal((workers, sum(sizes))).astype(np.float32) * 0.01)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", metavar="OUT", required=True, help="write a small random trace to OUT")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_demo(args.demo, args.steps, args.workers, args.seed)
    print(f"wrote {args.demo}: {args.steps} steps x {args.workers} workers")


if __name__ == "__main__":
    main()
