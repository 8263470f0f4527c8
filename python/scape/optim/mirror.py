"""The fp32 flat copy of the trainable tensors that every torch-native optimizer steps on.

With `bind` (the optimizers' `parameters_as_views=True`), a plain fp32 parameter that owns its
storage is made a view of the flat buffer (`p.data = view`,
as Megatron-Core's contiguous parameter buffer does): the step then writes the parameter itself,
and the copy of every parameter into the buffer before a step and out of it after one (two
passes over N, 8 bytes a parameter, a tenth of SCAPE's CPU step on a 15M-parameter model)
vanish, with the parameters' own storage (4 bytes a parameter) freed. Everything else is copied
as before: a DTensor's local shard (FSDP2 owns its storage), a bf16 or fp16 tensor (its slice is
the fp32 master), and a tensor that is a view into a larger buffer or whose storage another
tensor holds too (another parameter, a buffer, the tensor it was made of): another owner may
read or write through that storage.

The parameter stays the truth. One written in place (a `load_state_dict`) is the buffer already.
One moved by `p.data = ...` (a user's own storage, `model.to()`) is found before the next step by
its data pointer and copied from then on, in and out, so the user's storage keeps being the
parameter, as before the binding. A parameter leaving the layout (frozen, or the optimizer's
tensors rebuilt) gets a storage of its own back, so it keeps no old buffer alive."""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .params import is_dtensor, local_tensor

# The parameters a mirror bound, with the data pointer of the view each was given. A parameter
# still at that pointer lies in some mirror's buffer (an earlier optimizer's or another live
# one's), which no other owner writes through, so a new optimizer may bind it again.
_BOUND_AT = WeakIdKeyDictionary()
# The parameters a user moved away from a mirror's buffer, with the pointer they were moved to:
# that storage is the user's choice and is never taken from them.
_MOVED_TO = WeakIdKeyDictionary()


def _stamp(p: torch.Tensor):
    local = local_tensor(p)
    return local.data_ptr(), local._version


def _owns_storage(p: torch.Tensor) -> bool:
    """The whole storage is this tensor's, contiguous from its first byte."""
    return (p.is_contiguous() and p.storage_offset() == 0
            and p.untyped_storage().nbytes() == p.numel() * p.element_size())


_ALONE: Dict[str, int] = {}  # a device type: the storage use count of a parameter alone with it


def _storage_users(p: torch.Tensor) -> Optional[int]:
    """How many tensors hold p's storage (p among them), where torch tells (None where not)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return None if count is None else int(count(p.untyped_storage()._cdata))


def _no_other_holder(p: torch.Tensor) -> bool:
    """No other tensor holds the storage: not the tensor a parameter was made of (`w` of
    nn.Parameter(w), still in use), a second parameter over it, or a buffer tied to it by .data.
    The count a lone parameter gives is measured, not assumed."""
    users = _storage_users(p)
    if users is None:
        return True
    if p.device.type not in _ALONE:
        _ALONE[p.device.type] = _storage_users(torch.nn.Parameter(torch.empty(1, device=p.device)))
    return users == _ALONE[p.device.type]


def _in_a_buffer(p: torch.Tensor) -> bool:
    return _BOUND_AT.get(p) == p.data_ptr()


def bindable(p: torch.Tensor, device: torch.device) -> bool:
    """A plain fp32 tensor on the buffer's device whose storage no one else writes through."""
    if is_dtensor(p) or p.dtype != torch.float32 or p.device != device or p.numel() == 0:
        return False
    if _in_a_buffer(p):
        return True
    return _owns_storage(p) and _MOVED_TO.get(p) != p.data_ptr() and _no_other_holder(p)


