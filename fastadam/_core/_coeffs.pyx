"""The coefficient objects: each optimizer's hyper-parameters, checked and folded once per step
in float64 by fastadam/optim/_coefficients.py, held as the C struct its kernels read.

One object crosses from Python into the compiled drivers per call; they read ``kind`` and the
struct pointer and never see a long list of scalars.  The fields are the struct's (see
include/fastadam/adam.h, adagrad.h, momentum.h) and are fixed at construction.

``StructCoefficients`` holds the struct of any optimizer of the registration list
(include/fastadam/optimizers.def) given field by field, as every struct is laid out: float64
fields in declaration order, then the int ``flags``.  A new optimizer needs no class here: its
Python spec (fastadam/_core/_registry.py) names the fields, and the spec checks at import that their
count matches the size of the C struct.
"""

from libc.math cimport pow, sqrt

FLAG_L2 = FA_L2
FLAG_SCALE = FA_SCALE
FLAG_AMSGRAD = FA_AMSGRAD
FLAG_NESTEROV = FA_NESTEROV
FLAG_EPS_INSIDE = FA_EPS_INSIDE
FLAG_MOMENTUM_NESTEROV = FA_MOMENTUM_NESTEROV
KIND_ADAM = FA_OPT_ADAM
KIND_ADAGRAD = FA_OPT_ADAGRAD
KIND_MOMENTUM = FA_OPT_MOMENTUM


# float32's largest finite value, and the largest magnitude that rounds to 0 in float32.
cdef double F32_MAX = 3.4028234663852886e38
cdef double F32_ZERO = 7.006492321624085e-46


cdef inline check_finite32(double value, str name):
    if value > F32_MAX or value < -F32_MAX:
        raise ValueError(f"{name}: {value!r} overflows float32 (the precision this step "
                         f"computes in)")


cdef inline check_nonzero32(double value, str name):
    if value != 0.0 and -F32_ZERO <= value <= F32_ZERO:
        raise ValueError(f"{name}: {value!r} rounds to 0 in float32 (the precision this step "
                         f"computes in)")


cdef class Coefficients:
    """Base of the coefficient objects (not constructed directly)."""

    def retimed(self, t, dict hyper):
        """This fold of ``hyper`` moved to step ``t`` when it can be done here in C, else
        None: the spec's ``retime`` (fastadam/optim/_coefficients.py) does it."""
        return None

    def check_float32(self):
        """Raise ValueError, naming the hyper-parameter, if a folded value overflows float32 or
        a divisor (eps, grad_scale) rounds to 0 there: float32 and float16 steps compute in
        float32."""
        raise NotImplementedError

    def as_dict(self):
        """The struct's fields, for inspection and tests."""
        raise NotImplementedError

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"{type(self).__name__}({fields})"


cdef class AdamCoefficients(Coefficients):
    """fa_adam_coeffs: ``x = post_mul*(decay_mul*x - alpha*mu/(sqrt(vh)*denom_scale + eps))``."""

    def __cinit__(self):  # takes no arguments: the constructor's are parsed once, by __init__
        self.kind = FA_OPT_ADAM
        self.data = &self.c

    def __init__(self, *, double alpha, double denom_scale, double eps, double beta1,
                 double beta2, double sign, double grad_scale, double l2, double decay_mul,
                 double post_mul, int flags):
        self.c.alpha = alpha
        self.c.denom_scale = denom_scale
        self.c.eps = eps
        self.c.beta1 = beta1
        self.c.beta2 = beta2
        self.c.sign = sign
        self.c.grad_scale = grad_scale
        self.c.l2 = l2
        self.c.decay_mul = decay_mul
        self.c.post_mul = post_mul
        self.c.flags = flags
        self.flags = flags
        self.grad_scale = grad_scale

    def retimed(self, t, dict hyper):
        """The fold of ``hyper`` (which gave this object) at step ``t``, for an int ``t`` in
        [1, 2**63) and a convention of the formula ``alpha = lr*sqrt(bc2)/bc1`` ("tf",
        "onnx") or ``alpha = lr/bc1, denom_scale = 1/sqrt(bc2)`` ("torch"), computed as
        fastadam/optim/_coefficients.adam_step_sizes does (the same operations in float64:
        the same bits); None for any other ``t`` (the caller's Python path checks it)."""
        cdef long long k
        cdef double alpha, denom_scale
        if not step_index(t, &k):
            return None
        adam_step_sizes_c(hyper["lr"], self.c.beta1, self.c.beta2, k,
                          hyper["convention"] == "torch", &alpha, &denom_scale)
        return self._at_step(alpha, denom_scale)

    def at_step(self, double alpha, double denom_scale):
        """A copy with the two fields that depend on the step number replaced (what a fold
        of the same hyper-parameters at another step gives: _coefficients.adam_retime)."""
        return self._at_step(alpha, denom_scale)

    cdef AdamCoefficients _at_step(self, double alpha, double denom_scale):
        cdef AdamCoefficients out = AdamCoefficients.__new__(AdamCoefficients)
        out.c = self.c
        out.c.alpha = alpha
        out.c.denom_scale = denom_scale
        out.flags = self.flags
        out.grad_scale = self.grad_scale
        return out

    def check_float32(self):
        check_finite32(self.c.alpha, "lr")  # the step size: lr with the bias correction
        check_nonzero32(self.c.eps, "eps")
        check_finite32(self.c.grad_scale, "grad_scale")
        check_nonzero32(self.c.grad_scale, "grad_scale")
        check_finite32(self.c.l2, "weight_decay")

    def as_dict(self):
        return dict(self.c)


