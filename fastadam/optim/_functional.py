"""The functional optimizer steps on dense arrays: one compiled call per step, in place.

Each function folds its optimizer's hyper-parameters into a coefficient object
(``_coefficients.py``), validates the arrays (fastadam/_core/_validation.pyx: all checks before any
write), and makes one call into the multi-tensor driver (fastadam/_core/_dense.pyx), which picks the
optimizer's kernel from the C table.  The optimizer objects are built on these functions and
the sparse ones in ``_sparse_functional.py``.
"""
from typing import Optional, Sequence, Union

import numpy as np

from .._core._coeffs import adam_fold
# the dense step's validation and driver call, compiled (shared with the prepared steps)
from ._step_path import KIND_DENSE, check_compute_dtype, dense_step  # noqa: F401
from ._coefficients import adagrad_coefficients, adam_coefficients, momentum_coefficients

__all__ = ["step_inplace", "adagrad_step_inplace", "momentum_step_inplace"]

Arrays = Union[np.ndarray, Sequence[np.ndarray]]  # one array, or a list updated in one call


def step_inplace(x: Arrays, g: Arrays, m: Arrays, v: Arrays, t: int, *, lr: float = 1e-3,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 convention: str = "tf", weight_decay: float = 0.0,
                 decoupled_weight_decay: bool = False, post_decay: float = 0.0,
                 amsgrad: bool = False, v_max: Optional[Arrays] = None, nesterov: bool = False,
                 maximize: bool = False, grad_scale: Optional[float] = None,
                 skip_nonfinite: bool = False, num_threads: Optional[int] = None) -> bool:
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
    if amsgrad and v_max is None:
        raise ValueError("v_max: amsgrad=True needs v_max, an array like v updated in place "
                         "(start it at zeros)")
    # the common case folded in C; anything else (every error included) by adam_coefficients
    coeffs = adam_fold(t, lr, beta1, beta2, eps, convention, weight_decay,
                       decoupled_weight_decay, post_decay, amsgrad, nesterov, maximize, grad_scale)
    if coeffs is None:
        coeffs = adam_coefficients(t, lr, beta1, beta2, eps, convention, weight_decay,
                                   decoupled_weight_decay, post_decay, amsgrad, nesterov,
                                   maximize, grad_scale)
    slots = [("m", m), ("v", v), ("v_max", v_max)] if amsgrad else [("m", m), ("v", v)]
    return dense_step(coeffs, x, g, slots, skip_nonfinite, num_threads)


def adagrad_step_inplace(x: Arrays, g: Arrays, h: Arrays, t: int, *, lr: float = 1e-2,
                         lr_decay: float = 0.0, eps: Optional[float] = None,
                         weight_decay: float = 0.0, maximize: bool = False,
                         convention: str = "torch", grad_scale: Optional[float] = None,
                         skip_nonfinite: bool = False, num_threads: Optional[int] = None) -> bool:
    """One fused Adagrad step, in place, on one array or a list of arrays.

    Per element (scalars folded in float64 once per call; float16 computed in float32)::

        g' = (-1 if maximize else 1) * g / grad_scale
        g' = g' + weight_decay * x
        h  = h + g'**2
        x  = x - r * g' / (sqrt(h) + eps)          # "torch", "onnx"
        x  = x - r * g' / sqrt(h + eps)            # "keras" (eps inside the root)

    with, by ``convention``:

    - ``"torch"`` (``torch.optim.Adagrad``): ``r = lr / (1 + (t - 1) * lr_decay)``, ``t >= 1``,
      default ``eps = 1e-10``; torch's ``initial_accumulator_value`` is ``h``'s starting value;
    - ``"onnx"`` (``ai.onnx.preview.training.Adagrad``: R = lr, T = t,
      decay_factor = lr_decay, norm_coefficient = weight_decay, epsilon = eps):
      ``r = lr / (1 + t * lr_decay)``, ``t >= 0``, default ``eps = 1e-6``;
    - ``"keras"`` (Keras 3 ``Adagrad``): ``r = lr``, eps inside the square root, default
      ``eps = 1e-7``; Keras starts ``h`` at ``initial_accumulator_value = 0.1``.

    Parameters
    ----------
    x, g, h : ndarray or list of ndarray
        Parameters, gradient, accumulated squared gradients, as ``x, g, m`` in
        :func:`fastadam.step_inplace` (``x`` and ``h`` updated in place, ``g`` only read).
    t : int
        Step number of this update (1 for the first step; ONNX counts from 0).
    grad_scale, skip_nonfinite, num_threads
        As in :func:`fastadam.step_inplace`.

    Returns
    -------
    bool
        True if the step was applied, False if it was skipped (``skip_nonfinite``).
    """
    coeffs = adagrad_coefficients(t, lr=lr, lr_decay=lr_decay, eps=eps,
                                  weight_decay=weight_decay, maximize=maximize,
                                  convention=convention, grad_scale=grad_scale)
    return dense_step(coeffs, x, g, [("h", h)], skip_nonfinite, num_threads)


def momentum_step_inplace(x: Arrays, g: Arrays, v: Arrays, t: int, *, lr: float = 1e-2,
                          momentum: float = 0.9, dampening: float = 0.0, nesterov: bool = False,
                          weight_decay: float = 0.0, maximize: bool = False,
                          convention: str = "torch", grad_scale: Optional[float] = None,
                          skip_nonfinite: bool = False, num_threads: Optional[int] = None) -> bool:
    """One fused SGD-with-momentum step, in place, on one array or a list of arrays.

    Per element (scalars folded in float64 once per call; float16 computed in float32)::

        g' = (-1 if maximize else 1) * g / grad_scale
        g' = g' + weight_decay * x
        v  = a * v + b * g'
        x  = x - lr * v                            # standard
        x  = x - lr * (g' + momentum * v)          # nesterov

    with, by ``convention``:

    - ``"torch"`` (``torch.optim.SGD``): ``a = momentum``, ``b = 1 - dampening``, except on the
      first step (``t == 1``) where ``v = g'`` (torch's buffer starts as the gradient) and with
      ``momentum == 0`` (then ``v = g'``, plain SGD); ``t >= 1``; ``nesterov`` needs
      ``momentum > 0`` and ``dampening == 0``;
    - ``"onnx"`` (``ai.onnx.preview.training.Momentum``: R = lr, T = t, alpha = momentum,
      beta = 1 - dampening, mode "nesterov" = nesterov, norm_coefficient = weight_decay):
      ``a = alpha``, ``b = beta`` for ``t > 0`` and ``1`` for ``t == 0``.

    Parameters
    ----------
    x, g, v : ndarray or list of ndarray
        Parameters, gradient and momentum buffer (start it at zeros), as ``x, g, m`` in
        :func:`fastadam.step_inplace`.
    t : int
        Step number of this update (1 for the first step; ONNX counts from 0).
    grad_scale, skip_nonfinite, num_threads
        As in :func:`fastadam.step_inplace`.

    Returns
    -------
    bool
        True if the step was applied, False if it was skipped (``skip_nonfinite``).
    """
    coeffs = momentum_coefficients(t, lr=lr, momentum=momentum, dampening=dampening,
                                   nesterov=nesterov, weight_decay=weight_decay,
                                   maximize=maximize, convention=convention,
                                   grad_scale=grad_scale)
    return dense_step(coeffs, x, g, [("v", v)], skip_nonfinite, num_threads)
