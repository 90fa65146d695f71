/* The kernel backends of this build by name (kernels.h), IOR-style: one
 * entry per backend, each guarded by the configure macro that builds it,
 * in the order the default is chosen.  Finding a name, the messages and
 * the list for --help are base/registry.c's; this file holds the list and
 * the typed wrappers. */
#include <stddef.h>
#include <stdlib.h>

#include "base/mal.h"
#include "kernels.h"

extern const mal_kern_backend mal_kern_backend_cpu;
extern const mal_kern_backend mal_kern_backend_cpu_opaque;
#ifdef HAVE_CUDA
extern const mal_kern_backend mal_kern_backend_cuda;
#endif

/* The entries (mal_kern_backend.reg) of this build's backends. */
static const mal_registry_entry *const entries[] = {
    /* A GPU backend goes first, so that it is the default where its probe
     * finds a device. */
#ifdef HAVE_CUDA
    &mal_kern_backend_cuda.reg,
#endif
    &mal_kern_backend_cpu.reg,
    &mal_kern_backend_cpu_opaque.reg,
    NULL,
};

/* Backends some build has, for the message when this one lacks them. */
static const mal_registry_known known[] = {
    {"cuda", "a build with the CUDA backend (configure --with-cuda, on a checkout that has "
             "kernels/cuda)"},
};

static const mal_registry registry = {"device", entries, known, MAL_ARRAY_SIZE(known)};

/* The backend whose entry is `e` (its first member), or NULL. */
_Static_assert(offsetof(mal_kern_backend, reg) == 0, "the entry starts the backend's table");
static const mal_kern_backend *backend_of(const mal_registry_entry *e)
{
    return (const mal_kern_backend *)e;
}

mal_kern_config mal_kern_config_default(void)
{
    mal_kern_config c = {MAL_F32, 0, -1};
    return c;
}

void mal_kern_names(char *buf, size_t len, const char *sep)
{
    mal_registry_names(&registry, buf, len, sep);
}

int mal_kern_lookup(const char *name, const mal_kern_backend **out)
{
    const mal_registry_entry *e;
    int rc = mal_registry_lookup(&registry, name, &e);
    *out = backend_of(e);
    return rc;
}

/* Default candidates: not the test backends. */
static int is_default(const mal_registry_entry *e, const void *arg)
{
    (void)arg;
    return backend_of(e)->is_default;
}

const char *mal_kern_default_name(void)
{
    const char *env = getenv("MALLEUS_DEVICE");
    if (env && *env) return env;
    const mal_registry_entry *e = mal_registry_first(&registry, is_default, NULL);
    return e ? e->name : "cpu";
}

int mal_kern_create(const char *name, const mal_kern_config *cfg, mal_kern *out)
{
    const mal_kern_backend *b;
    mal_kern_config def = mal_kern_config_default();
    *out = NULL;
    int rc = mal_kern_lookup(name ? name : mal_kern_default_name(), &b);
    if (rc) return rc;
    mal_kern_config c = cfg ? *cfg : def;
    if (c.compute == MAL_DTYPE_AUTO) c.compute = b->default_compute;
    if ((rc = b->create(&c, out))) return rc;
    if ((rc = mal_kern_host_pool_create(*out)) || (rc = mal_kern_mem_create(*out))) {
        mal_kern_host_pool_destroy(*out);
        b->destroy(*out);
        *out = NULL;
    }
    return rc;
}

void mal_kern_destroy(mal_kern k)
{
    if (!k) return;
    const mal_kern_backend *b = backend_of(mal_registry_find(&registry, k->name));
    /* the pool unpins through the backend, so before the backend goes */
    mal_kern_host_pool_destroy(k);
    mal_kern_mem_destroy(k);
    if (b) b->destroy(k);
}

/* ---- operation counts (kernels.h) ------------------------------------- */

void mal_kern_counts_get(mal_kern k, unsigned long long out[MAL_KOP_N])
{
    for (int i = 0; i < MAL_KOP_N; i++)
        out[i] = __atomic_load_n(&k->counts[i], __ATOMIC_RELAXED);
}

void mal_kern_counts_reset(mal_kern k)
{
    for (int i = 0; i < MAL_KOP_N; i++)
        __atomic_store_n(&k->counts[i], 0ull, __ATOMIC_RELAXED);
}

const char *mal_kern_op_name(int op)
{
    static const char *const names[MAL_KOP_N] = {
        [MAL_KOP_ZERO] = "zero",
        [MAL_KOP_COPY] = "copy",
        [MAL_KOP_SYNC] = "sync",
        [MAL_KOP_QUEUE_WAIT] = "queue_wait",
        [MAL_KOP_EVENT_WAIT] = "event_wait",
        [MAL_KOP_MATMUL_FWD] = "matmul_fwd",
        [MAL_KOP_MATMUL_BWD] = "matmul_bwd",
        [MAL_KOP_RMSNORM_FWD] = "rmsnorm_fwd",
        [MAL_KOP_RMSNORM_BWD] = "rmsnorm_bwd",
        [MAL_KOP_ROPE] = "rope",
        [MAL_KOP_ATTENTION_FWD] = "attention_fwd",
        [MAL_KOP_ATTENTION_BWD] = "attention_bwd",
        [MAL_KOP_SWIGLU_FWD] = "swiglu_fwd",
        [MAL_KOP_SWIGLU_BWD] = "swiglu_bwd",
        [MAL_KOP_ELEMENTWISE] = "elementwise",
        [MAL_KOP_EMBEDDING_FWD] = "embedding_fwd",
        [MAL_KOP_EMBEDDING_BWD] = "embedding_bwd",
        [MAL_KOP_XENT] = "xent",
        [MAL_KOP_SUMSQ] = "sumsq",
        [MAL_KOP_SUMSQ_MULTI] = "sumsq_multi",
        [MAL_KOP_ADAMW] = "adamw",
        [MAL_KOP_ADAMW_MULTI] = "adamw_multi",
        [MAL_KOP_CAST] = "cast_working",
    };
    return op >= 0 && op < MAL_KOP_N && names[op] ? names[op] : "?";
}
