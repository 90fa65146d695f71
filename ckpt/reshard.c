/* Offline resharding of a snapshot onto another plan (see reshard.h).
 *
 * Every process computes the same picture without talking: the blocks
 * every destination rank writes under the new plan, the
 * destination shard files with their sizes, and which process writes which
 * shard files (largest first, each to the least-loaded process).  Then
 * every process opens the source, writes its shard files tensor by tensor,
 * and the snapshot writer commits the result collectively. */
#include "reshard.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/mal.h"
#include "snapshot.h"
#include "src/config.h"
#include "src/layout.h"
#include "src/model.h"

static const char *const groups[] = {"param", "adam_m", "adam_v"};
enum { N_GROUPS = 3 };

size_t mal_reshard_min_block_bytes = (size_t)1 << 20;

int mal_reshard_rank_blocks(const mal_plan *plan, const mal_model_config *cfg, int rank,
                            mal_tensor_info **tensors, int *n_tensors, mal_owned_block **blocks,
                            int *n_blocks)
{
    mal_model_part part;
    int active, rc, cap = 0;
    *tensors = NULL;
    *n_tensors = 0;
    *blocks = NULL;
    *n_blocks = 0;
    if ((rc = mal_layout_part(plan, cfg, rank, &part, &active))) return rc;
    if (!active) return 0;
    if ((rc = mal_model_layout(cfg, &part, tensors, n_tensors, NULL))) return rc;
    int n_act = mal_plan_n_active(plan) + 1;
    mal_slice_holding *h = malloc(sizeof *h * (size_t)n_act);
    int *writers = malloc(sizeof *writers * (size_t)n_act);
    mal_slice_map map = {0};
    if (!h || !writers) {
        rc = MAL_ERR(MAL_ENOMEM, "snapshot layout: out of memory");
        goto fail;
    }
    for (int ti = 0; ti < *n_tensors; ti++) {
        const mal_tensor_info *t = &(*tensors)[ti];
        int nh = mal_layout_holdings(plan, cfg, t, h);
        int64_t other = t->ndim == 2 ? t->shape[1 - t->axis] : 1;
        if ((rc = mal_slices_partition(h, nh, t->shape[t->axis], &map))) goto fail;
        for (int pi = 0; pi < map.n_pieces; pi++) {
            const mal_slice_piece *pc = &map.pieces[pi];
            /* one writer per replica: the first holder of each pipeline
             * (holders come sorted by pipeline, then rank) */
            int k = 0;
            for (int j = 0; j < pc->n_holders; j++) {
                const mal_slice_holding *x = &h[map.holders[pc->first + j]];
                if (k == 0 || h[writers[k - 1]].group != x->group)
                    writers[k++] = map.holders[pc->first + j];
            }
            int64_t len = pc->end - pc->begin;
            int64_t min_rows = (int64_t)(mal_reshard_min_block_bytes / sizeof(float)) / other;
            int64_t parts = MAL_MIN((int64_t)k, MAL_MAX(1, len / MAL_MAX(1, min_rows)));
            for (int64_t i = 0; i < parts; i++) {
                if (h[writers[i]].rank != rank) continue;
                if (mal_grow(blocks, &cap, *n_blocks, sizeof **blocks, 32)) {
                    rc = MAL_ERR(MAL_ENOMEM, "snapshot layout: out of memory");
                    goto fail;
                }
                (*blocks)[(*n_blocks)++] = (mal_owned_block){ti, pc->begin + len * i / parts,
                                                             pc->begin + len * (i + 1) / parts};
            }
        }
        mal_slices_fini(&map);
    }
    /* adjacent blocks of one tensor become one */
    int k = 0;
    for (int i = 0; i < *n_blocks; i++) {
        mal_owned_block *b = *blocks;
        if (k > 0 && b[k - 1].tensor == b[i].tensor && b[k - 1].end == b[i].begin)
            b[k - 1].end = b[i].end;
        else
            b[k++] = b[i];
    }
    *n_blocks = k;
    free(h);
    free(writers);
    return 0;
fail:
    mal_slices_fini(&map);
    free(h);
    free(writers);
    free(*tensors);
    free(*blocks);
    *tensors = NULL;
    *blocks = NULL;
    *n_tensors = *n_blocks = 0;
    return rc;
}

