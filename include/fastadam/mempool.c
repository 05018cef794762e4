/* fastadam/mempool.c -- a caching pool for NumPy array data (NumPy's NEP 49 data allocator).
 *
 * Purpose.  A training step allocates and frees the same multi-megabyte arrays every step
 * (activations, gradients).  glibc gives large freed blocks back to the OS (munmap, or a trim of
 * the heap top), so the next step page-faults every 4 KiB page in again.  A pool keeps freed
 * blocks on free lists, one list per exact block size, and hands them out again: after the
 * first step a step allocates nothing from the OS and faults no page in.  The pool is what a
 * PyDataMem_Handler capsule points to (fastadam/_core/_mempool.pyx); NumPy uses it only for the
 * arrays created while it is the current handler of a context, and every such array keeps a
 * reference to the capsule, so the pool outlives its blocks.
 *
 * Layout of a block (p: the data pointer NumPy gets).  The 16 bytes before p hold its
 * fa_block_head {capacity, nbytes}; free and realloc read it and never trust the size NumPy
 * passes.
 *   - a request of fewer than FA_POOL_MIN_BYTES: 16 + n bytes from the pool's small allocator
 *     (NumPy's default one, given by the caller, or the C library's), capacity 0, base p - 16
 *     (data aligned as that allocator aligns: 16 bytes); freed by it, with its size;
 *   - a pooled block: posix_memalign(FA_POOL_PREFIX, total), total = the request plus the
 *     prefix rounded up to a multiple of FA_POOL_PAGE; base p - FA_POOL_PREFIX (data aligned to
 *     64 bytes), capacity total - FA_POOL_PREFIX; while cached, the first word of the base links
 *     it into its size class's free list.
 *
 * Free lists: FA_POOL_CLASSES size classes {total, count, head}, given a size in the order
 * sizes are first freed and searched linearly (a training step uses a few dozen sizes).  A
 * freed block goes to its size's class; a new size takes the next class, or, once all have a
 * size, one whose list is empty; if none is empty, or the cap (max_cached_bytes) would be
 * passed, the block is really freed.  calloc zeroes the requested
 * bytes (a reused block is dirty); realloc keeps a pooled block when the new size fits its
 * capacity and is at least half of it, and otherwise moves the data to a new block.
 *
 * Thread safety.  NumPy may call these functions from any thread, with or without the GIL, so
 * one process-wide mutex guards the free lists and counters of every pool.  It is held only
 * around list and counter updates: malloc, free and memset run outside it, and nothing done
 * under it can call back into Python, wait, or fork.  Small requests call the small allocator
 * unlocked, exactly when NumPy would have called it (NumPy's default allocator is safe under
 * the conditions NumPy calls its handlers in).
 *
 * fork.  pthread_atfork handlers (registered once, when the first pool is made) take the mutex
 * before fork() and release it after, in the parent and in the child, so a child never inherits
 * it held by a thread that does not exist there, nor a free list half updated.  The child
 * inherits the pools' cached blocks with the rest of the heap and may use or free them.
 *
 * Complexity: O(sizes seen, at most FA_POOL_CLASSES) per pooled allocation or free, plus memset for calloc and a
 * copy for a realloc that moves.  No globals besides the mutex and its once-flag.
 */
#include "fastadam/mempool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t capacity; /* 0: a small block; else the pooled block's usable bytes */
    size_t nbytes;   /* the bytes last requested for this block */
} fa_block_head;

#define HEAD(p) ((fa_block_head *)((char *)(p) - sizeof(fa_block_head)))

typedef struct {
    size_t total; /* block size, prefix included, of this class */
    size_t count; /* blocks in the list */
    void *head;   /* the first block's base (NULL when count is 0); each base's first word
                     links to the next */
} fa_size_class;

struct fa_mempool {
    fa_small_allocator small;
    size_t max_cached_bytes;
    size_t cached_bytes;
    size_t cached_blocks;
    size_t reused;
    size_t fresh;
    int nclasses; /* classes[0 .. nclasses) have a size */
    fa_size_class classes[FA_POOL_CLASSES];
};

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void lock_before_fork(void) { pthread_mutex_lock(&pool_lock); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&pool_lock); }
static void register_atfork(void)
{
    pthread_atfork(lock_before_fork, unlock_after_fork, unlock_after_fork);
}

