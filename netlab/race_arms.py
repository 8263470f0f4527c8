"""The race's model, corpus and arms on one node (netlab/race_node.py builds them; the venv's
torch). Each arm is a training step over this rank's batch plus the bytes this rank sent in it:

- the DDP arms all-reduce every gradient inside backward (torch's own bucketed ring); their bytes
  are computed from the tensor shapes as a ring all-reduce sends them, 2 (W-1)/W of the payload;
  PowerSGD's are its P and Q of every matrix it compresses (torch's own rule: r (n + m) *
  min_compression_rate < n m), the rest whole, after its first dense step;
- scape.torch's arms count their own bytes from the tensors they send (`last_metrics`);
- torchft's DiLoCo runs as python/tests/torchft_diloco_worker.py drives it, without a lighthouse:
  a stand-in for the part of torchft's Manager that DiLoCo calls (its all-reduce as the mean over
  this gloo group, every commit granted), which counts the ring bytes of what it all-reduces.

The local-SGD arms use AdamW inner steps (scape.torch's inner="adamw"; torch.optim.AdamW inside
torchft), so they differ from the DDP AdamW arm only in how they communicate."""
import os
import pathlib

import numpy as np
import torch
import torch.distributed as dist

import scape.torch as st
from netlab import race_plan

ROOT = pathlib.Path(__file__).resolve().parents[1]
BETAS = (0.9, 0.95)
OUTER = {"outer_lr": 0.7, "outer_momentum": 0.9}  # DiLoCo's published outer step, here and in torchft's arm


def char_corpus(paths=None):
    """The bytes of race_plan.corpus_paths (or `paths`) as a char-level corpus: the tokens
    (indices into the sorted set of bytes present) and the vocabulary size."""
    paths = paths or race_plan.corpus_paths(ROOT)
    data = np.frombuffer(b"".join(pathlib.Path(p).read_bytes() for p in paths), dtype=np.uint8)
    alphabet = np.unique(data)
    lookup = np.zeros(256, dtype=np.int64)
    lookup[alphabet] = np.arange(alphabet.size)
    return lookup[data], int(alphabet.size)


