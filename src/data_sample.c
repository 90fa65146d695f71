/* Sampling the windows of a data set: a pure function of (seed, step,
 * position in the global batch) and the files, never of a cursor, so any
 * plan, restart or reshard reads the same sequences (data.h states the
 * contract).  Two modes:
 *
 *   random  each window starts at a counter-based random offset (with
 *           replacement): the built-in corpus's mode, bit for bit as it
 *           always was;
 *   epochs  the default for token files: the windows of each component
 *           are read without replacement, in a new order every epoch, the
 *           order a keyed permutation computed for any index in O(1) (a
 *           Feistel network with cycle walking), so no rank holds a table
 *           of the windows however many there are; a blend interleaves its
 *           components in a fixed pattern of MAL_DATA_BLEND_SLOTS slots in
 *           which each has its weight's share.
 *
 * Also here: each file's part (--val-fraction) and its windows, laid out
 * once at opening. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "base/rng.h"
#include "data_internal.h"

/* ---- the permutation ------------------------------------------------- */

uint64_t mal_data_permute(uint64_t key, uint64_t n, uint64_t i)
{
    if (n <= 1) return 0;
    /* the smallest even number of bits 2h with 4^h >= n: the balanced
     * Feistel network permutes [0, 4^h), and walking the cycle from i until
     * it lands below n permutes [0, n) (expected fewer than 4 steps, since
     * 4^h < 4n) */
    int h = 1;
    while (h < 32 && ((uint64_t)1 << (2 * h)) < n)
        h++;
    const uint64_t mask = ((uint64_t)1 << h) - 1;
    uint64_t x = i;
    do {
        uint64_t L = x >> h, R = x & mask;
        for (uint64_t r = 0; r < MAL_DATA_FEISTEL_ROUNDS; r++) {
            uint64_t t = L ^ (mal_rng_u64(key, r, R) & mask);
            L = R;
            R = t;
        }
        x = L << h | R;
    } while (x >= n);
    return x;
}

/* ---- layout at opening ----------------------------------------------- */

/* The first token of the held-out part of `f`: the last `fraction` of its
 * tokens, its start moved to the nearest document start of a Megatron
 * file, so that no document is split between training and validation. */
static uint64_t heldout_start(const mal_data_file *f, double fraction)
{
    uint64_t held = (uint64_t)llround(fraction * (double)f->n_tokens);
    uint64_t cut = f->n_tokens - MAL_MIN(held, f->n_tokens);
    if (f->format != MAL_DATA_MEGATRON || f->idx.n_docs == 0) return cut;
    /* the last document starting at or before cut (binary search over
     * document starts, which the index holds in order) */
    uint64_t lo = 0, hi = f->idx.n_docs; /* doc_start(lo) <= cut < doc_start(hi) */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (mal_data_doc_start(f, mid) <= cut)
            lo = mid;
        else
            hi = mid;
    }
    uint64_t a = mal_data_doc_start(f, lo), b = mal_data_doc_start(f, hi);
    return cut - a <= b - cut ? a : b;
}

/* Each file's part and windows, each component's windows. */
static int layout_windows(mal_data *d)
{
    const uint64_t T = (uint64_t)d->seq_len;
    for (int c = 0; c < d->n_comps; c++) {
        mal_data_comp *cp = &d->comps[c];
        cp->n_windows = 0;
        uint64_t part_tokens = 0;
        for (int i = cp->first_file; i < cp->first_file + cp->n_files; i++) {
            mal_data_file *f = &d->files[i];
            f->lo = 0;
            f->hi = f->n_tokens;
            if (d->part != MAL_DATA_PART_ALL) {
                uint64_t cut = heldout_start(f, d->val_fraction);
                if (d->part == MAL_DATA_PART_TRAIN)
                    f->hi = cut;
                else
                    f->lo = cut;
            }
            part_tokens += f->hi - f->lo;
            f->win0 = cp->n_windows;
            f->n_win = T && f->hi - f->lo > T ? (f->hi - f->lo - 1) / T : 0;
            cp->n_windows += f->n_win;
        }
        if (d->sampling == MAL_DATA_SAMPLE_EPOCHS && cp->n_windows == 0) {
            const char *first = d->files[cp->first_file].path;
            if (d->part == MAL_DATA_PART_HELDOUT)
                return MAL_ERR(MAL_EINVAL,
                               "--val-fraction %g holds out %" PRIu64 " tokens of %s%s, fewer "
                               "than one sequence of %d + 1: hold out more, or give --val-data",
                               d->val_fraction, part_tokens, first,
                               cp->n_files > 1 ? " and the files read with it" : "", d->seq_len);
            return MAL_ERR(MAL_EINVAL,
                           "data %s%s %s %" PRIu64 " tokens%s, fewer than one sequence of %d + "
                           "1: use more data or a shorter sequence length",
                           first, cp->n_files > 1 ? " and the files read with it" : "",
                           cp->n_files > 1 ? "hold" : "holds", part_tokens,
                           d->part == MAL_DATA_PART_TRAIN ? " outside the held-out part" : "",
                           d->seq_len);
        }
    }
    d->n_tokens = 0;
    for (int i = 0; i < d->n_files; i++)
        d->n_tokens += d->files[i].hi - d->files[i].lo;
    return 0;
}

