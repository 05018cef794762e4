"""The operators of ``ai.onnx.preview.training`` (Adam, Adagrad, Momentum) as functions.

Each public function is the operator: inputs in the operator's order (``R, T``, all X, all G,
then each state kind), outputs in the operator's order, functional (the arguments are never
written: the update runs on fresh copies, through fastadam's fused kernels with
``convention="onnx"``), every output in its input's dtype.  ``T`` is an int64 scalar handed to
the kernels as a Python int, so step counts past 2**32 stay exact.

``apply_*`` run the same update in place on arrays the caller owns; ``TrainingSession`` uses them
for optimizer nodes whose outputs are bound straight back to their inputs (and passes a
``cache``, so the arrays are checked once, not at every step).  Every update goes
through ``fastadam.optim.prepare_step``, one prepared step per dtype group: all groups are
prepared and their hyper-parameters checked (``PreparedStep.check``) before any group writes,
so a step over several dtypes is all or nothing.  Which optimizer an operator runs, and which
state slots its V/H inputs are, is read from the registry (``fastadam.optim.optimizer_spec``,
its ``onnx_op`` and ``slots``).
"""
import itertools
import numbers
import operator

import numpy as np

from ..optim import optimizer_spec, prepare_step


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


def _rate(op, R):
    """The learning rate ``R`` as a float: finite and >= 0 (a negative rate steps uphill)."""
    lr = _scalar(R, "R", "float")
    if not lr >= 0.0 or lr == float("inf"):
        raise ValueError(f"{op}: R: expected a finite learning rate >= 0, got {lr} (a negative "
                         f"rate steps uphill)")
    return lr


def _norm(op, norm_coefficient):
    """``norm_coefficient`` >= 0: the L2 term ``0.5 * norm_coefficient * ||X||^2`` with a
    negative coefficient pushes every parameter away from 0 without bound (fastadam's
    ``weight_decay`` rule, the same in every entry point)."""
    if not norm_coefficient >= 0.0:
        raise ValueError(f"{op}: norm_coefficient: expected a coefficient >= 0, got "
                         f"{norm_coefficient} (a negative L2 coefficient pushes the parameters "
                         f"away from 0)")
    return norm_coefficient


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


def _same(kept, written):
    """``kept`` (a list or None) holds the very objects of ``written``, in order."""
    return kept is not None and len(kept) == len(written) and \
        all(map(operator.is_, kept, written))


def _hyper(cache, lr, make):
    """The keyword dict of a step at rate ``lr``: ``make(lr)``, kept in ``cache`` (when
    given) and reused while the rate stays the same (the attributes do not change)."""
    if cache is None:
        return make(lr)
    hyper = cache.get("hyper")
    if hyper is None or hyper["lr"] != lr:
        hyper = cache["hyper"] = make(lr)
    return hyper


def _apply(name, t, lists, hyper, cache):
    """The update of registry optimizer ``name`` in place on ``lists = [X, G, states...]``
    (checked by ``_groups``): one prepared step per dtype group, every group checked before
    the first one writes.  ``cache``: None, or a dict the caller keeps for one optimizer node
    whose X and state arrays are the same objects at every step (``TrainingSession``'s
    in-place updates): their prepared steps are kept there and reused while they are (a
    caller that hands the very ``lists`` object of the last call again, its X and state lists
    untouched, skips the comparison)."""
    xs, gs, states = lists[0], lists[1], lists[2:]
    if cache is not None and cache.get("lists") is lists:
        steps = cache["steps"]
    else:
        written = list(itertools.chain(xs, *states))
        if cache is not None and _same(cache.get("written"), written):
            steps = cache["steps"]
        else:
            slots = optimizer_spec(name).slots
            steps = [(prepare_step(name, _select(xs, idx),
                                   {slot: _select(s, idx) for slot, s in zip(slots, states)}),
                      idx) for idx in _by_dtype(lists)]
        if cache is not None:
            cache.update(written=written, steps=steps, lists=lists)
    if len(steps) > 1:  # one group checks before it writes; several: all before the first
        for step, idx in steps:
            step.check(t, **hyper)
    for step, idx in steps:
        step.step(gs if len(steps) == 1 else _select(gs, idx), t, **hyper)


# ---------------------------------------------------------------------------------------------
# Adam
# ---------------------------------------------------------------------------------------------


