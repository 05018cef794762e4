# Cython declarations of the optimizers' coefficient structs (include/fastadam/adam.h,
# adagrad.h, momentum.h) and of the one object that carries them from Python to the kernels.
# fastadam/_core/_coeffs.pyx defines the classes; the drivers (_dense.pyx, _sparse.pyx) cimport them
# and pass `coeffs.kind` and `coeffs.data` straight to C.
cdef extern from "fastadam/formula.h":
    enum:
        FA_L2
        FA_SCALE
        FA_OPT_ADAM
        FA_OPT_ADAGRAD
        FA_OPT_MOMENTUM

cdef extern from "fastadam/adam.h":
    enum:
        FA_AMSGRAD
        FA_NESTEROV
    ctypedef struct fa_adam_coeffs:
        double alpha
        double denom_scale
        double eps
        double beta1
        double beta2
        double sign
        double grad_scale
        double l2
        double decay_mul
        double post_mul
        int flags

cdef extern from "fastadam/adagrad.h":
    enum:
        FA_EPS_INSIDE
    ctypedef struct fa_adagrad_coeffs:
        double lr
        double eps
        double sign
        double grad_scale
        double l2
        int flags

cdef extern from "fastadam/momentum.h":
    enum:
        FA_MOMENTUM_NESTEROV
    ctypedef struct fa_momentum_coeffs:
        double lr
        double a
        double b
        double an
        double idle_rate
        double sign
        double grad_scale
        double l2
        int flags


cdef class Coefficients:
    cdef readonly int kind          # FA_OPT_*
    cdef readonly int flags         # the struct's flags
    cdef readonly double grad_scale  # the gradient divisor (1.0 when off), for the finite check
    cdef const void *data            # the struct of the subclass


cdef class AdamCoefficients(Coefficients):
    cdef fa_adam_coeffs c
    cdef AdamCoefficients _at_step(self, double alpha, double denom_scale)


cdef class AdagradCoefficients(Coefficients):
    cdef fa_adagrad_coeffs c


cdef class MomentumCoefficients(Coefficients):
    cdef fa_momentum_coeffs c


cdef enum:
    STRUCT_MAX_FIELDS = 24  # doubles of the largest struct a StructCoefficients holds


cdef class StructCoefficients(Coefficients):
    # the struct as C lays out every coefficient struct: doubles in declaration order, then the
    # int flags (padded to 8 bytes)
    cdef double words[STRUCT_MAX_FIELDS + 1]
    cdef tuple names
    cdef tuple finite32
    cdef tuple nonzero32