/* One destination block: tensor (index into the full model's table),
 * group, and the block. */
typedef struct {
    int tensor, group;
    int handle, index; /* writer shard handle and block index within it */
    mal_snap_tensor b;
} rs_block;

/* A destination shard file: the blocks of one rank of the new plan. */
typedef struct {
    int rank;
    uint64_t bytes;
    int n;
    rs_block *b;
    int proc; /* process that writes it */
} rs_shard;

typedef struct {
    mal_model_config cfg;
    mal_tensor_info *full; /* the whole model's tensor table */
    int n_full;
    int n_groups;      /* N_GROUPS, or 1 for a weights-only snapshot (an import) */
    char (*names)[96]; /* [n_groups * n_full] "group/name" */
    rs_shard *sh;
    int n_sh;
} rs_plan;

static void rs_plan_fini(rs_plan *p)
{
    for (int i = 0; i < p->n_sh; i++)
        free(p->sh[i].b);
    free(p->sh);
    free(p->full);
    free(p->names);
    memset(p, 0, sizeof *p);
}

static int rs_find_full(const rs_plan *p, const char *name)
{
    for (int i = 0; i < p->n_full; i++)
        if (!strcmp(p->full[i].name, name)) return i;
    return -1;
}

/* Destination shards and their blocks under `plan`. */
static int rs_layout(rs_plan *p, const mal_plan *plan)
{
    int W = mal_plan_world_size(plan), rc = 0;
    p->sh = calloc((size_t)W + 1, sizeof *p->sh);
    if (!p->sh) return MAL_ERR(MAL_ENOMEM, "reshard: out of memory");
    for (int r = 0; r < W; r++) {
        mal_tensor_info *lt = NULL;
        mal_owned_block *ob = NULL;
        int nlt = 0, nob = 0;
        if ((rc = mal_reshard_rank_blocks(plan, &p->cfg, r, &lt, &nlt, &ob, &nob))) return rc;
        if (nob > 0) {
            rs_shard *s = &p->sh[p->n_sh];
            s->rank = r;
            s->b = calloc((size_t)p->n_groups * (size_t)nob, sizeof *s->b);
            if (!s->b) rc = MAL_ERR(MAL_ENOMEM, "reshard: out of memory");
            for (int g = 0; !rc && g < p->n_groups; g++)
                for (int i = 0; !rc && i < nob; i++) {
                    const mal_tensor_info *t = &lt[ob[i].tensor];
                    int f = rs_find_full(p, t->name);
                    if (f < 0) {
                        rc = MAL_ERR(MAL_EINVAL, "reshard: tensor %s is not in the model", t->name);
                        break;
                    }
                    rs_block *x = &s->b[s->n++];
                    x->tensor = f;
                    x->group = g;
                    x->b.name = p->names[g * p->n_full + f];
                    x->b.ndim = t->ndim;
                    int64_t c = 1;
                    for (int d = 0; d < t->ndim; d++) {
                        x->b.shape[d] = t->shape[d];
                        x->b.offset[d] = d == t->axis ? ob[i].begin : 0;
                        x->b.extent[d] = d == t->axis ? ob[i].end - ob[i].begin : t->shape[d];
                        c *= x->b.extent[d];
                    }
                    s->bytes += (uint64_t)c * sizeof(float);
                }
            p->n_sh++;
        }
        free(lt);
        free(ob);
        if (rc) return rc;
    }
    return 0;
}

