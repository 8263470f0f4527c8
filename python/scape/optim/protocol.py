"""The parts of torch.optim.Optimizer's protocol that the optimizers here must keep by hand,
because they replace the base class's state_dict and load_state_dict and keep their state
outside `opt.state`:

  state dict hooks  register_state_dict_pre_hook / _post_hook and register_load_state_dict_
                    pre_hook / _post_hook run where torch's own methods run them (a post hook's
                    or a load pre hook's return value replaces the dict, as in torch);
  copies            copy.deepcopy and pickle would keep only `defaults`, `state` and
                    `param_groups` (torch's __getstate__), not the flat buffers, the process
                    group or the step count, and give an optimizer that fails at its next
                    step: they are refused, naming the way that works (state_dict)."""
from __future__ import annotations

from typing import Any, Callable, Dict


def state_dict_with_hooks(opt, build: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """torch's Optimizer.state_dict order: the pre hooks, the dict, then each post hook, whose
    return value (when not None) replaces it."""
    for hook in opt._optimizer_state_dict_pre_hooks.values():
        hook(opt)
    state_dict = build()
    for hook in opt._optimizer_state_dict_post_hooks.values():
        result = hook(opt, state_dict)
        if result is not None:
            state_dict = result
    return state_dict


def load_state_dict_with_hooks(opt, state_dict, load: Callable[[Any], None]) -> None:
    """torch's Optimizer.load_state_dict order: a shallow copy (the caller's dict is not
    changed), each pre hook (its return value, when not None, replaces the dict), the load,
    then the post hooks. A load that raises leaves the groups' settings as they were (the
    loads take the saved lr, sparsity and betas before they have checked every entry)."""
    if isinstance(state_dict, dict):
        state_dict = state_dict.copy()
    for hook in opt._optimizer_load_state_dict_pre_hooks.values():
        result = hook(opt, state_dict)
        if result is not None:
            state_dict = result
    settings = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    try:
        load(state_dict)
    except BaseException:
        for group, kept in zip(opt.param_groups, settings):
            for key in [k for k in group if k != "params" and k not in kept]:
                del group[key]
            group.update(kept)
        raise
    for hook in opt._optimizer_load_state_dict_post_hooks.values():
        hook(opt)


def refuse_copy(opt):
    """__getstate__ of the optimizers here: raises TypeError naming what works instead."""
    name = f"scape.torch.{type(opt).__name__}"
    raise TypeError(f"{name} cannot be copied or pickled (copy.deepcopy, pickle, torch.save of the optimizer "
                    f"object): its state lives in flat buffers bound to its parameters and process group, which "
                    f"a copy would lose. Save opt.state_dict() (torch.save or torch.distributed.checkpoint) and "
                    f"load it into a new {type(opt).__name__} built over the parameters")
