"""Public dense Adam API: ``step_inplace`` and the ``Adam`` optimizer object.

Python validates every input and folds the hyper-parameters into a handful of float64
coefficients; one compiled call (fastadam/_dense.pyx) then updates every tensor.
"""
import math
import numbers

import numpy as np

from . import _dense
from ._threads import resolve_num_threads
from ._validation import check_tensor_lists

CONVENTIONS = ("tf", "torch", "onnx")


def _finite_float(value, name):
    if type(value) is float:  # fast path: the common case skips the ABC checks below
        if value - value == 0.0:  # false for inf and nan
            return value
        raise ValueError(f"{name}: expected a finite number, got {value}")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value}")
    return value


def _step_number(t):
    if type(t) is int:
        return t
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Integral):
        raise TypeError(f"t: expected an int step number, got {type(t).__name__}")
    return int(t)


def check_hyperparameters(lr, beta1, beta2, eps, convention, weight_decay, post_decay,
                          grad_scale=None):
    """Validate the scalar hyper-parameters shared by the dense and sparse steps."""
    lr = _finite_float(lr, "lr")
    beta1 = _finite_float(beta1, "beta1")
    beta2 = _finite_float(beta2, "beta2")
    eps = _finite_float(eps, "eps")
    weight_decay = _finite_float(weight_decay, "weight_decay")
    post_decay = _finite_float(post_decay, "post_decay")
    if not 0.0 <= beta1 < 1.0:
        raise ValueError(f"beta1: expected 0 <= beta1 < 1, got {beta1}")
    if not 0.0 <= beta2 < 1.0:
        raise ValueError(f"beta2: expected 0 <= beta2 < 1, got {beta2}")
    if not eps > 0.0:
        raise ValueError(f"eps: expected eps > 0, got {eps}")
    if convention not in CONVENTIONS:
        raise ValueError(f"convention: expected one of {CONVENTIONS}, got {convention!r}")
    if grad_scale is not None:
        grad_scale = _finite_float(grad_scale, "grad_scale")
        if grad_scale == 0.0:
            raise ValueError("grad_scale: expected a non-zero number, got 0.0")
    return lr, beta1, beta2, eps, weight_decay, post_decay, grad_scale


def step_coefficients(t, lr, beta1, beta2, convention):
    """(alpha, denom_scale) of the update ``x -= alpha * m / (sqrt(v) * denom_scale + eps)``,
    computed in float64 from the step number ``t`` (see include/fastadam/dense.h)."""
    t = _step_number(t)
    if convention == "onnx" and t <= 0:
        return lr, 1.0
    if t < 1:
        raise ValueError(f"t: expected a step number >= 1 for convention {convention!r}, got {t}")
    # beta**t underflows to 0 for large t, which is the exact limit: no overflow risk.
    bc1 = 1.0 - beta1 ** t
    bc2 = 1.0 - beta2 ** t
    if bc1 == 0.0 or bc2 == 0.0:
        # Only reachable with beta == 0 ... then bc == 1; kept as a guard against rounding.
        raise ValueError(f"t: the bias correction is zero at t={t}")
    if convention == "torch":
        return lr / bc1, 1.0 / math.sqrt(bc2)
    return lr * math.sqrt(bc2) / bc1, 1.0


def weight_decay_coefficients(lr, weight_decay, decoupled_weight_decay):
    """(l2, decay_mul) of the kernels: coupled decay adds ``l2 * x`` to the gradient (PyTorch
    Adam, ONNX norm_coefficient), decoupled decay scales ``x`` by ``decay_mul`` (AdamW)."""
    if weight_decay == 0.0:
        return 0.0, 1.0
    if decoupled_weight_decay:
        return 0.0, 1.0 - lr * weight_decay
    return weight_decay, 1.0


