"""Import of a ``torch.optim.Adam`` / ``AdamW`` run into ``fastadam.Adam`` / ``AdamW``.

Design: the parameters become NumPy views of the torch parameters (``Tensor.numpy()`` shares
memory on the CPU), so fastadam's steps update the torch model in place; the hyper-parameters
map one to one onto convention ``"torch"``; the state (``step``, ``exp_avg``, ``exp_avg_sq``,
``max_exp_avg_sq``) is copied.  torch is imported only here, only when called.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def _number(value: Any) -> float:
    return float(value.item()) if hasattr(value, "item") else float(value)


def adam_from_torch(cls, torch_optimizer: Any, decoupled_only: bool):
    """``cls.from_torch``; ``decoupled_only``: cls is AdamW (decoupled weight decay only)."""
    import torch

    if not isinstance(torch_optimizer, torch.optim.Adam):  # AdamW subclasses Adam in torch 2
        raise TypeError(f"torch_optimizer: expected a torch.optim.Adam or AdamW, got "
                        f"{type(torch_optimizer).__name__}")
    torch_groups = torch_optimizer.param_groups
    amsgrad = {bool(g["amsgrad"]) for g in torch_groups}
    if len(amsgrad) > 1:
        raise ValueError("torch_optimizer: amsgrad differs between groups; fastadam sets it "
                         "for the whole optimizer")
    groups, steps = [], set()
    for gi, g in enumerate(torch_groups):
        decoupled = bool(g.get("decoupled_weight_decay",
                               isinstance(torch_optimizer, torch.optim.AdamW)))
        arrays = []
        for p in g["params"]:
            if p.device.type != "cpu" or not p.is_contiguous():
                raise ValueError(f"torch_optimizer: group {gi} has a parameter that is not a "
                                 f"contiguous CPU tensor")
            arrays.append(p.detach().numpy())
            if p in torch_optimizer.state and "step" in torch_optimizer.state[p]:
                steps.add(int(_number(torch_optimizer.state[p]["step"])))
        group = dict(params=arrays, lr=_number(g["lr"]),
                     betas=tuple(_number(b) for b in g["betas"]), eps=float(g["eps"]), weight_decay=float(g["weight_decay"]),
                     maximize=bool(g["maximize"]))
        if decoupled_only:
            if not decoupled and group["weight_decay"]:
                raise ValueError(f"torch_optimizer: group {gi} uses coupled weight decay "
                                 f"(torch.optim.Adam); import it with fastadam.Adam.from_torch")
        else:
            group["decoupled_weight_decay"] = decoupled
        groups.append(group)
    if len(steps) > 1:
        raise ValueError(f"torch_optimizer: its parameters are at different steps "
                         f"{sorted(steps)}; fastadam keeps one step count")
    opt = cls(groups, convention="torch", amsgrad=amsgrad.pop() if amsgrad else False)
    names = [("m", "exp_avg"), ("v", "exp_avg_sq"), ("v_max", "max_exp_avg_sq")]
    params = [p for g in torch_groups for p in g["params"]]
    for i, p in enumerate(params):
        state = torch_optimizer.state.get(p, {})
        for ours, theirs in names:
            if ours in opt._slots and theirs in state:
                np.copyto(opt._slots[ours][i], state[theirs].detach().numpy())
    opt.t = steps.pop() if steps else 0
    return opt
