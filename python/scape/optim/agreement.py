"""The check that every rank of a group built the same optimizer. A collective whose ranks
disagree on the layout or on a switch does not fail where it should: ranks built with other
sparsities train on silently (replicated) or fail in an unrelated split (sharded). So the
optimizers all-gather one 56-bit digest per setting (a fixed number of them, whatever the
model, so the collective itself cannot mismatch) and raise on every rank, naming each setting
whose digest differs."""
from __future__ import annotations

import hashlib
from typing import Any, List, Sequence, Tuple

import torch


def digest(value: Any) -> int:
    """A digest of repr(value) that is the same in every process (Python's hash() is salted)."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=7).digest(), "little")


def check_agreement(comm, settings: Sequence[Tuple[str, Any]], when: str, device: torch.device) -> None:
    """Raises ValueError on every rank of `comm` if any setting differs between ranks."""
    if comm.size <= 1:
        return
    names = [name for name, _ in settings]
    mine = torch.tensor([digest(value) for _, value in settings], dtype=torch.int64, device=device)
    gathered, _ = comm.all_gather_uneven(mine, [mine.numel()] * comm.size, "agreement")
    comm.take_count()  # construction's bytes are no step's
    rows = gathered.view(comm.size, -1).cpu()
    differing: List[str] = []
    for i, name in enumerate(names):
        ranks = [r for r in range(comm.size) if rows[r, i] != rows[0, i]]
        if ranks:
            differing.append(f"{name} (rank 0 and rank(s) {ranks} differ; this rank {comm.rank} has "
                             f"{_short(settings[i][1])})")
    if differing:
        raise ValueError(f"{when}: the ranks of the group disagree on " + "; ".join(differing))


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
