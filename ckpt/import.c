/* Import of a Hugging Face checkpoint as a weights-only snapshot: the
 * checkpoint read through hf.h, the blocks of the plan's ranks streamed
 * into the snapshot writer a bounded slab at a time (import.h). */
#include "import.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/mal.h"
#include "reshard.h"
#include "snapshot.h"
#include "src/layout.h"
#include "src/model.h"

/* One shard of the destination: the param blocks of one rank. */
typedef struct {
    int rank, handle, n;
    mal_snap_tensor *b;
    char (*names)[96];
} im_shard;

static void shards_free(im_shard *s, int n)
{
    for (int i = 0; s && i < n; i++) {
        free(s[i].b);
        free(s[i].names);
    }
    free(s);
}

/* The param blocks every rank of `plan` writes (mal_reshard_rank_blocks:
 * a run on that plan writes the same), for the ranks that write any. */
static int layout(const mal_plan *plan, const mal_model_config *cfg, im_shard **out, int *n_out)
{
    int W = mal_plan_world_size(plan), n = 0, rc = 0;
    im_shard *s = calloc((size_t)W + 1, sizeof *s);
    if (!s) return MAL_ERR(MAL_ENOMEM, "import: out of memory");
    for (int r = 0; r < W && !rc; r++) {
        mal_tensor_info *lt = NULL;
        mal_owned_block *ob = NULL;
        int nlt = 0, nob = 0;
        if ((rc = mal_reshard_rank_blocks(plan, cfg, r, &lt, &nlt, &ob, &nob)) || nob == 0) {
            free(lt);
            free(ob);
            continue;
        }
        im_shard *x = &s[n++];
        x->rank = r;
        x->b = calloc((size_t)nob, sizeof *x->b);
        x->names = calloc((size_t)nob, sizeof *x->names);
        if (!x->b || !x->names) rc = MAL_ERR(MAL_ENOMEM, "import: out of memory");
        for (int i = 0; !rc && i < nob; i++) {
            const mal_tensor_info *t = &lt[ob[i].tensor];
            mal_snap_tensor *b = &x->b[x->n++];
            snprintf(x->names[i], sizeof x->names[i], "param/%s", t->name);
            b->name = x->names[i];
            b->ndim = t->ndim;
            for (int d = 0; d < t->ndim; d++) {
                b->shape[d] = t->shape[d];
                b->offset[d] = d == t->axis ? ob[i].begin : 0;
                b->extent[d] = d == t->axis ? ob[i].end - ob[i].begin : t->shape[d];
            }
        }
        free(lt);
        free(ob);
    }
    if (rc) {
        shards_free(s, n);
        return rc;
    }
    *out = s;
    *n_out = n;
    return 0;
}

static int hf_read(void *ctx, const mal_snap_tensor *want)
{
    return mal_hf_read_block(ctx, want);
}

/* The destination must be empty of snapshots: an import is step 0 of a
 * new line of snapshots, and a newer one beside it would be what a reader
 * of the directory takes. */
static int check_empty(const char *dir)
{
    mal_snap_scan sc;
    int rc = mal_snapshot_scan(dir, -1, &sc);
    if (rc == MAL_ENOENT) return 0;
    if (rc) return rc;
    if (sc.n_marked > 0 || sc.n_steps > 0)
        return MAL_ERR(MAL_EINVAL,
                       "%s holds snapshots already (%d step director%s%s): import into a new or "
                       "empty directory",
                       dir, sc.n_steps, sc.n_steps == 1 ? "y" : "ies",
                       sc.newest >= 0 ? ", the newest committed one of another run" : "");
    return 0;
}

/* OUT_SNAPSHOT must not be HF_DIR itself: step directories beside its
 * config.json would make --init-from take the directory for the
 * checkpoint, not for the import. */
