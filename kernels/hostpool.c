/* The pool of pinned host buffers behind mal_kern_host_alloc and
 * mal_kern_host_free (kernels.h, "Pinned staging buffers"): one per kernel
 * instance, made and emptied by the registry (registry.c) around the
 * backend's create and destroy.
 *
 * Why a pool: the MPI data plane stages every transfer of a GPU's buffers
 * through pinned host memory, and pinning (cudaMallocHost) and unpinning
 * (cudaFreeHost, which waits for the whole device) cost far more than a
 * copy of a few megabytes; a training step asks for the same sizes in the
 * same order every step (activations, TP all-reduces, gradient buckets), so
 * a buffer given back is kept and handed out again.
 *
 * Sizes are rounded up to a class (64 bytes; above 64 KiB, 1/8 of the
 * size's power of two: at most 12.5% more), and a free buffer serves a
 * request it holds at least once and at most twice, so that a small
 * request does not take a large buffer that a large request will want
 * next.  The bound: the buffers pinned in all are at most twice the most
 * bytes the instance ever had handed out at once (its peak); past that,
 * giving a buffer back unpins the least recently given back free ones.
 * A backend that cannot pin more gets its free buffers unpinned first,
 * then one more try.  Every buffer is unpinned when the instance goes.
 *
 * Thread-safe: a background snapshot writer gives its staging back from
 * its own thread. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/mal.h"
#include "kernels.h"

typedef struct {
    void *p;
    size_t bytes; /* the class size it was pinned with */
    int in_use;
    uint64_t used; /* when it was last given back (LRU) */
} block;

struct mal_kern_host_pool {
    pthread_mutex_t lock;
    block *b;
    int n, cap;
    uint64_t clock;
    mal_kern_host_stats s;
};

/* The size class of a request: 64-byte multiples up to 64 KiB, then
 * steps of 1/8 of the size's power of two.  SIZE_MAX on overflow. */
static size_t size_class(size_t bytes)
{
    if (bytes <= 64) return 64;
    size_t step = 64;
    if (bytes > (size_t)64 << 10) {
        size_t pow2 = (size_t)1 << (63 - __builtin_clzll((unsigned long long)bytes));
        step = pow2 / 8;
    }
    size_t r = (bytes + step - 1) / step * step;
    return r < bytes ? SIZE_MAX : r;
}

int mal_kern_host_pool_create(mal_kern k)
{
    struct mal_kern_host_pool *hp = calloc(1, sizeof *hp);
    if (!hp || pthread_mutex_init(&hp->lock, NULL) != 0) {
        free(hp);
        return MAL_ERR(MAL_ENOMEM, "out of memory for the pinned-buffer pool of a %s instance",
                       k->name);
    }
    k->host_pool = hp;
    return 0;
}

/* Unpin free block i (the lock held) and drop it from the list. */
static void unpin(mal_kern k, struct mal_kern_host_pool *hp, int i)
{
    k->ops->host_free(k, hp->b[i].p);
    hp->s.pinned_bytes -= hp->b[i].bytes;
    hp->s.unpins++;
    hp->b[i] = hp->b[--hp->n];
}

void mal_kern_host_pool_destroy(mal_kern k)
{
    struct mal_kern_host_pool *hp = k->host_pool;
    if (!hp) return;
    /* buffers still handed out are unpinned too: the instance they belong
     * to is going (kernels.h: every buffer is freed before the instance) */
    while (hp->n)
        unpin(k, hp, hp->n - 1);
    free(hp->b);
    pthread_mutex_destroy(&hp->lock);
    free(hp);
    k->host_pool = NULL;
}

/* The least recently given back free block, or -1. */
static int lru_free(const struct mal_kern_host_pool *hp)
{
    int best = -1;
    for (int i = 0; i < hp->n; i++)
        if (!hp->b[i].in_use && (best < 0 || hp->b[i].used < hp->b[best].used)) best = i;
    return best;
}

void *mal_kern_host_alloc(mal_kern k, size_t bytes)
{
    struct mal_kern_host_pool *hp = k->host_pool;
    if (!hp) return k->ops->host_alloc(k, bytes); /* an instance made outside the registry */
    size_t want = size_class(bytes);
    if (want == SIZE_MAX) return NULL;
    pthread_mutex_lock(&hp->lock);
    /* the smallest free buffer that holds the request at most twice */
    int best = -1;
    for (int i = 0; i < hp->n; i++) {
        const block *b = &hp->b[i];
        if (!b->in_use && b->bytes >= want && b->bytes / 2 <= want &&
            (best < 0 || b->bytes < hp->b[best].bytes))
            best = i;
    }
    void *p = NULL;
    if (best >= 0) {
        p = hp->b[best].p;
        hp->b[best].in_use = 1;
        hp->s.in_use_bytes += hp->b[best].bytes;
        hp->s.reuses++;
    } else if (mal_grow(&hp->b, &hp->cap, hp->n, sizeof *hp->b, 16) == 0) {
        p = k->ops->host_alloc(k, want);
        /* out of pinnable memory: what the pool keeps free goes, then one
         * more try */
        int i, freed = 0;
        while (!p && (i = lru_free(hp)) >= 0)
            unpin(k, hp, i), freed = 1;
        if (!p && freed) p = k->ops->host_alloc(k, want);
        if (p) {
            hp->b[hp->n++] = (block){p, want, 1, 0};
            hp->s.pins++;
            hp->s.pinned_bytes += want;
            hp->s.in_use_bytes += want;
        }
    }
    if (hp->s.in_use_bytes > hp->s.peak_bytes) hp->s.peak_bytes = hp->s.in_use_bytes;
    pthread_mutex_unlock(&hp->lock);
    return p;
}

void mal_kern_host_free(mal_kern k, void *p)
{
    struct mal_kern_host_pool *hp = k->host_pool;
    if (!p) return;
    if (!hp) {
        k->ops->host_free(k, p);
        return;
    }
    pthread_mutex_lock(&hp->lock);
    int i = 0;
    while (i < hp->n && hp->b[i].p != p)
        i++;
    if (i == hp->n || !hp->b[i].in_use) {
        /* not a buffer of this pool (or given back twice): nothing of the
         * pool's to do, and unpinning it could free what another holds */
        pthread_mutex_unlock(&hp->lock);
        return;
    }
    hp->b[i].in_use = 0;
    hp->b[i].used = ++hp->clock;
    hp->s.in_use_bytes -= hp->b[i].bytes;
    /* the bound: twice the peak, the least recently used free ones go */
    int j;
    while (hp->s.pinned_bytes > 2 * hp->s.peak_bytes && (j = lru_free(hp)) >= 0)
        unpin(k, hp, j);
    pthread_mutex_unlock(&hp->lock);
}

void mal_kern_host_stats_get(mal_kern k, mal_kern_host_stats *out)
{
    struct mal_kern_host_pool *hp = k->host_pool;
    if (!hp) {
        *out = (mal_kern_host_stats){0};
        return;
    }
    pthread_mutex_lock(&hp->lock);
    *out = hp->s;
    pthread_mutex_unlock(&hp->lock);
}