cdef class AdagradCoefficients(Coefficients):
    """fa_adagrad_coeffs: ``h += g'^2; x -= lr*g'/(sqrt(h) + eps)``."""

    def __cinit__(self):  # takes no arguments: the constructor's are parsed once, by __init__
        self.kind = FA_OPT_ADAGRAD
        self.data = &self.c

    def __init__(self, *, double lr, double eps, double sign, double grad_scale, double l2,
                 int flags):
        self.c.lr = lr
        self.c.eps = eps
        self.c.sign = sign
        self.c.grad_scale = grad_scale
        self.c.l2 = l2
        self.c.flags = flags
        self.flags = flags
        self.grad_scale = grad_scale

    def with_lr(self, double lr):
        """A copy with the decayed learning rate of another step (_coefficients.adagrad_retime)."""
        cdef AdagradCoefficients out = AdagradCoefficients.__new__(AdagradCoefficients)
        out.c = self.c
        out.c.lr = lr
        out.flags = self.flags
        out.grad_scale = self.grad_scale
        return out

    def check_float32(self):
        check_finite32(self.c.lr, "lr")
        check_finite32(self.c.eps, "eps")
        check_nonzero32(self.c.eps, "eps")
        check_finite32(self.c.grad_scale, "grad_scale")
        check_nonzero32(self.c.grad_scale, "grad_scale")
        check_finite32(self.c.l2, "weight_decay")

    def as_dict(self):
        return dict(self.c)


cdef class MomentumCoefficients(Coefficients):
    """fa_momentum_coeffs: ``v = a*v + b*g'; x -= lr*v`` (or ``lr*(g' + an*v)``)."""

    def __cinit__(self):  # takes no arguments: the constructor's are parsed once, by __init__
        self.kind = FA_OPT_MOMENTUM
        self.data = &self.c

    def __init__(self, *, double lr, double a, double b, double an, double idle_rate,
                 double sign, double grad_scale, double l2, int flags):
        self.c.lr = lr
        self.c.a = a
        self.c.b = b
        self.c.an = an
        self.c.idle_rate = idle_rate
        self.c.sign = sign
        self.c.grad_scale = grad_scale
        self.c.l2 = l2
        self.c.flags = flags
        self.flags = flags
        self.grad_scale = grad_scale

    def with_ab(self, double a, double b):
        """A copy with the buffer coefficients of another step (_coefficients.momentum_retime)."""
        cdef MomentumCoefficients out = MomentumCoefficients.__new__(MomentumCoefficients)
        out.c = self.c
        out.c.a = a
        out.c.b = b
        out.flags = self.flags
        out.grad_scale = self.grad_scale
        return out

    def check_float32(self):
        check_finite32(self.c.lr, "lr")
        check_finite32(self.c.an, "momentum")
        check_finite32(self.c.b, "dampening")
        check_finite32(self.c.grad_scale, "grad_scale")
        check_nonzero32(self.c.grad_scale, "grad_scale")
        check_finite32(self.c.l2, "weight_decay")

    def as_dict(self):
        return dict(self.c)


from libc.string cimport memcpy

STRUCT_MAX = STRUCT_MAX_FIELDS


