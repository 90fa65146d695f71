/* What a person watching a run sees: the step line, the plan in force and
 * its changes, MFU against a known peak, memory, elapsed time and ETA (see
 * progress.h).
 *
 * MFU counts model FLOPs as bench/gpu/flops.py does (so the two agree):
 * 6 per matmul parameter per token (forward 2, backward 4: wq, wk, wv, wo,
 * w1, w3, w2 and the LM head; the embedding is a gather) plus causal
 * attention 6 x layers x seq_len x d_model per token; recomputation is not
 * model work.  The peak is one device's dense rate in the compute dtype,
 * and MFU = model FLOPs per second / (peak x ranks of the job). */
#include "progress.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/mal.h"
#include "train_internal.h"

/* Dense peak FLOP/s of devices by a part of their name, bf16 and fp32
 * (the fp32 path uses no TF32: CUBLAS_COMPUTE_32F), from the vendors'
 * datasheets.  The first match wins: the more specific names first. */
static const struct {
    const char *name;
    double bf16, fp32;
} peaks[] = {
    {"H100 PCIe", 756e12, 51e12}, {"H100 NVL", 835e12, 60e12}, {"GH200", 989e12, 67e12},
    {"H200", 989e12, 67e12},      {"H100", 989e12, 67e12},     {"A100", 312e12, 19.5e12},
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mal_progress_init(struct mal_trainer *tr)
{
    mal_progress *pg = &tr->prog;
    const mal_model_config *c = &tr->o.model;
    double C = c->d_model, F = c->ffn_hidden, V = c->vocab, L = c->n_layers, T = c->seq_len;
    double per_token = 6 * (L * (4 * C * C + 3 * C * F) + V * C) + 6 * L * T * C;
    pg->flops_per_step = per_token * T * (double)tr->o.global_batch;
    pg->predicted_s = -1;
    pg->change_cost_s = -1;
    if (tr->o.peak_tflops > 0) {
        pg->peak_flops = tr->o.peak_tflops * 1e12;
        snprintf(pg->peak_what, sizeof pg->peak_what, "%g TFLOP/s (--peak-tflops)",
                 tr->o.peak_tflops);
        return;
    }
    mal_kern_device_info di;
    if (mal_kern_query_device(tr->k, &di) != 0) {
        mal_clearerr();
        snprintf(pg->peak_what, sizeof pg->peak_what, "none: %s has no peak (--peak-tflops)",
                 tr->k->name);
        return;
    }
    int bf16 = tr->k->compute == MAL_BF16;
    for (size_t i = 0; i < MAL_ARRAY_SIZE(peaks); i++)
        if (strstr(di.name, peaks[i].name)) {
            pg->peak_flops = bf16 ? peaks[i].bf16 : peaks[i].fp32;
            snprintf(pg->peak_what, sizeof pg->peak_what, "%.0f TFLOP/s (%s %s, table)",
                     pg->peak_flops / 1e12, peaks[i].name, mal_dtype_name(tr->k->compute));
            return;
        }
    snprintf(pg->peak_what, sizeof pg->peak_what, "unknown for %.60s: no MFU (give --peak-tflops)",
             di.name);
}

/* What the last line of a metrics file says about the plan it ran. */
typedef struct {
    int found;
    int gen;
    char id[MAL_PLAN_ID_LEN];
    double time;    /* wall clock of the last step (0: not recorded) */
    double step_ms; /* median step time of the last rows on that plan */
} metrics_tail;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Read the end of the metrics file, up to MAX_TAIL bytes (a line of a job
 * with 10^5 ranks is ~15 MB), and parse its last lines. */
enum { MAX_TAIL = 64 << 20, TAIL_ROWS = 8 };
static void read_tail(const char *path, metrics_tail *t)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (!f) return;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0) {
        fclose(f);
        return;
    }
    char *buf = NULL;
    size_t want = 1 << 16, got = 0;
    /* grow the window until it holds TAIL_ROWS whole lines or the file */
    for (;;) {
        size_t n = (size_t)sb.st_size < want ? (size_t)sb.st_size : want;
        char *nb = realloc(buf, n + 1);
        if (!nb) break;
        buf = nb;
        if (fseeko(f, (off_t)(sb.st_size - (off_t)n), SEEK_SET) != 0) break;
        got = fread(buf, 1, n, f);
        buf[got] = 0;
        int lines = 0;
        for (size_t i = 0; i < got; i++)
            lines += buf[i] == '\n';
        if (lines > TAIL_ROWS || n == (size_t)sb.st_size || want >= MAX_TAIL) break;
        want *= 4;
    }
    fclose(f);
    if (!buf) return;
    /* lines from the last one backwards */
    double ms[TAIL_ROWS];
    int n_ms = 0;
    char *end = buf + got;
    while (end > buf && n_ms < TAIL_ROWS) {
        while (end > buf && (end[-1] == '\n' || end[-1] == '\r'))
            *--end = 0;
        char *start = end;
        while (start > buf && start[-1] != '\n')
            start--;
        if (start == end) break;
        json_t *row = json_loads(start, 0, NULL);
        const char *ids = row ? json_string_value(json_object_get(row, "plan_id")) : NULL;
        if (!t->found) {
            json_t *gen = row ? json_object_get(row, "plan_gen") : NULL;
            if (!json_is_integer(gen) || !ids || strlen(ids) >= MAL_PLAN_ID_LEN) {
                /* the last line names no plan (an older file, or torn by
                 * a crash): nothing to go on */
                json_decref(row);
                break;
            }
            t->found = 1;
            t->gen = (int)json_integer_value(gen);
            snprintf(t->id, sizeof t->id, "%s", ids);
            t->time = json_number_value(json_object_get(row, "time"));
        }
        int same = ids && !strcmp(ids, t->id);
        if (same && json_is_number(json_object_get(row, "step_ms")))
            ms[n_ms++] = json_number_value(json_object_get(row, "step_ms"));
        json_decref(row);
        if (!same) break; /* the plan before it */
        end = start;
    }
    free(buf);
    if (n_ms) {
        qsort(ms, (size_t)n_ms, sizeof *ms, cmp_d);
        t->step_ms = ms[n_ms / 2];
    }
}

