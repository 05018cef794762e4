"""The operators of ``ai.onnx.preview.training`` (Adam, Adagrad, Momentum) as functions.

Each public function is the operator: inputs in the operator's order (``R, T``, all X, all G,
then each state kind), outputs in the operator's order, functional (the arguments are never
written: the update runs on fresh copies, through fastadam's fused kernels with
``convention="onnx"``), every output in its input's dtype.  ``T`` is an int64 scalar handed to
the kernels as a Python int, so step counts past 2**32 stay exact.

``apply_*`` run the same update in place on arrays the caller owns; ``TrainingSession`` uses them
for optimizer nodes whose outputs are bound straight back to their inputs.
"""
import numbers

import numpy as np

import fastadam

from ..optim.lowlevel import adam_coefficients, dense_step


def _scalar(value, name, kind):
    if value.__class__ is np.ndarray and value.ndim == 0:  # the common case: a 0-d tensor
        if kind == "int" and value.dtype.kind in "iu":
            return int(value)
        if kind == "float" and value.dtype.kind == "f":
            return float(value)
    a = np.asarray(value)
    if a.size != 1:
        raise ValueError(f"{name}: expected a scalar, got shape {a.shape}")
    if kind == "int":
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected an integer (int64) scalar, got dtype {a.dtype}")
        return int(a.reshape(()))
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name}: expected a floating-point scalar, got dtype {a.dtype}")
    return float(a.reshape(()))


def _groups(op, inputs, per_group):
    """Split the variadic inputs into ``per_group`` lists (X, G, states...) and check them."""
    if len(inputs) == 0 or len(inputs) % per_group:
        raise ValueError(f"{op}: expected a positive multiple of {per_group} tensors after R and "
                         f"T (X..., G..., then the states), got {len(inputs)}")
    n = len(inputs) // per_group
    arrays = [np.asarray(a) for a in inputs]
    kinds = "XGVH" if per_group == 4 else ("XGH" if op == "Adagrad" else "XGV")
    lists = [arrays[k * n:(k + 1) * n] for k in range(per_group)]
    for i in range(n):
        x = lists[0][i]
        if x.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError(f"{op}: X[{i}]: expected float16, float32 or float64, got {x.dtype}")
        for k in range(1, per_group):
            a = lists[k][i]
            if a.dtype != x.dtype:
                raise TypeError(f"{op}: {kinds[k]}[{i}]: expected dtype {x.dtype} (the dtype of "
                                f"X[{i}]), got {a.dtype}")
            if a.shape != x.shape:
                raise ValueError(f"{op}: {kinds[k]}[{i}]: expected shape {x.shape} (the shape of "
                                 f"X[{i}]), got {a.shape}")
    return lists


def _by_dtype(lists):
    """Indices of the tensors grouped by dtype (one compiled call per dtype)."""
    xs = lists[0]
    first = xs[0].dtype
    for x in xs:
        if x.dtype != first:
            break
    else:
        return [range(len(xs))]
    groups = {}
    for i, x in enumerate(xs):
        groups.setdefault(x.dtype, []).append(i)
    return list(groups.values())


def _dry_run(call, lists, groups):
    """Run each dtype group's call on empty arrays of its dtype before any group writes: a
    check that depends on the dtype (a hyper-parameter float32 cannot hold, where float64 can)
    then fails while nothing is written, so a step over several groups is all or nothing."""
    for idx in groups:
        dtype = lists[0][idx[0]].dtype
        call([[np.empty(0, dtype)] for _ in lists])


def _select(lst, idx):
    return lst if len(idx) == len(lst) else [lst[i] for i in idx]


def contiguous(a):
    """``a`` or a C-contiguous copy (keeps 0-d arrays 0-d, unlike np.ascontiguousarray)."""
    return a if a.flags.c_contiguous else np.array(a, order="C")


def _fresh(lists, written):
    """Writable contiguous copies of the lists that the kernel writes; the rest as they are."""
    return [[np.array(a, order="C") for a in lst] if k in written
            else [contiguous(a) for a in lst] for k, lst in enumerate(lists)]