/* Slots of a blend's pattern in the order of their ideal times: the j-th
 * slot of component c ideally at (2j + 1) / (2 n_c) of the block. */
typedef struct {
    uint32_t c, j, n;
} blend_slot;

static int slot_order(const void *pa, const void *pb)
{
    const blend_slot *a = pa, *b = pb;
    /* (2ja + 1) / na against (2jb + 1) / nb, exactly */
    uint64_t l = (2 * (uint64_t)a->j + 1) * b->n, r = (2 * (uint64_t)b->j + 1) * a->n;
    if (l != r) return l < r ? -1 : 1;
    return a->c < b->c ? -1 : a->c > b->c;
}

/* The pattern of a blend: component c gets n_c of the block's P slots (its
 * weight's share, largest remainders rounding), spread evenly. */
static int build_blend(mal_data *d)
{
    const uint32_t P = MAL_DATA_BLEND_SLOTS;
    int rc = 0;
    blend_slot *all = NULL;
    double *rem = NULL;
    uint32_t given = 0;
    if (!(rem = malloc((size_t)d->n_comps * sizeof *rem))) goto nomem;
    for (int c = 0; c < d->n_comps; c++) {
        double share = d->comps[c].weight * P;
        d->comps[c].n_slots = (uint32_t)floor(share);
        rem[c] = share - floor(share);
        given += d->comps[c].n_slots;
    }
    /* the slots rounding left over, to the largest remainders (ties: the
     * earlier item) */
    while (given < P) {
        int best = 0;
        for (int c = 1; c < d->n_comps; c++)
            if (rem[c] > rem[best]) best = c;
        d->comps[best].n_slots++;
        rem[best] = -1;
        given++;
    }
    for (int c = 0; c < d->n_comps; c++)
        if (d->comps[c].n_slots == 0) {
            rc = MAL_ERR(MAL_EINVAL,
                         "the weight of %s is below 1/%u of the blend's total: it would never "
                         "be read; give it more weight or leave it out",
                         d->files[d->comps[c].first_file].path, P);
            goto out;
        }
    if (!(all = malloc(P * sizeof *all)) || !(d->blend_comp = malloc(P * sizeof *d->blend_comp)) ||
        !(d->blend_rank = malloc(P * sizeof *d->blend_rank)))
        goto nomem;
    uint32_t k = 0;
    for (int c = 0; c < d->n_comps; c++)
        for (uint32_t j = 0; j < d->comps[c].n_slots; j++)
            all[k++] = (blend_slot){(uint32_t)c, j, d->comps[c].n_slots};
    qsort(all, P, sizeof *all, slot_order);
    for (uint32_t s = 0; s < P; s++) {
        d->blend_comp[s] = (uint16_t)all[s].c;
        d->blend_rank[s] = (uint16_t)all[s].j;
    }
    goto out;
nomem:
    rc = MAL_ERR(MAL_ENOMEM, "out of memory building the blend of %s", d->name);
out:
    free(all);
    free(rem);
    return rc;
}

int mal_data_layout(mal_data *d)
{
    int rc;
    if ((rc = layout_windows(d))) return rc;
    if (d->sampling == MAL_DATA_SAMPLE_EPOCHS && d->n_comps > 1) return build_blend(d);
    return 0;
}

/* ---- reading --------------------------------------------------------- */

/* Copy the window of T + 1 tokens of `f` from token `off` into inputs and
 * targets, checking each token against d->vocab when it is set. */
static int read_window(const mal_data *d, const mal_data_file *f, uint64_t off, int T, int *inputs,
                       int *targets)
{
    for (int i = 0; i <= T; i++) {
        int64_t t = mal_data_file_token(f, off + (uint64_t)i);
        if (t < 0 || t > INT_MAX || (d->vocab > 0 && t >= d->vocab))
            return MAL_ERR(MAL_EFORMAT,
                           "token file %s holds token id %" PRId64 " at token %" PRIu64
                           " but the model has a vocabulary of %d: the file was tokenized for "
                           "another model, or it is corrupt",
                           f->path, t, off + (uint64_t)i, d->vocab);
        if (i < T) inputs[i] = (int)t;
        if (i > 0) targets[i - 1] = (int)t;
    }
    return 0;
}

