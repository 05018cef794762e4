"""Abort the whole MPI job when one rank dies of an uncaught exception.

Design: under plain ``mpiexec -n N python train.py`` (without ``-m mpi4py``), a rank that
raises exits while the others wait in their next collective for ever.  ``abort_on_error()``
installs a ``sys.excepthook`` that prints the traceback as usual, then calls
``MPI.COMM_WORLD.Abort(1)``, which ends every rank.  ``ShardedOptimizer`` and
``ShardedEmbedding`` install it when they are built (``abort_on_error=False`` opts out), since
every method of theirs is collective.  It is installed once per process, wraps whatever hook
was there before, does nothing in a job of one process or once MPI is finalized, and leaves
exceptions in other threads (``threading.excepthook``) alone: a thread's death does not end
the process.
"""
import sys

from mpi4py import MPI

_INSTALLED = []  # the hook, once installed


def _abort_hook(previous):
    def hook(exc_type, exc, tb):
        try:
            previous(exc_type, exc, tb)
            sys.stderr.flush()
        finally:
            world = MPI.COMM_WORLD
            if (MPI.Is_initialized() and not MPI.Is_finalized()
                    and world.Get_size() > 1):
                sys.stderr.write(f"fastadam.distributed: rank {world.Get_rank()} raised "
                                 f"{exc_type.__name__}; aborting the MPI job "
                                 f"(MPI.COMM_WORLD.Abort)\n")
                sys.stderr.flush()
                world.Abort(1)
    hook.fastadam_abort_on_error = True
    return hook


def abort_on_error():
    """Make an uncaught exception on this rank abort the whole MPI job (``MPI_Abort``) after
    its traceback is printed, instead of leaving the other ranks waiting.  Idempotent; the
    same as running under ``python -m mpi4py``.  Called by ``ShardedOptimizer`` and
    ``ShardedEmbedding`` unless they are given ``abort_on_error=False``."""
    if getattr(sys.excepthook, "fastadam_abort_on_error", False):
        return
    sys.excepthook = _abort_hook(sys.excepthook)
    _INSTALLED.append(sys.excepthook)
