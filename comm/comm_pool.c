/* Communicators kept for reuse across plan changes (comm_pool.h). */
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "comm_pool.h"

typedef struct {
    int purpose, n;
    int *ranks;
    mal_comm *comm;
} entry;

struct mal_comm_pool {
    mal_comm *parent;
    entry *e;
    int n, cap;
    int created, reused;
};

int mal_comm_pool_create(mal_comm_pool **out, mal_comm *parent)
{
    *out = NULL;
    if (!parent) return MAL_ERR(MAL_EINVAL, "comm pool: no parent communicator");
    mal_comm_pool *p = calloc(1, sizeof *p);
    if (!p) return MAL_ERR(MAL_ENOMEM, "comm pool: out of memory");
    p->parent = parent;
    *out = p;
    return 0;
}

void mal_comm_pool_destroy(mal_comm_pool *p)
{
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        mal_comm_destroy(p->e[i].comm);
        free(p->e[i].ranks);
    }
    free(p->e);
    free(p);
}

int mal_comm_pool_get(mal_comm_pool *p, int purpose, const int *ranks, int n, mal_comm **out)
{
    *out = NULL;
    for (int i = 0; i < p->n; i++)
        if (p->e[i].purpose == purpose && p->e[i].n == n &&
            !memcmp(p->e[i].ranks, ranks, sizeof *ranks * (size_t)n)) {
            p->reused++;
            *out = p->e[i].comm;
            return 0;
        }
    if (mal_grow(&p->e, &p->cap, p->n, sizeof *p->e, 16))
        return MAL_ERR(MAL_ENOMEM, "comm pool: out of memory");
    entry *e = &p->e[p->n];
    e->purpose = purpose;
    e->n = n;
    if (!(e->ranks = malloc(sizeof *ranks * (size_t)(n > 0 ? n : 1))))
        return MAL_ERR(MAL_ENOMEM, "comm pool: out of memory");
    if (n > 0) memcpy(e->ranks, ranks, sizeof *ranks * (size_t)n);
    int rc = mal_comm_create_group(p->parent, ranks, n, &e->comm);
    if (rc) {
        free(e->ranks);
        return rc;
    }
    p->n++;
    p->created++;
    *out = e->comm;
    return 0;
}

void mal_comm_pool_counts(const mal_comm_pool *p, int *created, int *reused)
{
    if (created) *created = p ? p->created : 0;
    if (reused) *reused = p ? p->reused : 0;
}