static int rs_cmp_bytes_desc(const void *a, const void *b)
{
    const rs_shard *x = *(rs_shard *const *)a, *y = *(rs_shard *const *)b;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Largest shard first, each to the least-loaded process (lowest index on
 * ties): the same answer on every process. */
static int rs_assign(rs_plan *p, int n_procs)
{
    rs_shard **order = malloc(sizeof *order * ((size_t)p->n_sh + 1));
    uint64_t *load = calloc((size_t)n_procs, sizeof *load);
    if (!order || !load) {
        free(order);
        free(load);
        return MAL_ERR(MAL_ENOMEM, "reshard: out of memory");
    }
    for (int i = 0; i < p->n_sh; i++)
        order[i] = &p->sh[i];
    qsort(order, (size_t)p->n_sh, sizeof *order, rs_cmp_bytes_desc);
    for (int i = 0; i < p->n_sh; i++) {
        int best = 0;
        for (int q = 1; q < n_procs; q++)
            if (load[q] < load[best]) best = q;
        order[i]->proc = best;
        load[best] += order[i]->bytes;
    }
    free(order);
    free(load);
    return 0;
}

/* The snapshot holds exactly the model's state tensors, with their shapes. */
static int rs_check_tensors(const rs_plan *p, mal_snapshot *s, const char *src)
{
    int n = mal_snapshot_n_tensors(s);
    for (int g = 0; g < p->n_groups; g++)
        for (int f = 0; f < p->n_full; f++) {
            const char *want = p->names[g * p->n_full + f];
            const mal_tensor_info *t = &p->full[f];
            int found = 0;
            for (int i = 0; i < n && !found; i++) {
                mal_snap_tensor info;
                mal_snapshot_tensor_info(s, i, &info);
                if (strcmp(info.name, want)) continue;
                found = 1;
                int same = info.ndim == t->ndim;
                for (int d = 0; same && d < t->ndim; d++)
                    same = info.shape[d] == t->shape[d];
                if (!same)
                    return MAL_ERR(MAL_EMISMATCH,
                                   "snapshot %s: tensor '%s' does not have the shape its model "
                                   "config gives it; the snapshot is inconsistent",
                                   src, want);
            }
            if (!found)
                return MAL_ERR(MAL_EMISMATCH,
                               "snapshot %s lacks tensor '%s' of its own model: not a complete "
                               "training state",
                               src, want);
        }
    if (n != p->n_groups * p->n_full)
        return MAL_ERR(MAL_EMISMATCH,
                       "snapshot %s holds %d tensors; its model's state has %d: it holds state "
                       "malleus-reshard does not know how to move",
                       src, n, p->n_groups * p->n_full);
    return 0;
}

/* `path` as an absolute path without symbolic links, "." or "..", whether
 * or not it exists yet: the longest prefix that exists, resolved by
 * realpath, then the rest of the components applied by hand, as mkdir -p
 * would create them. */
static int rs_resolve(const char *path, char *out, size_t len)
{
    char pre[PATH_MAX], res[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof pre)
        return MAL_ERR(MAL_EINVAL, "path '%s' is empty or too long", path);
    memcpy(pre, path, n + 1);
    const char *rest = "";
    /* strip components from the end until what is left exists */
    for (;;) {
        if (realpath(pre[0] ? pre : ".", res)) break;
        char *slash = strrchr(pre, '/');
        if (!slash) {
            rest = path;
            pre[0] = '\0';
        } else if (slash == pre) {
            rest = path + 1;
            pre[1] = '\0';
        } else {
            *slash = '\0';
            rest = path + (slash - pre) + 1;
            continue;
        }
        if (!realpath(pre[0] ? pre : ".", res))
            return MAL_ERR(MAL_EIO, "cannot resolve %s: %s", pre[0] ? pre : ".", strerror(errno));
        break;
    }
    size_t k = strlen(res);
    while (*rest) {
        const char *e = strchr(rest, '/');
        size_t c = e ? (size_t)(e - rest) : strlen(rest);
        if (c == 2 && rest[0] == '.' && rest[1] == '.') {
            while (k > 1 && res[k - 1] != '/')
                k--;
            if (k > 1) k--; /* the slash, except the root's */
            res[k] = '\0';
        } else if (c > 0 && !(c == 1 && rest[0] == '.')) {
            if (k + 1 + c >= sizeof res) return MAL_ERR(MAL_EINVAL, "path %s is too long", path);
            if (k > 1) res[k++] = '/';
            memcpy(res + k, rest, c);
            k += c;
            res[k] = '\0';
        }
        rest += c + (e ? 1 : 0);
    }
    if (k >= len) return MAL_ERR(MAL_EINVAL, "path %s is too long", path);
    memcpy(out, res, k + 1);
    return 0;
}

/* The `n` bytes at `name` are "step_" and digits: a snapshot's step
 * directory (snapshot.h). */
static int rs_is_step_name(const char *name, size_t n)
{
    if (n <= 5 || strncmp(name, "step_", 5)) return 0;
    for (size_t i = 5; i < n; i++)
        if (name[i] < '0' || name[i] > '9') return 0;
    return 1;
}

/* `b` is `a` or lies below it (both resolved). */
static int rs_inside(const char *a, const char *b)
{
    size_t la = strlen(a);
    if (la == 1) return 1; /* "/" */
    return !strncmp(a, b, la) && (b[la] == '/' || b[la] == '\0');
}

int mal_reshard_check_dest(const char *step_dir, const char *dst)
{
    char src[PATH_MAX], tree[PATH_MAX], d[PATH_MAX];
    int rc;
    if (!realpath(step_dir, src))
        return MAL_ERR(MAL_ENOENT, "cannot resolve the snapshot %s: %s", step_dir, strerror(errno));
    if ((rc = rs_resolve(dst, d, sizeof d))) return rc;
    /* The source tree: a step directory's parent is the snapshot directory
     * whose `latest` and retention govern it. */
    snprintf(tree, sizeof tree, "%s", src);
    char *slash = strrchr(tree, '/');
    if (slash && slash != tree && rs_is_step_name(slash + 1, strlen(slash + 1))) *slash = '\0';
    if (rs_inside(tree, d))
        return MAL_ERR(MAL_EINVAL,
                       "the destination %s (%s) is inside the source snapshot %s: "
                       "malleus-reshard never writes into its source; give a directory "
                       "outside %s",
                       dst, d, tree, tree);
    /* DEST above the source: writing there creates step_* and `latest`,
     * removes .tmp-* debris and uncommitted step_* directories, and
     * retention removes old step_* ones; the source must be in none. */
    if (rs_inside(d, src)) {
        const char *rel = src + strlen(d) + (strlen(d) > 1 ? 1 : 0);
        size_t c = strcspn(rel, "/");
        int risky = rs_is_step_name(rel, c) || !strncmp(rel, ".tmp-", 5) ||
                    (c == 6 && !strncmp(rel, "latest", 6));
        if (risky)
            return MAL_ERR(MAL_EINVAL,
                           "the source snapshot %s lies in %s/%.*s, which writing a snapshot into "
                           "%s would remove or replace: malleus-reshard never writes into its "
                           "source; give another directory",
                           src, d, (int)c, rel, dst);
    }
    return 0;
}

static void rs_human(char *out, size_t len, double bytes)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    while (bytes >= 1024 && k < 4)
        bytes /= 1024, k++;
    snprintf(out, len, "%.*f %s", k ? 2 : 0, bytes, u[k]);
}

