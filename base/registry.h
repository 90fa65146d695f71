/* Backends by name: the part of a backend registry that does not depend on
 * what the backends are.  The kernel registry (kernels/registry.c) and the
 * comm registry (comm/registry.c) each keep their own list of this build's
 * backends, one line per backend guarded by the configure macro that
 * builds it (IOR's available_aiori[]), and wrap the functions below in
 * typed ones (mal_kern_lookup, mal_comm_lookup, ...); this file finds a
 * name in such a list, says what is wrong with a name it cannot use,
 * lists the names for --help and picks a default.
 *
 * A backend's table starts with a mal_registry_entry (its name and its
 * probe), so that the list is one of pointers to those entries and a
 * registry turns an entry back into its table with a cast (a pointer to a
 * structure, converted, points to its first member and back).
 *
 * Base layer: no dependency on anything but mal.h. */
#ifndef MAL_REGISTRY_H
#define MAL_REGISTRY_H

#include <stddef.h>

/* What the registry needs of one backend: the first member of its table. */
typedef struct {
    const char *name; /* "cpu", "mpi": what --device / --comm take */
    /* 0 when the backend can be used on this machine, else MAL_E* with the
     * reason recorded (no GPU, no driver; MAL_EINVAL for a bad setting) */
    int (*probe)(void);
} mal_registry_entry;

/* A backend some build has, and what a build needs to have it: the message
 * for a name this build lacks says so instead of "unknown". */
typedef struct {
    const char *name;
    const char *needs; /* "a build with the CUDA backend (configure --with-cuda, ...)" */
} mal_registry_known;

/* One registry.  Static data of the registry that owns it. */
typedef struct {
    const char *noun; /* what its messages call a backend: "device", "comm backend" */
    /* this build's backends, NULL-terminated, in the order the default is
     * chosen */
    const mal_registry_entry *const *entries;
    const mal_registry_known *known; /* backends some build has */
    size_t n_known;
} mal_registry;

/* Local.  The entry called `name`, or NULL; no probe, no message. */
const mal_registry_entry *mal_registry_find(const mal_registry *r, const char *name);

/* Local.  *out = the entry called `name` and 0 when its probe succeeds, or
 * *out = NULL and, with a message that lists this build's names:
 * MAL_EINVAL for a name no build knows, MAL_ENOTSUP for one of r->known
 * this build lacks, the probe's MAL_EINVAL (a bad setting) or else
 * MAL_EDEVICE for one that cannot be used here. */
int mal_registry_lookup(const mal_registry *r, const char *name, const mal_registry_entry **out);

/* Local.  The first entry in list order that `accept` takes (NULL: every
 * entry) and whose probe succeeds, or NULL.  `arg` is passed to accept.  A
 * failed probe leaves its message recorded. */
const mal_registry_entry *
mal_registry_first(const mal_registry *r,
                   int (*accept)(const mal_registry_entry *e, const void *arg), const void *arg);

/* Local.  This build's names in list order, `sep` between them, into buf
 * (cut to len bytes, always terminated when len > 0). */
void mal_registry_names(const mal_registry *r, char *buf, size_t len, const char *sep);

#endif /* MAL_REGISTRY_H */
