"""Products of a CSR matrix's rows with dense matrices, for a linear layer ``z = X @ W`` whose
gradient ``X.T @ dz`` must stay sparse (``fastadam.sparse.csr_transpose_dot``).

The kernels walk a list of the matrix's rows (``batch_rows``, in that order), so a shuffled
mini-batch is read in place, without gathering a new CSR matrix.  Two calls per batch:

- ``dot_and_columns`` (``columns`` without the product): one walk that finds the distinct
  columns the rows touch (int32 slots in a direct column map for matrices not much wider
  than the batch, else in a hash table sized to the batch, at most half full, so neither the
  cost nor the memory depends on the number of columns), sorts them with an
  LSD radix sort (``cols``), records for every stored entry the position of its column in ``cols``
  (``entry_rank``), and, in the same walk, computes the forward product
  ``z[i] = sum_p data[p] * W[indices[p]]`` over row ``batch_rows[i]``'s entries in storage
  order (scipy's ``csr_matvecs`` order);
- ``sum_rows``: ``sums[entry_rank[e]] += data[p] * dz[i]`` over the entries in walk order, from
  +0.  Each column's terms are thus added in the order the rows (then the entries) come: the
  rounding of ``segment_sum(indices, data[:, None] * dz[row_of_entry])`` (a stable sort keeps
  the original order in each segment), without the sort.

Cost O(nnz x K + u) for u distinct columns.  Arguments arrive validated
(fastadam/sparse/_segments.py checks the CSR structure, index range and dtypes; fastadam/sklearn
checks a training matrix once per fit), and ``indptr`` and ``indices`` are the private copies
that check made: another thread writing into the caller's matrix cannot reach the walks.  The
walks re-check only the batch rows' range (O(batch), before the GIL is released).
``-ffp-contract=off`` (setup.py) keeps ``a + b * c``
as two roundings, as NumPy computes it.  Written directly in Cython (typed pointer loops): the
kernels are a few lines each and have no SIMD or dispatch to share with include/fastadam.
"""
import threading

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memset

cnp.import_array()

cdef extern from *:
    void __builtin_prefetch(const void *addr) nogil

# How many rows ahead the walks prefetch a row's indptr entry (the row after that: its
# entries).  Batch rows are random rows of the matrix, so each costs cache misses otherwise.
cdef enum:
    AHEAD = 4
    RADIX_BITS = 11  # digits of the sort of a batch's distinct columns (2**11 counters: L1)

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
# A walk finds each column's slot in a direct column -> slot map (one int32 per column, kept
# per thread and reset after each walk) when the matrix has at most DIRECT_MAP_RATIO times as
# many columns as the hash table would have positions, else in the hash table: the map costs
# one load per entry, but for wide matrices it is a large table read at random.
DIRECT_MAP_RATIO = 4
_maps = threading.local()


cdef cnp.ndarray _column_map(Py_ssize_t n_cols):
    """This thread's int32 map of at least n_cols entries, every entry -1."""
    cdef cnp.ndarray m = getattr(_maps, "map", None)
    if m is None or m.shape[0] < n_cols:
        m = np.full(n_cols, -1, dtype=np.int32)
        _maps.map = m
    return m


# The hash table holds int32 slots (a quarter of the cache lines of (column, slot) int64
# pairs), so one walk may hold at most 2**31 - 1 stored entries.
SLOT_LIMIT = (1 << 31) - 1


cdef int _table_bits(Py_ssize_t total):
    """log2 of the hash table's size: the least power of two >= 2 * total (at most half full)."""
    cdef int bits = 4
    while (<Py_ssize_t>1 << bits) < 2 * total:
        bits += 1
    return bits


cdef int64_t _batch_entries(const index_t[::1] indptr, const int64_t[::1] batch_rows) except -1:
    """The stored entries of the rows batch_rows; IndexError for a row outside the matrix.
    indptr is a checked private copy (fastadam/_core/_sparse_host.py check_csr_structure: from 0,
    non-decreasing); this re-checks the one precondition the walks add, rows in range."""
    cdef Py_ssize_t i, n_rows = indptr.shape[0] - 1
    cdef int64_t r, total = 0
    if n_rows < 0:
        raise ValueError("indptr: expected at least one entry")
    for i in range(batch_rows.shape[0]):
        r = batch_rows[i]
        if r < 0 or r >= n_rows:
            raise IndexError(f"batch_rows: row {r} is out of range for {n_rows} rows")
        total += indptr[r + 1] - indptr[r]
    return total