static void *libc_malloc(void *ctx, size_t size) { (void)ctx; return malloc(size); }
static void *libc_calloc(void *ctx, size_t nelem, size_t elsize)
{
    (void)ctx;
    return calloc(nelem, elsize);
}
static void *libc_realloc(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    return realloc(ptr, size);
}
static void libc_free(void *ctx, void *ptr, size_t size) { (void)ctx; (void)size; free(ptr); }

fa_mempool *fa_mempool_new(size_t max_cached_bytes, const fa_small_allocator *small)
{
    static const fa_small_allocator libc = {NULL, libc_malloc, libc_calloc, libc_realloc,
                                            libc_free};
    fa_mempool *pool;
    pthread_once(&atfork_once, register_atfork);
    pool = calloc(1, sizeof *pool);
    if (pool == NULL) return NULL;
    pool->small = small != NULL ? *small : libc;
    pool->max_cached_bytes = max_cached_bytes;
    return pool;
}

/* The block size (prefix included) for a request of `size` bytes; 0 when it overflows. */
static size_t block_total(size_t size)
{
    if (size > SIZE_MAX - FA_POOL_PREFIX - FA_POOL_PAGE) return 0;
    return (size + FA_POOL_PREFIX + FA_POOL_PAGE - 1) / FA_POOL_PAGE * FA_POOL_PAGE;
}

/* The class of blocks of `total` bytes, or NULL; the mutex is held. */
static fa_size_class *find_class(fa_mempool *pool, size_t total)
{
    int i;
    for (i = 0; i < pool->nclasses; i++) {
        if (pool->classes[i].total == total) return &pool->classes[i];
    }
    return NULL;
}

/* A cached block of `total` bytes taken off its list, or NULL (counted as fresh). */
static char *take_cached(fa_mempool *pool, size_t total)
{
    char *base = NULL;
    fa_size_class *c;
    pthread_mutex_lock(&pool_lock);
    c = find_class(pool, total);
    if (c != NULL && c->count > 0) {
        base = c->head;
        c->head = *(void **)base;
        c->count--;
        pool->cached_bytes -= total;
        pool->cached_blocks--;
        pool->reused++;
    } else {
        pool->fresh++;
    }
    pthread_mutex_unlock(&pool_lock);
    return base;
}

/* Puts a block on its class's list, or frees it (cap reached, no class for its size). */
static void cache_or_free(fa_mempool *pool, char *base, size_t total)
{
    fa_size_class *c = NULL;
    int i;
    pthread_mutex_lock(&pool_lock);
    if (pool->cached_bytes <= pool->max_cached_bytes
            && total <= pool->max_cached_bytes - pool->cached_bytes) {
        c = find_class(pool, total);
        if (c == NULL && pool->nclasses < FA_POOL_CLASSES) {
            c = &pool->classes[pool->nclasses++];
            c->total = total;
        }
        for (i = 0; c == NULL && i < FA_POOL_CLASSES; i++) {  /* table full: an empty class */
            if (pool->classes[i].count == 0) {
                c = &pool->classes[i];
                c->total = total;
            }
        }
        if (c != NULL) {
            *(void **)base = c->head;
            c->head = base;
            c->count++;
            pool->cached_bytes += total;
            pool->cached_blocks++;
        }
    }
    pthread_mutex_unlock(&pool_lock);
    if (c == NULL) free(base);
}

static void *small_alloc(const fa_small_allocator *small, size_t size, int zero)
{
    fa_block_head *h = zero ? small->calloc(small->ctx, 1, sizeof *h + size)
                            : small->malloc(small->ctx, sizeof *h + size);
    if (h == NULL) return NULL;
    h->capacity = 0;
    h->nbytes = size;
    return h + 1;
}