void mal_progress_describe(const mal_plan *pl, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (n < len) {                                                                             \
            int k_ = snprintf(buf + n, len - n, __VA_ARGS__);                                      \
            n += k_ > 0 ? (size_t)k_ : 0;                                                          \
        }                                                                                          \
    } while (0)
    for (int p = 0; p < pl->n_pipelines; p++) {
        PUT("%sm=%d", p ? " | " : "", pl->pipelines[p].micro_batches);
        for (int s = 0; s < pl->pipelines[p].n_stages; s++) {
            const mal_plan_stage *st = &pl->pipelines[p].stages[s];
            PUT(" [");
            for (int r = 0; r < st->n_ranks; r++)
                PUT("%s%d", r ? "," : "", st->ranks[r]);
            PUT(":L%d-%d]", st->layer_begin, st->layer_end);
        }
    }
    if (pl->n_suspended) {
        PUT("; suspended");
        for (int i = 0; i < pl->n_suspended; i++)
            PUT(" %d", pl->suspended[i]);
    }
#undef PUT
    if (n >= len && len > 4) memcpy(buf + len - 4, "...", 4);
}

static void fmt_ms(char *buf, size_t len, double s)
{
    if (s >= 0)
        snprintf(buf, len, "%.1f ms", 1e3 * s);
    else
        snprintf(buf, len, "unknown");
}

void mal_progress_begin(struct mal_trainer *tr)
{
    mal_progress *pg = &tr->prog;
    pg->t0 = mal_now();
    pg->wall0 = wall_now();
    pg->step0 = tr->step;
    pg->plan_from = tr->step;
    pg->n_ring = 0;
    pg->settled = 0;
    pg->predicted_s = tr->plan.predicted_step_time;
    mal_plan_id(&tr->plan, pg->id);
    if (tr->world_rank != 0) return;
    char desc[256], pred[32];
    mal_progress_describe(&tr->plan, desc, sizeof desc);
    fmt_ms(pred, sizeof pred, pg->predicted_s);
    metrics_tail t = {0};
    if (tr->o.resume && tr->o.metrics_path) read_tail(tr->o.metrics_path, &t);
    if (t.found && strcmp(t.id, pg->id) != 0) {
        /* The run before this one ran another plan: it stopped for a
         * re-plan, and everything from its last step to this one's first
         * (its snapshot, the planner, the reshard, this start) is what the
         * change cost. */
        pg->gen = t.gen + 1;
        pg->change_cost_s = t.time > 0 && pg->wall0 > t.time ? pg->wall0 - t.time : -1;
        pg->change_cost_online = 0;
        char cost[64] = "not recorded";
        if (pg->change_cost_s >= 0)
            snprintf(cost, sizeof cost, "%.2f s (snapshot, re-plan, reshard, restart)",
                     pg->change_cost_s);
        mal_log(MAL_LOG_INFO,
                "plan change (restart) at step %lld: generation %d -> %d; old plan %s: measured "
                "%.1f ms/step; new plan %s: %s, predicted %s/step; the change took %s",
                (long long)tr->step, t.gen, pg->gen, t.id, t.step_ms, pg->id, desc, pred, cost);
        return;
    }
    pg->gen = t.found ? t.gen : 0;
    mal_log(MAL_LOG_INFO, "plan %s (generation %d): %s; predicted %s/step", pg->id, pg->gen, desc,
            pred);
}