void mal_reshard_summary(const mal_reshard_stats *st, char *out, size_t len)
{
    char r[32], wr[32], rate[32];
    rs_human(r, sizeof r, (double)st->bytes_read);
    rs_human(wr, sizeof wr, (double)st->bytes_written);
    rs_human(rate, sizeof rate, st->seconds > 0 ? (double)st->bytes_written / st->seconds : 0);
    snprintf(out, len,
             "step %lld: %d tensors into %d shard files, %s read, %s written in %.2f s (%s/s, %d "
             "process%s) -> %s",
             (long long)st->step, st->n_tensors, st->n_shards, r, wr, st->seconds, rate,
             st->n_procs, st->n_procs == 1 ? "" : "es", st->out_path);
}

typedef struct {
    FILE *f;
    double t0, last;
    uint64_t total, done;
    int n_tensors;
} rs_progress;

static void rs_progress_draw(rs_progress *pr, int tensors_done, int final)
{
    if (!pr->f) return;
    double now = mal_now();
    if (!final && now - pr->last < 0.25) return;
    pr->last = now;
    double el = now - pr->t0, rate = el > 0 ? (double)pr->done / el : 0;
    char d[32], t[32], r[32], eta[32] = "--:--";
    rs_human(d, sizeof d, (double)pr->done);
    rs_human(t, sizeof t, (double)pr->total);
    rs_human(r, sizeof r, rate);
    if (rate > 0) {
        long s = (long)((double)(pr->total - pr->done) / rate + 0.5);
        snprintf(eta, sizeof eta, "%ld:%02ld", s / 60, s % 60);
    }
    fprintf(pr->f, "\rreshard: tensor %d/%d | %s / %s | %s/s | %s left   %s", tensors_done,
            pr->n_tensors, d, t, r, eta, final ? "\n" : "");
    fflush(pr->f);
}

