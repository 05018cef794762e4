"""Products of a CSR matrix's rows with dense matrices, for a linear layer ``z = X @ W`` whose
gradient ``X.T @ dz`` must stay sparse (``fastadam.sparse.csr_transpose_dot``).

The kernels walk a list of the matrix's rows (``batch_rows``, in that order), so a shuffled
mini-batch is read in place, without gathering a new CSR matrix.  Two calls per batch:

- ``dot_and_columns`` (``columns`` without the product): one walk that finds the distinct
  columns the rows touch (a hash table sized to the batch, at most half full, so neither the
  cost nor the memory depends on the number of columns), sorts them (``cols``), records for every stored entry the position of its column in ``cols``
  (``entry_rank``), and, in the same walk, computes the forward product
  ``z[i] = sum_p data[p] * W[indices[p]]`` over row ``batch_rows[i]``'s entries in storage
  order (scipy's ``csr_matvecs`` order);
- ``sum_rows``: ``sums[entry_rank[e]] += data[p] * dz[i]`` over the entries in walk order, from
  +0.  Each column's terms are thus added in the order the rows (then the entries) come: the
  rounding of ``segment_sum(indices, data[:, None] * dz[row_of_entry])`` (a stable sort keeps
  the original order in each segment), without the sort.

Cost O(nnz x K + u log u) for u distinct columns.  Arguments arrive validated
(fastadam/sparse/_api.py checks the CSR structure, index range and dtypes; fastadam/sklearn
checks a training matrix once per fit).  ``-ffp-contract=off`` (setup.py) keeps ``a + b * c``
as two roundings, as NumPy computes it.  Written directly in Cython (typed pointer loops): the
kernels are a few lines each and have no SIMD or dispatch to share with include/fastadam.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint64_t

cnp.import_array()

cdef extern from *:
    void __builtin_prefetch(const void *addr) nogil

# How many rows ahead the walks prefetch a row's indptr entry (the row after that: its
# entries).  Batch rows are random rows of the matrix, so each costs cache misses otherwise.
cdef enum:
    AHEAD = 4

ctypedef fused index_t:
    int32_t
    int64_t

ctypedef fused real_t:
    float
    double

# The packed sort key is (column << 32) | first-appearance slot: columns below 2**31 (and
# fewer than 2**32 distinct columns per batch, implied by the walk's int64 sizes staying far
# below that) sort as one uint64 array; wider matrices use a stable argsort instead.
PACK_LIMIT = 1 << 31


cdef int _table_bits(Py_ssize_t total):
    """log2 of the hash table's size: the least power of two >= 2 * total (at most half full)."""
    cdef int bits = 4
    while (<Py_ssize_t>1 << bits) < 2 * total:
        bits += 1
    return bits


def dot_and_columns(const index_t[::1] indptr, const index_t[::1] indices,
                    const real_t[::1] data, const int64_t[::1] batch_rows, Py_ssize_t n_cols,
                    const real_t[:, ::1] w, real_t[:, ::1] z):
    """One walk over the rows batch_rows: (cols, entry_rank) as ``columns`` returns them, and,
    when w (n_cols, K) has columns, z[i] = X[batch_rows[i]] @ w (z of shape (n, K), written)."""
    cdef Py_ssize_t n = batch_rows.shape[0], k = w.shape[1], i, u = 0
    cdef int64_t r, total = 0
    for i in range(n):
        r = batch_rows[i]
        total += indptr[r + 1] - indptr[r]
    cdef cnp.ndarray entry_rank = np.empty(total, dtype=np.int64)
    if total == 0:
        if k:
            z[:, :] = 0
        return np.empty(0, dtype=np.int64), entry_rank
    cdef cnp.ndarray first = np.empty(total, dtype=np.int64)
    cdef int64_t *pfirst = <int64_t *>cnp.PyArray_DATA(first)
    cdef int64_t *prank = <int64_t *>cnp.PyArray_DATA(entry_rank)
    cdef int bits = _table_bits(total)
    cdef Py_ssize_t cap = <Py_ssize_t>1 << bits
    cdef cnp.ndarray table = np.full(2 * cap, -1, dtype=np.int64)  # (column, slot) pairs
    cdef int shift = 64 - bits
    with nogil:
        u = _walk(&indptr[0], &indices[0], &data[0], &batch_rows[0], n,
                  &w[0, 0] if k else NULL, &z[0, 0] if k else NULL, k,
                  <int64_t *>cnp.PyArray_DATA(table), cap - 1, shift, pfirst, prank)
    seen = first[:u]
    rank_of_first = np.empty(u, dtype=np.int64)
    if n_cols <= PACK_LIMIT:  # one sort of (column, slot) keys
        keys = np.sort((seen.astype(np.uint64) << np.uint64(32)) | np.arange(u, dtype=np.uint64))
        cols = (keys >> np.uint64(32)).astype(np.int64)
        rank_of_first[(keys & np.uint64(0xFFFFFFFF)).astype(np.int64)] = np.arange(u)
    else:
        order = np.argsort(seen, kind="stable")
        cols = seen[order]
        rank_of_first[order] = np.arange(u)
    cdef int64_t *pr = <int64_t *>cnp.PyArray_DATA(rank_of_first)
    cdef Py_ssize_t e
    with nogil:
        for e in range(total):
            prank[e] = pr[prank[e]]
    return cols, entry_rank