/* random mode: a counter-based offset, with replacement */
static int sample_random(const mal_data *d, uint64_t seed, int64_t step, int64_t pos, int T,
                         int *inputs, int *targets)
{
    const mal_data_comp *c = &d->comps[0];
    if (d->n_comps > 1) {
        /* the blend's draw: the component whose cumulative weight first
         * exceeds u (the last one when rounding leaves u above them all) */
        double u = mal_rng_uniform(seed ^ MAL_DATA_SALT ^ MAL_DATA_BLEND_SALT, (uint64_t)step,
                                   (uint64_t)pos);
        double cum = d->comps[0].weight;
        int k = 0;
        while (k + 1 < d->n_comps && cum <= u)
            cum += d->comps[++k].weight;
        c = &d->comps[k];
    }
    /* start positions of windows that lie in one file's part, over the
     * component's files laid end to end */
    uint64_t starts = 0;
    for (int i = c->first_file; i < c->first_file + c->n_files; i++) {
        uint64_t len = d->files[i].hi - d->files[i].lo;
        if (len > (uint64_t)T) starts += len - (uint64_t)T;
    }
    if (starts == 0) {
        const mal_data_file *f0 = &d->files[c->first_file];
        return MAL_ERR(MAL_EINVAL,
                       "data set %s: %s has %" PRIu64 " tokens, fewer than sequence length + 1 "
                       "= %lld%s: use a larger token file or a shorter sequence length",
                       d->name, f0->path, f0->hi - f0->lo, (long long)T + 1,
                       c->n_files > 1 ? ", and so has every other file read with it" : "");
    }
    uint64_t off = mal_rng_below(seed ^ MAL_DATA_SALT, (uint64_t)step, (uint64_t)pos, starts);
    const mal_data_file *f = &d->files[c->first_file];
    for (;; f++) {
        uint64_t len = f->hi - f->lo, s_f = len > (uint64_t)T ? len - (uint64_t)T : 0;
        if (off < s_f) break;
        off -= s_f;
    }
    return read_window(d, f, f->lo + off, T, inputs, targets);
}

/* epochs mode: sample number g of the run, its component and its number
 * k within the component, then the k-th window of the component's
 * sequence of epochs */
static int sample_epochs(const mal_data *d, uint64_t seed, uint64_t g, int *inputs, int *targets)
{
    int c = 0;
    uint64_t k = g;
    if (d->n_comps > 1) {
        uint32_t s = (uint32_t)(g % MAL_DATA_BLEND_SLOTS);
        c = d->blend_comp[s];
        k = g / MAL_DATA_BLEND_SLOTS * d->comps[c].n_slots + d->blend_rank[s];
    }
    const mal_data_comp *cp = &d->comps[c];
    uint64_t N = cp->n_windows, epoch = k / N;
    uint64_t key = mal_rng_u64(seed ^ MAL_DATA_SALT ^ MAL_DATA_EPOCH_SALT, (uint64_t)c, epoch);
    uint64_t w = mal_data_permute(key, N, k % N);
    /* the file holding window w: the last whose first window is <= w */
    int lo = cp->first_file, hi = cp->first_file + cp->n_files;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (d->files[mid].win0 <= w)
            lo = mid;
        else
            hi = mid;
    }
    const mal_data_file *f = &d->files[lo];
    /* files without windows share win0 with the next: skip them */
    while (f->n_win == 0 || w >= f->win0 + f->n_win)
        f++;
    return read_window(d, f, f->lo + (w - f->win0) * (uint64_t)d->seq_len, d->seq_len, inputs,
                       targets);
}

int mal_data_sample(const mal_data *d, uint64_t seed, int64_t step, int64_t pos, int T, int *inputs,
                    int *targets)
{
    if (T < 1) return MAL_ERR(MAL_EINVAL, "sequence length %d must be at least 1", T);
    if (step < 0 || pos < 0)
        return MAL_ERR(MAL_EINVAL, "negative step (%lld) or batch position (%lld) for sampling",
                       (long long)step, (long long)pos);
    if (d->synth_vocab) {
        mal_data_synth_window(seed, d->synth_vocab, step, pos, T, inputs, targets);
        return 0;
    }
    if (d->sampling != MAL_DATA_SAMPLE_EPOCHS)
        return sample_random(d, seed, step, pos, T, inputs, targets);
    if (T != d->seq_len)
        return MAL_ERR(MAL_EINVAL,
                       "data %s was opened for windows of %d + 1 tokens, asked for %d + 1", d->name,
                       d->seq_len, T);
    if (step > 0 && (uint64_t)step > (UINT64_MAX - (uint64_t)pos) / (uint64_t)d->batch)
        return MAL_ERR(MAL_EINVAL, "sample number of step %lld position %lld overflows",
                       (long long)step, (long long)pos);
    return sample_epochs(d, seed, (uint64_t)step * (uint64_t)d->batch + (uint64_t)pos, inputs,
                         targets);
}