def dot_and_columns(const index_t[::1] indptr, const index_t[::1] indices,
                    const real_t[::1] data, const int64_t[::1] batch_rows, Py_ssize_t n_cols,
                    const real_t[:, ::1] w, real_t[:, ::1] z):
    """One walk over the rows batch_rows: (cols, entry_rank) as ``columns`` returns them, and,
    when w (n_cols, K) has columns, z[i] = X[batch_rows[i]] @ w (z of shape (n, K), written)."""
    cdef Py_ssize_t n = batch_rows.shape[0], k = w.shape[1], i, u = 0
    cdef int64_t total = _batch_entries(indptr, batch_rows)
    cdef int64_t nnz = indptr[indptr.shape[0] - 1]
    if indices.shape[0] < nnz or data.shape[0] < nnz:
        raise ValueError(f"indptr ends at {nnz}, past {indices.shape[0]} indices or "
                         f"{data.shape[0]} values")
    if k and (w.shape[0] < n_cols or z.shape[0] != n or z.shape[1] != k):
        raise ValueError(f"w of shape {tuple(w.shape)[:2]} and z of shape {tuple(z.shape)[:2]} "
                         f"do not fit {n} rows of {n_cols} columns")
    cdef cnp.ndarray entry_rank = np.empty(total, dtype=np.int64)
    if total == 0:
        if k:
            z[:, :] = 0
        return np.empty(0, dtype=np.int64), entry_rank
    cdef cnp.ndarray first = np.empty(total, dtype=np.int64)
    cdef int64_t *pfirst = <int64_t *>cnp.PyArray_DATA(first)
    cdef int64_t *prank = <int64_t *>cnp.PyArray_DATA(entry_rank)
    if total > SLOT_LIMIT:
        raise ValueError(f"the rows hold {total} stored entries; at most {SLOT_LIMIT} per call "
                         f"(pass fewer rows at a time)")
    cdef int bits = _table_bits(total)
    cdef Py_ssize_t cap = <Py_ssize_t>1 << bits
    cdef bint direct = n_cols <= DIRECT_MAP_RATIO * cap
    cdef cnp.ndarray table
    if direct:  # this thread's column -> slot map (all -1 between calls)
        table = _column_map(n_cols)
    else:
        table = np.full(cap, -1, dtype=np.int32)  # hash positions -> slots
    cdef int32_t *ptable = <int32_t *>cnp.PyArray_DATA(table)
    cdef int shift = 64 - bits
    with nogil:
        u = _walk(&indptr[0], &indices[0], &data[0], &batch_rows[0], n,
                  &w[0, 0] if k else NULL, &z[0, 0] if k else NULL, k, direct,
                  ptable, cap - 1, shift, pfirst, prank)
        if direct:
            for i in range(u):
                ptable[pfirst[i]] = -1
    seen = first[:u]
    cdef cnp.ndarray cols
    cdef cnp.ndarray rank_of_first = np.empty(u, dtype=np.int64)
    cdef int64_t *pr = <int64_t *>cnp.PyArray_DATA(rank_of_first)
    cdef cnp.ndarray keys, spare, count
    cdef int key_bits
    cdef Py_ssize_t e
    if n_cols <= PACK_LIMIT:  # an LSD radix sort of (column << 32 | slot) keys, in C loops
        keys = np.empty(u, dtype=np.uint64)
        spare = np.empty(u, dtype=np.uint64)
        count = np.empty(1 << RADIX_BITS, dtype=np.intp)
        cols = np.empty(u, dtype=np.int64)
        key_bits = int(max(n_cols - 1, 1)).bit_length()
        with nogil:
            _sort_first_columns(pfirst, u, key_bits, <uint64_t *>cnp.PyArray_DATA(keys),
                                <uint64_t *>cnp.PyArray_DATA(spare),
                                <Py_ssize_t *>cnp.PyArray_DATA(count),
                                <int64_t *>cnp.PyArray_DATA(cols), pr)
    else:
        order = np.argsort(seen, kind="stable")
        cols = seen[order]
        rank_of_first[order] = np.arange(u)
    with nogil:
        for e in range(total):
            prank[e] = pr[prank[e]]
    return cols, entry_rank


cdef void _sort_first_columns(const int64_t *first, Py_ssize_t u, int key_bits, uint64_t *a,
                              uint64_t *b, Py_ssize_t *count, int64_t *cols,
                              int64_t *rank_of_first) noexcept nogil:
    """cols = the u distinct columns first[0:u] (each < 2**key_bits <= 2**31) in increasing
    order, and rank_of_first[slot] = the position of first[slot] in cols: a stable LSD radix
    sort of the keys (column << 32 | slot) on their column bits, RADIX_BITS per pass (a and b
    are u-long scratch buffers, count 2**RADIX_BITS counters)."""
    cdef Py_ssize_t i, run, c
    cdef int shift = 32
    cdef uint64_t d, mask = (1 << RADIX_BITS) - 1
    cdef uint64_t *t
    for i in range(u):
        a[i] = (<uint64_t>first[i] << 32) | <uint64_t>i
    while shift < 32 + key_bits:
        memset(count, 0, (1 << RADIX_BITS) * sizeof(Py_ssize_t))
        for i in range(u):
            count[(a[i] >> shift) & mask] += 1
        run = 0
        for i in range(1 << RADIX_BITS):
            c = count[i]
            count[i] = run
            run += c
        for i in range(u):
            d = (a[i] >> shift) & mask
            b[count[d]] = a[i]
            count[d] += 1
        t = a
        a = b
        b = t
        shift += RADIX_BITS
    for i in range(u):
        cols[i] = <int64_t>(a[i] >> 32)
        rank_of_first[<uint32_t>a[i]] = i  # the low 32 bits: the slot


