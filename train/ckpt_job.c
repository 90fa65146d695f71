/* One snapshot as its writer sees it (trainer layer; the snapshot files
 * are ckpt/'s): what is saved - parameters, both Adam moments, progress,
 * the model config, the training settings and the plan - described and
 * copied out of the trainer (mal_ckpt_job_prepare), then written and
 * committed (mal_ckpt_job_write) either by the synchronous save (ckpt.c),
 * packing one block at a time, or by the background writer (ckpt_async.c)
 * from its staged host copy: the same blocks in the same order, so the
 * same files.  State bytes leave the device only through the kernel
 * table: each block is packed straight from the state buffer into a
 * pinned host buffer (a tensor piece, piece.h).
 *
 * Saving is collective over the world: every rank writes its blocks of
 * the state into its own shard file.  Each element has exactly one writer
 * (the pieces a rank owns, layout.h, shared out among the data-parallel
 * replicas that hold them: mal_reshard_rank_blocks), so the snapshot holds
 * the state once, not once per replica, and replicas share the writing;
 * suspended ranks write nothing but take part in the commit.  With the
 * sharded optimizer (--zero 1) the Adam moments' blocks are the ones each
 * rank keeps (mal_gradsync_zero_blocks: its regions as rectangles), the
 * parameters' as above -- or, with the master sharded too (--zero-master),
 * the master shard's blocks likewise. */
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "ckpt/reshard.h"
#include "ckpt/snapshot.h"
#include "src/data.h"
#include "src/layout.h"
#include "src/piece.h"
#include "train_internal.h"

/* The snapshot tensor groups of the model: parameters and both Adam
 * moments (mal_model_state_name gives their names). */
enum { N_GROUPS = MAL_STATE_N_SAVED };

/* The block of tensor t covering [begin, end) along its axis. */
static void axis_block(const mal_tensor_info *t, int64_t begin, int64_t end, mal_snap_tensor *b)
{
    b->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) {
        b->shape[d] = t->shape[d];
        b->offset[d] = d == t->axis ? begin : 0;
        b->extent[d] = d == t->axis ? end - begin : t->shape[d];
    }
}

/* The blocks this rank writes (reshard.h: owned pieces, shared out among
 * replicas), against the model's own tensor table. */
static int owned_blocks(const struct mal_trainer *tr, mal_owned_block **out, int *n_out)
{
    const mal_model *m = tr->part.model;
    mal_tensor_info *lt = NULL;
    int nlt = 0;
    int rc = mal_reshard_rank_blocks(&tr->plan, &m->cfg, tr->world_rank, &lt, &nlt, out, n_out);
    if (rc) return rc;
    if (nlt != m->n_tensors) {
        rc = MAL_ERR(MAL_EMISMATCH, "snapshot: the layout lists %d tensors, the model part %d", nlt,
                     m->n_tensors);
    } else {
        for (int i = 0; i < nlt && !rc; i++)
            if (strcmp(lt[i].name, m->tensors[i].name) != 0)
                rc = MAL_ERR(MAL_EMISMATCH, "snapshot: layout tensor %d is '%s', the model's '%s'",
                             i, lt[i].name, m->tensors[i].name);
    }
    free(lt);
    if (rc) {
        free(*out);
        *out = NULL;
        *n_out = 0;
    }
    return rc;
}

int mal_ckpt_staging_floats(const mal_plan *plan, const mal_model_config *cfg, int rank,
                            size_t *floats)
{
    mal_tensor_info *lt = NULL;
    mal_owned_block *ob = NULL;
    int nlt = 0, nob = 0;
    *floats = 0;
    int rc = mal_reshard_rank_blocks(plan, cfg, rank, &lt, &nlt, &ob, &nob);
    for (int i = 0; !rc && i < nob; i++)
        *floats += N_GROUPS * mal_piece_floats(&lt[ob[i].tensor], ob[i].begin, ob[i].end);
    free(lt);
    free(ob);
    return rc;
}