void mal_progress_record(struct mal_trainer *tr, double step_s)
{
    mal_progress *pg = &tr->prog;
    pg->ring[pg->n_ring % MAL_PROGRESS_RING] = step_s;
    pg->n_ring++;
}

double mal_progress_step_time(const struct mal_trainer *tr, int n)
{
    const mal_progress *pg = &tr->prog;
    double v[MAL_PROGRESS_RING];
    int have = (int)MAL_MIN(pg->n_ring, (int64_t)MAL_PROGRESS_RING);
    if (n > have) n = have;
    if (n <= 0) return -1;
    for (int i = 0; i < n; i++)
        v[i] = pg->ring[(pg->n_ring - 1 - i) % MAL_PROGRESS_RING];
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mal_progress_memory(struct mal_trainer *tr)
{
    mal_kern_device_info di;
    if (tr->k && tr->k->ops->device_info && mal_kern_query_device(tr->k, &di) == 0)
        return di.used_bytes;
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE);
}

double mal_progress_memory_peak(const struct mal_trainer *tr)
{
    mal_kern_mem_stats ms;
    mal_kern_mem_get(tr->k, &ms);
    return (double)ms.total_peak;
}

int mal_progress_memory_summary(struct mal_trainer *tr)
{
    mal_kern_mem_stats ms;
    mal_kern_mem_get(tr->k, &ms);
    double mine[MAL_MEM_N + 1];
    for (int c = 0; c < MAL_MEM_N; c++)
        mine[c] = (double)ms.at_peak[c];
    mine[MAL_MEM_N] = (double)ms.total_peak;
    double *all = NULL;
    if (tr->world_rank == 0 && !(all = malloc(sizeof mine * (size_t)tr->world_size)))
        return MAL_ERR(MAL_ENOMEM, "out of memory");
    int rc = tr->world ? mal_comm_gather(tr->world, mine, all, sizeof mine, 0) : 0;
    if (!tr->world && all) memcpy(all, mine, sizeof mine);
    if (rc || tr->world_rank != 0 || mal_log_level < MAL_LOG_INFO) {
        free(all);
        return rc;
    }
    const double MiB = 1048576.0;
    mal_log(MAL_LOG_INFO, "memory peak per rank (the kernel table's buffers, MiB):");
    for (int r = 0; r < tr->world_size; r++) {
        const double *v = all + (size_t)r * (MAL_MEM_N + 1);
        char line[512];
        int n = snprintf(line, sizeof line, "  rank %d: %.2f =", r, v[MAL_MEM_N] / MiB);
        int any = 0;
        for (int c = 0; c < MAL_MEM_N && n < (int)sizeof line; c++)
            if (v[c] > 0) {
                n += snprintf(line + n, sizeof line - (size_t)n, "%s %s %.2f", any ? " +" : "",
                              mal_mem_cat_name(c), v[c] / MiB);
                any = 1;
            }
        mal_log(MAL_LOG_INFO, "%s%s", line, any ? "" : " (suspended)");
    }
    free(all);
    return 0;
}

static double max_memory(const struct mal_trainer *tr, const mal_step_stats *st, int *rank)
{
    double m = 0;
    *rank = 0;
    for (int r = 0; st->ranks && r < tr->world_size; r++)
        if (st->ranks[r].mem_bytes > m) {
            m = st->ranks[r].mem_bytes;
            *rank = r;
        }
    return m;
}

static double mfu(const struct mal_trainer *tr, const mal_step_stats *st)
{
    const mal_progress *pg = &tr->prog;
    if (!(pg->peak_flops > 0) || !(st->step_s > 0)) return -1;
    return pg->flops_per_step / st->step_s / (pg->peak_flops * tr->world_size);
}

static void fmt_hms(char *buf, size_t len, double s)
{
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    snprintf(buf, len, "%ld:%02d:%02d", t / 3600, (int)(t / 60 % 60), (int)(t % 60));
}

