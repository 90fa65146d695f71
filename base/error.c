/* Error codes, per-thread error messages, logging and small utilities. */
#include "mal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int mal_log_level = MAL_LOG_INFO;

static _Thread_local char errbuf[1024];

const char *mal_strerror(int err)
{
    switch (err) {
    case MAL_OK: return "success";
    case MAL_EINVAL: return "invalid argument";
    case MAL_ENOMEM: return "out of memory";
    case MAL_EIO: return "I/O error";
    case MAL_EFORMAT: return "malformed input";
    case MAL_ENOENT: return "not found";
    case MAL_ECORRUPT: return "corrupt or incomplete data";
    case MAL_EMPI: return "MPI error";
    case MAL_ELP: return "lp_solve error";
    case MAL_EDEVICE: return "device error";
    case MAL_ENOTSUP: return "not supported by this build";
    case MAL_EMISMATCH: return "mismatch";
    default: return "unknown error";
    }
}

int mal_exit_status(int err)
{
    switch (err) {
    case MAL_OK: return 0;
    case MAL_EINVAL:
    case MAL_EFORMAT:
    case MAL_ENOENT:
    case MAL_ECORRUPT:
    case MAL_EMISMATCH:
    case MAL_ENOTSUP: return 2;
    default: return 1;
    }
}

int mal_seterr_at(const char *file, int line, int err, const char *fmt, ...)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(errbuf, sizeof errbuf, "%s:%d: ", base, line);
    if (n < 0 || (size_t)n >= sizeof errbuf) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf + n, sizeof errbuf - (size_t)n, fmt, ap);
    va_end(ap);
    return err;
}

const char *mal_errmsg(void) { return errbuf; }

void mal_clearerr(void) { errbuf[0] = '\0'; }

void mal_log_at(int level, const char *fmt, ...)
{
    static const char *tag[] = {"error", "warning", "info", "debug"};
    FILE *f = level <= MAL_LOG_WARN ? stderr : stdout;
    /* one write for the whole line: stderr is unbuffered, and a line
     * written in pieces is cut when a launcher ends the job right after an
     * error (seen with MPI_Abort), or mixed with another rank's */
    char line[4096];
    int n = level <= MAL_LOG_WARN ? snprintf(line, sizeof line, "malleus: %s: ", tag[level]) : 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    fprintf(f, "%s\n", line);
    fflush(f);
}

int mal_grow(void *array_ptr, int *cap, int n, size_t elem_size, int first)
{
    if (n < *cap) return 0;
    int ncap = *cap ? 2 * *cap : first;
    if (ncap <= n) ncap = n + 1;
    void *old, *grown;
    memcpy(&old, array_ptr, sizeof old); /* any T **, without aliasing it as void ** */
    if (!(grown = realloc(old, elem_size * (size_t)ncap))) return -1;
    memcpy(array_ptr, &grown, sizeof grown);
    *cap = ncap;
    return 0;
}

double mal_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The limit in `file` under the cgroup mount `root` for group `group`, or
 * at the mount's root when the group is not visible there (a container's
 * own namespace).  0 when there is none ("max", or v1's huge "unlimited"). */
static size_t cgroup_limit(const char *root, const char *group, const char *file)
{
    char path[700];
    unsigned long long lim = 0;
    for (int i = 0; i < 2 && !lim; i++) {
        snprintf(path, sizeof path, "%s%s/%s", root, i ? "" : group, file);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fscanf(f, "%llu", &lim) != 1) lim = 0;
        fclose(f);
    }
    return lim > 0 && lim < (1ull << 60) ? (size_t)lim : 0;
}

size_t mal_phys_memory_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t mem = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    /* The memory limit of this process's control group, v2 ("0::/path")
     * or v1 ("N:memory:/path"). */
    char line[512];
    FILE *f = fopen("/proc/self/cgroup", "r");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        size_t lim = 0;
        if (!strncmp(line, "0::", 3))
            lim = cgroup_limit("/sys/fs/cgroup", line + 3, "memory.max");
        else if (strstr(line, ":memory:"))
            lim = cgroup_limit("/sys/fs/cgroup/memory", strstr(line, ":memory:") + 8,
                               "memory.limit_in_bytes");
        if (lim && (mem == 0 || lim < mem)) mem = lim;
    }
    if (f) fclose(f);
    /* MALLEUS_MEMORY_MB caps it: a node shared with other jobs, and tests
     * that need a machine of a known size. */
    const char *cap = getenv("MALLEUS_MEMORY_MB");
    char *end;
    unsigned long long mb = cap ? strtoull(cap, &end, 10) : 0;
    if (cap && *end == '\0' && mb > 0 && mb < (1ull << 40) && (mem == 0 || (mb << 20) < mem))
        mem = (size_t)(mb << 20);
    return mem;
}
