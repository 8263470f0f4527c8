"""The collectives of the torch-native optimizers over any torch.distributed process group
(gloo, NCCL), with every rank relative to the group and every byte counted from the tensors
handed to torch.distributed.

Sums are taken in rank order: each owner receives the W contributions to its segment (one
all_to_all_single), adds them as x_0 + x_1 + ... + x_{W-1} in fp32 and divides by W, which is
the C++ core's mean_in_rank_order (core/communicator.cpp). The result is then bit-identical
whatever the segmentation, bucketing or backend, and an all-reduce is that reduce-scatter plus
an all-gather: 2(W-1)/W of the payload sent per rank, the ring all-reduce's volume.

Counting: a rank "sends" what it hands the collective for the other ranks and "receives" what
lands from them; its own segment moves no bytes.

Exit: a collective started asynchronously (SCAPE's lagged mask all-gather) may still be in
flight when a script ends without opt.finish(), and a gloo process group that Python's exit
tears down, instead of destroy_process_group(), aborted here ("terminate called without an
active exception": 7 in 10 runs under load with a collective in flight, 2 in 10 with none, in
plain torch). So at interpreter exit every collective these optimizers started is waited for
and, if the process group is still initialized, it is destroyed, as torch asks every program
to do (tested: 20 runs without finish(), none aborts)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import atexit
import os
import time
import weakref

import torch
import torch.distributed as dist

_IN_FLIGHT: "weakref.WeakSet" = weakref.WeakSet()  # works started async_op, not yet waited for
_USED = {"distributed": False}


@atexit.register
def _leave_cleanly() -> None:
    for work in list(_IN_FLIGHT):
        try:
            work.wait()
        except Exception:  # a peer already gone: exiting is all that is left
            pass
    if _USED["distributed"] and dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass


@dataclass
class ByteCount:
    """Bytes a rank sent and received since the last take_count(), and by purpose the bytes
    sent and the wall seconds its blocking collectives took (a call started with async_op is
    not timed here: its wait is, where the optimizer waits for it)."""
    sent: int = 0
    received: int = 0
    by_purpose: Dict[str, int] = field(default_factory=dict)
    seconds_by_purpose: Dict[str, float] = field(default_factory=dict)

    def add(self, purpose: str, sent: int, received: int) -> None:
        self.sent += sent
        self.received += received
        self.by_purpose[purpose] = self.by_purpose.get(purpose, 0) + sent

    def add_seconds(self, purpose: str, seconds: float) -> None:
        self.seconds_by_purpose[purpose] = self.seconds_by_purpose.get(purpose, 0.0) + seconds

    def metrics(self) -> Dict[str, float]:
        """bytes_sent_<purpose> and comm_time_measured_<purpose> (the run file's names for
        the MPI runtime's same figures, so that `scape predict --calibrate` reads both)."""
        out: Dict[str, float] = {f"bytes_sent_{p}": sent for p, sent in sorted(self.by_purpose.items())}
        out.update({f"comm_time_measured_{p}": s for p, s in sorted(self.seconds_by_purpose.items())})
        return out


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _split(n: int, workers: int) -> List[int]:
    """Near-equal contiguous segments of n elements for the rank-order all-reduce."""
    base, extra = divmod(n, workers)
    return [base + (1 if r < extra else 0) for r in range(workers)]


class Group:
    """A process group seen from this rank. `group=None` with torch.distributed uninitialized
    is a group of one: every collective is a local copy and counts no bytes."""

    def __init__(self, group=None):
        self.group = group
        self.distributed = dist.is_available() and dist.is_initialized()
        if group is not None and not self.distributed:
            raise ValueError("group: a process group was given but torch.distributed is not initialized")
        world = os.environ.get("WORLD_SIZE", "1")
        if not self.distributed and world.isdigit() and int(world) > 1:
            raise ValueError(f"group: torch.distributed is not initialized, but WORLD_SIZE is {world} (torchrun): "
                             f"every rank would train alone. Build the optimizer after "
                             f"torch.distributed.init_process_group (with the HF Trainer, after TrainingArguments)")
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.size = dist.get_world_size(group) if self.distributed else 1
        self.backend = str(dist.get_backend(group)) if self.distributed else "none"
        _USED["distributed"] = _USED["distributed"] or self.distributed
        self.count = ByteCount()

    def global_rank(self, group_rank: int) -> int:
        if not self.distributed or self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def take_count(self) -> ByteCount:
        out, self.count = self.count, ByteCount()
        return out

    def broadcast_from_first(self, t: torch.Tensor) -> None:
        if self.size <= 1:
            return
        if self.backend == "gloo" and t.device.type != "cpu":
            host = t.cpu()
            dist.broadcast(host, src=self.global_rank(0), group=self.group)
            t.copy_(host)
            return
        dist.broadcast(t, src=self.global_rank(0), group=self.group)

    def all_to_all(self, send: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
                   purpose: str, async_op: bool = False):
        """all_to_all_single with uneven splits; returns (received, work or None)."""
        recv = torch.empty(sum(recv_splits), dtype=send.dtype, device=send.device)
        if self.size == 1:
            recv.copy_(send)
            return recv, None
        item = send.element_size()
        self.count.add(purpose, item * (sum(send_splits) - send_splits[self.rank]),
                       item * (sum(recv_splits) - recv_splits[self.rank]))
        started = time.perf_counter()
        if self.backend == "gloo" and send.device.type != "cpu":
            # gloo moves host memory only: stage through it (one GPU shared by several ranks)
            host = torch.empty(recv.numel(), dtype=recv.dtype)
            dist.all_to_all_single(host, send.cpu(), output_split_sizes=list(recv_splits),
                                   input_split_sizes=list(send_splits), group=self.group)
            recv.copy_(host)
            self.count.add_seconds(purpose, time.perf_counter() - started)
            return recv, None
        work = dist.all_to_all_single(recv, send, output_split_sizes=list(recv_splits),
                                      input_split_sizes=list(send_splits), group=self.group, async_op=async_op)
        if work is not None:
            _IN_FLIGHT.add(work)
        else:  # blocking: on gloo it has completed; on NCCL this is the host's time to enqueue it
            self.count.add_seconds(purpose, time.perf_counter() - started)
        return recv, work

    def reduce_scatter_mean(self, payload: torch.Tensor, counts: Sequence[int], purpose: str,
                            extra: Optional[torch.Tensor] = None):
        """Owner r receives the rank-order mean of everyone's payload[seg_r] (counts[r] values
        each, in order). `extra` (a few values every rank sends to every rank, such as the
        non-finite flag) is returned as a [W, len(extra)] tensor beside it."""
        w, me = self.size, self.rank
        e = 0 if extra is None else extra.numel()
        if e:
            parts = torch.split(payload, list(counts))
            send = torch.cat([torch.cat((p, extra)) for p in parts])
        else:
            send = payload
        recv, _ = self.all_to_all(send, [c + e for c in counts], [counts[me] + e] * w, purpose)
        rows = recv.view(w, counts[me] + e)
        out = rows[0, :counts[me]].clone()
        for r in range(1, w):
            out.add_(rows[r, :counts[me]])
        out.div_(float(w))
        extras = rows[:, counts[me]:] if e else None
        return out, extras

    def all_gather_uneven(self, own: torch.Tensor, counts: Sequence[int], purpose: str,
                          async_op: bool = False):
        """Everyone's `own` (counts[r] elements from rank r), concatenated in rank order."""
        send = own.repeat(self.size) if self.size > 1 else own
        return self.all_to_all(send, [own.numel()] * self.size, list(counts), purpose, async_op)

    def all_reduce_mean(self, payload: torch.Tensor, purpose: str, extra: Optional[torch.Tensor] = None):
        """The rank-order mean of everyone's payload on every rank (a reduce-scatter over
        near-equal segments, then an all-gather), and the [W, e] extras."""
        counts = _split(payload.numel(), self.size)
        mine, extras = self.reduce_scatter_mean(payload, counts, purpose, extra)
        if self.size == 1:
            return mine, extras
        full, _ = self.all_gather_uneven(mine, counts, purpose)
        return full, extras

    def all_gather_scalars(self, value: torch.Tensor, purpose: str) -> torch.Tensor:
        """One value from every rank, in rank order (the clip norm's partial sums)."""
        out, _ = self.all_gather_uneven(value.reshape(1), [1] * self.size, purpose)
        return out
