"""The figures of one step of a torch-native optimizer on this rank. They stay tensors until
read, so a step on a GPU waits for none of them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import torch

from .masks import bits_at


@dataclass
class StepMetrics:
    step: int
    bytes_sent: int
    bytes_received: int
    bytes_by_purpose: Dict[str, int]
    mask_size: int
    n: int
    jaccard: Optional[torch.Tensor]
    residual_norm: Optional[torch.Tensor]
    clip_factor: float
    lr: float
    extra: Dict[str, float] = field(default_factory=dict)
    seconds_by_purpose: Dict[str, float] = field(default_factory=dict)  # blocking collectives' wall time

    @staticmethod
    def collect(opt, t: int, idx: torch.Tensor, clip_factor: float) -> "StepMetrics":
        count = opt.comm.take_count()
        jaccard = None
        if opt._previous_mask is not None:
            both = bits_at(opt._previous_mask, idx).sum()
            either = idx.numel() + opt._previous_size - both
            jaccard = both.double() / either.clamp(min=1).double()
        residual_norm = torch.linalg.vector_norm(opt._e) if opt._e.numel() else None
        return StepMetrics(t, count.sent, count.received, dict(count.by_purpose), int(idx.numel()), opt.layout.n,
                           jaccard, residual_norm, clip_factor, float(opt.param_groups[0]["lr"]),
                           seconds_by_purpose=dict(count.seconds_by_purpose))

    def as_dict(self) -> Dict[str, float]:
        out = {"step": self.step, "lr": self.lr, "bytes_sent": self.bytes_sent,
               "bytes_received": self.bytes_received, "mask_size": self.mask_size,
               "mask_density": self.mask_size / self.n if self.n else 0.0,
               "mask_jaccard": float(self.jaccard) if self.jaccard is not None else float("nan"),
               "residual_norm": float(self.residual_norm) if self.residual_norm is not None else 0.0,
               "clip_factor": self.clip_factor}
        for purpose, sent in sorted(self.bytes_by_purpose.items()):
            out[f"bytes_sent_{purpose}"] = sent
        for purpose, seconds in sorted(self.seconds_by_purpose.items()):
            out[f"comm_time_measured_{purpose}"] = seconds
        out.update(self.extra)
        return out