static void *pooled_alloc(fa_mempool *pool, size_t size, int zero)
{
    size_t total = block_total(size);
    char *base, *p;
    if (total == 0) return NULL;
    base = take_cached(pool, total);
    if (base == NULL) {
        void *raw = NULL;
        if (posix_memalign(&raw, FA_POOL_PREFIX, total) != 0) return NULL;
        base = raw;
    }
    p = base + FA_POOL_PREFIX;
    HEAD(p)->capacity = total - FA_POOL_PREFIX;
    HEAD(p)->nbytes = size;
    if (zero) memset(p, 0, size);
    return p;
}

void *fa_mempool_malloc(void *ctx, size_t size)
{
    fa_mempool *pool = ctx;
    if (size < FA_POOL_MIN_BYTES) return small_alloc(&pool->small, size, 0);
    return pooled_alloc(pool, size, 0);
}

void *fa_mempool_calloc(void *ctx, size_t nelem, size_t elsize)
{
    fa_mempool *pool = ctx;
    size_t size;
    if (elsize != 0 && nelem > SIZE_MAX / elsize) return NULL;
    size = nelem * elsize;
    if (size < FA_POOL_MIN_BYTES) return small_alloc(&pool->small, size, 1);
    return pooled_alloc(pool, size, 1);
}

void fa_mempool_free(void *ctx, void *ptr, size_t size)
{
    fa_mempool *pool = ctx;
    fa_block_head *h;
    (void)size; /* the block's own head says what it is */
    if (ptr == NULL) return;
    h = HEAD(ptr);
    if (h->capacity == 0) {
        pool->small.free(pool->small.ctx, h, sizeof *h + h->nbytes);
        return;
    }
    cache_or_free(pool, (char *)ptr - FA_POOL_PREFIX, h->capacity + FA_POOL_PREFIX);
}

void *fa_mempool_realloc(void *ctx, void *ptr, size_t new_size)
{
    fa_mempool *pool = ctx;
    fa_block_head *h;
    void *moved;
    size_t keep;
    if (ptr == NULL) return fa_mempool_malloc(ctx, new_size);
    h = HEAD(ptr);
    if (h->capacity == 0 && new_size < FA_POOL_MIN_BYTES) { /* small to small */
        fa_block_head *n = pool->small.realloc(pool->small.ctx, h, sizeof *h + new_size);
        if (n == NULL) return NULL;
        n->nbytes = new_size;
        return n + 1;
    }
    if (h->capacity != 0 && new_size <= h->capacity && new_size >= h->capacity / 2) {
        h->nbytes = new_size;
        return ptr;
    }
    moved = fa_mempool_malloc(ctx, new_size);
    if (moved == NULL) return NULL; /* the old block is left as it was */
    keep = h->nbytes < new_size ? h->nbytes : new_size;
    memcpy(moved, ptr, keep);
    fa_mempool_free(ctx, ptr, 0);
    return moved;
}

void fa_mempool_release(fa_mempool *pool)
{
    void *lists[FA_POOL_CLASSES];
    int i;
    pthread_mutex_lock(&pool_lock);
    for (i = 0; i < FA_POOL_CLASSES; i++) {
        lists[i] = pool->classes[i].head;
        pool->classes[i].head = NULL;
        pool->classes[i].count = 0;
        pool->classes[i].total = 0;
    }
    pool->nclasses = 0;
    pool->cached_bytes = 0;
    pool->cached_blocks = 0;
    pthread_mutex_unlock(&pool_lock);
    for (i = 0; i < FA_POOL_CLASSES; i++) {
        void *base = lists[i];
        while (base != NULL) {
            void *next = *(void **)base;
            free(base);
            base = next;
        }
    }
}

void fa_mempool_destroy(fa_mempool *pool)
{
    if (pool == NULL) return;
    fa_mempool_release(pool);
    free(pool);
}

fa_mempool_stats fa_mempool_get_stats(fa_mempool *pool)
{
    fa_mempool_stats s;
    pthread_mutex_lock(&pool_lock);
    s.max_cached_bytes = pool->max_cached_bytes;
    s.cached_bytes = pool->cached_bytes;
    s.cached_blocks = pool->cached_blocks;
    s.reused = pool->reused;
    s.fresh = pool->fresh;
    pthread_mutex_unlock(&pool_lock);
    return s;
}