def columns(const index_t[::1] indptr, const index_t[::1] indices, const real_t[::1] data,
            const int64_t[::1] batch_rows, Py_ssize_t n_cols):
    """(cols, entry_rank): the sorted distinct columns of the rows batch_rows (int64), and for
    each of their stored entries, in walk order (row by row, then storage order), the position
    of its column in cols."""
    cdef real_t[:, ::1] none = np.empty((0, 0), dtype=np.float32 if real_t is float else np.float64)
    return dot_and_columns(indptr, indices, data, batch_rows, n_cols, none, none)


cdef inline Py_ssize_t _probe(const int32_t *table, const int64_t *first, int64_t mask,
                             int shift, int64_t c) noexcept nogil:
    """The table position whose slot holds column c (first[slot] == c), or the empty one (-1)
    where it goes (linear probing from a Fibonacci hash of c)."""
    cdef int64_t h = <int64_t>((<uint64_t>c * <uint64_t>0x9E3779B97F4A7C15ULL) >> shift)
    while table[h] != -1 and first[table[h]] != c:
        h = (h + 1) & mask
    return h


cdef Py_ssize_t _walk(const index_t *indptr, const index_t *indices, const real_t *data,
                      const int64_t *batch_rows, Py_ssize_t n, const real_t *w, real_t *z,
                      Py_ssize_t k, bint direct, int32_t *table, int64_t mask, int shift,
                      int64_t *first, int64_t *entry_slot) noexcept nogil:
    """The distinct columns in order of first appearance (first[0:u]), each entry's
    first-appearance slot, and (k > 0) the forward product z = X[batch_rows] @ w.  table
    holds int32 slots (-1: empty): indexed by column when direct, else a hash table with at
    least twice as many positions as there are entries.  With k == 4 (four classes) a row's sums stay in registers; the additions
    and their order are the same."""
    cdef Py_ssize_t i, j, u = 0, e = 0, h
    cdef int64_t p, r, c, end
    cdef int32_t slot
    cdef real_t a, z0, z1, z2, z3
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
        z0 = z1 = z2 = z3 = 0
        if k != 4:
            for j in range(k):
                row[j] = 0
        end = indptr[r + 1]
        for p in range(indptr[r], end):
            c = indices[p]
            if k and p + AHEAD < end:  # the weight rows are random rows of w
                __builtin_prefetch(w + indices[p + AHEAD] * k)
            h = c if direct else _probe(table, first, mask, shift, c)
            slot = table[h]
            if slot == -1:
                slot = <int32_t>u
                table[h] = slot
                first[u] = c
                u += 1
            entry_slot[e] = slot
            e += 1
            if k == 4:
                a = data[p]
                src = w + c * 4
                z0 = z0 + a * src[0]
                z1 = z1 + a * src[1]
                z2 = z2 + a * src[2]
                z3 = z3 + a * src[3]
            elif k:
                a = data[p]
                src = w + c * k
                for j in range(k):
                    row[j] = row[j] + a * src[j]
        if k == 4:
            row[0] = z0
            row[1] = z1
            row[2] = z2
            row[3] = z3
    return u


def sum_rows(const index_t[::1] indptr, const real_t[::1] data, const int64_t[::1] batch_rows,
             const int64_t[::1] entry_rank, const real_t[:, ::1] dz, Py_ssize_t u):
    """sums (u, K): sums[entry_rank[e]] += data[p] * dz[i] over the entries e (stored entry p
    of row batch_rows[i]) in walk order, from +0."""
    cdef Py_ssize_t n = batch_rows.shape[0], k = dz.shape[1]
    cdef int64_t total = _batch_entries(indptr, batch_rows)
    if entry_rank.shape[0] != total or dz.shape[0] != n:
        raise ValueError(f"sum_rows: entry_rank of {entry_rank.shape[0]} entries and dz of "
                         f"{dz.shape[0]} rows for {n} rows holding {total} entries")
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
    cdef real_t a, g0, g1, g2, g3
    cdef real_t *dst
    cdef const real_t *g
    for i in range(n):
        r = batch_rows[i]
        g = dz + i * k
        if k == 4:  # the row of dz in registers (same products and sums)
            g0, g1, g2, g3 = g[0], g[1], g[2], g[3]
            for p in range(indptr[r], indptr[r + 1]):
                dst = out + entry_rank[e] * 4
                e += 1
                a = data[p]
                dst[0] = dst[0] + a * g0
                dst[1] = dst[1] + a * g1
                dst[2] = dst[2] + a * g2
                dst[3] = dst[3] + a * g3
            continue
        for p in range(indptr[r], indptr[r + 1]):
            dst = out + entry_rank[e] * k
            e += 1
            a = data[p]
            for j in range(k):
                dst[j] = dst[j] + a * g[j]
