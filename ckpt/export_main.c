/* malleus-export: command-line shell over mal_export_hf (export.h).
 * Exit codes: 0 done, 1 failure while writing, 2 usage error or a snapshot
 * refused (missing, never committed, corrupt, not of its model). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "mal.h"

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: malleus-export [OPTIONS] SNAPSHOT OUT_DIR\n"
            "Write the parameters of a training snapshot as a Hugging Face LlamaForCausalLM\n"
            "checkpoint: OUT_DIR/config.json and OUT_DIR/model.safetensors.\n"
            "\n"
            "  SNAPSHOT          a snapshot directory (its `latest` is used) or a step\n"
            "                    directory, written under any plan\n"
            "  OUT_DIR           created if needed; existing files of those names are replaced\n"
            "\n"
            "Options:\n"
            "  --dtype T         fp32 or bf16 (round to nearest even) (default: fp32)\n"
            "  --mem MIB         row buffer in MiB (default: %zu); memory use is about this\n"
            "                    plus 8 MiB and the snapshot's block table, whatever the model\n"
            "  --quiet           no summary line\n"
            "  -h, --help        this text\n"
            "  --version         print the version\n"
            "\n"
            "The query and key projections are permuted from Malleus's interleaved rotary\n"
            "pairs to Hugging Face's rotate-half convention; lm_head stays untied.  Load with\n"
            "  LlamaForCausalLM.from_pretrained(OUT_DIR)\n"
            "Exit status: 0 done, 1 write failure, 2 usage error or refused snapshot\n"
            "(missing, never committed, corrupt, not of its model).\n",
            MAL_EXPORT_MEM_DEFAULT >> 20);
}

static int bad(const char *msg, const char *arg)
{
    fprintf(stderr, "malleus-export: %s%s\nTry 'malleus-export --help'.\n", msg, arg);
    return 2;
}

enum { O_DTYPE = 256, O_MEM, O_QUIET, O_VERSION };
static const struct option longopts[] = {
    {"dtype", required_argument, 0, O_DTYPE}, {"mem", required_argument, 0, O_MEM},
    {"quiet", no_argument, 0, O_QUIET},       {"help", no_argument, 0, 'h'},
    {"version", no_argument, 0, O_VERSION},   {0, 0, 0, 0},
};

int main(int argc, char **argv)
{
    mal_export_options o = {0};
    int quiet = 0, c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case O_DTYPE:
            if (!strcmp(optarg, "fp32") || !strcmp(optarg, "float32")) o.dtype = MAL_EXPORT_F32;
            else if (!strcmp(optarg, "bf16") || !strcmp(optarg, "bfloat16")) o.dtype = MAL_EXPORT_BF16;
            else return bad("--dtype must be fp32 or bf16, got ", optarg);
            break;
        case O_MEM: {
            char *end;
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || v < 1 || v > (1L << 20))
                return bad("--mem expects an integer in [1, 1048576] (MiB), got ", optarg);
            o.mem_bytes = (size_t)v << 20;
            break;
        }
        case O_QUIET: quiet = 1; break;
        case 'h': usage(stdout); return 0;
        case O_VERSION: printf("malleus-export %s\n", PACKAGE_VERSION); return 0;
        case ':': return bad("option needs a value: ", argv[optind - 1]);
        default: return bad("unknown option ", argv[optind - 1]);
        }
    }
    if (argc - optind != 2) return bad("expected SNAPSHOT OUT_DIR", "");
    o.snapshot = argv[optind];
    o.out_dir = argv[optind + 1];
    mal_export_stats st;
    int rc = mal_export_hf(&o, &st);
    if (rc) {
        fprintf(stderr, "malleus-export: %s\n", mal_errmsg());
        /* A snapshot that cannot be trusted or does not fit is the user's
         * input to fix (2); anything else failed while writing (1). */
        return rc == MAL_EIO || rc == MAL_ENOMEM ? 1 : 2;
    }
    if (!quiet)
        printf("malleus-export: step %lld: %d tensors, %.2f MiB read, %.2f MiB written (%s) in "
               "%.2f s -> %s\n",
               (long long)st.step, st.n_tensors, (double)st.bytes_read / 1048576.0,
               (double)st.bytes_written / 1048576.0, o.dtype == MAL_EXPORT_BF16 ? "bf16" : "fp32",
               st.seconds, o.out_dir);
    return 0;
}