def apply_adam(R, T, lists, *, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post,
               cache=None):
    """The Adam update in place on ``lists = [X, G, V, H]`` (checked by ``_groups``)."""
    lr, t = _rate("Adam", R), _scalar(T, "T", "int")
    _apply("adam", t, lists, _hyper(cache, lr, lambda lr: dict(
        lr=lr, beta1=alpha, beta2=beta, eps=epsilon, convention="onnx",
        weight_decay=_norm("Adam", norm_coefficient), post_decay=norm_coefficient_post)), cache)


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
    ``R`` must be finite and >= 0 (a negative rate steps uphill).
    """
    lists = _fresh(_groups("Adam", inputs, 4), (0, 2, 3))
    apply_adam(R, T, lists, alpha=alpha, beta=beta, epsilon=epsilon,
               norm_coefficient=norm_coefficient, norm_coefficient_post=norm_coefficient_post)
    return _outputs(lists, (0, 2, 3))


# ---------------------------------------------------------------------------------------------
# Adagrad
# ---------------------------------------------------------------------------------------------


def apply_adagrad(R, T, lists, *, decay_factor, epsilon, norm_coefficient, cache=None):
    """The Adagrad update in place on ``lists = [X, G, H]``."""
    lr, t = _rate("Adagrad", R), _scalar(T, "T", "int")
    if decay_factor < 0.0:
        raise ValueError(f"Adagrad: decay_factor: expected a decay >= 0, got {decay_factor}")
    if decay_factor and not 1.0 + t * decay_factor > 0.0:
        # r = R / (1 + T * decay_factor) <= 0 or undefined: the step would go uphill
        raise ValueError(f"Adagrad: T: {t} with decay_factor {decay_factor:.7g} makes "
                         f"1 + T * decay_factor = {1.0 + t * decay_factor:g}, so the learning "
                         f"rate R / (1 + T * decay_factor) is not positive; T counts the updates "
                         f"already applied (0 or 1 at the first), expected T > "
                         f"{-1.0 / decay_factor:g}")
    _apply("adagrad", t, lists, dict(lr=lr, lr_decay=decay_factor, eps=epsilon,
                                     weight_decay=_norm("Adagrad", norm_coefficient),
                                     convention="onnx"), cache)


def adagrad(R, T, *inputs, decay_factor=0.0, epsilon=ADAGRAD_DEFAULTS["epsilon"],
            norm_coefficient=0.0):
    """``ai.onnx.preview.training.Adagrad``: returns ``(X_new..., H_new...)``.

    The defaults are the schema's (``epsilon`` is 1e-6 rounded to float32).  ``T`` counts the
    updates already applied; a negative ``T`` is computed as the operator's pseudo-code (and
    ``onnx.reference``) computes it while ``1 + T * decay_factor > 0``, and refused otherwise:
    there the rate ``r`` would be negative (the step uphill) or undefined.  ``R`` must be finite
    and >= 0, ``decay_factor`` >= 0.

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
    for name, v in (("alpha", alpha), ("beta", beta)):
        # a negative beta turns the gradient around; a negative alpha, in the nesterov form
        # G' + alpha * V_new, can too (from zero momentum: (1 + alpha * beta) * G')
        if not v >= 0.0:
            raise ValueError(f"Momentum: {name}: expected a coefficient >= 0, got {v} (a "
                             f"negative one can step uphill)")
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum: mode: expected 'standard' or 'nesterov', got {mode!r}")
    _norm("Momentum", norm_coefficient)


def apply_momentum(R, T, lists, *, alpha, beta, mode, norm_coefficient, cache=None):
    """The Momentum update in place on ``lists = [X, G, V]``."""
    _check_momentum_attrs(alpha, beta, mode, norm_coefficient)
    lr, t = _rate("Momentum", R), _scalar(T, "T", "int")
    _apply("momentum", t, lists, dict(lr=lr, momentum=alpha, dampening=1.0 - beta,
                                      nesterov=(mode == "nesterov"),
                                      weight_decay=norm_coefficient, convention="onnx"), cache)


def momentum(R, T, *inputs, alpha, beta, mode, norm_coefficient):
    """``ai.onnx.preview.training.Momentum``: returns ``(X_new..., V_new...)``.

    ``R``, ``alpha`` and ``beta`` must be >= 0 (a negative one can step uphill).  Per tensor,
    with ``b = beta if T > 0 else 1`` (any ``T``, negative included)::

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


def _operator(name, fun, apply, n_states, defaults):
    """The row of registry optimizer ``name``: its ONNX operator's name (from the registry) ->
    (function, in-place update, inputs per tensor (X, G, then ``n_states`` states, which are
    the first ``n_states`` slots of the spec), indices of the written lists, attribute
    defaults (None: required))."""
    spec = optimizer_spec(name)
    if spec.onnx_op is None or len(spec.slots) < n_states:
        raise ValueError(f"{name}: the registry gives it no ONNX operator with {n_states} states")
    return spec.onnx_op, (fun, apply, 2 + n_states, (0, *range(2, 2 + n_states)), defaults)


OPTIMIZERS = dict([
    _operator("adam", adam, apply_adam, 2, ADAM_DEFAULTS),
    _operator("adagrad", adagrad, apply_adagrad, 1, ADAGRAD_DEFAULTS),
    _operator("momentum", momentum, apply_momentum, 1,
              dict(alpha=None, beta=None, mode=None, norm_coefficient=None)),
])
