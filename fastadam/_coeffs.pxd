# Cython declaration of the coefficient struct every Adam kernel takes (include/fastadam/dense.h),
# shared by the dense and sparse drivers: `from fastadam._coeffs cimport fa_adam_coeffs`.
cdef extern from "fastadam/dense.h":
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
