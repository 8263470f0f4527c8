"""The state of scape.torch.SCAPE seen as torch sees an optimizer's state: per parameter, in
`opt.state[p]`, and saved by state_dict() in torch's form ({"state": {index: {...}},
"param_groups": [...]}) so that torch.distributed.checkpoint (get_state_dict, set_state_dict,
dcp.save, dcp.load) keeps it, and a checkpoint written at one world size resumes at another.

keep_untouched and restore_untouched hold the state of the tensors that had no gradient on any
rank across a step, which leaves them as they were.

Live, `opt.state[p]` holds views of the flat buffers the step works on: "exp_avg" (shaped like
p when replicated; the 1-D part of p inside this rank's shard when sharded), "residual" (this
rank's own), "carried_momentum" (sharded), "step".

Saved, every entry is the parameter's whole tensor, the same on every rank, except the
residual, which is each rank's own:
  step, exp_avg, carried_momentum (sharded), master (bf16/fp16 parameters), mask and
  previous_mask (the packed bits of the parameter's part of the global masks; all zero, with
  mask_step 0 or previous_size 0, before there is one), mask_step, mask_density,
  skipped_steps, world_size, sharded, format: world-size independent;
  residual_rank{r}_of_{W}: rank r's own residual, under a key of its own so that
  torch.distributed.checkpoint keeps each rank's apart (it keeps one copy of a key that every
  rank saves) and a world of another size never reads it;
  residual_mean (sharded only): the mean of the ranks' residuals, which is all the next
  payload needs of them (the reduce adds them up).
Replicated, state_dict() is local: any one rank may call it (the HF Trainer and the common
`if rank == 0: torch.save(...)` save from rank 0 alone). Sharded, a rank holds only its shard
of the first moment, so state_dict() gathers it and the mean residual: a collective, called on
every rank, as FSDP's is.
A resume at the same world size is bit-identical. At another world size, sharded state starts
every rank from residual_mean (the next payload's mean is then exactly what it would have been,
while the owners' selection statistics, which read their own residual, start from the mean);
replicated state has no mean without a collective, so its residuals restart from zero, as error
feedback does at its first step (docs/python.md, "Checkpoints and resharding")."""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional

import torch

from .masks import pack_bits, unpack_bits
from .agreement import check_agreement
from .params import FLATTENED_HINT, local_tensor, saved_groups, state_by_param, trainable_tensors

FORMAT = 2


def bind_views(opt) -> None:
    """opt.state[p] as views of the live buffers (again after the residual trades places)."""
    lo, hi = opt._state_range
    for slot, p in zip(opt.layout.slots, opt._tensors):
        entry = opt.state[p]
        entry.clear()
        entry["step"] = opt._step_count
        shape = local_tensor(p).shape
        if opt.sharded:
            a, b = max(slot.offset, lo), min(slot.end, hi)
            entry["exp_avg"] = opt._m[a - lo:max(a, b) - lo]
            if opt._q.numel():
                entry["carried_momentum"] = opt._q[a - lo:max(a, b) - lo]
        else:
            entry["exp_avg"] = opt._m[slot.offset:slot.end].view(shape)
        if opt._e.numel():
            entry["residual"] = opt._e[slot.offset:slot.end].view(shape)