cdef class StructCoefficients(Coefficients):
    """Any optimizer's struct, field by field: ``names`` and ``values`` the float64 fields in
    the header's declaration order, ``flags`` last.  ``finite32`` / ``nonzero32``: (field
    index, public name) pairs that must not overflow / round to zero in float32."""

    def __cinit__(self, int kind, tuple names, tuple values, int flags, double grad_scale=1.0,
                  tuple finite32=(), tuple nonzero32=()):
        cdef Py_ssize_t n = len(values), i
        if n != len(names) or n > STRUCT_MAX_FIELDS:
            raise ValueError(f"values: expected {len(names)} fields (at most "
                             f"{STRUCT_MAX_FIELDS}), got {n}")
        for i in range(n):
            self.words[i] = values[i]
        self.words[n] = 0.0
        memcpy(<char *>&self.words[n], &flags, sizeof(int))
        self.names = names
        self.finite32 = finite32
        self.nonzero32 = nonzero32
        self.kind = kind
        self.flags = flags
        self.grad_scale = grad_scale
        self.data = &self.words[0]

    def check_float32(self):
        cdef Py_ssize_t i
        for i, name in self.finite32:
            check_finite32(self.words[i], name)
        for i, name in self.nonzero32:
            check_nonzero32(self.words[i], name)

    def as_dict(self):
        out = {name: self.words[i] for i, name in enumerate(self.names)}
        out["flags"] = self.flags
        return out


cdef double F64_MAX = 1.7976931348623157e308


cdef inline bint step_index(object t, long long *k):
    """``t`` as a step number of the C folds: an exact int in [1, 2**63), else False (the
    Python fold then checks it and names it in its error)."""
    if type(t) is not int:
        return False
    try:
        k[0] = t
    except OverflowError:
        return False
    return k[0] >= 1


cdef inline void adam_step_sizes_c(double lr, double beta1, double beta2, long long k,
                                   bint torch, double *alpha, double *denom_scale) noexcept:
    """fastadam/optim/_coefficients.adam_step_sizes for t = k >= 1: the same float64
    operations, so the same bits ("torch": lr/bc1 and 1/sqrt(bc2); "tf", "onnx":
    lr*sqrt(bc2)/bc1 and 1)."""
    cdef double bc1 = 1.0 - pow(beta1, <double>k)
    cdef double bc2 = 1.0 - pow(beta2, <double>k)
    if torch:
        alpha[0] = lr / bc1
        denom_scale[0] = 1.0 / sqrt(bc2)
    else:
        alpha[0] = lr * sqrt(bc2) / bc1
        denom_scale[0] = 1.0

cdef inline bint plain_finite(object v):
    """An exact float, finite (a subclass, an int or a 0-d array takes the Python path)."""
    cdef double d
    if type(v) is not float:
        return False
    d = <double>v
    return -F64_MAX <= d <= F64_MAX


def adam_fold(t, lr, beta1, beta2, eps, convention, weight_decay, decoupled_weight_decay,
              post_decay, amsgrad, nesterov, maximize, grad_scale):
    """fastadam/optim/_coefficients.adam_coefficients for the common case, in C: every
    scalar an exact finite float in its range, the flags exact bools, ``t`` an int in
    [1, 2**63), a known convention.  The same operations in float64 (the same bits); None for
    anything else, which the Python fold then checks and folds (and names in its error)."""
    cdef long long k
    cdef double lr_, b1, b2, eps_, wd, post, scale = 1.0, alpha, denom_scale
    cdef double l2 = 0.0, decay_mul = 1.0
    cdef int flags = 0
    if (not step_index(t, &k) or not plain_finite(lr) or not plain_finite(beta1) or not plain_finite(beta2)
            or not plain_finite(eps) or not plain_finite(weight_decay)
            or not plain_finite(post_decay) or type(decoupled_weight_decay) is not bool
            or type(amsgrad) is not bool or type(nesterov) is not bool
            or type(maximize) is not bool):
        return None
    if not (convention == "tf" or convention == "torch" or convention == "onnx"):
        return None
    lr_, b1, b2, eps_ = lr, beta1, beta2, eps
    wd, post = weight_decay, post_decay
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0 and eps_ > 0.0 and 0.0 <= post < 1.0):
        return None
    if grad_scale is not None:
        if not plain_finite(grad_scale) or <double>grad_scale == 0.0:
            return None
        scale = grad_scale
        flags |= FA_SCALE
    adam_step_sizes_c(lr_, b1, b2, k, convention == "torch", &alpha, &denom_scale)
    if wd != 0.0:
        if decoupled_weight_decay:
            decay_mul = 1.0 - lr_ * wd
        else:
            l2 = wd
            flags |= FA_L2
    if amsgrad:
        flags |= FA_AMSGRAD
    if nesterov:
        flags |= FA_NESTEROV
    cdef AdamCoefficients out = AdamCoefficients.__new__(AdamCoefficients)
    out.c.alpha = alpha
    out.c.denom_scale = denom_scale
    out.c.eps = eps_
    out.c.beta1 = b1
    out.c.beta2 = b2
    out.c.sign = -1.0 if maximize else 1.0
    out.c.grad_scale = scale
    out.c.l2 = l2
    out.c.decay_mul = decay_mul
    out.c.post_mul = 1.0 - post
    out.c.flags = flags
    out.flags = flags
    out.grad_scale = scale
    return out
