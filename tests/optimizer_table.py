"""The optimizer table: one ``OptimizerInfo`` row per optimizer (as PyTorch's
``torch.testing._internal.common_optim.optim_db``), read by test_optimizer_table.py's dense,
sparse, object and GPU-emulation sweeps.  A new optimizer is tested by adding a row: its
functional steps, its float64 oracle (tests/reference.py), its option sets and its class.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import fastadam
from fastadam._core._registry import spec
from fastadam.optim._lion import HYPER_RULES as LION_RULES
from fastadam.optim._rmsprop import HYPER_RULES as RMSPROP_RULES
from fastadam.optim._rowwise_adagrad import HYPER_RULES as ROWWISE_RULES
from reference import (adagrad_reference, adam_reference, lion_reference, momentum_reference,
                       rmsprop_reference, rowwise_adagrad_reference)


@dataclass(frozen=True)
class ErrorInput:
    """A bad hyper-parameter (``options``: functional keywords) that every entry point refuses
    with ``error``, naming ``arg`` (as torch.testing's ``ErrorOptimizerInput``)."""

    options: Dict[str, Any]
    error: type
    arg: str

    def __repr__(self):
        return ",".join(f"{k}={v!r}" for k, v in self.options.items())


#: Adam's, Adagrad's and SGD's rules of the two hyper-parameters every entry point checks alike
#: (their other ranges are half-open or depend on the convention: their own tests)
NON_NEGATIVE_RULES = {"lr": (0.0, None), "weight_decay": (0.0, None)}


def rule_errors(rules):
    """The error rows of an optimizer's ``HYPER_RULES`` table: a value below each range and
    above each bounded one, and the rows every real hyper-parameter shares."""
    rows = []
    for name, (low, high) in rules.items():
        rows.append(ErrorInput({name: low - 0.5}, ValueError, name))
        if high is not None:
            rows.append(ErrorInput({name: high + 0.5}, ValueError, name))
    return rows + [ErrorInput({"lr": float("nan")}, ValueError, "lr"),
                   ErrorInput({"lr": [0.1]}, TypeError, "lr"),
                   ErrorInput({"weight_decay": float("inf")}, ValueError, "weight_decay")]


@dataclass(frozen=True)
class OptimizerInfo:
    """name: the registry name.  dense(x, g, state, t, **options) and sparse(x, grad, state, t,
    **options): the functional steps with ``state`` a dict of the slots (functional names).
    reference(x, g, state, t, **options) -> (x, state): the float64 oracle.  option_sets: the
    functional keyword sets the sweeps run.  cls / object_options(options): the optimizer class
    and its constructor keywords for an option set (None: the set has no object form).
    sparse_ok(options): whether the sparse walk has the set.  first_t: the first step number.
    error_inputs: bad hyper-parameters that every entry point refuses alike.  torch_class /
    torch_options(options): the fastadam.torch class and its keywords (None: none).
    element_wise: False for a row-wise optimizer (one state value per row): no prepared step,
    no low-precision states, no GPU kernel yet; its slots are shaped by the spec."""

    name: str
    dense: Callable
    sparse: Callable
    reference: Callable
    option_sets: List[Dict[str, Any]]
    cls: type
    object_options: Callable
    sparse_ok: Callable = lambda options: True
    first_t: int = 1
    error_inputs: List[ErrorInput] = field(default_factory=list)
    torch_class: Optional[str] = None
    torch_options: Callable = lambda options: None
    element_wise: bool = True

    def slot_shape(self, name, shape):
        """The shape of functional slot ``name`` of a parameter of ``shape``."""
        return spec(self.name).slot_shape(name, shape)

    def slots(self, options) -> Tuple[str, ...]:
        """The functional slot names this option set uses, in kernel order."""
        s = spec(self.name)
        coeffs = s.fold(self.first_t, **fold_options(self.name, options))
        return tuple(s.slots[i] for i in s.slot_indices(coeffs.flags))

    def object_slot(self, name):
        """The object's name of functional slot ``name``."""
        s = spec(self.name)
        return s.object_slots[s.slots.index(name)]


def fold_options(name, options):
    """The option set as the spec's fold takes it (the functional steps' keywords)."""
    out = dict(options)
    if name == "adam":
        keys = ("lr", "beta1", "beta2", "eps", "convention", "weight_decay",
                "decoupled_weight_decay", "post_decay", "amsgrad", "nesterov", "maximize",
                "grad_scale")
        defaults = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, convention="tf")
        return {k: out.get(k, defaults.get(k)) for k in keys if k in out or k in defaults}
    return out


def _adam_dense(x, g, s, t, **kw):
    return fastadam.step_inplace(x, g, s["m"], s["v"], t, v_max=s.get("v_max"), **kw)


def _adam_sparse(x, grad, s, t, **kw):
    return fastadam.sparse_step_inplace(x, grad, s["m"], s["v"], t, **kw)


