"""``MemoryPool``: a caching pool for NumPy array data, installed per context (NumPy's NEP 49
data allocator; the pool itself is include/fastadam/mempool.c, whose design note says how
blocks are laid out, cached, locked and kept consistent across fork).

NumPy (>= 1.22) takes the allocator of new arrays' data from a context variable:
``PyDataMem_SetHandler(capsule)`` makes a ``PyDataMem_Handler`` (in a capsule named
"mem_handler") the allocator of the current thread or asyncio task and returns the previous
one.  Every array keeps a reference to the capsule that allocated it and frees its data through
it, whatever context it is freed in; so the pool (freed by the capsule's destructor) lives until
its last array is gone, and leaving a ``with pool:`` block never invalidates an array.

``with pool:`` pushes the previous handler on a stack held in a context variable of this module
and restores it on exit: blocks nest, an exception restores the handler too, and two threads
(or tasks) entering the same pool each restore their own previous handler.
"""
import contextvars
import numbers
import sys

from cpython.object cimport PyObject
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from libc.stdint cimport uint8_t
from libc.stdlib cimport calloc, free
from libc.string cimport strncpy

cimport numpy as cnp

cnp.import_array()


cdef extern from "fastadam/mempool.h":
    ctypedef struct fa_mempool:
        pass

    ctypedef struct fa_mempool_stats:
        size_t max_cached_bytes
        size_t cached_bytes
        size_t cached_blocks
        size_t reused
        size_t fresh

    size_t FA_POOL_MIN_BYTES
    size_t FA_POOL_PAGE
    size_t FA_POOL_PREFIX
    int FA_POOL_CLASSES

    ctypedef struct fa_small_allocator:
        void *ctx
        void *(*malloc)(void *ctx, size_t size) noexcept nogil
        void *(*calloc)(void *ctx, size_t nelem, size_t elsize) noexcept nogil
        void *(*realloc)(void *ctx, void *ptr, size_t new_size) noexcept nogil
        void (*free)(void *ctx, void *ptr, size_t size) noexcept nogil

    fa_mempool *fa_mempool_new(size_t max_cached_bytes, const fa_small_allocator *small) nogil
    void fa_mempool_destroy(fa_mempool *pool) nogil
    void *fa_mempool_malloc(void *ctx, size_t size) noexcept nogil
    void *fa_mempool_calloc(void *ctx, size_t nelem, size_t elsize) noexcept nogil
    void *fa_mempool_realloc(void *ctx, void *ptr, size_t new_size) noexcept nogil
    void fa_mempool_free(void *ctx, void *ptr, size_t size) noexcept nogil
    void fa_mempool_release(fa_mempool *pool) nogil
    fa_mempool_stats fa_mempool_get_stats(fa_mempool *pool) nogil


cdef extern from "numpy/arrayobject.h":
    ctypedef struct PyDataMemAllocator:
        void *ctx
        void *(*malloc)(void *ctx, size_t size) noexcept nogil
        void *(*calloc)(void *ctx, size_t nelem, size_t elsize) noexcept nogil
        void *(*realloc)(void *ctx, void *ptr, size_t new_size) noexcept nogil
        void (*free)(void *ctx, void *ptr, size_t size) noexcept nogil

    ctypedef struct PyDataMem_Handler:
        char name[127]
        uint8_t version
        PyDataMemAllocator allocator

    object PyDataMem_SetHandler(object handler)
    object PyDataMem_GetHandler()
    PyObject *PyDataMem_DefaultHandler  # NumPy's own handler capsule (lives forever)


#: The name NumPy reports for arrays allocated by a pool (``numpy.lib`` ``get_handler_name``).
HANDLER_NAME = "fastadam_memory_pool"
#: Requests smaller than this go straight to malloc/free (not cached).
MIN_POOLED_BYTES = FA_POOL_MIN_BYTES
#: A pooled block, its 64-byte prefix included, is a multiple of this many bytes.
BLOCK_UNIT_BYTES = FA_POOL_PAGE
#: Distinct block sizes a pool caches; blocks of further sizes are freed, not cached.
SIZE_CLASSES = FA_POOL_CLASSES
DEFAULT_MAX_CACHED_BYTES = 256 * 1024 * 1024

cdef fa_small_allocator _small_allocator():
    """NumPy's default allocator, for the requests a pool does not cache (its small-size cache
    is faster than malloc)."""
    cdef PyDataMem_Handler *default = <PyDataMem_Handler *>PyCapsule_GetPointer(
        <object>PyDataMem_DefaultHandler, "mem_handler")
    cdef fa_small_allocator small
    small.ctx = default.allocator.ctx
    small.malloc = default.allocator.malloc
    small.calloc = default.allocator.calloc
    small.realloc = default.allocator.realloc
    small.free = default.allocator.free
    return small


cdef fa_small_allocator SMALL = _small_allocator()

# the handlers that ``with pool:`` blocks replaced in this context, innermost last: (pool,
# previous handler capsule) pairs
_entered = contextvars.ContextVar("fastadam_memory_pool_entered", default=())


cdef void _destroy_handler(object capsule) noexcept:
    """The capsule's destructor: runs when the pool object and every array it allocated are
    gone; frees the cached blocks, the pool and the handler."""
    cdef PyDataMem_Handler *handler = <PyDataMem_Handler *>PyCapsule_GetPointer(
        capsule, "mem_handler")
    if handler == NULL:
        return
    fa_mempool_destroy(<fa_mempool *>handler.allocator.ctx)
    free(handler)


def _check_max_cached_bytes(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"max_cached_bytes: expected an int, got {type(value).__name__}")
    value = int(value)
    if not 0 <= value <= sys.maxsize:
        raise ValueError(f"max_cached_bytes: expected 0 <= max_cached_bytes <= {sys.maxsize}, "
                         f"got {value}")
    return value