void mal_progress_step(struct mal_trainer *tr, const mal_step_stats *st)
{
    mal_progress *pg = &tr->prog;
    const mal_train_options *o = &tr->o;
    /* the new plan's measured line, once it has settled */
    if (!pg->settled && tr->step - pg->plan_from >= MAL_PROGRESS_SETTLE) {
        pg->settled = 1;
        char pred[32], ratio[48] = "";
        fmt_ms(pred, sizeof pred, pg->predicted_s);
        /* the first step on a plan pays for warm-up: left out */
        double m = mal_progress_step_time(tr, MAL_PROGRESS_SETTLE - 1);
        if (pg->predicted_s > 0)
            snprintf(ratio, sizeof ratio, " (measured/predicted %.2f)", m / pg->predicted_s);
        mal_log(
            MAL_LOG_INFO,
            "plan %s (generation %d): measured %.1f ms/step over steps %lld-%lld, predicted %s%s",
            pg->id, pg->gen, 1e3 * m, (long long)(pg->plan_from + 2), (long long)tr->step, pred,
            ratio);
    }
    if (!(o->log_every > 0 &&
          (st->step % o->log_every == 0 || st->step == o->steps || st->has_val)))
        return;
    const int width = snprintf(NULL, 0, "%lld", (long long)o->steps);
    char val[32] = "", eff[32] = "", mem[48] = "", slow[64] = "", eta[128];
    if (st->has_val) snprintf(val, sizeof val, " | val %.4f", st->val_loss);
    double u = mfu(tr, st);
    if (u >= 0) snprintf(eff, sizeof eff, " | MFU %4.1f%%", 100 * u);
    int mr;
    double m = max_memory(tr, st, &mr);
    if (tr->world_size > 1) {
        snprintf(mem, sizeof mem, " | mem %.2f GiB (rank %d)", m / 1073741824.0, mr);
        snprintf(slow, sizeof slow, " | slowest rank %d (%.1f ms compute)", st->slowest_rank,
                 1e3 * st->ranks[st->slowest_rank].compute_s);
    } else {
        snprintf(mem, sizeof mem, " | mem %.2f GiB", m / 1073741824.0);
    }
    /* ETA from the recent steps: the plan in force and the rates now */
    double recent = mal_progress_step_time(tr, 8);
    char el[48], left[48];
    fmt_hms(el, sizeof el, mal_now() - pg->t0);
    fmt_hms(left, sizeof left, recent > 0 ? recent * (double)(o->steps - st->step) : 0);
    snprintf(eta, sizeof eta, " | %s elapsed, ETA %s", el, left);
    mal_log(MAL_LOG_INFO,
            "step %*lld/%lld | loss %.4f%s | lr %.2e | norm %6.3f | %8.0f tok/s | %8.1f ms%s%s%s%s",
            width, (long long)st->step, (long long)o->steps, st->loss, val, (double)st->lr,
            st->grad_norm, st->tokens_per_s, 1e3 * st->step_s, eff, mem, slow, eta);
}

void mal_progress_metrics(const struct mal_trainer *tr, FILE *f, const mal_step_stats *st)
{
    const mal_progress *pg = &tr->prog;
    int mr;
    fprintf(f, ", \"time\": %.3f, \"plan_gen\": %d, \"plan_id\": \"%s\", \"mem_mb\": %.1f",
            wall_now(), pg->gen, pg->id, max_memory(tr, st, &mr) / 1048576.0);
    double u = mfu(tr, st);
    if (u >= 0) fprintf(f, ", \"mfu\": %.4f", u);
}

void mal_progress_plan_changed(struct mal_trainer *tr, double predicted_s, double cost_s,
                               int online)
{
    mal_progress *pg = &tr->prog;
    pg->gen++;
    mal_plan_id(&tr->plan, pg->id);
    pg->predicted_s = predicted_s;
    pg->plan_from = tr->step;
    pg->n_ring = 0;
    pg->settled = 0;
    if (cost_s >= 0) {
        pg->change_cost_s = cost_s;
        pg->change_cost_online = online;
    }
    if (tr->world_rank != 0 || !tr->o.snapshot_dir) return;
    /* Every plan the run takes is kept next to its snapshots, as the
     * restart loop keeps plan.G.json next to snap.G: a snapshot written
     * from now on is this plan's, and malleus-reshard or a resume with
     * --plan needs the file. */
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/plan.%d.json", tr->o.snapshot_dir, pg->gen);
    if (n < 0 || n >= (int)sizeof path) return;
    if (mkdir(tr->o.snapshot_dir, 0777) != 0 && errno != EEXIST) {
        mal_log(MAL_LOG_WARN, "cannot create %s for the new plan file: %s", tr->o.snapshot_dir,
                strerror(errno));
        return;
    }
    if (mal_plan_write(&tr->plan, path) != 0)
        mal_log(MAL_LOG_WARN, "the new plan was not written: %s", mal_errmsg());
    else
        mal_log(MAL_LOG_INFO, "plan %s written to %s", pg->id, path);
}
