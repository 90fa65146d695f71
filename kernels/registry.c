/* The kernel backends of this build by name (kernels.h), IOR-style: one
 * table entry per backend, each guarded by the configure macro that
 * builds it, in the order the default is chosen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "kernels.h"

extern const mal_kern_backend mal_kern_backend_cpu;
extern const mal_kern_backend mal_kern_backend_cpu_opaque;
#ifdef HAVE_CUDA
extern const mal_kern_backend mal_kern_backend_cuda;
#endif

const mal_kern_backend *const mal_kern_backends[] = {
    /* A GPU backend goes first, so that it is the default where its probe
     * finds a device. */
#ifdef HAVE_CUDA
    &mal_kern_backend_cuda,
#endif
    &mal_kern_backend_cpu,
    &mal_kern_backend_cpu_opaque,
    NULL,
};

/* Backends some build has, for the message when this one lacks them. */
static const struct {
    const char *name, *needs;
} known[] = {
    {"cuda", "a build with the CUDA backend (configure --with-cuda, on a checkout that has "
             "kernels/cuda)"},
};

const char *mal_dtype_name(mal_dtype t)
{
    return t == MAL_BF16 ? "bf16" : "fp32";
}

mal_kern_config mal_kern_config_default(void)
{
    mal_kern_config c = {MAL_F32, 0, -1};
    return c;
}

void mal_kern_names(char *buf, size_t len, const char *sep)
{
    size_t n = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; mal_kern_backends[i] && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? sep : "", mal_kern_backends[i]->name);
}

int mal_kern_lookup(const char *name, const mal_kern_backend **out)
{
    char names[256];
    *out = NULL;
    mal_kern_names(names, sizeof names, ", ");
    for (int i = 0; mal_kern_backends[i]; i++)
        if (!strcmp(mal_kern_backends[i]->name, name)) {
            int rc = mal_kern_backends[i]->probe();
            if (rc) {
                /* the probe's reason, copied: MAL_ERR writes the buffer
                 * mal_errmsg() points at */
                char why[512];
                snprintf(why, sizeof why, "%s", mal_errmsg());
                return MAL_ERR(MAL_EDEVICE, "device '%s' cannot be used on this machine: %s", name,
                               why);
            }
            *out = mal_kern_backends[i];
            return 0;
        }
    for (size_t i = 0; i < MAL_ARRAY_SIZE(known); i++)
        if (!strcmp(known[i].name, name))
            return MAL_ERR(MAL_ENOTSUP,
                           "device '%s' is not compiled into this build (it needs %s); this build "
                           "has: %s",
                           name, known[i].needs, names);
    return MAL_ERR(MAL_EINVAL, "unknown device '%s': this build has %s", name, names);
}

const char *mal_kern_default_name(void)
{
    const char *env = getenv("MALLEUS_DEVICE");
    if (env && *env) return env;
    for (int i = 0; mal_kern_backends[i]; i++)
        if (mal_kern_backends[i]->is_default && mal_kern_backends[i]->probe() == 0)
            return mal_kern_backends[i]->name;
    return "cpu";
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
    return b->create(&c, out);
}

void mal_kern_destroy(mal_kern k)
{
    if (!k) return;
    for (int i = 0; mal_kern_backends[i]; i++)
        if (!strcmp(mal_kern_backends[i]->name, k->name)) {
            mal_kern_backends[i]->destroy(k);
            return;
        }
}
