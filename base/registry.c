/* Backends by name, whatever the backends are (registry.h). */
#include "registry.h"

#include <stdio.h>
#include <string.h>

#include "mal.h"

const mal_registry_entry *mal_registry_find(const mal_registry *r, const char *name)
{
    for (int i = 0; r->entries[i]; i++)
        if (!strcmp(r->entries[i]->name, name)) return r->entries[i];
    return NULL;
}

int mal_registry_lookup(const mal_registry *r, const char *name, const mal_registry_entry **out)
{
    char names[256];
    *out = NULL;
    mal_registry_names(r, names, sizeof names, ", ");
    const mal_registry_entry *e = mal_registry_find(r, name);
    if (e) {
        int rc = e->probe();
        if (rc) {
            /* the probe's reason, copied: MAL_ERR writes the buffer
             * mal_errmsg() points at */
            char why[512];
            snprintf(why, sizeof why, "%s", mal_errmsg());
            /* a bad setting is the user's to fix (MAL_EINVAL); anything
             * else means no device here */
            return MAL_ERR(rc == MAL_EINVAL ? MAL_EINVAL : MAL_EDEVICE,
                           "%s '%s' cannot be used on this machine: %s", r->noun, name, why);
        }
        *out = e;
        return 0;
    }
    for (size_t i = 0; i < r->n_known; i++)
        if (!strcmp(r->known[i].name, name))
            return MAL_ERR(MAL_ENOTSUP,
                           "%s '%s' is not compiled into this build (it needs %s); this build "
                           "has: %s",
                           r->noun, name, r->known[i].needs, names);
    return MAL_ERR(MAL_EINVAL, "unknown %s '%s': this build has %s", r->noun, name, names);
}

const mal_registry_entry *
mal_registry_first(const mal_registry *r,
                   int (*accept)(const mal_registry_entry *e, const void *arg), const void *arg)
{
    for (int i = 0; r->entries[i]; i++)
        if ((!accept || accept(r->entries[i], arg)) && r->entries[i]->probe() == 0)
            return r->entries[i];
    return NULL;
}

void mal_registry_names(const mal_registry *r, char *buf, size_t len, const char *sep)
{
    size_t n = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; r->entries[i] && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? sep : "", r->entries[i]->name);
}
