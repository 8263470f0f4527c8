"""SCAPE's sparse reduce overlapped with the backward pass (`overlap_backward=True`), beyond the
paper: under mask lag 1 the mask of step t is known before step t's backward pass, so each
tensor's candidate c = (b1 m_prev + (1-b1) g) + e can be formed, and its mask positions packed,
as soon as its gradient is accumulated (register_post_accumulate_grad_hook). Tensors are
grouped into buckets of about `bucket_bytes` of payload, from the last tensor of the layout to
the first (the order backward produces them), and each bucket's collective starts once the
bucket is complete.

Every rank issues its collectives in one fixed order (bucket 0, 1, ...; a bucket completed
early waits for the ones before it), as the group requires. The reduction is the rank-order
mean of comm.py, elementwise and independent of how the payload is cut, so the result equals
the non-overlapped step bit for bit (python/tests/test_torch_scape.py). Replicated state runs
each bucket as an all-to-all to the segment owners (started in the hook) and an all-gather of
the segment means (started when the next bucket starts, or at step()); sharded state needs
only the first. The non-finite flag rides in the last bucket. Not combined with GradScaler
(the payload leaves before the gradients are unscaled) nor with gradient accumulation (a
tensor's hook firing twice before step() raises).

A gradient changed between its hook and step() (torch.nn.utils.clip_grad_norm_, a hook of the
user's) would be ignored, since its payload has left: step() raises instead, naming the tensor.
The check is cheap: each gradient's tensor and version counter are kept at the hook, and only
a gradient whose version moved is compared with its packed candidate (a clip whose factor
came out 1 changes nothing and passes). SCAPE's own clip_grad clips the reconstructed
gradient and works with the overlap."""
from __future__ import annotations

import time
import weakref
from typing import List, Optional

import torch

from .arith import f32, momentum
from .comm import _split
from .params import local_tensor, trainable_tensors


def _remove_hooks(handles) -> None:
    for handle in handles:
        handle.remove()


class _Bucket:
    def __init__(self, slots: List[int], begin: int, end: int):
        self.slots = slots              # layout slot indices
        self.begin, self.end = begin, end
        self.fired = 0
        self.launched = False
        self.idx: Optional[torch.Tensor] = None
        self.counts: List[int] = []
        self.recv = self.work = None    # phase 1 (to the segment owners)
        self.gathered = self.gather_work = None  # phase 2 (replicated: the means to everyone)
        self.extra = 0
        self.flags = None