int mal_reshard_stream_block(mal_snap_writer *w, int h, int index, const mal_snap_tensor *b,
                             mal_snap_read_fn read, void *ctx, float *buf, size_t cap)
{
    int64_t row = 1;
    for (int d = 1; d < b->ndim; d++)
        row *= b->extent[d];
    mal_snap_tensor part = *b;
    part.data = buf;
    int rc;
    if ((size_t)row <= cap || b->ndim != 2) {
        int64_t rows = MAL_MAX(1, (int64_t)(cap / (size_t)row));
        for (int64_t r0 = 0; r0 < b->extent[0]; r0 += rows) {
            part.offset[0] = b->offset[0] + r0;
            part.extent[0] = MAL_MIN(rows, b->extent[0] - r0);
            if ((rc = read(ctx, &part)) ||
                (rc = mal_snap_writer_put(w, h, index, buf, (size_t)(part.extent[0] * row))))
                return rc;
        }
        return 0;
    }
    part.extent[0] = 1;
    for (int64_t r = 0; r < b->extent[0]; r++)
        for (int64_t c0 = 0; c0 < b->extent[1]; c0 += (int64_t)cap) {
            part.offset[0] = b->offset[0] + r;
            part.offset[1] = b->offset[1] + c0;
            part.extent[1] = MAL_MIN((int64_t)cap, b->extent[1] - c0);
            if ((rc = read(ctx, &part)) ||
                (rc = mal_snap_writer_put(w, h, index, buf, (size_t)part.extent[1])))
                return rc;
        }
    return 0;
}

/* Put block x from `box` (a block of the same tensor containing it, its
 * data in box->data): one contiguous run per index of the leading
 * dimensions, in the block's row-major order. */
static int rs_put_from_box(mal_snap_writer *w, const rs_block *x, const mal_snap_tensor *box)
{
    const mal_snap_tensor *b = &x->b;
    const int nd = b->ndim;
    int64_t idx[MAL_SNAP_MAXDIM] = {0};
    const int64_t run = b->extent[nd - 1];
    for (;;) {
        int64_t pos = 0;
        for (int d = 0; d < nd; d++)
            pos =
                pos * box->extent[d] + (b->offset[d] + (d < nd - 1 ? idx[d] : 0) - box->offset[d]);
        int rc = mal_snap_writer_put(w, x->handle, x->index, box->data + pos, (size_t)run);
        if (rc) return rc;
        int d = nd - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < b->extent[d]) break;
            idx[d] = 0;
        }
        if (d < 0) return 0;
    }
}

static int rs_cmp_work(const void *a, const void *b)
{
    const rs_block *x = *(rs_block *const *)a, *y = *(rs_block *const *)b;
    if (x->group != y->group) return x->group - y->group;
    if (x->tensor != y->tensor) return x->tensor - y->tensor;
    return (x->handle > y->handle) - (x->handle < y->handle);
}

