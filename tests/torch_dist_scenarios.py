"""Scenarios run on two gloo processes by tests/test_torch_fsdp.py:

    python tests/torch_dist_scenarios.py RANK WORLD PORT OUTDIR NAME [NAME ...]

Each scenario trains a small float32 model under torch's distributed wrappers (FSDP2's
``fully_shard``, with and without ``CPUOffloadPolicy``; DDP; ``ZeroRedundancyOptimizer``)
twice on the same seeded data, once with a ``torch.optim`` optimizer and once with its
``fastadam.torch`` twin, and rank 0 pickles what the test compares (whole parameters gathered
with ``full_tensor()``, the optimizers' state layouts, caught error messages) to
``OUTDIR/NAME.pkl``.  The comparisons themselves are made by the test.  A scenario that raises
writes its traceback instead, so the test shows it.
"""
import os
import pickle
import sys
import time
import traceback

START = time.perf_counter()

import torch
import torch.distributed as dist

import fastadam.torch as ft

STEPS = 5
# torch.optim's optimizer and fastadam's twin, with the same arguments
OPTIMIZERS = {
    "adam": (torch.optim.Adam, ft.Adam, dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1)),
    "adam_amsgrad": (torch.optim.Adam, ft.Adam, dict(lr=1e-2, amsgrad=True, maximize=True)),
    "adamw": (torch.optim.AdamW, ft.AdamW, dict(lr=1e-2, weight_decay=0.3)),
    "sgd_momentum": (torch.optim.SGD, ft.SGD, dict(lr=5e-2, momentum=0.9, nesterov=True,
                                                   weight_decay=0.01)),
    "sgd": (torch.optim.SGD, ft.SGD, dict(lr=5e-2)),
}


def model(seed=0):
    """Uneven shards on two ranks: 5 and 3 rows split 3+2 and 2+1; the last bias has one
    element, so rank 1's shard of it is empty."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3),
                               torch.nn.Tanh(), torch.nn.Linear(3, 1))


def sharded(offload=False, seed=0):
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    # pin_memory=True (the default) needs an accelerator: on a CPU-only machine torch raises
    # "Cannot access accelerator device when none is available"
    kw = dict(offload_policy=CPUOffloadPolicy(pin_memory=False)) if offload else {}
    net = model(seed)
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **kw)
    fully_shard(net, **kw)
    return net


def batch(step, rank):
    """Rank ``rank``'s data at ``step``: every rank sees its own batch."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 1, generator=g)


def train(net, opt, first, last):
    rank = dist.get_rank()
    for step in range(first, last):
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()


def gathered(net):
    """Every parameter whole, as float64 NumPy arrays (a collective: every rank calls it)."""
    out = []
    for p in net.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
        out.append(full.detach().double().numpy().copy())
    return out


def state_layout(opt):
    """Each state entry's (key, type, placements, local shape, dtype), in parameter order."""
    out = []
    for p in (p for g in opt.param_groups for p in g["params"]):
        for k, v in sorted(opt.state[p].items()):
            local = v.to_local() if hasattr(v, "to_local") else v
            out.append((k, type(v).__name__, str(getattr(v, "placements", None)),
                        tuple(local.shape), str(v.dtype)))
    return out


# ---- scenarios: each returns what rank 0 pickles ------------------------------------------------
def fsdp_against_torch(name, offload=False):
    torch_cls, fast_cls, kw = OPTIMIZERS[name]
    out = {"initial": gathered(sharded(offload))}
    for label, cls in (("torch", torch_cls), ("fastadam", fast_cls)):
        net = sharded(offload)
        opt = cls(net.parameters(), **kw)
        train(net, opt, 0, STEPS)
        out[label] = gathered(net)
        out[label + "_layout"] = state_layout(opt)
    return out