class BackwardOverlap:
    def __init__(self, opt, bucket_bytes: int):
        # The hooks live on the user's parameters, which outlive the optimizer: they hold the
        # overlap weakly, the overlap holds the optimizer weakly, and the hooks are removed once
        # the optimizer is gone (a SCAPE replaced by another optimizer must not go on packing).
        self._opt = weakref.ref(opt)
        slots = opt.layout.slots
        self.buckets: List[_Bucket] = []
        current, payload = [], 0.0
        for j in reversed(range(len(slots))):
            s = slots[j]
            density = 1.0 if s.dense else 1.0 - opt.param_groups[s.group]["sparsity"]
            current.append(j)
            payload += 4 * s.numel * density
            if payload >= bucket_bytes:
                self.buckets.append(self._bucket(current))
                current, payload = [], 0.0
        if current:
            self.buckets.append(self._bucket(current))
        self.bucket_of = {}
        for b, bucket in enumerate(self.buckets):
            for j in bucket.slots:
                self.bucket_of[j] = b
        self._reset()
        self.buckets_in_backward = 0  # of the last step: buckets whose collective started before step()
        self.mask_wait = self.last_waited = 0.0  # of the last step: seconds waiting for the mask, the buckets
        self.handles = [p.register_post_accumulate_grad_hook(self._hook(j)) for j, p in enumerate(opt._tensors)]
        weakref.finalize(self, _remove_hooks, self.handles)

    @property
    def opt(self):
        return self._opt()

    def detach(self) -> None:
        """Removes the hooks (the layout changed, a new overlap takes over)."""
        self.abandon()
        _remove_hooks(self.handles)
        self.handles.clear()

    def _bucket(self, slots: List[int]) -> _Bucket:
        layout = self.opt.layout.slots
        return _Bucket(sorted(slots), layout[min(slots)].offset, layout[max(slots)].end)

    def _reset(self) -> None:
        self.active = False
        self.c = self.idx = self.flag = None
        self.fired = set()
        self.seen = {}  # slot -> (gradient tensor, its version) when its candidate was packed
        self.next_launch = 0
        self.waited = 0.0
        self.started_in_backward = 0
        for b in self.buckets:
            b.fired, b.launched, b.idx, b.recv, b.work, b.gathered, b.gather_work, b.flags = (0, False, None, None, None,
                                                                                           None, None, None)

    def in_flight(self) -> bool:
        return self.active

    def abandon(self) -> None:
        """Waits for anything started and forgets this step's buckets."""
        for b in self.buckets:
            for work in (b.work, b.gather_work):
                if work is not None:
                    work.wait()
        self._reset()

    # ----- during backward --------------------------------------------------------------------
    def _hook(self, j: int):
        overlap = weakref.ref(self)

        def on_gradient(param: torch.Tensor) -> None:
            live = overlap()
            if live is not None and live.opt is not None:
                live._gradient_ready(j, param)
        return on_gradient

    def _begin(self) -> bool:
        opt = self.opt
        # Step 1, and the first step after a change of layout, choose their mask from their own
        # gradient: nothing to overlap.
        if [id(p) for p in trainable_tensors(opt.param_groups)] != [id(p) for p in opt._tensors]:
            return False
        if not opt._mask_known(opt._t + 1):
            return False
        waited = time.perf_counter()
        opt._wait_next_mask()
        self.mask_wait = time.perf_counter() - waited
        self.active = True
        self.idx = opt._mask_indices()
        self.c = opt._spare
        self.flag = torch.zeros(1 + len(opt._tensors), dtype=torch.float32, device=opt.device)
        bounds = torch.tensor([b.begin for b in self.buckets] + [b.end for b in self.buckets],
                              dtype=self.idx.dtype, device=self.idx.device)
        cuts = torch.searchsorted(self.idx, bounds).tolist()
        nb = len(self.buckets)
        for b, bucket in enumerate(self.buckets):
            bucket.idx = self.idx[cuts[b]:cuts[nb + b]]
        return True

    @torch.no_grad()
    def _gradient_ready(self, j: int, param: torch.Tensor) -> None:
        if not self.active and not self._begin():
            return
        if j in self.fired:
            name = self.opt.layout.slots[j].name
            raise RuntimeError(f"overlap_backward: the gradient of {name} was accumulated twice before step(); "
                               f"gradient accumulation needs overlap_backward=False")
        self.fired.add(j)
        self._candidate(j, param.grad)
        bucket = self.buckets[self.bucket_of[j]]
        bucket.fired += 1
        launched = self.next_launch
        self._launch_ready()
        self.started_in_backward += self.next_launch - launched

    def _candidate(self, j: int, grad: Optional[torch.Tensor]) -> None:
        s = self.opt.layout.slots[j]
        if grad is not None:
            local = local_tensor(grad).detach()
            self.flag[0] = torch.maximum(self.flag[0], (~torch.isfinite(local).all()).float())
            self.flag[1 + j] = 1.0
            self.seen[j] = (grad, grad._version)
        self._pack(j, grad, self.c[s.offset:s.end])

    def _pack(self, j: int, grad: Optional[torch.Tensor], c: torch.Tensor) -> None:
        """Slot j's candidate c = (b1 m_prev + (1-b1) g) + e from the gradient `grad`."""
        opt, s = self.opt, self.opt.layout.slots[j]
        omb1 = f32(1.0 - opt.beta1)
        g = torch.zeros(s.numel, dtype=torch.float32, device=opt.device) if grad is None else \
            local_tensor(grad).detach().reshape(-1).float()
        if opt.sharded:
            torch.mul(g, omb1, out=c)
        else:
            c.copy_(momentum(opt._m[s.offset:s.end], g, f32(opt.beta1), omb1))
        if opt.residual:
            c.add_(opt._e[s.offset:s.end])

    def _changed_gradients(self) -> list:
        """Names of the tensors whose gradient changed after its payload was packed."""
        changed = []
        for j, (grad, version) in self.seen.items():
            p = self.opt._tensors[j]
            if p.grad is grad and grad._version == version:
                continue
            s = self.opt.layout.slots[j]
            now = torch.empty(s.numel, dtype=torch.float32, device=self.opt.device)
            self._pack(j, p.grad, now)
            if not torch.equal(now, self.c[s.offset:s.end]):
                changed.append(s.name)
        return changed

    def _launch_ready(self) -> None:
        while self.next_launch < len(self.buckets):
            bucket = self.buckets[self.next_launch]
            if bucket.fired < len(bucket.slots):
                return
            self._launch(self.next_launch)
            self.next_launch += 1

    def _launch(self, b: int) -> None:
        opt, comm = self.opt, self.opt.comm
        if b > 0 and not opt.sharded:
            self._gather_means(self.buckets[b - 1])
        bucket = self.buckets[b]
        last = b == len(self.buckets) - 1
        payload = self.c.index_select(0, bucket.idx)
        if opt.sharded:
            lo = torch.tensor([r[0] for r in opt.layout.shard_ranges[1:]], dtype=bucket.idx.dtype,
                              device=bucket.idx.device)
            cuts = [0] + torch.searchsorted(bucket.idx, lo).tolist() + [bucket.idx.numel()]
            bucket.counts = [cuts[r + 1] - cuts[r] for r in range(comm.size)]
        else:
            bucket.counts = _split(payload.numel(), comm.size)
        bucket.extra = self.flag.numel() if last else 0
        if bucket.extra:
            parts = torch.split(payload, bucket.counts)
            send = torch.cat([torch.cat((p, self.flag)) for p in parts])
        else:
            send = payload
        purpose = "grad_reduce_scatter" if opt.sharded else "grad_all_reduce"
        me = comm.rank
        send_splits = [c + bucket.extra for c in bucket.counts]
        recv_splits = [bucket.counts[me] + bucket.extra] * comm.size
        bucket.recv, bucket.work = comm.all_to_all(send, send_splits, recv_splits, purpose, async_op=True)
        bucket.launched = True

    def _segment_mean(self, bucket: _Bucket):
        if bucket.work is not None:
            started = time.perf_counter()
            bucket.work.wait()
            self.waited += time.perf_counter() - started
            bucket.work = None
        w, me = self.opt.comm.size, self.opt.comm.rank
        rows = bucket.recv.view(w, bucket.counts[me] + bucket.extra)
        mean = rows[0, :bucket.counts[me]].clone()
        for r in range(1, w):
            mean.add_(rows[r, :bucket.counts[me]])
        return mean.div_(float(w)), (rows[:, bucket.counts[me]:] if bucket.extra else None)

    def _gather_means(self, bucket: _Bucket) -> None:
        mean, bucket.flags = self._segment_mean(bucket)
        bucket.gathered, bucket.gather_work = self.opt.comm.all_gather_uneven(mean, bucket.counts, "grad_all_reduce",
                                                                              async_op=True)

    # ----- at step() --------------------------------------------------------------------------
    @torch.no_grad()
    def finish(self):
        """Starts what backward left (tensors without a gradient count as zeros), waits for
        every bucket, and returns (t, c, idx, reduced, flags) as the plain step's exchange."""
        opt = self.opt
        for j, p in enumerate(opt._tensors):
            if j not in self.fired:
                self.fired.add(j)
                self._candidate(j, p.grad)
                self.buckets[self.bucket_of[j]].fired += 1
        self._launch_ready()
        parts, flags = [], None
        if opt.sharded:
            for bucket in self.buckets:
                mean, extra = self._segment_mean(bucket)
                parts.append(mean)
                flags = extra if extra is not None else flags
        else:
            self._gather_means(self.buckets[-1])
            for bucket in self.buckets:
                started = time.perf_counter()
                bucket.gather_work.wait() if bucket.gather_work is not None else None
                self.waited += time.perf_counter() - started
                parts.append(bucket.gathered)
                flags = bucket.flags if bucket.flags is not None else flags
        reduced = torch.cat(list(reversed(parts)))  # buckets run from the end of the layout
        changed = self._changed_gradients()
        if changed:
            self._reset()
            raise ValueError(f"overlap_backward: the gradient of {', '.join(changed[:3])}"
                             f"{' and others' if len(changed) > 3 else ''} changed between backward and step() "
                             f"(clip_grad_norm_, or a hook of yours), after its payload had left during backward; "
                             f"nothing was updated. Use SCAPE(clip_grad=...) to clip the reconstructed gradient, "
                             f"or overlap_backward=False")
        t, c, idx = opt._t + 1, self.c, self.idx
        self.buckets_in_backward = self.started_in_backward
        self.last_waited = self.waited
        self._reset()
        return t, c, idx, reduced, flags