def param_groups(model):
    """nanoGPT's groups: matrices decayed, biases and LayerNorm gains not."""
    named = list(model.named_parameters())
    return [{"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0}]


POWERSGD_START = 2  # torch's start_powerSGD_iter: the steps before it compresses


def ring_bytes(elements, world, element_size=4):
    """What one rank sends in a ring all-reduce of `elements` values."""
    return 2 * (world - 1) / world * element_size * elements


def powersgd_elements(model, rank, min_rate=2.0):
    """The values torch's PowerSGD hook all-reduces a step once compressing: P and Q (rank r) of
    every tensor it compresses (viewed as shape[0] x rest), every other tensor whole."""
    total = 0
    for p in model.parameters():
        n = p.shape[0] if p.dim() >= 2 else 1
        m = p.numel() // n
        compressed = (n + m) * rank
        total += compressed if p.dim() >= 2 and compressed * min_rate < n * m else p.numel()
    return total


class Arm:
    """One arm's training step on this rank: step(x, y) -> (loss, bytes sent in it)."""

    def __init__(self, net, opt, bytes_of_step, finish=None):
        self.net, self.opt, self._bytes, self._finish = net, opt, bytes_of_step, finish

    def step(self, t, x, y, loss_fn):
        self.opt.zero_grad(set_to_none=True)
        loss = loss_fn(self.net(x), y)
        loss.backward()
        self.opt.step()
        return float(loss.detach()), self._bytes(t)

    def finish(self):
        if self._finish:
            self._finish()


def _scape_bytes(opt):
    return lambda t: float(opt.last_metrics["bytes_sent"])


def ddp_arm(model, lr, world, powersgd_rank=0):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    dense = ring_bytes(sum(p.numel() for p in model.parameters()), world)
    if not powersgd_rank:
        net = torch.nn.parallel.DistributedDataParallel(model)
        return net, torch.optim.AdamW(param_groups(model), lr=lr, betas=BETAS), lambda t: dense
    # One bucket: the hook chains each bucket's P and Q all-reduces through futures, and on gloo
    # the callbacks of one bucket and the next bucket's hook run on different threads, so with
    # two buckets the ranks can issue them in different orders (gloo then aborts: "Received data
    # size doesn't match expected size"). A cap above the model puts every gradient in one.
    cap_mb = 4 * sum(p.numel() for p in model.parameters()) / 2 ** 20 + 1  # fp32 gradients, MiB
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    # start_powerSGD_iter=2: torch's minimum with error feedback. The hook all-reduces plainly
    # while its counter (0 at first, +1 after each step's last bucket) is below it: steps 1 and 2.
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=powersgd_rank,
                                   start_powerSGD_iter=POWERSGD_START, min_compression_rate=2)
    net.register_comm_hook(state, powersgd.powerSGD_hook)
    compressed = ring_bytes(powersgd_elements(model, powersgd_rank), world)
    return net, torch.optim.AdamW(param_groups(model), lr=lr, betas=BETAS), lambda t: dense if t <= POWERSGD_START else compressed


class _Done:
    def wait(self, timeout=None):
        return True

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(None)
        return future


class CountingManager:
    """The part of torchft.manager.Manager that torchft.local_sgd.DiLoCo calls, over this gloo
    group: all-reduce is the mean over the ranks (torchft's own reduction), every commit granted
    (no failures here), and the ring bytes of each all-reduce are counted."""
    _use_async_quorum = False

    def __init__(self, world):
        self.world, self.step, self.sent = world, 0, 0.0

    def allreduce(self, tensor, should_quantize=False, reduce_op=None):
        dist.all_reduce(tensor)
        tensor.div_(self.world)
        self.sent += ring_bytes(tensor.numel(), self.world, tensor.element_size())
        return _Done()

    def should_commit(self, timeout=None):
        self.step += 1
        return True

    def current_step(self):
        return self.step

    def num_participants(self):
        return self.world

    def errored(self):
        return None

    def start_quorum(self, *args, **kwargs):
        pass

    def allow_state_dict_read(self):
        pass

    def disallow_state_dict_read(self):
        pass

    def register_state_dict_fn(self, *args, **kwargs):
        pass


def torchft_arm(model, lr, world, sync_every):
    from torchft.local_sgd import DiLoCo
    inner = torch.optim.AdamW(param_groups(model), lr=lr, betas=BETAS)
    outer = torch.optim.SGD(model.parameters(), lr=OUTER["outer_lr"], momentum=OUTER["outer_momentum"], nesterov=True)
    manager = CountingManager(world)
    diloco = DiLoCo(manager, [model], inner, outer, sync_every=sync_every)
    diloco.__enter__()
    counted = [0.0]

    def sent(t):  # this step's share: what the manager counted since the last step
        now, counted[0] = manager.sent - counted[0], manager.sent
        return now
    return model, inner, sent, lambda: diloco.__exit__(None, None, None)


def scape_arm(arm, model, lr, total):
    groups = param_groups(model)
    if arm == "adams":
        opt = st.AdamS(groups, lr=lr, betas=BETAS)
    elif arm.startswith("scape-"):
        groups[1]["sparsity"] = 0.0  # biases and gains sent dense, as the example does
        opt = st.SCAPE(groups, lr=lr, betas=BETAS, sparsity={"scape-90": 0.9, "scape-99": 0.99}[arm])
    elif arm == "sparseloco":
        opt = st.SparseLoCo(groups, lr=lr, betas=BETAS, inner="adamw", inner_steps=10, sparsity=0.99,
                            quant_bits=2, total_steps=total)
    else:
        h, fragments = {"diloco-h10": (10, 1), "diloco-h50": (50, 1), "diloco-streaming": (50, 5)}[arm]
        opt = st.DiLoCo(groups, lr=lr, betas=BETAS, inner="adamw", inner_steps=h, streaming_fragments=fragments,
                        total_steps=total, **OUTER)
    return model, opt, _scape_bytes(opt), opt.finish


def build(arm, model, lr, total, world):
    """The Arm `arm` (a name of race_plan.ARMS) training `model` at peak rate `lr` over `total` steps."""
    if arm == "ddp-adamw":
        return Arm(*ddp_arm(model, lr, world))
    if arm.startswith("ddp-powersgd-r"):
        return Arm(*ddp_arm(model, lr, world, powersgd_rank=int(arm.rsplit("r", 1)[1])))
    if arm == "torchft-diloco":
        return Arm(*torchft_arm(model, lr, world, sync_every=10))
    return Arm(*scape_arm(arm, model, lr, total))


def threads():
    """One core a node: the netlab pins each node to its own core."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