def _adam_reference(x, g, s, t, **kw):
    kw = dict(kw)
    amsgrad = kw.pop("amsgrad", False)
    out = adam_reference(x, g, s["m"], s["v"], t, amsgrad=amsgrad, v_max=s.get("v_max"), **kw)
    names = ["m", "v"] + (["v_max"] if amsgrad else [])
    return out[0], dict(zip(names, out[1:]))


def _adam_object(o):
    if o.get("grad_scale") is not None:
        return None
    kw = dict(lr=o.get("lr", 1e-3), betas=(o.get("beta1", 0.9), o.get("beta2", 0.999)),
              eps=o.get("eps", 1e-8), convention=o.get("convention", "tf"))
    for k in ("weight_decay", "decoupled_weight_decay", "post_decay", "amsgrad", "nesterov",
              "maximize"):
        if k in o:
            kw[k] = o[k]
    return kw


def _rmsprop_dense(x, g, s, t, **kw):
    return fastadam.rmsprop_step_inplace(x, g, s["square_avg"], t,
                                         momentum_buffer=s.get("momentum_buffer"),
                                         grad_avg=s.get("grad_avg"), **kw)


def _rmsprop_sparse(x, grad, s, t, **kw):
    return fastadam.sparse_rmsprop_step_inplace(x, grad, s["square_avg"], t,
                                                momentum_buffer=s.get("momentum_buffer"),
                                                grad_avg=s.get("grad_avg"), **kw)


def _rmsprop_reference(x, g, s, t, **kw):
    x, v, b, a = rmsprop_reference(x, g, s["square_avg"], t,
                                   momentum_buffer=s.get("momentum_buffer"),
                                   grad_avg=s.get("grad_avg"), **kw)
    out = {"square_avg": v}
    if b is not None:
        out["momentum_buffer"] = b
    if a is not None:
        out["grad_avg"] = a
    return x, out


def _rmsprop_object(o):
    return None if o.get("grad_scale") is not None else dict(o)


def _lion_dense(x, g, s, t, **kw):
    return fastadam.lion_step_inplace(x, g, s["m"], t, **kw)


def _lion_sparse(x, grad, s, t, **kw):
    return fastadam.sparse_lion_step_inplace(x, grad, s["m"], t, **kw)


def _lion_reference(x, g, s, t, **kw):
    x, m = lion_reference(x, g, s["m"], t, **kw)
    return x, {"m": m}


def _lion_object(o):
    if o.get("grad_scale") is not None:
        return None
    kw = dict(lr=o.get("lr", 1e-4), betas=(o.get("beta1", 0.9), o.get("beta2", 0.99)))
    for k in ("weight_decay", "maximize"):
        if k in o:
            kw[k] = o[k]
    return kw


def _rmsprop_torch(o):
    return None if "convention" in o or "grad_scale" in o else dict(o)


def _lion_torch(o):
    return _lion_object(o)


def _adagrad_reference(x, g, s, t, **kw):
    x, h = adagrad_reference(x, g, s["h"], t, **kw)
    return x, {"h": h}


def _momentum_reference(x, g, s, t, **kw):
    x, v = momentum_reference(x, g, s["v"], t, **kw)
    return x, {"v": v}


def _rowwise_adagrad_reference(x, g, s, t, **kw):
    x, acc = rowwise_adagrad_reference(x, g, s["acc"], t, **kw)
    return x, {"acc": acc}


def _rowwise_object(o):
    return None if o.get("grad_scale") is not None else dict(o)


def _rmsprop_sets():
    sets = []
    for convention in ("torch", "keras"):
        for centered in (False, True):
            for momentum in (0.0, 0.9):
                sets.append(dict(lr=0.01, alpha=0.9, eps=1e-6, convention=convention,
                                 centered=centered, momentum=momentum))
    sets += [dict(lr=0.01, weight_decay=0.1, maximize=True, centered=True),
             dict(lr=0.01, momentum=0.5, grad_scale=4.0)]
    return sets


