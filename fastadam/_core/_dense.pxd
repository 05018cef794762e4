# The driver's entry for the compiled step path (fastadam/optim/_step_path.pyx), which calls it
# without Python's argument parsing; Python callers see the same function.
from fastadam._core._coeffs cimport Coefficients

cpdef object dense_step(Coefficients coeffs, list xs, list gs, list slots, int typenum,
                        bint skip_nonfinite, int num_threads)
