"""fastadam.optim.lowlevel: fold the hyper-parameters, run the dense driver, or both, prepared.

For front-ends that drive many steps themselves (the ONNX training operators, the
scikit-learn estimators' compiled epoch loop) and need what ``fastadam.step_inplace`` does in
two parts.  These are the only optimizer internals a front-end may use (tests/test_layering.py);
``fastadam.optim.prepare_step`` is meant to replace them.

- ``adam_coefficients(t, lr, beta1, beta2, eps, convention, weight_decay=0.0,
  decoupled_weight_decay=False, post_decay=0.0, amsgrad=False, nesterov=False,
  maximize=False, grad_scale=None)``: the Adam coefficient fold of step ``t``: checks the
  hyper-parameters (a ValueError/TypeError naming the argument) and folds them in float64 into
  the coefficient object the kernels read, exactly as ``step_inplace`` does (same arguments,
  same conventions "tf", "torch", "onnx"; the step size ``alpha = lr * sqrt(1 - beta2**t) /
  (1 - beta1**t)`` in "tf").  Positional arguments are allowed: it is a per-step call.
- ``dense_step(coeffs, x, g, slots, skip_nonfinite, num_threads)``: one dense step
  of the optimizer ``coeffs`` describes, in place: ``x``, ``g`` an array or equal-length lists,
  ``slots`` the optimizer's state as ``(name, array or list)`` pairs in slot order (Adam:
  ``[("m", m), ("v", v)]``); validates every array before writing (dtypes, shapes, no shared
  memory, float32-range of the folded values), picks the thread count as ``step_inplace``
  does (``None``: measured; all six arguments are required), dispatches CuPy arrays to the
  GPU path.  Returns False only when ``skip_nonfinite`` found a non-finite gradient (nothing
  written), else True.
- ``PreparedAdam(params, grads, m, v, *, lr, beta1, beta2, eps, convention="tf",
  num_threads=None)``: Adam steps on fixed arrays (NumPy, one array each or equal-length
  lists), every array and hyper-parameter checked once, here; ``step(t)`` then folds step t's
  coefficients (the same float64 operations as ``adam_coefficients``) and runs the driver on
  whatever ``grads`` holds now: what ``step_inplace(params, grads, m, v, t, ...)`` computes,
  bit for bit, without re-checking per step.  The object keeps references to the arrays, so
  they cannot be freed or resized under it.
"""
import numpy as np

from .._core import _dense
from .._core._coeffs import AdamCoefficients
from .._core._threads import adaptive_threads, resolve_num_threads
from .._core._validation import check_step_arrays
from ._coefficients import adam_coefficients, adam_step_sizes
from ._functional import KIND_DENSE, check_compute_dtype, dense_step

__all__ = ["PreparedAdam", "adam_coefficients", "dense_step"]


class PreparedAdam:
    """Adam steps on arrays checked once (see the module docstring)."""

    __slots__ = ("_hyper", "_fields", "_float32", "_args", "_size", "_threads")

    def __init__(self, params, grads, m, v, *, lr, beta1, beta2, eps, convention="tf",
                 num_threads=None):
        first = adam_coefficients(1, lr, beta1, beta2, eps, convention)  # checks; writes nothing
        xs, gs, slots, typenum = check_step_arrays(params, grads, [("m", m), ("v", v)])
        check_compute_dtype(first, typenum, "params")
        self._hyper = (float(lr), float(beta1), float(beta2), convention)
        self._fields = first.as_dict()  # what does not depend on t
        self._float32 = typenum != np.dtype(np.float64).num
        self._args = (xs, gs, slots, typenum, False)
        self._size = sum([a.size for a in xs])
        # None: the measured thread choice (0 for the driver), as step_inplace
        self._threads = 0 if num_threads is None else resolve_num_threads(num_threads)

    def step(self, t):
        """One Adam step number ``t`` (>= 1; >= 0 in the "onnx" convention), in place."""
        lr, beta1, beta2, convention = self._hyper
        alpha, denom_scale = adam_step_sizes(t, lr, beta1, beta2, convention)
        fields = self._fields
        coeffs = AdamCoefficients(alpha=alpha, denom_scale=denom_scale, eps=fields["eps"],
                                  beta1=fields["beta1"], beta2=fields["beta2"],
                                  sign=fields["sign"], grad_scale=fields["grad_scale"],
                                  l2=fields["l2"], decay_mul=fields["decay_mul"],
                                  post_mul=fields["post_mul"], flags=fields["flags"])
        if self._float32:
            coeffs.check_float32()  # a large step size: a ValueError naming lr, nothing written
        if _dense.dense_step(coeffs, *self._args, self._threads) is None:
            adaptive_threads.run(_dense.dense_step, (coeffs,) + self._args, self._size,
                                 KIND_DENSE)
