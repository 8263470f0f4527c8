"""Running scape.torch.SCAPE inside DistributedDataParallel. SCAPE does its own communication
from each rank's local gradient, so DDP's gradient all-reduce must not run: register
`local_gradients_hook`, which hands every bucket back untouched, or do not wrap the model.
(No `from __future__ import annotations` here: DDP checks the hook's annotations as objects.)"""
import torch
import torch.distributed as dist


def local_gradients_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook that sends nothing: each rank keeps its own gradient.
    model.register_comm_hook(None, scape.torch.local_gradients_hook)"""
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future
