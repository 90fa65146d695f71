/* tests/snapdump: every tensor of a snapshot's param/, adam_m/ and adam_v/
 * groups as one safetensors file, for Python tests on machines without h5py
 * (the GPU machine's PyTorch venv): tests/snapread.py runs it and reads the
 * file with numpy alone.
 *
 * The snapshot is read through the library's reader (ckpt/snapshot.h), as a
 * resume reads it: a snapshot directory's `latest` or a step directory,
 * COMPLETE and the index checked at open, every stored block verified
 * against its CRC-32C as it is read.  No MPI: the reader is local.
 *
 * Output (the header written by mal_export_safetensors_header, export.h):
 * 8-byte little-endian header length N, N bytes of JSON padded with spaces
 * to a multiple of 8 --
 *   {"__metadata__": {"format": "malleus-snapdump", "step": "300", ...},
 *    "param/layers.0.wq": {"dtype": "F32", "shape": [64, 64],
 *                          "data_offsets": [A, B]}, ...}
 * (metadata values are strings, as safetensors wants: step,
 * consumed_samples, seed, rng_counter in decimal; config_json, train_json,
 * plan_json where the snapshot stores them; step_dir) -- then the float32
 * data, little-endian, row-major, back to back in the snapshot's tensor
 * order.  Memory: one tensor's block of rows at a time (MEM_BYTES, or one
 * row if larger) plus the reader's 8 MiB chunk.
 *
 * Exit status: 0 written; 2 usage, a snapshot refused (missing,
 * uncommitted, corrupt, without parameters) or an output path in a missing
 * directory; 1 the output could not be written. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/mal.h"
#include "base/opts.h"
#include "ckpt/export.h"
#include "ckpt/snapshot.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "snapdump writes host floats as safetensors' little-endian data"
#endif

#define MEM_BYTES ((size_t)16 << 20)

static int dumped_group(const char *name)
{
    return !strncmp(name, "param/", 6) || !strncmp(name, "adam_m/", 7) ||
           !strncmp(name, "adam_v/", 7);
}

static int meta_set(json_t *md, const char *key, const char *value)
{
    json_t *v = json_string(value);
    return !v || json_object_set_new(md, key, v);
}

/* The header (owned by the caller) and the number of tensors it lists. */
static int make_header(mal_snapshot *s, const char *step_dir, json_t **out, int *n_out)
{
    const mal_snap_meta *m = mal_snapshot_meta(s);
    json_t *h = json_object(), *md = json_object();
    char num[4][32];
    int rc = 0, bad = 0;
    if (!h || !md) {
        json_decref(h);
        json_decref(md);
        return MAL_ERR(MAL_ENOMEM, "snapdump: out of memory for the header");
    }
    if (json_object_set_new(h, "__metadata__", md)) bad = 1; /* md is released then */
    snprintf(num[0], sizeof num[0], "%" PRId64, m->step);
    snprintf(num[1], sizeof num[1], "%" PRId64, m->consumed_samples);
    snprintf(num[2], sizeof num[2], "%" PRIu64, m->seed);
    snprintf(num[3], sizeof num[3], "%" PRIu64, m->rng_counter);
    bad = bad || meta_set(md, "format", "malleus-snapdump") || meta_set(md, "step", num[0]) ||
          meta_set(md, "consumed_samples", num[1]) || meta_set(md, "seed", num[2]) ||
          meta_set(md, "rng_counter", num[3]) || meta_set(md, "step_dir", step_dir);
    /* The JSON texts the writer stored: a string that is not UTF-8 is
     * refused by Jansson, and with it the snapshot (it came from elsewhere). */
    const char *texts[3][2] = {{"config_json", m->config_json},
                               {"train_json", m->train_json},
                               {"plan_json", m->plan_json}};
    for (int k = 0; k < 3 && !bad; k++)
        if (texts[k][1] && meta_set(md, texts[k][0], texts[k][1])) {
            rc = MAL_ERR(MAL_EFORMAT, "snapshot %s: its %s is not UTF-8 text", step_dir,
                         texts[k][0]);
            goto out;
        }
    uint64_t off = 0;
    int n = 0;
    for (int i = 0; i < mal_snapshot_n_tensors(s) && !bad; i++) {
        mal_snap_tensor t;
        if ((rc = mal_snapshot_tensor_info(s, i, &t))) goto out;
        if (!dumped_group(t.name)) continue;
        json_t *shape = json_array();
        uint64_t bytes = sizeof(float);
        for (int d = 0; d < t.ndim && shape; d++) {
            bytes *= (uint64_t)t.shape[d]; /* bounded by the reader's checks */
            if (json_array_append_new(shape, json_integer((json_int_t)t.shape[d]))) bad = 1;
        }
        json_t *e = shape ? json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + bytes))
                          : NULL;
        if (!e || json_object_set_new(h, t.name, e)) bad = 1;
        off += bytes;
        n++;
    }
    if (bad) {
        rc = MAL_ERR(MAL_ENOMEM, "snapdump: out of memory for the header");
        goto out;
    }
    if (n == 0) {
        rc = MAL_ERR(MAL_EFORMAT, "snapshot %s holds no param/, adam_m/ or adam_v/ tensor",
                     step_dir);
        goto out;
    }
    *out = h;
    *n_out = n;
    return 0;