static int check_not_source(const char *src, const char *dst)
{
    struct stat a, b;
    if (stat(dst, &a) == 0 && stat(src, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return MAL_ERR(MAL_EINVAL,
                       "OUT_SNAPSHOT %s is the checkpoint's own directory: import into a new or "
                       "empty directory",
                       dst);
    return 0;
}

int mal_import_hf(const mal_import_options *o, mal_import_stats *st)
{
    double t0 = mal_now();
    mal_hf *h = NULL;
    mal_snap_dest *dest = NULL;
    mal_snap_writer *w = NULL;
    im_shard *sh = NULL;
    mal_tensor_info *full = NULL;
    int n_sh = 0, n_full = 0, rc;
    float *buf = NULL;
    char *identity = NULL, *plan_text = NULL;
    json_t *tj = NULL;
    mal_snap_meta meta = {0};
    mal_plan one;
    mal_plan_init(&one);

    /* Everything that can refuse the import, before anything is written. */
    if ((rc = mal_hf_open(&h, o->src, &o->hf)) || (rc = check_not_source(o->src, o->dst_dir)))
        goto out;
    const mal_model_config *cfg = mal_hf_config(h);
    const mal_plan *plan = o->plan;
    if (!plan) {
        if ((rc = mal_plan_uniform(1, 1, 1, cfg->n_layers, 1, 1, &one))) goto out;
        plan = &one;
    }
    int gb = mal_plan_global_batch(plan);
    if ((rc = mal_plan_validate(plan, mal_plan_world_size(plan), cfg->n_layers, cfg->n_heads,
                                cfg->ffn_hidden, gb > 0 ? gb : 1))) {
        char why[1024];
        snprintf(why, sizeof why, "%s", mal_errmsg());
        rc = MAL_ERR(rc, "the plan does not fit the model (%d layers, %d heads, FFN %d): %s",
                     cfg->n_layers, cfg->n_heads, cfg->ffn_hidden, why);
        goto out;
    }
    mal_model_part whole = mal_model_part_full(cfg);
    if ((rc = mal_model_layout(cfg, &whole, &full, &n_full, NULL)) ||
        (rc = layout(plan, cfg, &sh, &n_sh)) || (rc = mal_hf_identity(h, &identity)) ||
        (rc = mal_plan_to_string(plan, &plan_text)))
        goto out;
    /* the settings say what the snapshot is and where it came from */
    json_error_t jerr;
    json_t *id = json_loads(identity, 0, &jerr);
    tj = json_pack("{s:b, s:o?}", "weights_only", 1, "imported_from", id);
    meta.config_json = mal_config_to_json(cfg);
    meta.train_json = tj ? json_dumps(tj, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    meta.plan_json = plan_text;
    size_t cap =
        (o->mem_bytes ? o->mem_bytes : (size_t)MAL_IMPORT_MEM_DEFAULT_MIB << 20) / sizeof(float);
    buf = malloc(MAL_MAX(cap, 1) * sizeof(float));
    if (!id || !meta.config_json || !meta.train_json || !buf) {
        rc = MAL_ERR(MAL_ENOMEM, "import: out of memory (a %zu-byte buffer: lower --mem)",
                     cap * sizeof(float));
        goto out;
    }
    /* the destination held (locked, probed) and empty of snapshots */
    if ((rc = mal_snap_dest_open(&dest, o->dst_dir, "malleus-import")) ||
        (rc = check_empty(o->dst_dir)))
        goto out;

    if ((rc = mal_snap_writer_begin(&w, NULL, o->dst_dir, &meta))) goto out;
    int lrc = 0;
    for (int i = 0; i < n_sh && !lrc; i++)
        if ((sh[i].handle = mal_snap_writer_add_shard(w, sh[i].rank, sh[i].b, sh[i].n)) < 0)
            lrc = sh[i].handle;
    /* Tensor by tensor (the checkpoint's files are read in order), each
     * destination block of it streamed a slab at a time. */
    uint64_t written = 0;
    for (int k = 0; !lrc && k < n_full; k++) {
        char name[96];
        snprintf(name, sizeof name, "param/%s", full[k].name);
        for (int i = 0; i < n_sh && !lrc; i++)
            for (int j = 0; j < sh[i].n && !lrc; j++) {
                const mal_snap_tensor *b = &sh[i].b[j];
                if (strcmp(b->name, name)) continue;
                lrc = mal_reshard_stream_block(w, sh[i].handle, j, b, hf_read, h, buf,
                                               MAL_MAX(cap, 1));
                int64_t c = 1;
                for (int d = 0; d < b->ndim; d++)
                    c *= b->extent[d];
                written += (uint64_t)c * sizeof(float);
            }
    }
    char out_path[4096] = "";
    if ((rc = mal_snap_writer_finish(w, lrc, 0, out_path, sizeof out_path))) goto out;
    if (st) {
        memset(st, 0, sizeof *st);
        st->n_tensors = n_full;
        st->n_shards = n_sh;
        st->bytes_read = mal_hf_bytes_read(h);
        st->bytes_written = written;
        st->seconds = mal_now() - t0;
        snprintf(st->dtype, sizeof st->dtype, "%s", mal_hf_dtype(h));
        snprintf(st->unknown, sizeof st->unknown, "%s", mal_hf_unknown_fields(h));
        st->cfg = *cfg;
        snprintf(st->out_path, sizeof st->out_path, "%s", out_path);
    }
out:
    /* an import that committed nothing leaves no directory it created */
    mal_snap_dest_close(dest, rc != 0);
    shards_free(sh, n_sh);
    free(full);
    free(buf);
    free(identity);
    free(plan_text);
    free(meta.config_json);
    free(meta.train_json);
    json_decref(tj);
    mal_plan_fini(&one);
    mal_hf_close(h);
    return rc;
}

int mal_import_cli_run(const mal_import_cli *cli)
{
    mal_plan plan;
    mal_plan_init(&plan);
    int rc = 0;
    if (cli->plan_path && (rc = mal_plan_read(&plan, cli->plan_path))) {
        fprintf(stderr, "malleus-import: %s\n", mal_errmsg());
        return 2;
    }
    /* the plan must not be a file the snapshot in OUT would replace */
    if (cli->plan_path && mal_snapshot_dir_owns(cli->dst_dir, cli->plan_path)) {
        fprintf(stderr,
                "malleus-import: --plan %s is an entry of %s, which the snapshot would "
                "replace: keep the plan outside OUT_SNAPSHOT\n",
                cli->plan_path, cli->dst_dir);
        mal_plan_fini(&plan);
        return 2;
    }
    mal_import_options o = {.src = cli->src,
                            .dst_dir = cli->dst_dir,
                            .plan = cli->plan_path ? &plan : NULL,
                            .hf = {.seq_len = cli->seq_len, .round = cli->round},
                            .mem_bytes = cli->mem_bytes};
    mal_import_stats st;
    rc = mal_import_hf(&o, &st);
    mal_plan_fini(&plan);
    if (rc) {
        fprintf(stderr, "malleus-import: %s\n", mal_errmsg());
        return mal_exit_status(rc);
    }
    if (cli->quiet) return 0;
    if (st.unknown[0])
        printf("malleus-import: config.json fields not read (they do not change a "
               "LlamaForCausalLM): %s\n",
               st.unknown);
    const mal_model_config *c = &st.cfg;
    printf("malleus-import: %s (%s): vocab %d, d_model %d, %d layers, %d heads, %d key/value "
           "heads, FFN %d, seq_len %d, rope_theta %g%s%s: %d tensors into %d shard file%s, "
           "%.2f MiB read, %.2f MiB written in %.2f s -> %s (weights only: start a run from it "
           "with malleus-train --init-from)\n",
           cli->src, st.dtype, c->vocab, c->d_model, c->n_layers, c->n_heads, c->n_kv_heads,
           c->ffn_hidden, c->seq_len, (double)c->rope.theta,
           c->rope.llama3 ? ", llama3 scaling" : "", c->tie_embeddings ? ", tied embeddings" : "",
           st.n_tensors, st.n_shards, st.n_shards == 1 ? "" : "s",
           (double)st.bytes_read / 1048576.0, (double)st.bytes_written / 1048576.0, st.seconds,
           st.out_path);
    return 0;
}
