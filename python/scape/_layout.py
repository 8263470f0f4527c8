"""The flat parameter layout: named tensors back to back in one float32 buffer, in order."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Tuple


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: Tuple[int, ...]
    decay: bool

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class Layout:
    """Tensors in flat-buffer order. `decay` says whether decoupled weight decay applies."""

    def __init__(self, tensors: Iterable):
        self.tensors: List[TensorSpec] = []
        for i, t in enumerate(tensors):
            if isinstance(t, TensorSpec):
                self.tensors.append(t)
                continue
            try:
                name, shape, decay = t
            except (TypeError, ValueError):
                raise ValueError(f"layout[{i}]: expected (name, shape, decay), got {t!r}") from None
            if not isinstance(name, str):
                raise ValueError(f"layout[{i}]: the name must be a string, got {type(name).__name__}")
            try:
                shape = tuple(int(d) for d in shape)
            except (TypeError, ValueError):
                raise ValueError(f"layout[{i}] ({name}): the shape must be a sequence of ints, got {shape!r}") from None
            self.tensors.append(TensorSpec(name, shape, bool(decay)))

    @classmethod
    def from_module(cls, module) -> "Layout":
        """The module's trainable parameters in named_parameters() order; matrices and
        embeddings (2-D and up) take weight decay, vectors (biases, norms) do not."""
        return cls((name, tuple(p.shape), p.dim() >= 2) for name, p in module.named_parameters() if p.requires_grad)

    @property
    def size(self) -> int:
        return sum(t.numel for t in self.tensors)

    def offsets(self) -> List[int]:
        out, at = [], 0
        for t in self.tensors:
            out.append(at)
            at += t.numel
        return out

    def specs(self) -> List[Tuple[str, List[int], bool]]:
        return [(t.name, list(t.shape), t.decay) for t in self.tensors]

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        return f"Layout({len(self.tensors)} tensors, {self.size} values)"


def as_layout(layout) -> Layout:
    if isinstance(layout, Layout):
        return layout
    if hasattr(layout, "named_parameters"):
        return Layout.from_module(layout)
    if isinstance(layout, (list, tuple)):
        return Layout(layout)
    raise ValueError(f"layout: a scape.Layout, a list of (name, shape, decay) or a torch.nn.Module, "
                     f"got {type(layout).__name__}")