def fsdp_dcp(_):
    """A DCP checkpoint of model and optimizer after 3 steps, loaded into a new model and
    optimizer that take 3 more; also torch.optim's checkpoint loaded into fastadam and back."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    torch_cls, fast_cls, kw = OPTIMIZERS["adamw"]
    root = os.environ["SCENARIO_DIR"]
    out = {}

    def save(net, opt, path):
        dcp.save({"model": get_model_state_dict(net),
                  "optim": get_optimizer_state_dict(net, opt)}, checkpoint_id=path)

    def resume(cls, path):
        net = sharded(seed=1)  # other initial values: everything must come from the checkpoint
        opt = cls(net.parameters(), **kw)
        sd = {"model": get_model_state_dict(net), "optim": get_optimizer_state_dict(net, opt)}
        dcp.load(sd, checkpoint_id=path)
        set_model_state_dict(net, sd["model"])
        set_optimizer_state_dict(net, opt, sd["optim"])
        return net, opt

    for label, cls in (("torch", torch_cls), ("fastadam", fast_cls)):
        net = sharded()
        opt = cls(net.parameters(), **kw)
        train(net, opt, 0, 3)
        save(net, opt, os.path.join(root, f"dcp_{label}"))
        train(net, opt, 3, 6)
        out[f"{label}_straight"] = gathered(net)
        out[f"{label}_saved_step"] = [float(opt.state[p]["step"])
                                      for p in net.parameters()]
    for saved, loaded_cls, label in (("fastadam", fast_cls, "fastadam_from_fastadam"),
                                     ("torch", fast_cls, "fastadam_from_torch"),
                                     ("fastadam", torch_cls, "torch_from_fastadam")):
        net, opt = resume(loaded_cls, os.path.join(root, f"dcp_{saved}"))
        out[label + "_loaded_step"] = [float(opt.state[p]["step"]) for p in net.parameters()]
        out[label + "_layout"] = state_layout(opt)
        train(net, opt, 3, 6)
        out[label] = gathered(net)
    # optimizer.state_dict() keeps DTensor state, as torch.optim's
    net = sharded()
    opt = fast_cls(net.parameters(), **kw)
    train(net, opt, 0, 1)
    sd = opt.state_dict()
    out["state_dict_types"] = sorted({type(v).__name__ for s in sd["state"].values()
                                      for v in s.values()})
    return out


def fsdp_refusals(_):
    """State tensors that are not sharded like their parameter, 8-bit states and master copies
    are refused before any write."""
    from torch.distributed.tensor import Replicate, distribute_tensor
    net = sharded()
    opt = ft.Adam(net.parameters(), lr=1e-2)
    train(net, opt, 0, 1)
    p = next(net.parameters())
    out = {}
    cases = {
        "plain": lambda: torch.zeros(p.shape),
        "replicated": lambda: distribute_tensor(torch.zeros(p.shape), p.device_mesh,
                                                [Replicate()]),
    }
    for case, make in cases.items():
        kept = opt.state[p]["exp_avg"]
        opt.state[p]["exp_avg"] = make()
        before = gathered(net)
        x, y = batch(9, dist.get_rank())
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        try:
            opt.step()
            out[case] = None
        except ValueError as exc:
            out[case] = str(exc)
        out[case + "_unchanged"] = all((a == b).all() for a, b in zip(before, gathered(net)))
        opt.state[p]["exp_avg"] = kept
    # 8-bit states and master copies are not sharded like the parameter: refused
    for case, kw in (("int8", dict(state_dtype="int8")), ("master", dict(master_weights=True))):
        net = sharded(seed=1)
        opt = ft.AdamW(net.parameters(), lr=1e-2, **kw)
        before = gathered(net)
        x, y = batch(9, dist.get_rank())
        torch.nn.functional.mse_loss(net(x), y).backward()
        try:
            opt.step()
            out[case] = None
        except ValueError as exc:
            out[case] = str(exc)
        out[case + "_unchanged"] = all((a == b).all() for a, b in zip(before, gathered(net)))
        out[case + "_no_state"] = not any(opt.state[p] for p in net.parameters())
    return out


def fsdp_bfloat16_states(_):
    """state_dtype="bfloat16" on DTensor parameters against the same optimizer under DDP
    (plain parameters, the same averaged gradients): the states stay DTensors."""
    from torch.nn.parallel import DistributedDataParallel
    out = {"initial": gathered(model())}
    net = sharded()
    opt = ft.AdamW(net.parameters(), lr=1e-2, state_dtype="bfloat16")
    train(net, opt, 0, STEPS)
    out["fsdp"], out["fsdp_layout"] = gathered(net), state_layout(opt)
    ddp = DistributedDataParallel(model())
    opt = ft.AdamW(ddp.parameters(), lr=1e-2, state_dtype="bfloat16")
    train(ddp, opt, 0, STEPS)
    out["ddp"] = gathered(ddp.module)
    return out


def replicated_against_torch(name, zero=False):
    """DDP (and with ``zero``, ZeroRedundancyOptimizer(optimizer_class=...) on top)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel
    torch_cls, fast_cls, kw = OPTIMIZERS[name]
    out = {"initial": gathered(model())}
    for label, cls in (("torch", torch_cls), ("fastadam", fast_cls)):
        net = DistributedDataParallel(model())
        if zero:
            opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=cls, **kw)
        else:
            opt = cls(net.parameters(), **kw)
        train(net, opt, 0, STEPS)
        out[label] = gathered(net.module)
        if zero:  # the consolidated state, as a checkpoint on rank 0 holds it
            opt.consolidate_state_dict(to=0)
            if dist.get_rank() == 0:
                out[label + "_layout"] = [
                    (k, type(v).__name__, tuple(v.shape) if torch.is_tensor(v) else None)
                    for s in opt.state_dict()["state"].values() for k, v in sorted(s.items())]
    return out


SCENARIOS = {
    **{f"fsdp_{n}": (fsdp_against_torch, n, {}) for n in OPTIMIZERS},
    "fsdp_offload_adam": (fsdp_against_torch, "adam", dict(offload=True)),
    "fsdp_offload_sgd_momentum": (fsdp_against_torch, "sgd_momentum", dict(offload=True)),
    "fsdp_dcp": (fsdp_dcp, None, {}),
    "fsdp_refusals": (fsdp_refusals, None, {}),
    "fsdp_bfloat16_states": (fsdp_bfloat16_states, None, {}),
    "ddp_adam": (replicated_against_torch, "adam", {}),
    "zero_adamw": (replicated_against_torch, "adamw", dict(zero=True)),
}


def main(rank, world, port, outdir, names):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        for name in names:
            fn, arg, kw = SCENARIOS[name]
            try:
                result = fn(arg, **kw)
            except Exception:
                result = {"error": f"rank {rank}: {traceback.format_exc()}"}
            if rank == 0 or "error" in result:
                path = os.path.join(outdir, f"{name}.pkl" if rank == 0 else
                                    f"{name}.rank{rank}.pkl")
                with open(path, "wb") as f:
                    pickle.dump(result, f)
            print(f"scenario {name} done on rank {rank} at {time.perf_counter() - START:.1f} s",
                  flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("SCENARIO_DIR", sys.argv[4])
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:])