OPTIMIZERS = [
    OptimizerInfo(
        name="adam", dense=_adam_dense, sparse=_adam_sparse, reference=_adam_reference,
        option_sets=[dict(lr=0.01, convention="torch"), dict(lr=0.01, convention="tf"),
                     dict(lr=0.01, convention="torch", amsgrad=True, weight_decay=0.1),
                     dict(lr=0.01, convention="tf", nesterov=True, maximize=True),
                     dict(lr=0.01, convention="torch", weight_decay=0.1,
                          decoupled_weight_decay=True, grad_scale=8.0)],
        cls=fastadam.Adam, object_options=_adam_object,
        sparse_ok=lambda o: not (o.get("amsgrad") or o.get("nesterov") or o.get("grad_scale")),
        error_inputs=rule_errors(NON_NEGATIVE_RULES), torch_class="Adam",
        torch_options=lambda o: dict(o)),
    OptimizerInfo(
        name="adagrad", dense=lambda x, g, s, t, **kw: fastadam.adagrad_step_inplace(
            x, g, s["h"], t, **kw),
        sparse=lambda x, grad, s, t, **kw: fastadam.sparse_adagrad_step_inplace(
            x, grad, s["h"], t, **kw),
        reference=_adagrad_reference,
        option_sets=[dict(lr=0.05, convention="torch", eps=1e-10),
                     dict(lr=0.05, convention="keras", eps=1e-7, weight_decay=0.1)],
        cls=fastadam.Adagrad, object_options=lambda o: dict(o),
        sparse_ok=lambda o: not o.get("grad_scale"),
        error_inputs=rule_errors(NON_NEGATIVE_RULES), torch_class="Adagrad",
        torch_options=lambda o: dict(o)),
    OptimizerInfo(
        name="momentum", dense=lambda x, g, s, t, **kw: fastadam.momentum_step_inplace(
            x, g, s["v"], t, **kw),
        sparse=lambda x, grad, s, t, **kw: fastadam.sparse_momentum_step_inplace(
            x, grad, s["v"], t, **kw),
        reference=_momentum_reference,
        option_sets=[dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, nesterov=True,
                                                        weight_decay=0.1)],
        cls=fastadam.SGD, object_options=lambda o: dict(o),
        sparse_ok=lambda o: not o.get("grad_scale"),
        error_inputs=rule_errors(NON_NEGATIVE_RULES), torch_class="SGD",
        torch_options=lambda o: dict(o)),
    OptimizerInfo(
        name="rmsprop", dense=_rmsprop_dense, sparse=_rmsprop_sparse,
        reference=_rmsprop_reference, option_sets=_rmsprop_sets(), cls=fastadam.RMSprop,
        object_options=_rmsprop_object,
        sparse_ok=lambda o: not o.get("grad_scale") and not (o.get("centered")
                                                             and o.get("momentum", 0) > 0),
        error_inputs=rule_errors(RMSPROP_RULES), torch_class="RMSprop",
        torch_options=_rmsprop_torch),
    OptimizerInfo(
        name="lion", dense=_lion_dense, sparse=_lion_sparse, reference=_lion_reference,
        option_sets=[dict(lr=0.01), dict(lr=0.01, beta1=0.8, beta2=0.95, weight_decay=0.5,
                                         maximize=True),
                     dict(lr=0.01, grad_scale=2.0)],
        cls=fastadam.Lion, object_options=_lion_object,
        sparse_ok=lambda o: not o.get("grad_scale"),
        error_inputs=rule_errors(LION_RULES), torch_class="Lion", torch_options=_lion_torch),
    OptimizerInfo(
        name="rowwise_adagrad",
        dense=lambda x, g, s, t, **kw: fastadam.rowwise_adagrad_step_inplace(
            x, g, s["acc"], t, **kw),
        sparse=lambda x, grad, s, t, **kw: fastadam.sparse_rowwise_adagrad_step_inplace(
            x, grad, s["acc"], t, **kw),
        reference=_rowwise_adagrad_reference,
        option_sets=[dict(lr=0.05), dict(lr=0.05, eps=1e-6, weight_decay=0.1, lr_decay=0.01),
                     dict(lr=0.05, weight_decay=0.1, weight_decay_mode="decoupled",
                          maximize=True),
                     dict(lr=0.05, weight_decay=0.1, grad_scale=4.0)],
        cls=fastadam.RowWiseAdagrad, object_options=_rowwise_object,
        sparse_ok=lambda o: not o.get("grad_scale"),
        error_inputs=rule_errors(ROWWISE_RULES) + [
            ErrorInput({"eps": 0.0}, ValueError, "eps"),
            ErrorInput({"weight_decay_mode": "l1"}, ValueError, "weight_decay_mode")],
        torch_class="RowWiseAdagrad", torch_options=_rowwise_object, element_wise=False),
]

CASES = [(info, options) for info in OPTIMIZERS for options in info.option_sets]
#: the cases of the element-wise optimizers: the prepared step and the low-precision states
#: (which a row-wise optimizer does not have) sweep these
ELEMENT_CASES = [c for c in CASES if c[0].element_wise]


def case_id(case):
    info, options = case
    return info.name + "-" + ",".join(f"{k}={v}" for k, v in options.items()
                                      if k not in ("lr",))


ERROR_CASES = [(info, row) for info in OPTIMIZERS for row in info.error_inputs]
#: the optimizers' tables of closed ranges (their ends must be legal in every entry point)
RULES = {"rmsprop": RMSPROP_RULES, "lion": LION_RULES, "rowwise_adagrad": ROWWISE_RULES}


def error_case_id(case):
    info, row = case
    return f"{info.name}-{row!r}"