class ParamMirror:
    """The fp32 flat buffer of `tensors` in order (`theta`), its slices (`views`) and the same
    shaped as the tensors (`shaped`). Bound tensors are views of it; the others are copied in
    before every step (`pull`) and out after it (`push`). A bf16 or fp16 tensor's slice is its
    fp32 master: it is kept between steps and re-read from the parameter only when the parameter
    was changed outside the optimizer (another storage or a newer version than the optimizer's
    last write) to values other than the master's rounding, so a reload that puts back the same
    values keeps the master's precision."""

    def __init__(self, tensors: List[torch.Tensor], device: torch.device, bind: bool = False):
        self.tensors = tensors
        self.theta = torch.empty(sum(local_tensor(p).numel() for p in tensors), dtype=torch.float32, device=device)
        self.views, at = [], 0
        for p in tensors:
            n = local_tensor(p).numel()
            self.views.append(self.theta[at:at + n])
            at += n
        # Views shaped as the tensors, made once: the copies in and out are then one foreach op
        # a step, not a reshape and a copy a tensor.
        self.shaped = [view.view(local_tensor(p).shape) for view, p in zip(self.views, tensors)]
        self.stamps: List[Any] = [None] * len(tensors)
        self.low_precision = [j for j, p in enumerate(tensors) if p.dtype != torch.float32]
        self.bound = [False] * len(tensors)
        self._copied: List[int] = []
        self._copied_shaped: List[torch.Tensor] = []
        self._set_copied()
        self.pull(everything=True)
        if bind:
            plain = [j for j, p in enumerate(tensors) if p.dtype == torch.float32 and not is_dtensor(p)]
            self._bind(plain)
            refused = sum(1 for j in plain if not self.bound[j])
            if refused:
                warnings.warn(f"parameters_as_views: {refused} of {len(plain)} plain fp32 tensors stay copied in and "
                              f"out: each is a view into a larger storage, or another tensor holds its storage too "
                              f"(a second parameter, a buffer, a state_dict kept, the tensor it was made of)",
                              stacklevel=4)

    def _set_copied(self) -> None:
        """The tensors copied in and out, and their shaped slices, kept for every step's copies."""
        self._copied = [j for j, b in enumerate(self.bound) if not b]
        self._copied_shaped = [self.shaped[j] for j in self._copied]

    @torch.no_grad()
    def _bind(self, candidates: List[int]) -> None:
        """Binds the candidates that qualify (their values already in the buffer); a storage
        that two of them share stays copied, so neither parameter loses the other's writes."""
        device = self.theta.device
        ok = [j for j in candidates if bindable(self.tensors[j], device)]
        storages: Dict[int, int] = {}  # of the tensors that own theirs (not those in a mirror's buffer)
        for j in ok:
            if not _in_a_buffer(self.tensors[j]):
                key = self.tensors[j].untyped_storage().data_ptr()
                storages[key] = storages.get(key, 0) + 1
        for j in ok:
            p = self.tensors[j]
            if _in_a_buffer(p) or storages[p.untyped_storage().data_ptr()] == 1:
                p.data = self.shaped[j]
                _BOUND_AT[p] = p.data_ptr()
                self.bound[j] = True
        self._set_copied()

    @torch.no_grad()
    def pull(self, everything: bool = False) -> None:
        """The parameters as the user has them now into the buffer; a bound one that was moved
        is copied from then on."""
        moved = [j for j, b in enumerate(self.bound) if b and self.tensors[j].data_ptr() != self.views[j].data_ptr()]
        for j in moved:
            p = self.tensors[j]
            self.bound[j] = False
            if not _in_a_buffer(p):  # not into another mirror's buffer: the user's storage
                _MOVED_TO[p] = p.data_ptr()
        if moved:
            self._set_copied()
        if not self.low_precision:  # one op, not one a tensor
            if self._copied:
                torch._foreach_copy_(self._copied_shaped, [local_tensor(self.tensors[j]) for j in self._copied])
            return
        for j in self._copied:
            p, view = self.tensors[j], self.views[j]
            local = local_tensor(p)
            if p.dtype == torch.float32 or everything:
                view.copy_(local.reshape(-1))
            elif self.stamps[j] != _stamp(p):
                if not torch.equal(view.to(local.dtype), local.reshape(-1)):
                    view.copy_(local.reshape(-1))
                self.stamps[j] = _stamp(p)

    @torch.no_grad()
    def push(self) -> None:
        """The flat values into the copied parameters (rounded where they are bf16 or fp16)."""
        if self._copied:
            torch._foreach_copy_([local_tensor(self.tensors[j]) for j in self._copied], self._copied_shaped)
        for j in self.low_precision:
            self.stamps[j] = _stamp(self.tensors[j])

    @torch.no_grad()
    def release(self) -> None:
        """Every bound parameter gets a storage of its own with its values: called before the
        buffer is dropped, so that a parameter leaving the layout does not keep it alive."""
        for j, p in enumerate(self.tensors):
            if self.bound[j] and p.data_ptr() == self.views[j].data_ptr():
                p.data = p.data.clone()
                _BOUND_AT.pop(p, None)
            self.bound[j] = False
        self._set_copied()

    def masters(self) -> Dict[int, torch.Tensor]:
        """The fp32 masters of the low-precision tensors, by position."""
        return {j: self.views[j] for j in self.low_precision}