cdef class MemoryPool:
    """A caching pool for the data of the NumPy arrays created inside ``with pool:``.

    A training step allocates and frees the same large arrays every step.  The C library
    returns large freed blocks to the operating system, and the next step page-faults every
    4 KiB page of them in again, which can cost more than the arithmetic.  Inside ``with
    pool:``, NumPy takes the data of new arrays from this pool (NumPy's per-context data
    allocator, NEP 49); a freed array's block goes back to the pool and the next request of the
    same size gets it again, already mapped.

    Parameters
    ----------
    max_cached_bytes : int, default 256 MiB
        The most bytes of freed blocks the pool keeps for reuse; a block freed past it is
        returned to the C library.  ``0`` caches nothing.

    Notes
    -----
    - Scope: ``with pool:`` installs the pool for the current context only (the thread, or the
      asyncio task) and restores the previous allocator on exit, exception or not.  Blocks
      nest.  Other threads are not affected.
    - Arrays created inside the block may outlive it: each keeps a reference to the pool's
      allocator and frees its data into it wherever it is freed (any thread).  The cached
      memory is freed when the pool object and every array it allocated are gone, or by
      :meth:`release`.
    - Requests under 4 KiB go to NumPy's default allocator (with a 16-byte header).  Larger
      blocks are rounded up to a multiple of 4 KiB (a 64-byte header included) and their data
      is 64-byte aligned; freed blocks are cached per exact size, for up to 64 distinct sizes.
    - Thread-safe; after ``fork`` the child may use the pool (the lock is taken around fork).
    - Copying or pickling a pool gives a new, empty pool with the same ``max_cached_bytes``.

    Examples
    --------
    >>> import numpy as np
    >>> import fastadam
    >>> pool = fastadam.MemoryPool()
    >>> with pool:
    ...     for _ in range(3):
    ...         a = np.ones(1 << 20)  # the same 8 MiB block from the second loop on
    ...         del a
    >>> pool.cached_bytes >= 8 << 20
    True
    >>> pool.release()
    >>> pool.cached_bytes
    0
    """

    cdef object _capsule
    cdef fa_mempool *_pool

    def __cinit__(self, max_cached_bytes=DEFAULT_MAX_CACHED_BYTES):
        cdef size_t cap = _check_max_cached_bytes(max_cached_bytes)
        cdef PyDataMem_Handler *handler = <PyDataMem_Handler *>calloc(1, sizeof(PyDataMem_Handler))
        if handler == NULL:
            raise MemoryError("MemoryPool: cannot allocate the handler")
        cdef fa_mempool *pool = fa_mempool_new(cap, &SMALL)
        if pool == NULL:
            free(handler)
            raise MemoryError("MemoryPool: cannot allocate the pool")
        name = HANDLER_NAME.encode()
        strncpy(handler.name, name, 126)
        handler.version = 1
        handler.allocator.ctx = pool
        handler.allocator.malloc = fa_mempool_malloc
        handler.allocator.calloc = fa_mempool_calloc
        handler.allocator.realloc = fa_mempool_realloc
        handler.allocator.free = fa_mempool_free
        try:
            self._capsule = PyCapsule_New(handler, "mem_handler", _destroy_handler)
        except BaseException:
            fa_mempool_destroy(pool)
            free(handler)
            raise
        self._pool = pool

    def __enter__(self):
        previous = PyDataMem_SetHandler(self._capsule)
        _entered.set(_entered.get() + ((self, previous),))
        return self

    def __exit__(self, exc_type, exc, tb):
        stack = _entered.get()
        cdef Py_ssize_t last = len(stack) - 1
        if last < 0 or stack[last][0] is not self:
            raise RuntimeError("MemoryPool: __exit__ without a matching __enter__ in this "
                               "context (with-blocks of pools must nest)")
        _entered.set(stack[:last])
        PyDataMem_SetHandler(stack[last][1])
        return False

    @property
    def max_cached_bytes(self):
        """The most bytes of freed blocks kept for reuse (``int``)."""
        return fa_mempool_get_stats(self._pool).max_cached_bytes

    @property
    def cached_bytes(self):
        """Bytes of freed blocks held for reuse now, their headers included (``int``)."""
        return fa_mempool_get_stats(self._pool).cached_bytes

    @property
    def cached_blocks(self):
        """Freed blocks held for reuse now (``int``)."""
        return fa_mempool_get_stats(self._pool).cached_blocks

    def stats(self):
        """Counters of the pool, as a dict.

        Returns
        -------
        dict
            ``max_cached_bytes``, ``cached_bytes``, ``cached_blocks``; ``reused``: requests of
            4 KiB or more served from a cached block; ``fresh``: such requests that allocated a
            new block.
        """
        cdef fa_mempool_stats s = fa_mempool_get_stats(self._pool)
        return {"max_cached_bytes": s.max_cached_bytes, "cached_bytes": s.cached_bytes,
                "cached_blocks": s.cached_blocks, "reused": s.reused, "fresh": s.fresh}

    def release(self):
        """Free every cached block (arrays in use are not affected; the pool stays usable)."""
        with nogil:
            fa_mempool_release(self._pool)

    def __reduce__(self):
        # a copy or an unpickled pool is a new, empty pool with the same cap
        return (MemoryPool, (self.max_cached_bytes,))

    def __repr__(self):
        s = fa_mempool_get_stats(self._pool)
        return (f"MemoryPool(max_cached_bytes={s.max_cached_bytes}, "
                f"cached_bytes={s.cached_bytes}, cached_blocks={s.cached_blocks})")