def step_inplace(x, g, m, v, t, *, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, convention="tf",
                 weight_decay=0.0, decoupled_weight_decay=False, post_decay=0.0, amsgrad=False,
                 v_max=None, nesterov=False, maximize=False, grad_scale=None,
                 skip_nonfinite=False, num_threads=None):
    """One fused Adam step, in place, on one array or a list of arrays.

    Per element (all scalars folded in float64 once per call, elements computed in the arrays'
    precision, float16 in float32)::

        g' = (-1 if maximize else 1) * g / grad_scale
        g' = g' + weight_decay * x                  # unless decoupled_weight_decay
        x  = (1 - lr * weight_decay) * x            # if decoupled_weight_decay (AdamW)
        m  = beta1 * m + (1 - beta1) * g'
        v  = beta2 * v + (1 - beta2) * g'**2
        v_max = max(v_max, v); vh = v_max if amsgrad else v
        mu = beta1 * m + (1 - beta1) * g' if nesterov else m     # TensorFlow's use_nesterov
        x  = (1 - post_decay) * (x - alpha * mu / (sqrt(vh) * s + eps))

    with, by ``convention``:

    - ``"tf"`` (TensorFlow ApplyAdam, Keras, DirectML, scikit-learn's MLP Adam): epsilon outside
      the bias correction, ``alpha = lr * sqrt(1 - beta2**t) / (1 - beta1**t)``, ``s = 1``;
    - ``"torch"`` (PyTorch Adam/AdamW, optax): ``alpha = lr / (1 - beta1**t)``,
      ``s = 1 / sqrt(1 - beta2**t)``;
    - ``"onnx"`` (``ai.onnx.preview.training.Adam``; R = lr, T = t, alpha = beta1,
      beta = beta2, norm_coefficient = weight_decay, norm_coefficient_post = post_decay):
      as ``"tf"`` for ``t > 0``, and ``t <= 0`` means no bias correction (``alpha = lr``).

    Parameters
    ----------
    x, g, m, v : ndarray or list of ndarray
        Parameters, gradient, first and second moments: C-contiguous, one float dtype
        (float16, float32 or float64), ``m[i]``/``v[i]``/``g[i]`` of ``x[i]``'s shape.
        ``x``, ``m``, ``v`` are updated in place and must be writable and not overlap each
        other or ``g``; ``g`` is never written (read-only arrays are fine).
    t : int
        Step number of this update (1 for the first step).
    amsgrad, v_max : bool, ndarray or list
        AMSGrad keeps the running maximum of ``v`` in ``v_max`` (required, updated in place).
    grad_scale : float, optional
        Loss-scaling factor; gradients are divided by it on the fly.
    skip_nonfinite : bool
        If True, a NaN or infinity anywhere in ``g / grad_scale`` skips the whole step: no array
        changes and the call returns False.  If False, non-finite values propagate (IEEE).
    num_threads : int, optional
        OpenMP threads (None: as many as OpenMP allows; negative counts back from that).
        The result is bit-identical for any thread count.

    Returns
    -------
    bool
        True if the step was applied, False if it was skipped (``skip_nonfinite``).
    """
    lr, beta1, beta2, eps, weight_decay, post_decay, grad_scale = check_hyperparameters(
        lr, beta1, beta2, eps, convention, weight_decay, post_decay, grad_scale)
    if amsgrad and v_max is None:
        raise ValueError("v_max: amsgrad=True needs v_max, an array like v updated in place "
                         "(start it at zeros)")
    alpha, denom_scale = step_coefficients(t, lr, beta1, beta2, convention)
    nt = resolve_num_threads(num_threads)
    xs, gs, ms, vs, vmaxs, typenum = check_tensor_lists(x, g, m, v, v_max if amsgrad else None)
    l2, decay_mul = weight_decay_coefficients(lr, weight_decay, decoupled_weight_decay)
    flags = _dense.FLAG_L2 if l2 != 0.0 else 0
    if grad_scale is not None:
        flags |= _dense.FLAG_SCALE
    if amsgrad:
        flags |= _dense.FLAG_AMSGRAD
    if nesterov:
        flags |= _dense.FLAG_NESTEROV
    return _dense.adam_dense(
        xs, gs, ms, vs, vmaxs, typenum, alpha, denom_scale, eps, beta1, beta2,
        -1.0 if maximize else 1.0, 1.0 if grad_scale is None else grad_scale, l2, decay_mul,
        1.0 - post_decay, flags, bool(skip_nonfinite), nt)
