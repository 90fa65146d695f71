/* What the snapshot benchmarks (bench_snapshot.c, bench_async.c) share:
 * the job's communicator, dying on an error (the whole job, with the
 * library's message), and removing a directory tree (rank 0, then a
 * barrier).  Each program defines BENCH_NAME before including it. */
#ifndef MAL_BENCH_UTIL_H
#define MAL_BENCH_UTIL_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "base/mal.h"
#include "comm/comm.h"
#include "src/config.h"

static mal_comm *world;

#define DIE_IF(rc)                                                                                 \
    do {                                                                                           \
        if (rc) {                                                                                  \
            fprintf(stderr, BENCH_NAME ": rank %d: %s\n", world->rank, mal_errmsg());              \
            mal_comm_abort(world, 1);                                                              \
        }                                                                                          \
    } while (0)

static int bench_rm_cb(const char *p, const struct stat *st, int fl, struct FTW *f)
{
    (void)st, (void)fl, (void)f;
    return remove(p);
}

/* Collective: rm -rf p (rank 0 does it). */
static inline void rmtree(const char *p)
{
    if (world->rank == 0) nftw(p, bench_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    DIE_IF(mal_comm_barrier(world));
}

/* Local: the model config `model` (a preset or a file), by default the
 * one next to this file (bench/snapshot/model.json, found from
 * $top_srcdir). */
static inline void load_model(mal_model_config *cfg, const char *model)
{
    char path[4096];
    if (!model) {
        const char *top = getenv("top_srcdir");
        snprintf(path, sizeof path, "%s/bench/snapshot/model.json", top ? top : ".");
        model = path;
    }
    DIE_IF(mal_config_load(cfg, model));
}

#endif /* MAL_BENCH_UTIL_H */