/* The blocks of all groups, their names and where each lies when staged
 * back to back.  Sharded (--zero 1), the moments' blocks are the sharded
 * optimizer's own (each rank's regions: every element once, by the rank
 * that keeps it), after the parameters' owned blocks. */
static int describe_blocks(const struct mal_trainer *tr, mal_ckpt_job *job)
{
    const mal_model *m = tr->part.model;
    int rc, nob;
    if ((rc = owned_blocks(tr, &job->owned, &job->n_owned))) return rc;
    nob = job->n_owned;
    job->n_state_groups = N_GROUPS;
    if (tr->o.zero) {
        job->n_state_groups = 1;
        if ((rc = mal_gradsync_zero_blocks(tr->part.gsync, 0, &job->zb, &job->n_zb))) return rc;
    }
    /* the master sharded too (--zero-master): its blocks are the shard's */
    if (mal_gradsync_zero_master_sharded(tr->part.gsync)) job->n_state_groups = 0;
    int n = job->n_state_groups * nob + (N_GROUPS - job->n_state_groups) * job->n_zb;
    if (n == 0) return 0;
    job->blocks = calloc((size_t)n, sizeof *job->blocks);
    job->names = calloc((size_t)n, sizeof *job->names);
    job->offset = calloc((size_t)n, sizeof *job->offset);
    if (!job->blocks || !job->names || !job->offset)
        return MAL_ERR(MAL_ENOMEM, "snapshot: out of memory");
    for (int k = 0; k < n; k++) {
        int g, zi = -1;
        const mal_tensor_info *t;
        size_t f;
        if (k < job->n_state_groups * nob) {
            const mal_owned_block *o = &job->owned[k % nob];
            g = k / nob;
            t = &m->tensors[o->tensor];
            axis_block(t, o->begin, o->end, &job->blocks[k]);
            f = mal_piece_floats(t, o->begin, o->end);
        } else {
            int j = k - job->n_state_groups * nob;
            const mal_zero_block *z = &job->zb[zi = j % job->n_zb];
            g = job->n_state_groups + j / job->n_zb;
            t = &m->tensors[z->tensor];
            job->blocks[k].ndim = t->ndim;
            for (int d = 0; d < t->ndim; d++) {
                job->blocks[k].shape[d] = t->shape[d];
                job->blocks[k].offset[d] = z->offset[d];
                job->blocks[k].extent[d] = z->extent[d];
            }
            f = z->n;
        }
        snprintf(job->names[k], sizeof job->names[k], "%s/%s", mal_model_state_name(g), t->name);
        job->blocks[k].name = job->names[k];
        job->offset[k] = job->floats;
        job->floats += f;
        job->max_block = MAL_MAX(job->max_block, f);
    }
    job->n_blocks = n;
    return 0;
}

void mal_ckpt_job_pack(const mal_ckpt_job *job, const struct mal_trainer *tr, int k, float *dst)
{
    mal_model *m = tr->part.model;
    int nob = job->n_owned;
    if (k < job->n_state_groups * nob) {
        const mal_owned_block *o = &job->owned[k % nob];
        mal_piece_pack(m->k, &m->tensors[o->tensor], mal_model_state(m, k / nob), o->begin,
                       o->end, dst, MAL_COPY_D2H);
        return;
    }
    int j = k - job->n_state_groups * nob;
    const mal_zero_block *z = &job->zb[j % job->n_zb];
    mal_gradsync_zero_to_host(tr->part.gsync, job->n_state_groups + j / job->n_zb, z->at, z->n,
                              dst);
}

