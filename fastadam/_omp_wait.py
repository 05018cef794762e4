"""How fastadam's OpenMP workers wait between steps: a bounded spin, set before the runtime loads.

After a parallel region, libgomp's workers spin for ``GOMP_SPINCOUNT`` iterations (300,000 by
default, about a millisecond) before they sleep.  In a training loop that is the worst moment:
the next thing to run is BLAS (NumPy's matmul), whose own threads then share the cores with
spinning fastadam workers, and the next fastadam step waits for BLAS threads that spin in turn.
On a 2-vCPU machine that made a step 25x slower with 2 threads than with 1.

libgomp reads its wait policy once, when it is loaded.  So fastadam loads its compiled core with
``GOMP_SPINCOUNT=0`` (workers sleep at once; waking one costs a few microseconds, nothing beside a
step large enough to be run in parallel) and then puts the environment back as it was, so other
libraries and child processes see the user's environment.  It applies to the libgomp that
fastadam's extension loads: in a wheel that is fastadam's own copy (auditwheel bundles it under
a hashed name); in a source build linked to the system libgomp it applies only if no other
library loaded that libgomp first.  A user who sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``
keeps their choice.  :data:`POLICY` records what happened (``fastadam.show_config()`` shows it).
"""
import os

SPIN_COUNT = "0"
POLICY = "not loaded"


def load_core():
    """Import the compiled core with the bounded spin (idempotent); return the policy string."""
    global POLICY
    if POLICY != "not loaded":
        return POLICY
    user = [k for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ]
    if user:
        POLICY = "user: " + ", ".join(f"{k}={os.environ[k]}" for k in user)
        from ._core import _config  # noqa: F401
        return POLICY
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    try:
        from ._core import _config, _dense  # noqa: F401  (libgomp's constructor reads it)
    finally:
        del os.environ["GOMP_SPINCOUNT"]
    POLICY = f"fastadam: GOMP_SPINCOUNT={SPIN_COUNT} while loading its OpenMP runtime"
    return POLICY
