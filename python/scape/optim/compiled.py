"""The step's candidate, c = (b1 m + (1-b1) g) + e: in eager torch ops over the whole buffer (the
reference: four passes), in place in the gradient's buffer with m's term on its support alone
(the eager step's: two passes), or, with SCAPE(..., compile=True), fused by torch.compile into
one loop (its shape is the layout's, so it compiles once).

Measured on the 2-core development machine, one thread, GPT-2 at 1/4 width (15.2M parameters):
the fused candidate saves about 20 ms of a 270 ms SCAPE 99% step. The selection's thresholds were
tried fused too and dropped: inductor's loop over a per-piece bound gathered by index ran four
times slower than torch's eager index_select and compare (docs/python.md, "Speed").

Both forms compute the same fp32 operations in the same order (products rounded before the
sum, as arith.py), so their results are equal bit for bit; python/tests/test_torch_compiled.py
checks it."""
from __future__ import annotations

from typing import Callable, Optional

import torch


def candidate_eager(m: torch.Tensor, g: torch.Tensor, e: Optional[torch.Tensor], b1: float, omb1: float,
                    out: torch.Tensor) -> None:
    """out = (b1 m + (1-b1) g) + e, the replicated step's candidate (g is overwritten)."""
    g.mul_(omb1)
    torch.mul(m, b1, out=out).add_(g)
    if e is not None:
        out.add_(e)


def candidate_in_place(c: torch.Tensor, m: torch.Tensor, support: Optional[torch.Tensor], e: Optional[torch.Tensor],
                       b1: float, omb1: float) -> None:
    """c = (b1 m + (1-b1) c) + e, c holding the gradient: the eager step's candidate in two passes
    where m is known to be zero off `support` (the last mask, step 7 of the paper formulation),
    b1 m added there alone with the core's fp32 roundings (off it b1 * 0 + x = x, the sign of a
    zero aside); support None: m anywhere. m None: no momentum term (the sharded a)."""
    c.mul_(omb1)
    if m is not None and support is None:
        c.add_(torch.mul(m, b1))
    elif m is not None and support.numel():
        c.index_copy_(0, support, torch.mul(m.index_select(0, support), b1).add_(c.index_select(0, support)))
    if e is not None:
        c.add_(e)


def _candidate_fused(m, g, e, b1: float, omb1: float, out) -> None:
    c = m * b1 + g * omb1
    out.copy_(c + e if e is not None else c)


_compiled_candidate: Optional[Callable] = None


def candidate_compiled() -> Callable:
    """The torch.compile'd candidate, made on first use and shared by every optimizer (dynamic
    shapes: one compilation whatever the layout's size)."""
    global _compiled_candidate
    if _compiled_candidate is None:
        _compiled_candidate = torch.compile(_candidate_fused, dynamic=True, fullgraph=True)
    return _compiled_candidate