/* This process's share: declare its shards, then stream tensor by tensor. */
static int rs_write_mine(rs_plan *p, mal_snapshot *src, mal_snap_writer *w, int me,
                         const mal_reshard_options *o, uint64_t *written)
{
    int rc = 0, n_work = 0;
    rs_block **work = NULL;
    mal_snap_tensor *decl = NULL;
    size_t cap = (o->mem_bytes ? o->mem_bytes : MAL_RESHARD_MEM_DEFAULT) / sizeof(float);
    float *buf = NULL;
    rs_progress pr = {me == 0 ? o->progress : NULL, mal_now(), 0, 0, 0, p->n_groups * p->n_full};
    int total_blocks = 0;
    for (int i = 0; i < p->n_sh; i++)
        if (p->sh[i].proc == me) {
            total_blocks += p->sh[i].n;
            pr.total += p->sh[i].bytes;
        }
    work = malloc(sizeof *work * ((size_t)total_blocks + 1));
    buf = malloc(MAL_MAX(cap, 1) * sizeof(float));
    if (!work || !buf) {
        rc = MAL_ERR(MAL_ENOMEM, "reshard: cannot allocate the %zu-byte buffer (lower --mem)",
                     cap * sizeof(float));
        goto out;
    }
    for (int i = 0; i < p->n_sh && !rc; i++) {
        rs_shard *s = &p->sh[i];
        if (s->proc != me) continue;
        decl = realloc(decl, sizeof *decl * ((size_t)s->n + 1));
        if (!decl) {
            rc = MAL_ERR(MAL_ENOMEM, "reshard: out of memory");
            goto out;
        }
        for (int k = 0; k < s->n; k++)
            decl[k] = s->b[k].b;
        int h = mal_snap_writer_add_shard(w, s->rank, decl, s->n);
        if (h < 0) {
            rc = h;
            goto out;
        }
        for (int k = 0; k < s->n; k++) {
            s->b[k].handle = h;
            s->b[k].index = k;
            work[n_work++] = &s->b[k];
        }
    }
    /* Tensor by tensor.  When the bounding box of this process's blocks
     * of a tensor fits the buffer, it is read once and every block is put
     * from it run by run (each source block is then read, and its checksum
     * verified, once); otherwise block by block, in slabs. */
    qsort(work, (size_t)n_work, sizeof *work, rs_cmp_work);
    int k = 0;
    for (int g = 0; g < p->n_groups; g++)
        for (int f = 0; f < p->n_full; f++) {
            int e = k;
            while (e < n_work && work[e]->group == g && work[e]->tensor == f)
                e++;
            if (e > k) {
                mal_snap_tensor box = work[k]->b;
                for (int i = k + 1; i < e; i++)
                    for (int d = 0; d < box.ndim; d++) {
                        const mal_snap_tensor *b = &work[i]->b;
                        int64_t lo = MAL_MIN(box.offset[d], b->offset[d]);
                        int64_t hi =
                            MAL_MAX(box.offset[d] + box.extent[d], b->offset[d] + b->extent[d]);
                        box.offset[d] = lo;
                        box.extent[d] = hi - lo;
                    }
                int64_t vol = 1;
                for (int d = 0; d < box.ndim; d++)
                    vol *= box.extent[d];
                if ((size_t)vol <= MAL_MAX(cap, 1)) {
                    box.data = buf;
                    if ((rc = mal_snapshot_read_block(src, &box))) goto out;
                    for (int i = k; i < e; i++)
                        if ((rc = rs_put_from_box(w, work[i], &box))) goto out;
                } else {
                    for (int i = k; i < e; i++)
                        if ((rc = mal_reshard_stream_block(w, work[i]->handle, work[i]->index,
                                                           &work[i]->b, mal_snapshot_read_fn, src,
                                                           buf, MAL_MAX(cap, 1))))
                            goto out;
                }
                for (int i = k; i < e; i++) {
                    int64_t c = 1;
                    for (int d = 0; d < work[i]->b.ndim; d++)
                        c *= work[i]->b.extent[d];
                    pr.done += (uint64_t)c * sizeof(float);
                }
            }
            k = e;
            rs_progress_draw(&pr, g * p->n_full + f + 1, 0);
        }
    rs_progress_draw(&pr, p->n_groups * p->n_full, 1);
out:
    *written = pr.done;
    free(work);
    free(decl);
    free(buf);
    return rc;
}