out:
    json_decref(h);
    return rc;
}

/* Write the dump of snapshot `snap` to `path`; *n, *step report it. */
static int dump(const char *snap, const char *path, int *n, int64_t *step)
{
    char step_dir[4096];
    mal_snapshot *s = NULL;
    json_t *header = NULL;
    float *buf = NULL;
    mal_output f;
    int f_open = 0, rc;

    if ((rc = mal_snapshot_resolve(snap, step_dir, sizeof step_dir))) return rc;
    if ((rc = mal_snapshot_open(&s, step_dir))) return rc;
    *step = mal_snapshot_meta(s)->step;
    if ((rc = make_header(s, step_dir, &header, n))) goto out;
    if (!(buf = malloc(MEM_BYTES))) {
        rc = MAL_ERR(MAL_ENOMEM, "snapdump: out of memory for a %zu-byte buffer", MEM_BYTES);
        goto out;
    }
    if ((rc = mal_output_open(&f, path))) goto out;
    f_open = 1;
    if ((rc = mal_export_safetensors_header(&f, header, NULL))) goto out;

    /* Tensor by tensor in header order, a block of whole rows (along the
     * first dimension) at a time: each read assembles the stored blocks it
     * touches and verifies their CRC-32C. */
    for (int i = 0; i < mal_snapshot_n_tensors(s) && !rc; i++) {
        mal_snap_tensor t;
        if ((rc = mal_snapshot_tensor_info(s, i, &t))) break;
        if (!dumped_group(t.name)) continue;
        size_t row = 1;
        for (int d = 1; d < t.ndim; d++)
            row *= (size_t)t.shape[d];
        size_t step_rows = MEM_BYTES / sizeof(float) / row;
        if (step_rows == 0) { /* one row does not fit: grow the buffer to one row */
            float *b2 = realloc(buf, row * sizeof(float));
            if (!b2) {
                rc = MAL_ERR(MAL_ENOMEM, "snapdump: out of memory for a row of %s", t.name);
                break;
            }
            buf = b2;
            step_rows = 1;
        }
        for (int64_t r0 = 0; r0 < t.shape[0] && !rc; r0 += (int64_t)step_rows) {
            mal_snap_tensor want = t;
            want.offset[0] = r0;
            want.extent[0] = MAL_MIN((int64_t)step_rows, t.shape[0] - r0);
            want.data = buf;
            if ((rc = mal_snapshot_read_block(s, &want))) break;
            rc = mal_output_write(&f, buf, (size_t)want.extent[0] * row * sizeof(float));
        }
    }
    if (rc) goto out;
    f_open = 0;
    rc = mal_output_commit(&f);
out:
    if (f_open) mal_output_discard(&f);
    mal_snapshot_close(s);
    json_decref(header);
    free(buf);
    return rc;
}

int main(int argc, char **argv)
{
    int quiet = 0, first, n = 0;
    int64_t step = 0;
    const mal_opt opts[] = {
        {MAL_OPT_SECTION, .help = "Options:"},
        {MAL_OPT_FLAG, "quiet", .target = &quiet, .ival = 1, .help = "no summary line"},
        {MAL_OPT_HELP, "help", 'h', .label = "-h, --help", .help = "this text"},
        {.kind = MAL_OPT_END},
    };
    const mal_opts_spec spec = {
        .prog = "snapdump",
        .version = PACKAGE_VERSION,
        .usage = "Usage: tests/snapdump [--quiet] SNAPSHOT OUT.safetensors\n"
                 "Write every tensor of a snapshot's param/, adam_m/ and adam_v/ groups as one\n"
                 "safetensors file (float32; names \"param/layers.0.wq\"; the step, seed and\n"
                 "JSON texts in __metadata__), read and verified as a resume reads them.  For\n"
                 "tests whose Python has numpy but no h5py (tests/snapread.py).\n"
                 "\n"
                 "  SNAPSHOT               a snapshot directory (its newest snapshot) or a step\n"
                 "                         directory\n"
                 "  OUT.safetensors        written atomically (temporary file, rename)\n",
        .footer = "\nExit status: 0 written, 1 the output could not be written, 2 usage error,\n"
                  "refused snapshot (missing, never committed, corrupt, without parameters) or\n"
                  "an output path in a missing directory.\n",
        .opts = opts,
    };
    int rc = mal_opts_parse(&spec, argc, argv, &first);
    if (rc >= 0) return rc;
    if (argc - first != 2) return mal_opts_bad(&spec, "expected SNAPSHOT OUT.safetensors");
    if ((rc = dump(argv[first], argv[first + 1], &n, &step))) {
        fprintf(stderr, "snapdump: %s\n", mal_errmsg());
        return mal_exit_status(rc);
    }
    if (!quiet) printf("snapdump: step %" PRId64 ": %d tensors -> %s\n", step, n, argv[first + 1]);
    return 0;
}
