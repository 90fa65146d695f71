/* malleus-import: the option table and a call into mal_import_cli_run
 * (ckpt/import.h).  Exit codes: 0 done, 1 failure while writing, 2 usage
 * error or a checkpoint, plan or destination refused. */
#include <limits.h>
#include <stdio.h>

#include "base/mal.h"
#include "base/opts.h"
#include "ckpt/import.h"

static const char *const dtypes[] = {"fp32", "bf16", NULL};
static const int dtype_values[] = {MAL_HF_AS_STORED, MAL_HF_ROUND_BF16};

_Static_assert(MAL_IMPORT_MEM_DEFAULT_MIB == 64, "update --mem's help");

int main(int argc, char **argv)
{
    mal_import_cli cli = {0};
    int mem_mib = MAL_IMPORT_MEM_DEFAULT_MIB, first;
    const mal_opt opts[] = {
        {MAL_OPT_SECTION, .help = "Options:"},
        {MAL_OPT_STRING, "plan", .metavar = "FILE", .target = &cli.plan_path,
         .help = "write the shards a run under this plan writes (default:\n"
                 "one process's: whole tensors in one shard file)"},
        {MAL_OPT_CHOICE, "dtype", .metavar = "T", .target = &cli.round, .choices = dtypes,
         .values = dtype_values,
         .help = "the values the fp32 master weights take: fp32 (default:\n"
                 "the checkpoint's exactly; bf16 and fp16 are exact in\n"
                 "fp32) or bf16 (each rounded to bf16, nearest even)"},
        {MAL_OPT_INT, "seq-len", .metavar = "N", .target = &cli.seq_len, .lo = 1, .hi = 1 << 20,
         .help = "the model's training sequence length (default: config.json's\n"
                 "max_position_embeddings; the rotary frequencies do not\n"
                 "depend on it)"},
        {MAL_OPT_INT, "mem", .metavar = "MIB", .target = &mem_mib, .lo = 1, .hi = 1 << 20,
         .help = "row buffer in MiB (default: 64); memory use is about this\n"
                 "plus 8 MiB and the checkpoint's headers, whatever the model"},
        {MAL_OPT_FLAG, "quiet", .target = &cli.quiet, .ival = 1, .help = "errors only"},
        {MAL_OPT_HELP, "help", 'h', .label = "-h, --help", .help = "this text"},
        {MAL_OPT_VERSION, "version", .help = "print the version"},
        {.kind = MAL_OPT_END},
    };
    const mal_opts_spec spec = {
        .prog = "malleus-import",
        .version = PACKAGE_VERSION,
        .usage = "Usage: malleus-import [OPTIONS] HF_DIR OUT_SNAPSHOT\n"
                 "Write a Hugging Face LlamaForCausalLM checkpoint as a Malleus snapshot of its\n"
                 "weights, to fine-tune with malleus-train --init-from OUT_SNAPSHOT.\n"
                 "\n"
                 "  HF_DIR                 config.json and model.safetensors, or a sharded\n"
                 "                         checkpoint (model.safetensors.index.json and its\n"
                 "                         files); F32, F16 or BF16\n"
                 "  OUT_SNAPSHOT           a snapshot directory, created if needed, holding\n"
                 "                         no snapshot yet; the import is its step 0\n",
        .footer = "\nThe query and key projections are permuted back from Hugging Face's\n"
                  "rotate-half convention to Malleus's interleaved rotary pairs (malleus-export\n"
                  "does the opposite).  Refused, naming the field or tensor: another\n"
                  "architecture, attention or MLP biases, a rope_scaling other than llama3,\n"
                  "hidden_act other than silu, tied embeddings with an lm_head (or untied\n"
                  "without), missing, extra or misshapen tensors, other dtypes, and\n"
                  "pytorch_model.bin alone (convert it to safetensors).  The snapshot holds\n"
                  "the weights only (no optimizer state): --resume refuses it, --init-from\n"
                  "starts a run from it.\n"
                  "\n"
                  "Example (fine-tuning):\n"
                  "  malleus-import --seq-len 2048 hf/llama3 run/base\n"
                  "  mpiexec -n 8 malleus-train --dp 8 --init-from run/base --data data/web \\\n"
                  "      --lr 2e-5 --steps 1000 --snapshot-dir run/ft\n"
                  "  malleus-export run/ft run/hf-ft\n"
                  "\n"
                  "Exit status: 0 done, 1 write failure, 2 usage error or refused checkpoint,\n"
                  "plan or destination.\n",
        .opts = opts,
    };
    int rc = mal_opts_parse(&spec, argc, argv, &first);
    if (rc >= 0) return rc;
    if (argc - first != 2) return mal_opts_bad(&spec, "expected HF_DIR OUT_SNAPSHOT");
    cli.src = argv[first];
    cli.dst_dir = argv[first + 1];
    cli.mem_bytes = (size_t)mem_mib << 20;
    return mal_import_cli_run(&cli);
}