def _outputs(lists, written):
    return tuple(a for k in written for a in lists[k])


def _f32(value):
    """``value`` rounded to float32: the schemas' float defaults are float32 numbers."""
    return float(np.float32(value))


# the schemas' attribute defaults (a node without the attribute computes with these)
ADAM_DEFAULTS = dict(alpha=_f32(0.9), beta=_f32(0.999), epsilon=_f32(1e-6),
                     norm_coefficient=0.0, norm_coefficient_post=0.0)
ADAGRAD_DEFAULTS = dict(decay_factor=0.0, epsilon=_f32(1e-6), norm_coefficient=0.0)


def _need(name):
    fun = getattr(fastadam, name, None)
    if fun is None:
        raise NotImplementedError(f"fastadam.{name} is not available in this version of fastadam")
    return fun


# ---------------------------------------------------------------------------------------------
# Adam
# ---------------------------------------------------------------------------------------------


def apply_adam(R, T, lists, *, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post):
    """The Adam update in place on ``lists = [X, G, V, H]`` (checked by ``_groups``)."""
    lr, t = _scalar(R, "R", "float"), _scalar(T, "T", "int")
    xs, gs, vs, hs = lists
    # what fastadam.step_inplace does, with the coefficients folded once for every dtype group
    coeffs = adam_coefficients(t, lr, alpha, beta, epsilon, "onnx", norm_coefficient, False,
                               norm_coefficient_post)
    groups = _by_dtype(lists)
    if len(groups) == 1:
        dense_step(coeffs, xs, gs, [("m", vs), ("v", hs)], False, None)
        return
    _dry_run(lambda e: dense_step(coeffs, e[0], e[1], [("m", e[2]), ("v", e[3])], False, None),
             lists, groups)
    for idx in groups:
        dense_step(coeffs, _select(xs, idx), _select(gs, idx),
                   [("m", _select(vs, idx)), ("v", _select(hs, idx))], False, None)


def adam(R, T, *inputs, alpha=ADAM_DEFAULTS["alpha"], beta=ADAM_DEFAULTS["beta"],
         epsilon=ADAM_DEFAULTS["epsilon"], norm_coefficient=0.0, norm_coefficient_post=0.0):
    """``ai.onnx.preview.training.Adam``: returns ``(X_new..., V_new..., H_new...)``.

    The defaults are the schema's, float32 numbers: 0.9, 0.999 and 1e-6 rounded to float32.

    Per tensor, with ``r = R * sqrt(1 - beta**T) / (1 - alpha**T)`` if ``T > 0`` else ``R``::

        G' = G + norm_coefficient * X
        V_new = alpha * V + (1 - alpha) * G'
        H_new = beta * H + (1 - beta) * G'**2
        X_new = (1 - norm_coefficient_post) * (X - r * V_new / (sqrt(H_new) + epsilon))

    ``inputs``: X1..Xn, G1..Gn, V1..Vn, H1..Hn (each G, V, H of its X's shape and dtype).
    """
    lists = _fresh(_groups("Adam", inputs, 4), (0, 2, 3))
    apply_adam(R, T, lists, alpha=alpha, beta=beta, epsilon=epsilon,
               norm_coefficient=norm_coefficient, norm_coefficient_post=norm_coefficient_post)
    return _outputs(lists, (0, 2, 3))


# ---------------------------------------------------------------------------------------------
# Adagrad
# ---------------------------------------------------------------------------------------------


def apply_adagrad(R, T, lists, *, decay_factor, epsilon, norm_coefficient):
    """The Adagrad update in place on ``lists = [X, G, H]``."""
    lr, t = _scalar(R, "R", "float"), _scalar(T, "T", "int")
    step = _need("adagrad_step_inplace")
    xs, gs, hs = lists
    groups = _by_dtype(lists)

    def call(x, g, h):
        step(x, g, h, t, lr=lr, lr_decay=decay_factor, eps=epsilon,
             weight_decay=norm_coefficient, convention="onnx")
    if len(groups) > 1:
        _dry_run(lambda e: call(*e), lists, groups)
    for idx in groups:
        call(_select(xs, idx), _select(gs, idx), _select(hs, idx))


