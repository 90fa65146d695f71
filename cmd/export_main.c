/* malleus-export: the option table and a call into mal_export_hf
 * (export.h).  Exit codes: 0 done, 1 failure while writing, 2 usage error or
 * a snapshot refused (missing, never committed, corrupt, not of its model). */
#include <stdio.h>

#include "base/mal.h"
#include "base/opts.h"
#include "ckpt/export.h"

static const char *const dtypes[] = {"fp32", "bf16", NULL};
static const int dtype_values[] = {MAL_EXPORT_F32, MAL_EXPORT_BF16};

int main(int argc, char **argv)
{
    mal_export_options o = {0};
    int quiet = 0, mem_mib = (int)(MAL_EXPORT_MEM_DEFAULT >> 20), first;
    const mal_opt opts[] = {
        {MAL_OPT_SECTION, .help = "Options:"},
        {MAL_OPT_CHOICE, "dtype", .metavar = "T", .target = &o.dtype, .choices = dtypes,
         .values = dtype_values,
         .help = "fp32 or bf16 (round to nearest, ties to even) (default: fp32)"},
        {MAL_OPT_INT, "mem", .metavar = "MIB", .target = &mem_mib, .lo = 1, .hi = 1 << 20,
         .help = "row buffer in MiB (default: 64); memory use is about this\n"
                 "plus 8 MiB and the snapshot's block table, whatever the model"},
        {MAL_OPT_FLAG, "quiet", .target = &quiet, .ival = 1, .help = "no summary line"},
        {MAL_OPT_HELP, "help", 'h', .label = "-h, --help", .help = "this text"},
        {MAL_OPT_VERSION, "version", .help = "print the version"},
        {.kind = MAL_OPT_END},
    };
    const mal_opts_spec spec = {
        .prog = "malleus-export",
        .version = PACKAGE_VERSION,
        .usage = "Usage: malleus-export [OPTIONS] SNAPSHOT OUT_DIR\n"
                 "Write the parameters of a training snapshot as a Hugging Face LlamaForCausalLM\n"
                 "checkpoint: OUT_DIR/config.json and OUT_DIR/model.safetensors.\n"
                 "\n"
                 "  SNAPSHOT               a snapshot directory (its newest snapshot) or a step\n"
                 "                         directory, written under any plan\n"
                 "  OUT_DIR                created if needed; files of those names are replaced\n",
        .footer = "\nThe query and key projections are permuted from Malleus's interleaved rotary\n"
                  "pairs to Hugging Face's rotate-half convention; lm_head stays untied.  Load\n"
                  "with LlamaForCausalLM.from_pretrained(OUT_DIR).\n"
                  "Exit status: 0 done, 1 write failure, 2 usage error or refused snapshot\n"
                  "(missing, never committed, corrupt, not of its model).\n",
        .opts = opts,
    };
    int rc = mal_opts_parse(&spec, argc, argv, &first);
    if (rc >= 0) return rc;
    if (argc - first != 2) return mal_opts_bad(&spec, "expected SNAPSHOT OUT_DIR");
    o.snapshot = argv[first];
    o.out_dir = argv[first + 1];
    o.mem_bytes = (size_t)mem_mib << 20;
    mal_export_stats st;
    if ((rc = mal_export_hf(&o, &st))) {
        fprintf(stderr, "malleus-export: %s\n", mal_errmsg());
        /* A snapshot that cannot be trusted or does not fit is the user's
         * input to fix (2); anything else failed while writing (1). */
        return mal_exit_status(rc);
    }
    if (!quiet)
        printf("malleus-export: step %lld: %d tensors, %.2f MiB read, %.2f MiB written (%s) in "
               "%.2f s -> %s\n",
               (long long)st.step, st.n_tensors, (double)st.bytes_read / 1048576.0,
               (double)st.bytes_written / 1048576.0, o.dtype == MAL_EXPORT_BF16 ? "bf16" : "fp32",
               st.seconds, o.out_dir);
    return 0;
}
