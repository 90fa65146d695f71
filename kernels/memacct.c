/* The memory accountant of a kernel instance (kernels.h, "the memory
 * accountant"): every device buffer allocated through the table is
 * recorded with its size and category until it is freed, and the bytes
 * held now, each category's peak and the categories at the moment the
 * total peaked are kept.  One per instance, made and ended by the
 * registry (registry.c) around the backend's create and destroy.
 *
 * The buffers are found again at free and resize by their address in an
 * open-addressing table (linear probing, deletion by shifting back), so a
 * free costs the same whether the instance holds ten buffers or ten
 * thousand.  Thread-safe: a background snapshot writer or a test may free
 * from another thread. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "kernels.h"

typedef struct {
    void *p; /* NULL: empty slot */
    size_t bytes;
    int cat;
} slot;

struct mal_kern_mem {
    pthread_mutex_t lock;
    slot *t;
    size_t cap, n; /* slots (a power of two), buffers held */
    mal_kern_mem_stats s;
};

const char *mal_mem_cat_name(int cat)
{
    static const char *const names[MAL_MEM_N] = {
        "other",       "weights", "master", "moments", "gradients",
        "activations", "scratch", "comm",   "staging",
    };
    return cat >= 0 && cat < MAL_MEM_N ? names[cat] : "?";
}

int mal_kern_mem_create(mal_kern k)
{
    struct mal_kern_mem *a = calloc(1, sizeof *a);
    if (!a || !(a->t = calloc(64, sizeof *a->t))) {
        free(a);
        return MAL_ERR(MAL_ENOMEM, "kernels: out of memory for the memory accountant");
    }
    a->cap = 64;
    pthread_mutex_init(&a->lock, NULL);
    k->mem = a;
    return 0;
}

void mal_kern_mem_destroy(mal_kern k)
{
    struct mal_kern_mem *a = k ? k->mem : NULL;
    if (!a) return;
    if (a->n)
        mal_log(MAL_LOG_DEBUG, "kernels: %zu buffer(s), %zu bytes, still held at the end", a->n,
                a->s.total);
    pthread_mutex_destroy(&a->lock);
    free(a->t);
    free(a);
    k->mem = NULL;
}

static size_t home(const struct mal_kern_mem *a, const void *p)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 20) & (a->cap - 1);
}

/* Insert (p, bytes, cat); the table has room (grown below). */
static void put(struct mal_kern_mem *a, void *p, size_t bytes, int cat)
{
    size_t i = home(a, p);
    while (a->t[i].p)
        i = (i + 1) & (a->cap - 1);
    a->t[i] = (slot){p, bytes, cat};
    a->n++;
}

/* Keep the table at most half full.  0, or -1 when it cannot grow (the
 * buffer is then not recorded: the counts stay right, only its free is
 * not seen). */
static int grow(struct mal_kern_mem *a)
{
    if (2 * (a->n + 1) <= a->cap) return 0;
    slot *old = a->t;
    size_t old_cap = a->cap;
    slot *t = calloc(2 * old_cap, sizeof *t);
    if (!t) return -1;
    a->t = t;
    a->cap = 2 * old_cap;
    a->n = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].p) put(a, old[i].p, old[i].bytes, old[i].cat);
    free(old);
    return 0;
}

/* Remove p's record into *out; 0 when it was not recorded. */
static int take(struct mal_kern_mem *a, const void *p, slot *out)
{
    size_t i = home(a, p);
    while (a->t[i].p && a->t[i].p != p)
        i = (i + 1) & (a->cap - 1);
    if (!a->t[i].p) return 0;
    *out = a->t[i];
    a->t[i].p = NULL;
    a->n--;
    /* shift back the entries of the run that probed past the hole */
    for (size_t j = (i + 1) & (a->cap - 1); a->t[j].p; j = (j + 1) & (a->cap - 1)) {
        size_t h = home(a, a->t[j].p);
        /* j's entry may fill the hole when its home is not in (i, j] */
        int stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (stays) continue;
        a->t[i] = a->t[j];
        a->t[j].p = NULL;
        i = j;
    }
    return 1;
}

static void add(struct mal_kern_mem *a, int cat, size_t bytes)
{
    mal_kern_mem_stats *s = &a->s;
    s->now[cat] += bytes;
    s->total += bytes;
    if (s->now[cat] > s->peak[cat]) s->peak[cat] = s->now[cat];
    if (s->total > s->total_peak) {
        s->total_peak = s->total;
        memcpy(s->at_peak, s->now, sizeof s->now);
    }
    s->n_buffers = a->n;
}

static void sub(struct mal_kern_mem *a, int cat, size_t bytes)
{
    a->s.now[cat] -= bytes;
    a->s.total -= bytes;
    a->s.n_buffers = a->n;
}

void *mal_kern_alloc_as(mal_kern k, size_t bytes, mal_mem_cat cat)
{
    void *p = k->ops->alloc(k, bytes);
    struct mal_kern_mem *a = k->mem;
    if (!p || !a) return p;
    if (cat < 0 || cat >= MAL_MEM_N) cat = MAL_MEM_OTHER;
    pthread_mutex_lock(&a->lock);
    if (grow(a) == 0) {
        put(a, p, bytes, cat);
        add(a, cat, bytes);
    }
    pthread_mutex_unlock(&a->lock);
    return p;
}

void mal_kern_free(mal_kern k, void *p)
{
    if (!p) return;
    struct mal_kern_mem *a = k->mem;
    if (a) {
        slot x;
        pthread_mutex_lock(&a->lock);
        if (take(a, p, &x)) sub(a, x.cat, x.bytes);
        pthread_mutex_unlock(&a->lock);
    }
    k->ops->free(k, p);
}

void *mal_kern_resize(mal_kern k, void *p, size_t old_bytes, size_t new_bytes)
{
    void *q = k->ops->resize(k, p, old_bytes, new_bytes);
    struct mal_kern_mem *a = k->mem;
    if (!q || !a) return q;
    slot x = {NULL, 0, MAL_MEM_OTHER};
    pthread_mutex_lock(&a->lock);
    if (take(a, p, &x)) sub(a, x.cat, x.bytes);
    if (grow(a) == 0) {
        put(a, q, new_bytes, x.cat);
        add(a, x.cat, new_bytes);
    }
    pthread_mutex_unlock(&a->lock);
    return q;
}

void mal_kern_mem_get(mal_kern k, mal_kern_mem_stats *out)
{
    struct mal_kern_mem *a = k ? k->mem : NULL;
    memset(out, 0, sizeof *out);
    if (!a) return;
    pthread_mutex_lock(&a->lock);
    *out = a->s;
    pthread_mutex_unlock(&a->lock);
}

void mal_kern_mem_reset_peak(mal_kern k)
{
    struct mal_kern_mem *a = k ? k->mem : NULL;
    if (!a) return;
    pthread_mutex_lock(&a->lock);
    mal_kern_mem_stats *s = &a->s;
    memcpy(s->peak, s->now, sizeof s->now);
    memcpy(s->at_peak, s->now, sizeof s->now);
    s->total_peak = s->total;
    pthread_mutex_unlock(&a->lock);
}
