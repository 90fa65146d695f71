/* malleus-sample: the option table and a call into the library: load a
 * snapshot's parameters on this process (load.h) and print a continuation
 * of the prompt (sample.h).  Exit codes: 0 done, 1 failure, 2 usage error
 * or a snapshot refused (missing, never committed, corrupt). */
#include <stdio.h>
#include <stdlib.h>

#include "base/mal.h"
#include "base/opts.h"
#include "ckpt/load.h"
#include "kernels/kernels.h"
#include "src/data.h"
#include "src/sample.h"

static void stream_token(void *ctx, int token)
{
    const int *vocab = ctx;
    mal_sample_print(stdout, &token, 1, *vocab);
    if (*vocab != MAL_DATA_BYTE_VOCAB) fputc(' ', stdout);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const char *prompt_text = "", *device = NULL;
    int n_new = 200, threads = 0, first;
    mal_sample_options so = {0.8f, 40, 1234};
    const mal_opt opts[] = {
        {MAL_OPT_SECTION, .help = "Options:"},
        {MAL_OPT_STRING, "prompt", .metavar = "TEXT", .target = &prompt_text,
         .help = "text to continue (default: a newline); with a vocabulary\n"
                 "that is not byte-level: token ids separated by spaces"},
        {MAL_OPT_INT, "tokens", .metavar = "N", .target = &n_new, .lo = 0, .hi = 1 << 20,
         .help = "tokens to generate (default: 200)"},
        {MAL_OPT_FLOAT, "temperature", .metavar = "X", .target = &so.temperature, .flo = 0,
         .fhi = 100, .help = "softmax temperature; 0 = greedy (default: 0.8)"},
        {MAL_OPT_INT, "top-k", .metavar = "K", .target = &so.top_k, .lo = 0, .hi = 1 << 30,
         .help = "draw among the K most likely tokens; 0 = all (default: 40)"},
        {MAL_OPT_UINT64, "seed", .metavar = "S", .target = &so.seed, .lo = 0, .hi = 1LL << 62,
         .help = "seed of the draws: the same seed, prompt and snapshot\n"
                 "give the same text (default: 1234)"},
        {MAL_OPT_INT, "threads", .metavar = "N", .target = &threads, .lo = 1, .hi = 1024,
         .help = "BLAS threads (default: OpenBLAS's choice)"},
        {MAL_OPT_STRING, "device", .metavar = "NAME", .target = &device,
         .help = "kernel backend by name (default: as malleus-train's)"},
        {MAL_OPT_HELP, "help", 'h', .label = "-h, --help", .help = "this text"},
        {MAL_OPT_VERSION, "version", .help = "print the version"},
        {.kind = MAL_OPT_END},
    };
    const mal_opts_spec spec = {
        .prog = "malleus-sample",
        .version = PACKAGE_VERSION,
        .usage = "Usage: malleus-sample [OPTIONS] SNAPSHOT\n"
                 "Generate text with the parameters of a training snapshot (written under any\n"
                 "plan), on this process: the prompt, then the new tokens as they come.  The\n"
                 "byte-level vocabulary prints text (bytes outside printable ASCII as \\xNN);\n"
                 "other vocabularies print token ids.\n"
                 "\n"
                 "  SNAPSHOT               a snapshot directory (its newest snapshot) or a step\n"
                 "                         directory\n",
        .footer = "\nEach token re-runs the model over the last seq_len tokens (no cache).\n"
                  "Exit status: 0 done, 1 failure, 2 usage error or refused snapshot.\n"
                  "Example:\n"
                  "  malleus-sample --prompt 'Seven plus five is' --tokens 80 run/snap\n",
        .opts = opts,
    };
    int rc = mal_opts_parse(&spec, argc, argv, &first);
    if (rc >= 0) return rc;
    if (argc - first != 1) return mal_opts_bad(&spec, "expected one SNAPSHOT");

    mal_kern k = NULL;
    mal_kern_config kc = mal_kern_config_default();
    kc.threads = threads;
    mal_model *m = NULL;
    mal_acts *a = NULL;
    int *prompt = NULL, *out = NULL, n_prompt = 0, status = 2;
    if ((rc = mal_kern_create(device, &kc, &k))) goto fail; /* an unknown or absent backend: 2 */
    if ((rc = mal_load_model(argv[first], k, 1, &m, NULL))) {
        /* a snapshot that is missing, uncommitted or corrupt is the user's to fix */
        status = mal_exit_status(rc);
        goto fail;
    }
    int vocab = m->cfg.vocab;
    status = 1;
    if ((rc = mal_acts_create(&a, m, 1))) goto fail;
    if ((rc = mal_sample_parse_prompt(prompt_text, vocab, &prompt, &n_prompt))) {
        status = 2;
        goto fail;
    }
    if (!(out = malloc((size_t)(n_prompt + n_new) * sizeof *out))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        goto fail;
    }
    mal_sample_print(stdout, prompt, n_prompt, vocab);
    if (vocab != MAL_DATA_BYTE_VOCAB) fputc(' ', stdout);
    fflush(stdout);
    if ((rc = mal_sample_generate(m, a, prompt, n_prompt, n_new, &so, out, stream_token, &vocab)))
        goto fail;
    printf("\n");
    status = 0;
fail:
    if (status) fprintf(stderr, "malleus-sample: %s\n", mal_errmsg());
    free(prompt);
    free(out);
    if (a) mal_acts_destroy(m, a);
    mal_model_destroy(m);
    if (k) mal_kern_destroy(k);
    return status;
}
