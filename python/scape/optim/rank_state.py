"""State that differs from rank to rank under keys of the rank's own.

torch.distributed.checkpoint keeps one copy of a key that every rank saves, so the state of the
optimizers whose ranks hold different values (the local-SGD family's inner moments and error
feedback between syncs, DeMo's momentum) is saved as `<key>_rank<r>_of_<W>`, as SCAPE saves its
residual: each rank's survives dcp.save, and a group of another size finds no key of its own
and is told so instead of resuming from another rank's values. A state saved before these keys
(per rank, with torch.save) holds the plain keys and is read as the rank's own."""
from __future__ import annotations

import re
from typing import Any, Dict

import torch

_SUFFIX = re.compile(r"_rank(\d+)_of_(\d+)$")


def suffix(rank: int, world: int) -> str:
    return f"_rank{rank}_of_{world}"


def own_keys(entry: Dict[str, Any], rank: int, world: int, keep=("step",)) -> Dict[str, Any]:
    """`entry` with every tensor but those in `keep` under this rank's key."""
    end = suffix(rank, world)
    return {k + end if isinstance(v, torch.Tensor) and k not in keep else k: v for k, v in entry.items()}


def plain_keys(entry: Dict[str, Any], rank: int, world: int, where: str, kind: str) -> Dict[str, Any]:
    """This rank's entries back under their plain keys; ValueError naming `where` when the entry
    holds only other ranks' (another world size, or another rank's file)."""
    end = suffix(rank, world)
    own = {k[:-len(end)]: v for k, v in entry.items() if k.endswith(end)}
    others = [(k, m) for k, m in ((k, _SUFFIX.search(k)) for k in entry) if m and not k.endswith(end)]
    if not own and others:
        sizes = sorted({int(m.group(2)) for _, m in others})
        if world not in sizes:
            raise ValueError(f"state_dict: {where}: saved by a group of {', '.join(map(str, sizes))} ranks, this one "
                             f"has {world}: {kind}'s state is each rank's own, so it resumes at the world size it "
                             f"was saved at")
        raise ValueError(f"state_dict: {where}: holds the state of rank(s) "
                         f"{sorted({int(m.group(1)) for _, m in others})} of {world}, not of this rank {rank}: "
                         f"{kind}'s state is each rank's own; load what this rank saved (torch.save on every "
                         f"rank, or torch.distributed.checkpoint, which keeps every rank's)")
    return {**{k: v for k, v in entry.items() if not _SUFFIX.search(k)}, **own}