def adagrad(R, T, *inputs, decay_factor=0.0, epsilon=ADAGRAD_DEFAULTS["epsilon"],
            norm_coefficient=0.0):
    """``ai.onnx.preview.training.Adagrad``: returns ``(X_new..., H_new...)``.

    The defaults are the schema's (``epsilon`` is 1e-6 rounded to float32).  ``T`` may be
    negative, as in the operator's pseudo-code (a ``T`` with ``1 + T * decay_factor == 0`` is
    refused).

    Per tensor, with ``r = R / (1 + T * decay_factor)``::

        G' = G + norm_coefficient * X
        H_new = H + G'**2
        X_new = X - r * G' / (sqrt(H_new) + epsilon)
    """
    lists = _fresh(_groups("Adagrad", inputs, 3), (0, 2))
    apply_adagrad(R, T, lists, decay_factor=decay_factor, epsilon=epsilon,
                  norm_coefficient=norm_coefficient)
    return _outputs(lists, (0, 2))


# ---------------------------------------------------------------------------------------------
# Momentum
# ---------------------------------------------------------------------------------------------


def _check_momentum_attrs(alpha, beta, mode, norm_coefficient):
    for name, v in (("alpha", alpha), ("beta", beta), ("norm_coefficient", norm_coefficient)):
        if not isinstance(v, numbers.Real):
            raise TypeError(f"Momentum: {name}: expected a float (a required attribute), got "
                            f"{type(v).__name__}")
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum: mode: expected 'standard' or 'nesterov', got {mode!r}")


def apply_momentum(R, T, lists, *, alpha, beta, mode, norm_coefficient):
    """The Momentum update in place on ``lists = [X, G, V]``."""
    _check_momentum_attrs(alpha, beta, mode, norm_coefficient)
    lr, t = _scalar(R, "R", "float"), _scalar(T, "T", "int")
    step = _need("momentum_step_inplace")
    xs, gs, vs = lists
    groups = _by_dtype(lists)

    def call(x, g, v):
        step(x, g, v, t, lr=lr, momentum=alpha, dampening=1.0 - beta,
             nesterov=(mode == "nesterov"), weight_decay=norm_coefficient, convention="onnx")
    if len(groups) > 1:
        _dry_run(lambda e: call(*e), lists, groups)
    for idx in groups:
        call(_select(xs, idx), _select(gs, idx), _select(vs, idx))


def momentum(R, T, *inputs, alpha, beta, mode, norm_coefficient):
    """``ai.onnx.preview.training.Momentum``: returns ``(X_new..., V_new...)``.

    Per tensor, with ``b = beta if T > 0 else 1`` (any ``T``, negative included)::

        G' = G + norm_coefficient * X
        V_new = alpha * V + b * G'
        X_new = X - R * V_new                      # mode "standard"
        X_new = X - R * (G' + alpha * V_new)       # mode "nesterov"
    """
    _check_momentum_attrs(alpha, beta, mode, norm_coefficient)
    lists = _fresh(_groups("Momentum", inputs, 3), (0, 2))
    apply_momentum(R, T, lists, alpha=alpha, beta=beta, mode=mode,
                   norm_coefficient=norm_coefficient)
    return _outputs(lists, (0, 2))


# name -> (function, in-place update, inputs per tensor, indices of the written lists,
#          attribute defaults (None: required))
OPTIMIZERS = {
    "Adam": (adam, apply_adam, 4, (0, 2, 3), ADAM_DEFAULTS),
    "Adagrad": (adagrad, apply_adagrad, 3, (0, 2), ADAGRAD_DEFAULTS),
    "Momentum": (momentum, apply_momentum, 3, (0, 2),
                 dict(alpha=None, beta=None, mode=None, norm_coefficient=None)),
}