def columns(const index_t[::1] indptr, const index_t[::1] indices, const real_t[::1] data,
            const int64_t[::1] batch_rows, Py_ssize_t n_cols):
    """(cols, entry_rank): the sorted distinct columns of the rows batch_rows (int64), and for
    each of their stored entries, in walk order (row by row, then storage order), the position
    of its column in cols."""
    cdef real_t[:, ::1] none = np.empty((0, 0), dtype=np.float32 if real_t is float else np.float64)
    return dot_and_columns(indptr, indices, data, batch_rows, n_cols, none, none)


cdef inline Py_ssize_t _probe(const int64_t *table, int64_t mask, int shift,
                             int64_t c) noexcept nogil:
    """The table position holding column c, or the empty one where it goes (linear probing
    from a Fibonacci hash of c)."""
    cdef int64_t h = <int64_t>((<uint64_t>c * <uint64_t>0x9E3779B97F4A7C15ULL) >> shift)
    while table[2 * h] != c and table[2 * h] != -1:
        h = (h + 1) & mask
    return h


cdef Py_ssize_t _walk(const index_t *indptr, const index_t *indices, const real_t *data,
                      const int64_t *batch_rows, Py_ssize_t n, const real_t *w, real_t *z,
                      Py_ssize_t k, int64_t *table, int64_t mask, int shift, int64_t *first,
                      int64_t *entry_slot) noexcept nogil:
    """The distinct columns in order of first appearance (first[0:u]), each entry's
    first-appearance slot, and (k > 0) the forward product z = X[batch_rows] @ w.  table is
    a (column, slot) hash table of at least twice as many pairs as there are entries."""
    cdef Py_ssize_t i, j, u = 0, e = 0, h
    cdef int64_t p, r, c
    cdef real_t a
    cdef real_t *row = z
    cdef const real_t *src
    for i in range(n):
        r = batch_rows[i]
        if i + AHEAD < n:
            __builtin_prefetch(&indptr[batch_rows[i + AHEAD]])
        if i + 1 < n:
            p = indptr[batch_rows[i + 1]]
            __builtin_prefetch(&indices[p])
            __builtin_prefetch(&data[p])
        if k:
            row = z + i * k
            for j in range(k):
                row[j] = 0
        for p in range(indptr[r], indptr[r + 1]):
            c = indices[p]
            h = _probe(table, mask, shift, c)
            if table[2 * h] == -1:
                table[2 * h] = c
                table[2 * h + 1] = u
                first[u] = c
                u += 1
            entry_slot[e] = table[2 * h + 1]
            e += 1
            if k:
                a = data[p]
                src = w + c * k
                for j in range(k):
                    row[j] = row[j] + a * src[j]
    return u


def sum_rows(const index_t[::1] indptr, const real_t[::1] data, const int64_t[::1] batch_rows,
             const int64_t[::1] entry_rank, const real_t[:, ::1] dz, Py_ssize_t u):
    """sums (u, K): sums[entry_rank[e]] += data[p] * dz[i] over the entries e (stored entry p
    of row batch_rows[i]) in walk order, from +0."""
    cdef Py_ssize_t n = batch_rows.shape[0], k = dz.shape[1]
    cdef cnp.ndarray out = np.zeros((u, k), dtype=np.float32 if real_t is float else np.float64)
    if u and k:
        with nogil:
            _sum_rows(&indptr[0], &data[0], &batch_rows[0], &entry_rank[0], &dz[0, 0], n, k,
                      <real_t *>cnp.PyArray_DATA(out))
    return out


cdef void _sum_rows(const index_t *indptr, const real_t *data, const int64_t *batch_rows,
                    const int64_t *entry_rank, const real_t *dz, Py_ssize_t n, Py_ssize_t k,
                    real_t *out) noexcept nogil:
    cdef Py_ssize_t i, j, e = 0
    cdef int64_t p, r
    cdef real_t a
    cdef real_t *dst
    cdef const real_t *g
    for i in range(n):
        r = batch_rows[i]
        g = dz + i * k
        for p in range(indptr[r], indptr[r + 1]):
            dst = out + entry_rank[e] * k
            e += 1
            a = data[p]
            for j in range(k):
                dst[j] = dst[j] + a * g[j]