int mal_reshard(mal_comm *comm, const mal_reshard_options *o, mal_reshard_stats *st)
{
    if (!o || !o->src || !o->dst_dir || !o->plan)
        return MAL_ERR(MAL_EINVAL, "mal_reshard: src, dst_dir and plan are required");
    const int me = comm ? comm->rank : 0, n_procs = comm ? comm->size : 1;
    double t0 = mal_now();
    rs_plan p;
    memset(&p, 0, sizeof p);
    mal_snapshot *src = NULL;
    mal_snap_writer *w = NULL;
    char step_dir[4096], *plan_text = NULL;
    json_t *tj = NULL;
    int rc;

    /* Everything that can refuse the job, before writing anything. */
    if ((rc = mal_snapshot_resolve(o->src, step_dir, sizeof step_dir)) ||
        (rc = mal_snapshot_open(&src, step_dir)))
        goto agreed;
    const mal_snap_meta *meta = mal_snapshot_meta(src);
    if (!meta->config_json) {
        rc =
            MAL_ERR(MAL_EFORMAT, "snapshot %s stores no model config: cannot reshard it", step_dir);
        goto agreed;
    }
    if ((rc = mal_config_from_json(&p.cfg, meta->config_json, step_dir))) goto agreed;
    /* A weights-only snapshot (an import, import.h) moves its parameters
     * alone, and has no run whose batch the plan must keep: any plan's
     * own batch fits it. */
    p.n_groups = mal_snapshot_has_group(src, "adam_m") ? N_GROUPS : 1;
    json_error_t jerr;
    tj = meta->train_json ? json_loads(meta->train_json, 0, &jerr) : NULL;
    json_t *gbj = tj ? json_object_get(tj, "global_batch") : NULL;
    int gb = mal_plan_global_batch(o->plan);
    if (p.n_groups == N_GROUPS || gbj) {
        if (!json_is_integer(gbj)) {
            rc = MAL_ERR(MAL_EFORMAT, "snapshot %s stores no global batch in its training settings",
                         step_dir);
            goto agreed;
        }
        /* outside input: a batch past int is out of range, not wrapped */
        if (json_integer_value(gbj) < 1 || json_integer_value(gbj) > INT_MAX) {
            rc = MAL_ERR(MAL_EFORMAT,
                         "snapshot %s: global batch %lld in its training settings is out of "
                         "range (1..%d)",
                         step_dir, (long long)json_integer_value(gbj), INT_MAX);
            goto agreed;
        }
        gb = (int)json_integer_value(gbj);
    }
    if ((rc = mal_plan_validate(o->plan, mal_plan_world_size(o->plan), p.cfg.n_layers,
                                p.cfg.n_heads, p.cfg.ffn_hidden, gb))) {
        char why[1024];
        snprintf(why, sizeof why, "%s", mal_errmsg());
        rc = MAL_ERR(rc,
                     "the new plan does not fit the snapshot's model (%d layers, %d heads, FFN "
                     "%d, global batch %d): %s",
                     p.cfg.n_layers, p.cfg.n_heads, p.cfg.ffn_hidden, gb, why);
        goto agreed;
    }
    if ((rc = mal_reshard_check_dest(step_dir, o->dst_dir))) goto agreed;
    mal_model_part full = mal_model_part_full(&p.cfg);
    if ((rc = mal_model_layout(&p.cfg, &full, &p.full, &p.n_full, NULL))) goto agreed;
    p.names = calloc((size_t)p.n_groups * (size_t)p.n_full, sizeof *p.names);
    if (!p.names) {
        rc = MAL_ERR(MAL_ENOMEM, "reshard: out of memory");
        goto agreed;
    }
    for (int g = 0; g < p.n_groups; g++)
        for (int f = 0; f < p.n_full; f++)
            snprintf(p.names[g * p.n_full + f], sizeof p.names[0], "%s/%s", groups[g],
                     p.full[f].name);
    if ((rc = rs_check_tensors(&p, src, step_dir)) || (rc = rs_layout(&p, o->plan)) ||
        (rc = rs_assign(&p, n_procs)) || (rc = mal_plan_to_string(o->plan, &plan_text)))
        goto agreed;
agreed:
    if ((rc = mal_snapshot_agree(comm, rc))) goto out;

    mal_snap_meta nm = *mal_snapshot_meta(src);
    nm.plan_json = plan_text;
    if ((rc = mal_snap_writer_begin(&w, comm, o->dst_dir, &nm))) goto out;
    uint64_t written = 0;
    int lrc = rs_write_mine(&p, src, w, me, o, &written);
    char out_path[4096];
    if ((rc = mal_snap_writer_finish(w, lrc, o->keep_last, out_path, sizeof out_path))) goto out;
    if (st) {
        double sums[2] = {(double)mal_snapshot_bytes_read(src), (double)written};
        double el[1] = {mal_now() - t0};
        if (comm && ((rc = mal_comm_allreduce_f64(comm, sums, 2)) ||
                     (rc = mal_comm_allreduce_max_f64(comm, el, 1))))
            goto out;
        memset(st, 0, sizeof *st);
        st->step = nm.step;
        st->n_tensors = p.n_groups * p.n_full;
        st->n_shards = p.n_sh;
        st->n_procs = n_procs;
        st->bytes_read = (uint64_t)sums[0];
        st->bytes_written = (uint64_t)sums[1];
        st->seconds = el[0];
        snprintf(st->out_path, sizeof st->out_path, "%s", out_path);
    }
out:
    json_decref(tj);
    free(plan_text);
    mal_snapshot_close(src);
    rs_plan_fini(&p);
    return rc;
}
