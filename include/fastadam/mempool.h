/* fastadam/mempool.h -- a caching pool for NumPy array data (contract in mempool.c). */
#ifndef FASTADAM_MEMPOOL_H
#define FASTADAM_MEMPOOL_H

#include <stddef.h>

/* Requests of at least this many bytes are pooled; smaller ones go to malloc/free. */
#define FA_POOL_MIN_BYTES ((size_t)4096)
/* The block size unit: a pooled block (its prefix included) is a multiple of this. */
#define FA_POOL_PAGE ((size_t)4096)
/* Bytes before the data of a pooled block; the data is aligned to this. */
#define FA_POOL_PREFIX ((size_t)64)
/* Size classes a pool keeps free lists for; a block of another size is not cached. */
#define FA_POOL_CLASSES 64

typedef struct fa_mempool fa_mempool;

/* Where requests under FA_POOL_MIN_BYTES go: the layout of NumPy's PyDataMemAllocator (the
 * pool passes them NumPy's default allocator, whose small-size cache is faster than malloc). */
typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} fa_small_allocator;

/* A new pool (NULL when out of memory); `small` is copied; NULL means the C library's. */
fa_mempool *fa_mempool_new(size_t max_cached_bytes, const fa_small_allocator *small);
void fa_mempool_destroy(fa_mempool *pool);

/* The four functions of NumPy's PyDataMemAllocator (ctx is the pool). */
void *fa_mempool_malloc(void *ctx, size_t size);
void *fa_mempool_calloc(void *ctx, size_t nelem, size_t elsize);
void *fa_mempool_realloc(void *ctx, void *ptr, size_t new_size);
void fa_mempool_free(void *ctx, void *ptr, size_t size);

/* Frees every cached block; the pool stays usable. */
void fa_mempool_release(fa_mempool *pool);

typedef struct {
    size_t max_cached_bytes; /* the cap */
    size_t cached_bytes;     /* bytes of the blocks in the free lists, prefixes included */
    size_t cached_blocks;    /* blocks in the free lists */
    size_t reused;           /* requests served from a free list */
    size_t fresh;            /* pooled-size requests that allocated a new block */
} fa_mempool_stats;

fa_mempool_stats fa_mempool_get_stats(fa_mempool *pool);

#endif /* FASTADAM_MEMPOOL_H */