def follow_tensors(opt) -> None:
    """Follows the user's tensors: one whose requires_grad turned on joins the layout, one
    turned off leaves it (its state kept in opt.state[p] for its return), and a group added
    by add_param_group joins. Collective: every rank of the group must make the same change
    before the same step(), which the agreement check verifies."""
    if [id(p) for p in trainable_tensors(opt.param_groups)] == [id(p) for p in opt._tensors]:
        return
    opt._wait_next_mask()
    parts = whole_tensors(opt, with_mean=False)
    kept = {id(p): part for p, part in zip(opt._tensors, parts)}
    for p, part in zip(opt._tensors, parts):  # leaving ones keep a copy of their own
        opt.state[p] = {k: v.clone() for k, v in part.items() if isinstance(v, torch.Tensor)}
    old_ids = {id(p) for p in opt._tensors}
    opt.mirror.release()  # a tensor that left keeps none of the old buffer alive
    opt._build_layout()
    check_agreement(opt.comm, opt._settings(), f"SCAPE at step {opt._t + 1} (tensors joined or left)",
                    opt.device)
    opt._allocate_state()
    lo, hi = opt._state_range
    for j, (slot, p) in enumerate(zip(opt.layout.slots, opt._tensors)):
        part = kept.get(id(p)) or (opt.state.get(p) if id(p) not in old_ids else None)
        if not part:
            continue
        if part.get("master") is not None and j in opt.mirror.masters():
            opt.mirror.views[j].copy_(part["master"])
        a, b = max(slot.offset, lo), min(slot.end, hi)
        if a < b:
            opt._m[a - lo:b - lo] = part["exp_avg"][a - slot.offset:b - slot.offset]
            if opt._q.numel() and part.get("carried_momentum") is not None:
                opt._q[a - lo:b - lo] = part["carried_momentum"][a - slot.offset:b - slot.offset]
        if opt._e.numel() and part.get("residual") is not None:
            opt._e[slot.offset:slot.end] = part["residual"]
    for p in opt._tensors:
        opt.state.pop(p, None)
    # The lagged mask was drawn for the old layout: the next step chooses its own.
    opt._mask, opt._mask_step, opt._previous_mask, opt._previous_size = None, 0, None, 0
    opt._attach_overlap()
    bind_views(opt)


def bind_residual_views(opt) -> None:
    """opt.state[p]["residual"] again after the step's residual traded places with the
    workspace (the only view a step moves)."""
    if not opt._e.numel():
        return
    # The residual alternates between two buffers, so the views of each are made once (a slice
    # and a view a tensor every step were most of the ops a step dispatched).
    cache = getattr(opt, "_residual_views", None)
    if cache is None or cache[0] is not opt.layout:
        cache = opt._residual_views = (opt.layout, {})
    key = opt._e.data_ptr()
    if key not in cache[1]:
        cache[1][key] = (opt._e, [opt._e[slot.offset:slot.end].view(local_tensor(p).shape)
                                  for slot, p in zip(opt.layout.slots, opt._tensors)])
    for p, view in zip(opt._tensors, cache[1][key][1]):
        opt.state[p]["residual"] = view


def _full(opt, part: torch.Tensor) -> torch.Tensor:
    """A sharded buffer gathered whole (every rank), or the replicated buffer itself."""
    if not opt.sharded or opt.comm.size == 1:
        return part
    counts = [hi - lo for lo, hi in opt.layout.shard_ranges]
    full, _ = opt.comm.all_gather_uneven(part, counts, "checkpoint")
    return full


def whole_tensors(opt, with_mean: bool) -> List[Dict[str, Any]]:
    """Per slot, the flat whole tensors of its state (the collectives run on every rank)."""
    m = _full(opt, opt._m)
    q = _full(opt, opt._q) if opt._q.numel() else None
    mean = None
    if with_mean and opt._e.numel():
        mean = opt._e if opt.comm.size == 1 else opt.comm.all_reduce_mean(opt._e, "checkpoint")[0]
    opt.comm.take_count()  # a checkpoint's bytes are no step's
    masters = opt.mirror.masters()
    mask = None if opt._mask is None else unpack_bits(opt._mask, opt.layout.n)
    previous = None if opt._previous_mask is None else unpack_bits(opt._previous_mask, opt.layout.n)
    out = []
    for j, slot in enumerate(opt.layout.slots):
        cut = slice(slot.offset, slot.end)
        out.append({"exp_avg": m[cut], "carried_momentum": None if q is None else q[cut],
                    "residual": opt._e[cut] if opt._e.numel() else None,
                    "residual_mean": None if mean is None else mean[cut],
                    "master": masters.get(j), "mask": None if mask is None else mask[cut],
                    "previous_mask": None if previous is None else previous[cut]})
    return out