void mal_ckpt_job_prepare(const struct mal_trainer *tr, const char *dir, mal_ckpt_job *job)
{
    memset(job, 0, sizeof *job);
    job->keep = tr->o.keep_snapshots;
    job->shard = tr->world_rank;
    job->meta = (mal_snap_meta){.step = tr->step,
                                .consumed_samples = tr->step * (int64_t)tr->o.global_batch,
                                .seed = tr->o.seed,
                                .config_json = mal_config_to_json(&tr->o.model),
                                .train_json = mal_train_settings_json(tr)};
    int rc = mal_plan_to_string(&tr->plan, &job->meta.plan_json);
    if (!rc && (!(job->dir = strdup(dir)) || !job->meta.config_json || !job->meta.train_json))
        rc = MAL_ERR(MAL_ENOMEM, "snapshot: out of memory");
    if (!rc && tr->part.model) rc = describe_blocks(tr, job);
    if (rc) {
        job->local_rc = rc;
        snprintf(job->local_msg, sizeof job->local_msg, "%s", mal_errmsg());
    }
}

void mal_ckpt_job_fini(mal_ckpt_job *job)
{
    free(job->dir);
    free(job->meta.config_json);
    free(job->meta.train_json);
    free(job->meta.plan_json);
    free(job->owned);
    free(job->zb);
    free(job->blocks);
    free(job->names);
    free(job->offset);
    memset(job, 0, sizeof *job);
}

/* Declare this rank's shard and put every block, from the staging area or
 * packed one at a time from the state (memory: one block, pinned). */
static int write_blocks(const mal_ckpt_job *job, mal_snap_writer *w,
                        const struct mal_trainer *tr, const float *staged)
{
    mal_model *m = tr ? tr->part.model : NULL;
    float *pack = NULL;
    int rc = 0;
    if (job->n_blocks == 0) return 0;
    if (!staged && !(pack = mal_kern_host_alloc(m->k, job->max_block * sizeof(float))))
        return MAL_ERR(MAL_ENOMEM, "snapshot: no pinned host memory for a block of %zu floats",
                       job->max_block);
    int h = mal_snap_writer_add_shard(w, job->shard, job->blocks, job->n_blocks);
    if (h < 0) rc = h;
    for (int k = 0; k < job->n_blocks && !rc; k++) {
        const float *data = staged ? staged + job->offset[k] : pack;
        size_t n = (k + 1 < job->n_blocks ? job->offset[k + 1] : job->floats) - job->offset[k];
        if (!staged) {
            mal_ckpt_job_pack(job, tr, k, pack);
            if ((rc = mal_kern_sync(m->k))) break;
        }
        rc = mal_snap_writer_put(w, h, k, data, n);
    }
    if (pack) mal_kern_host_free(m->k, pack);
    return rc;
}

/* Test hook: MALLEUS_TEST_SNAPSHOT_FAIL=RANK:STEP:N makes the N-th writer
 * I/O step of that rank's write of the snapshot of STEP fail with EIO
 * (mal_snapshot_fault_nth_io, armed on the thread that writes), so the
 * tests see a failure in the middle of a write - synchronous or in the
 * background - reach every rank and end the run. */
static void arm_fault_hook(int rank, int64_t step)
{
    const char *e = getenv("MALLEUS_TEST_SNAPSHOT_FAIL");
    int r, n;
    long long s;
    if (e && sscanf(e, "%d:%lld:%d", &r, &s, &n) == 3 && r == rank && s == step && n > 0)
        mal_snapshot_fault_nth_io = n;
}

int mal_ckpt_job_write(const mal_ckpt_job *job, mal_comm *comm, const struct mal_trainer *tr,
                       const float *staged, char *out_path, size_t out_len)
{
    mal_snap_writer *w = NULL;
    arm_fault_hook(job->shard, job->meta.step);
    int rc = mal_snap_writer_begin(&w, comm, job->dir, &job->meta);
    if (rc) return rc;
    /* A failure found while preparing is reported by finish on every
     * rank; its message is re-recorded here, on the writing thread. */
    int lrc = job->local_rc ? MAL_ERR(job->local_rc, "%s", job->local_msg)
                            : write_blocks(job, w, tr, staged);
    rc = mal_snap_writer_finish(w, lrc, job->keep, out_path, out_len);
    mal_snapshot_fault_nth_io = 0; /* a hook that did not fire stays off */
    return rc;
}