def save(opt) -> Dict[str, Any]:
    opt._wait_next_mask()  # the lagged all-gather lands in the checkpoint, not after it
    parts = whole_tensors(opt, with_mean=opt.sharded)
    index = {id(p): i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    w, r = opt.comm.size, opt.comm.rank
    state = {}
    for j, (slot, p) in enumerate(zip(opt.layout.slots, opt._tensors)):
        part, shape = parts[j], local_tensor(p).shape
        # Counters and flags as 0-d tensors, as torch keeps "step": torch.distributed.checkpoint
        # loads tensors in place but writes a Python number under "0" beside the entry 0.
        entry = {"format": FORMAT, "step": torch.tensor(float(opt._t)), "world_size": torch.tensor(w),
                 "sharded": torch.tensor(opt.sharded), "skipped_steps": torch.tensor(opt.skipped_steps),
                 "exp_avg": part["exp_avg"].view(shape).clone(),
                 "mask_step": torch.tensor(opt._mask_step if opt._mask is not None else 0),
                 "previous_size": torch.tensor(opt._previous_size if opt._previous_mask is not None else 0),
                 "mask_density": torch.tensor(0.0 if opt._mask_rho is None else opt._mask_rho[slot.group],
                                              dtype=torch.float64)}
        if part["carried_momentum"] is not None:
            entry["carried_momentum"] = part["carried_momentum"].view(shape).clone()
        if part["residual"] is not None:
            entry[f"residual_rank{r}_of_{w}"] = part["residual"].view(shape).clone()
            if part["residual_mean"] is not None:
                entry["residual_mean"] = part["residual_mean"].view(shape).clone()
        if part["master"] is not None:
            entry["master"] = part["master"].view(shape).clone()
        # Always present and always this size, set or not: torch.distributed.checkpoint loads
        # only the keys, and shapes, of the state it is handed to fill.
        for key in ("mask", "previous_mask"):
            bits = part[key] if part[key] is not None else torch.zeros(slot.numel, dtype=torch.bool, device=opt.device)
            entry[key] = pack_bits(bits)
        if opt.fp8 is not None:
            entry["fp8_exponent"], entry["fp8_scaled"] = torch.tensor(opt.fp8.exponent), torch.tensor(opt.fp8.scaled)
        state[index[id(p)]] = entry
    return {"state": state, "param_groups": saved_groups(opt.param_groups)}


def _value(entry: Dict[str, Any], key: str, name: str):
    if key not in entry:
        raise ValueError(f"state_dict: {name} has no '{key}'")
    value = entry[key]
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 and key != "step" else value


def load(opt, state_dict: Dict[str, Any]) -> None:
    if not isinstance(state_dict, dict):
        raise ValueError(f"state_dict: expected a dict, got {type(state_dict).__name__}")
    by_param = state_by_param(opt.param_groups, state_dict)
    opt._sync_layout()
    entries = []
    for slot, p in zip(opt.layout.slots, opt._tensors):
        entry = by_param.get(id(p))
        if entry is None:
            raise ValueError(f"state_dict: no state for {slot.name}, a parameter that trains; "
                             f"saved by another model or optimizer?")
        if entry.get("format") != FORMAT:
            raise ValueError(f"state_dict: {slot.name} has format {entry.get('format')!r}, this version reads "
                             f"{FORMAT} (written by another version of scape.torch.SCAPE)"
                             + (FLATTENED_HINT if "format" not in entry else ""))
        if bool(entry.get("sharded")) != opt.sharded:
            raise ValueError(f"state_dict: saved with sharded={entry.get('sharded')}, this optimizer has "
                             f"sharded={opt.sharded}")
        if tuple(entry["exp_avg"].shape) != tuple(local_tensor(p).shape):
            raise ValueError(f"state_dict: {slot.name}'s exp_avg is {tuple(entry['exp_avg'].shape)}, the "
                             f"parameter {tuple(local_tensor(p).shape)}")
        entries.append(entry)
    opt._wait_next_mask()
    opt.mirror.pull()  # the parameters as the user has them now; masters are set below
    first = entries[0] if entries else {}
    saved_world = int(_value(first, "world_size", "state")) if entries else opt.comm.size
    own_key = f"residual_rank{opt.comm.rank}_of_{opt.comm.size}"
    residual_key = own_key if saved_world == opt.comm.size and own_key in first else "residual_mean"
    if opt._e.numel() and entries and residual_key not in first:
        residual_key = None
    if opt._e.numel() and entries and residual_key != own_key:
        why = (f"saved at world size {saved_world}" if saved_world != opt.comm.size
               else f"rank {opt.comm.rank}'s own residual is not in it (saved by one rank for all?)")
        warnings.warn(f"state_dict: {why}; every rank starts from "
                      f"{'the ranks' + chr(39) + ' mean residual' if residual_key else 'a zero residual'}", stacklevel=3)
    _fill(opt, entries, residual_key)
    opt._t = int(float(first["step"])) if entries else 0
    opt._step_count.fill_(float(opt._t))
    opt.skipped_steps = int(_value(first, "skipped_steps", "state")) if entries else 0
    opt._mask_step = int(first.get("mask_step") or 0)
    opt._previous_size = int(first.get("previous_size") or 0)
    opt._mask = _global_mask(opt, entries, "mask") if opt._mask_step > 0 else None
    opt._previous_mask = _global_mask(opt, entries, "previous_mask") if opt._previous_size > 0 else None
    opt._mask_rho = None
    if opt._mask is not None:
        rho = {slot.group: float(e["mask_density"]) for slot, e in zip(opt.layout.slots, entries)}
        opt._mask_rho = [rho.get(gi, 1.0 - g["sparsity"]) for gi, g in enumerate(opt.param_groups)]
    else:
        opt._mask_step = 0
    if opt.fp8 is not None:
        if "fp8_exponent" not in first:
            raise ValueError("state_dict: saved without wire_dtype fp8_e5m2, this optimizer has it")
        opt.fp8.exponent, opt.fp8.scaled = int(first["fp8_exponent"]), bool(first["fp8_scaled"])
    opt._next, opt._metrics = None, None
    opt.mirror.push()
    bind_views(opt)


def _fill(opt, entries: List[Dict[str, Any]], residual_key: Optional[str]) -> None:
    lo, hi = opt._state_range
    dev = opt.device
    masters = opt.mirror.masters()
    for j, (slot, entry) in enumerate(zip(opt.layout.slots, entries)):
        a, b = (max(slot.offset, lo), min(slot.end, hi)) if opt.sharded else (slot.offset, slot.end)
        if a < b:
            whole = entry["exp_avg"].reshape(-1).to(dev, torch.float32)
            opt._m[a - lo:b - lo] = whole[a - slot.offset:b - slot.offset]
            if opt._q.numel():
                q = entry.get("carried_momentum")
                if q is None:
                    raise ValueError(f"state_dict: {slot.name} has no carried_momentum")
                opt._q[a - lo:b - lo] = q.reshape(-1).to(dev, torch.float32)[a - slot.offset:b - slot.offset]
        if opt._e.numel():
            e = None if residual_key is None else entry.get(residual_key)
            if e is None:
                opt._e[slot.offset:slot.end] = 0.0
            else:
                opt._e[slot.offset:slot.end] = e.reshape(-1).to(dev, torch.float32)
        if j in masters:
            master = entry.get("master")
            if master is None:
                raise ValueError(f"state_dict: {slot.name} is {opt._tensors[j].dtype} here and has no fp32 master")
            masters[j].copy_(master.reshape(-1).to(dev, torch.float32))


def _global_mask(opt, entries: List[Dict[str, Any]], key: str) -> Optional[torch.Tensor]:
    if not entries or any(e.get(key) is None for e in entries):
        return None
    bits = torch.cat([unpack_bits(e[key].to(opt.device), slot.numel)
                      for slot, e in zip(opt.layout.slots, entries)])
    return pack_bits(bits)


def keep_untouched(opt, slots: List[int]):
    """A tensor without a gradient on any rank is skipped as torch's optimizers skip it: its
    parameter (no decay), first moment and residual stay as they were."""
    lo, hi = opt._state_range
    kept = []
    for j in slots:
        s = opt.layout.slots[j]
        a, b = max(s.offset, lo), min(s.end, hi)
        kept.append((s, opt._theta[s.offset:s.end].clone(),
                     opt._e[s.offset:s.end].clone() if opt._e.numel() else None,
                     (a, b, opt._m[a - lo:b - lo].clone(), opt._q[a - lo:b - lo].clone() if opt._q.numel() else None)
                     if a < b else None))
    return kept


def restore_untouched(opt, kept) -> None:
    """Puts back what keep_untouched kept, after the step."""
    lo = opt._state_range[0]
    for s, theta, e, state in kept:
        opt._theta[s.offset:s.end] = theta
        if e is not None:
            opt._e[s.offset:s.end] = e
        if state is not None:
            a, b, m, q = state
            opt._m[a - lo:b - lo] = m
            if q is not None:
                opt._q[a - lo:b - lo] = q
