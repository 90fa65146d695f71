/* malleus-train: the option table and a call into the library
 * (train/train_cli.h runs what the flags describe and returns the exit
 * status: 0 done, 1 failure, 2 bad usage or input, 3 stopped with a
 * snapshot because the monitor advised a re-plan, 4 stopped with a
 * snapshot by a signal).  A new flag is one line below. */
#include <limits.h>

#include "base/mal.h"
#include "base/opts.h"
#include "src/data.h"
#include "train/train_cli.h"

static const char *const data_formats[] = {"auto", "llmc", "raw16", "raw32", "megatron", NULL};
static const int data_format_values[] = {MAL_DATA_AUTO, MAL_DATA_LLMC, MAL_DATA_RAW16,
                                         MAL_DATA_RAW32, MAL_DATA_MEGATRON};
static const char *const samplings[] = {"epochs", "random", NULL};
static const int sampling_values[] = {MAL_DATA_SAMPLE_EPOCHS, MAL_DATA_SAMPLE_RANDOM};
static const char *const adapt_modes[] = {"off", "restart", "online", NULL};
static const int adapt_values[] = {MAL_ADAPT_OFF, MAL_ADAPT_RESTART, MAL_ADAPT_ONLINE};
static const char *const precisions[] = {"fp32", "bf16", NULL};
static const int precision_values[] = {MAL_PRECISION_FP32, MAL_PRECISION_BF16};
static const char *const inject_modes[] = {"sleep", "gpu", NULL};
static const int inject_mode_values[] = {MAL_INJECT_SLEEP, MAL_INJECT_GPU};
static const char *const on_off[] = {"on", "off", NULL};
static const char *const recompute_modes[] = {"none", "selective", "full", NULL};
static const int recompute_values[] = {MAL_RECOMPUTE_NONE, MAL_RECOMPUTE_SELECTIVE,
                                       MAL_RECOMPUTE_FULL};
static const int on_off_values[] = {1, 0};

int main(int argc, char **argv)
{
    static mal_train_cli cli;
    mal_train_cli_init(&cli);
    mal_train_options *o = &cli.o;
    mal_optim_config *op = &o->optim;
    char device_help[512], comm_help[512];
    mal_train_cli_backends_help(device_help, sizeof device_help, comm_help, sizeof comm_help);
    const mal_opt opts[] = {
        {MAL_OPT_SECTION, .help = "Model and data:"},
        {MAL_OPT_STRING, "model", .metavar = "PRESET|FILE", .target = &cli.model,
         .help = "model config: tiny, tiny-llama3, small, 124m, 1b, llama3-1b,\n"
                 "llama2-7b, 32b, 70b, 110b, or a JSON file with vocab, d_model,\n"
                 "n_layers, n_heads, ffn_hidden, seq_len [, n_kv_heads,\n"
                 "tie_embeddings, rope_theta, rope_scaling, norm_eps]\n"
                 "(default: tiny; with --resume: the snapshot's)"},
        {MAL_OPT_STRING, "data", .metavar = "SPEC", .target = &o->data_path,
         .help = "token files: FILE, or several separated by commas, each\n"
                 "a path or a glob ('data/*.bin'), read as one; or a blend,\n"
                 "every item with a weight: 'web/*.bin:0.7,code.bin:0.3'.\n"
                 "Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx;\n"
                 "name PREFIX or PREFIX.bin), llm.c files (uint16 or uint32\n"
                 "tokens), headerless uint16/uint32; mapped, never read\n"
                 "whole.  Or synthetic:V for generated tokens 0..V-1\n"
                 "(benchmarks); default: the built-in corpus (byte-level,\n"
                 "vocab 256; with --resume: the snapshot's data)"},
        {MAL_OPT_CHOICE, "data-format", .metavar = "F", .target = &o->data_format,
         .choices = data_formats, .values = data_format_values,
         .help = "auto, llmc, raw16, raw32 or megatron (default: auto:\n"
                 "Megatron when the .idx is there, llm.c when the header's\n"
                 "magic says so, else raw16)"},
        {MAL_OPT_CHOICE, "data-sampling", .metavar = "M", .target = &o->data_sampling,
         .choices = samplings, .values = sampling_values,
         .help = "epochs: every window of T+1 tokens once per epoch, in a\n"
                 "new seeded order each epoch (the default for --data);\n"
                 "random: windows at random offsets, with replacement (the\n"
                 "built-in corpus's)"},

        {MAL_OPT_SECTION, .help = "Validation and samples:"},
        {MAL_OPT_STRING, "val-data", .metavar = "SPEC", .target = &o->val_data_path,
         .help = "validation token files (as --data); default: the\n"
                 "built-in corpus's held-out part (when training on the\n"
                 "built-in corpus; training never samples it)"},
        {MAL_OPT_CHOICE, "val-data-format", .metavar = "F", .target = &o->val_data_format,
         .choices = data_formats, .values = data_format_values,
         .help = "as --data-format (default: auto)"},
        {MAL_OPT_DOUBLE, "val-fraction", .metavar = "F", .target = &o->val_fraction, .flo = 0,
         .fhi = 0.9,
         .help = "hold out the last F of every --data file (whole\n"
                 "documents of a Megatron dataset) as the validation data;\n"
                 "training never reads it (default: 0 = none)"},
        {MAL_OPT_INT, "eval-every", .metavar = "N", .target = &o->eval_every, .lo = 0,
         .hi = INT_MAX,
         .help = "validation loss every N steps and at the end (default: 0 =\n"
                 "never): val_loss in the metrics and the step line"},
        {MAL_OPT_INT, "eval-batches", .metavar = "K", .target = &o->eval_batches, .lo = 1,
         .hi = 1 << 20,
         .help = "validation batches of --global-batch sequences (default: 4);\n"
                 "the same K x global-batch sequences every time, on every plan"},
        {MAL_OPT_FLAG, "eval-only", .target = &o->eval_only, .ival = 1,
         .help = "report the validation loss and exit without training\n"
                 "(with --resume: the newest snapshot's; with\n"
                 "--sample-every: and a sample)"},
        {MAL_OPT_INT, "sample-every", .metavar = "N", .target = &o->sample_every, .lo = 0,
         .hi = INT_MAX,
         .help = "print a 64-token sample every N steps (default: 0 = never)"},
        {MAL_OPT_STRING, "sample-prompt", .metavar = "TEXT", .target = &o->sample_prompt,
         .help = "its prompt (default: a newline; token ids when the\n"
                 "vocabulary is not byte-level)"},

        {MAL_OPT_SECTION,
         .help = "Parallel layout (run under mpiexec or srun, one rank per device):"},
        {MAL_OPT_STRING, "plan", .metavar = "FILE", .target = &cli.plan_path,
         .help = "a plan file (malleus-plan/1: pipelines, stages, TP groups,\n"
                 "micro-batches per pipeline, suspended ranks)"},
        {MAL_OPT_INT, "dp", .metavar = "N", .target = &o->dp, .lo = 1, .hi = 1 << 20,
         .label = "--dp N --tp N --pp N",
         .help = "or the uniform Megatron-style layout (default: 1 1 1)"},
        {MAL_OPT_INT, "tp", .metavar = "N", .target = &o->tp, .lo = 1, .hi = 1 << 20},
        {MAL_OPT_INT, "pp", .metavar = "N", .target = &o->pp, .lo = 1, .hi = 1 << 20},

        {MAL_OPT_SECTION, .help = "Training:"},
        {MAL_OPT_INT64, "steps", .metavar = "N", .target = &o->steps, .lo = 0,
         .hi = LLONG_MAX / 65536, .help = "train until N optimizer steps are done (default: 100)"},
        {MAL_OPT_UINT64, "seed", .metavar = "S", .target = &o->seed, .lo = 0, .hi = LLONG_MAX,
         .help = "seed of initialisation and data order (default: 1234)"},
        {MAL_OPT_INT, "global-batch", .metavar = "N", .target = &o->global_batch, .lo = 1,
         .hi = 1 << 20, .help = "sequences per step (default: 16)"},
        {MAL_OPT_INT, "micro-batch", .metavar = "N", .target = &o->micro_batch, .lo = 1,
         .hi = 1 << 20, .given = &cli.micro_given,
         .help = "sequences per forward/backward (default: 4; a --plan\n"
                 "sets its own micro_batch_size)"},
        {MAL_OPT_FLOAT, "lr", .metavar = "X", .target = &op->lr, .flo = 1e-12, .fhi = 10,
         .help = "peak learning rate (default: 1e-3)"},
        {MAL_OPT_FLOAT, "min-lr-ratio", .metavar = "X", .target = &op->min_lr_ratio, .flo = 0,
         .fhi = 1, .help = "cosine floor as a fraction of --lr (default: 0.1)"},
        {MAL_OPT_INT, "warmup", .metavar = "N", .target = &op->warmup_steps, .lo = 0, .hi = INT_MAX,
         .help = "linear warmup steps (default: 10)"},
        {MAL_OPT_INT, "decay-steps", .metavar = "N", .target = &op->total_steps, .lo = 1,
         .hi = INT_MAX, .help = "length of the schedule (default: --steps)"},
        {MAL_OPT_FLOAT, "weight-decay", .metavar = "X", .target = &op->weight_decay, .flo = 0,
         .fhi = 10, .help = "AdamW decoupled weight decay on matrices (default: 0.1)"},
        {MAL_OPT_FLOAT, "beta1", .metavar = "X", .target = &op->beta1, .flo = 0, .fhi = 0.999999,
         .label = "--beta1 X, --beta2 X", .help = "Adam moments (default: 0.9, 0.95)"},
        {MAL_OPT_FLOAT, "beta2", .metavar = "X", .target = &op->beta2, .flo = 0, .fhi = 0.999999},
        {MAL_OPT_FLOAT, "adam-eps", .metavar = "X", .target = &op->eps, .flo = 1e-30, .fhi = 1,
         .help = "Adam epsilon (default: 1e-8)"},
        {MAL_OPT_FLOAT, "clip", .metavar = "X", .target = &op->grad_clip, .flo = 0, .fhi = 1e30,
         .help = "global gradient-norm clip, 0 = off (default: 1.0)"},
        {MAL_OPT_INT, "threads", .metavar = "N", .target = &o->threads, .lo = 1, .hi = 1024,
         .help = "BLAS threads (default: OpenBLAS's choice)"},
        {MAL_OPT_CHOICE, "recompute", .metavar = "MODE", .target = &o->recompute,
         .choices = recompute_modes, .values = recompute_values,
         .help = "activation recomputation on every stage, overriding\n"
                 "the plan's \"recompute\" fields: none (keep everything\n"
                 "the backward reads), selective (drop the norms' outputs\n"
                 "and the SwiGLU product, recomputed before each layer's\n"
                 "backward), full (keep only each layer's input; its\n"
                 "forward runs again before its backward).  The same\n"
                 "numbers, bit for bit; less memory, more time (default:\n"
                 "the plan's, else none)"},

        {MAL_OPT_SECTION, .help = "Backends:"},
        {MAL_OPT_STRING, "device", .metavar = "NAME", .target = &o->device, .help = device_help},
        {MAL_OPT_CHOICE, "precision", .metavar = "P", .target = &o->precision,
         .choices = precisions, .values = precision_values,
         .help = "fp32 or bf16: activations and working weights (master\n"
                 "weights, gradients and Adam moments are fp32 always;\n"
                 "default: bf16 on GPUs, fp32 on the CPU, where bf16 is\n"
                 "bf16 storage with fp32 arithmetic, for tests; fp32 on a\n"
                 "GPU is the CPU's arithmetic)"},
        {MAL_OPT_STRING, "comm", .metavar = "NAME", .target = &o->comm, .help = comm_help},
        {MAL_OPT_CHOICE, "dp-overlap", .metavar = "on|off", .target = &o->dp_overlap,
         .choices = on_off, .values = on_off_values,
         .help = "sum the data-parallel gradients in buckets posted\n"
                 "during the backward pass, as each bucket's layers\n"
                 "finish (on, the default), or after the whole backward\n"
                 "pass (off); on costs one more copy of the replicated\n"
                 "gradients in device memory"},
        {MAL_OPT_DOUBLE, "dp-bucket-mb", .metavar = "X", .target = &o->dp_bucket_mb, .flo = 0,
         .fhi = 1e6,
         .help = "with --dp-overlap on: MiB of gradients per bucket\n"
                 "(default: 25, as PyTorch DDP; 0: a bucket per layer)"},
        {MAL_OPT_INT, "zero", .metavar = "0|1", .target = &o->zero, .lo = 0, .hi = 1,
         .help = "1: shard the Adam moments over the holders of each\n"
                 "parameter slice (ZeRO-1): gradients reduce-scattered\n"
                 "(in the --dp-overlap buckets), each rank updates its\n"
                 "share, parameters all-gathered; snapshots write each\n"
                 "rank's share. 0: whole moments on every replica.\n"
                 "Default: 1 where the plan has more than one pipeline\n"
                 "(replicas), else 0"},
        {MAL_OPT_CHOICE, "zero-master", .metavar = "on|off", .target = &o->zero_master,
         .choices = on_off, .values = on_off_values,
         .help = "with --zero 1: shard the fp32 master weights too, as\n"
                 "the moments (each rank keeps its share; the updated\n"
                 "working weights are all-gathered in the compute\n"
                 "dtype). Only where the working weights are a separate\n"
                 "copy (bf16 compute): with fp32 compute they are the\n"
                 "master and `on` changes nothing. Default: as --zero\n"
                 "(on where the moments are sharded)"},

        {MAL_OPT_SECTION, .help = "Straggler monitor and adaptation:"},
        {MAL_OPT_CHOICE, "adapt", .metavar = "MODE", .target = &o->adapt, .choices = adapt_modes,
         .values = adapt_values,
         .help = "off, restart or online (default: off).  restart: on a\n"
                 "re-plan advice write a snapshot and exit with status 3;\n"
                 "online: plan anew and migrate the state in the job"},
        {MAL_OPT_INT, "check-every", .metavar = "K", .target = &o->check_every, .lo = 1,
         .hi = 1000000, .help = "steps between policy checks (default: 3)"},
        {MAL_OPT_INT, "window", .metavar = "W", .target = &o->window, .lo = 1, .hi = 1000,
         .help = "samples per check: a rate has moved when all W\n"
                 "agree (default: 2); the planner gets their mean"},
        {MAL_OPT_INT, "persist", .metavar = "P", .target = &o->persist, .lo = 1, .hi = 1000,
         .help = "a move must be seen at P checks in a row (default: 1)"},
        {MAL_OPT_DOUBLE, "change-cost", .metavar = "S", .target = &o->change_cost, .flo = 0,
         .fhi = 1e9,
         .help = "what a plan change costs, seconds: a change is made\n"
                 "only when the gain predicted over the remaining steps\n"
                 "exceeds it (default: measured at the last change of\n"
                 "the kind, else estimated; 0: every gain pays)"},
        {MAL_OPT_DOUBLE, "gap", .metavar = "X", .target = &o->gap, .flo = 1e-6, .fhi = 1000,
         .help = "re-plan when a rate moved by >= X from the plan's\n"
                 "(default: 0.3)"},
        {MAL_OPT_DOUBLE, "threshold", .metavar = "X", .target = &o->threshold, .flo = 1,
         .fhi = 1000, .help = "suspended ranks stay so while rate >= X (default: 1.2)"},
        {MAL_OPT_DOUBLE, "noise-floor", .metavar = "X", .target = &o->noise_floor, .flo = 1,
         .fhi = 1000, .help = "rates below X count as 1.0 (default: 1.2)"},
        {MAL_OPT_STRING, "baseline-rates", .metavar = "FILE", .target = &cli.baseline_rates,
         .help = "rates the plan was made with ({\"rank\": rate} or a\n"
                 "metrics file; default: all 1.0)"},
        {MAL_OPT_INT, "probe-size", .metavar = "N", .target = &o->probe_n, .lo = 8, .hi = 4096,
         .help = "size of the monitor's probe matmul (default: 192)"},
        {MAL_OPT_INT, "link-probe-every", .metavar = "N", .target = &o->link_probe_every,
         .lo = 0, .hi = 1000000,
         .help = "the link monitor: a ping-pong between the ranks that\n"
                 "share traffic every N steps, rates in the metrics\n"
                 "(default: 50; 0: off)"},
        {MAL_OPT_INT, "link-probe-bytes", .metavar = "B", .target = &o->link_probe_bytes,
         .lo = 1, .hi = 1 << 30, .help = "its message size (default: 65536)"},
        {MAL_OPT_DOUBLE, "link-noise-floor", .metavar = "X", .target = &o->link_noise_floor,
         .flo = 1, .fhi = 1000,
         .help = "link rates below X count as 1.0 (default: 2.0)"},
        {MAL_OPT_DOUBLE, "link-gap", .metavar = "G", .target = &o->link_gap, .flo = 0.01,
         .fhi = 20,
         .help = "a link's rate moved when it changed by 2^G times\n"
                 "(default: 1, a doubling or a halving)"},
        {MAL_OPT_INT, "ranks-per-node", .metavar = "N", .target = &o->ranks_per_node, .lo = 1,
         .hi = 1 << 20, .help = "node size for the online planner (default: all ranks)"},
        {MAL_OPT_DOUBLE, "device-memory-mb", .metavar = "X", .target = &o->device_memory_mb,
         .flo = 1, .fhi = 1e9, .help = "device memory for the online planner (default: 16384)"},
        {MAL_OPT_STRING, "planner-profile", .metavar = "P", .target = &o->profile,
         .help = "planner profile: preset or JSON file (default: --model)"},
        {MAL_OPT_DOUBLE, "planner-time-limit", .metavar = "S", .target = &o->planner_time_limit,
         .flo = -1, .fhi = 1e9,
         .help = "seconds the online planner searches before it takes the\n"
                 "best plan found (default: 5; -1: no limit)"},
        {MAL_OPT_FUNC, "inject", .metavar = "R:F[:FROM[:TO]]", .fn = mal_train_cli_inject,
         .help = "TEST FEATURE: slow rank R by factor F from step FROM\n"
                 "to step TO (0-based, TO exclusive), as --inject-mode\n"
                 "says; repeatable"},
        {MAL_OPT_FUNC, "inject-link", .metavar = "A:B:F[:FROM[:TO]]",
         .fn = mal_train_cli_inject_link,
         .help = "TEST FEATURE: every message between ranks A and B takes\n"
                 "F times its measured time (sleeps) from step FROM to TO:\n"
                 "stage-boundary sends, the TP all-reduces of a group\n"
                 "holding both, their gradient sum, the link monitor's\n"
                 "probe; repeatable"},
        {MAL_OPT_CHOICE, "inject-mode", .metavar = "MODE", .target = &o->inject_mode,
         .choices = inject_modes, .values = inject_mode_values,
         .help = "how --inject slows a rank: sleep (default: sleeps of\n"
                 "(F-1) x its measured compute; right when ranks share a\n"
                 "device) or gpu (a busy kernel takes the rank's GPU for\n"
                 "1 - 1/F of every 2 ms, for real; --device cuda, one\n"
                 "GPU per rank)"},

        {MAL_OPT_SECTION, .help = "Profiling:"},
        {MAL_OPT_STRING, "profile", .metavar = "FILE", .target = &cli.measure_path,
         .help = "measure a planner profile of --model on this machine\n"
                 "(layer time per TP size up to --tp, memory) into FILE\n"
                 "and exit; use it with malleus-replan --profile"},

        {MAL_OPT_SECTION, .help = "Snapshots and output:"},
        {MAL_OPT_STRING, "snapshot-dir", .metavar = "DIR", .target = &o->snapshot_dir,
         .help = "where snapshots go (a final one is written at the end)"},
        {MAL_OPT_INT, "snapshot-every", .metavar = "N", .target = &o->snapshot_every, .lo = 0,
         .hi = INT_MAX, .help = "also snapshot every N steps (default: 0 = end only)"},
        {MAL_OPT_INT, "keep", .metavar = "N", .target = &o->keep_snapshots, .lo = 0, .hi = INT_MAX,
         .help = "keep the newest N snapshots (default: 0 = all)"},
        {MAL_OPT_FLAG, "snapshot-async", .target = &o->snapshot_async, .ival = 1,
         .help = "write the --snapshot-every snapshots in the background:\n"
                 "the state is copied to pinned host memory (one more copy\n"
                 "of this rank's share of it) and training goes on while a\n"
                 "thread writes and commits it (needs MPI_THREAD_MULTIPLE)"},
        {MAL_OPT_FLAG, "resume", .target = &o->resume, .ival = 1,
         .help = "continue from the newest committed snapshot in\n"
                 "--snapshot-dir (found by looking; `latest` is a hint):\n"
                 "the flags left out take its run's values (model, data,\n"
                 "steps, seed, batch, schedule, AdamW, clip); a flag that\n"
                 "differs from them is refused (exit 2) unless --override\n"
                 "names it; more --steps than its run's keep its schedule\n"
                 "and need --override steps or an explicit --decay-steps"},
        {MAL_OPT_INT64, "resume-from", .metavar = "STEP", .target = &o->resume_from, .lo = 0,
         .hi = LLONG_MAX / 65536, .given = &cli.resume_from_given,
         .help = "continue from the snapshot of step STEP instead: a\n"
                 "rollback (implies --resume; the snapshots after STEP\n"
                 "must go: --overwrite-snapshots)"},
        {MAL_OPT_STRING, "init-from", .metavar = "SOURCE", .target = &o->init_from,
         .help = "start a new run from pretrained weights: a snapshot (any\n"
                 "plan; malleus-import's, or a run's) or a Hugging Face\n"
                 "checkpoint directory (read as malleus-import reads it).\n"
                 "Step 0, fresh optimizer state, this run's plan, batch,\n"
                 "schedule and data; the model is the source's (a --model\n"
                 "must have its shapes).  The fine-tuning path; not with\n"
                 "--resume"},
        {MAL_OPT_FLAG, "overwrite-snapshots", .target = &o->overwrite_snapshots, .ival = 1,
         .help = "let the snapshots in --snapshot-dir that this run would\n"
                 "bury go: without --resume every one (another run's),\n"
                 "with --resume-from those after STEP; they are deleted\n"
                 "at start.  Without it such a run is refused (exit 2)"},
        {MAL_OPT_STRING, "override", .metavar = "KEY[,KEY]", .target = &o->overrides,
         .help = "with --resume: settings that may differ from the\n"
                 "snapshot's run, by flag name (lr, steps, data, seed, ...;\n"
                 "seq_len, rope_theta, norm_eps of the model); each is\n"
                 "logged, in the metrics and the events"},
        {MAL_OPT_INT, "stop-timeout", .metavar = "S", .target = &cli.stop_timeout, .lo = 1,
         .hi = 86400,
         .help = "SIGTERM, SIGINT, SIGHUP or SIGUSR1 stop the run after\n"
                 "the step in progress with a snapshot (exit status 4); a\n"
                 "process still alive S seconds later exits with status 1\n"
                 "(default: 300); a second signal ends it at once"},
        {MAL_OPT_DOUBLE, "peer-timeout", .metavar = "S", .target = &cli.peer_timeout, .flo = 0,
         .fhi = 86400,
         .help = "a rank waiting for a peer (a collective, a receive)\n"
                 "whose heartbeat has been silent S seconds (its node\n"
                 "died or was stopped) ends the job with status 1,\n"
                 "naming the peer, instead of waiting for the launcher\n"
                 "(default: 10; 0: no heartbeat); a slow peer still beats"},
        {MAL_OPT_STRING, "metrics", .metavar = "FILE", .target = &o->metrics_path,
         .help = "one JSON object per step (appended to when resuming;\n"
                 "rows past the snapshot move to FILE.superseded)"},
        {MAL_OPT_STRING, "events", .metavar = "FILE", .target = &o->events_path,
         .help = "append a line for each resume, override and stop"},
        {MAL_OPT_INT, "log-every", .metavar = "N", .target = &o->log_every, .lo = 0, .hi = INT_MAX,
         .help = "print a step line every N steps (default: 1)"},
        {MAL_OPT_DOUBLE, "peak-tflops", .metavar = "X", .target = &o->peak_tflops, .flo = 1e-6,
         .fhi = 1e9,
         .help = "one device's peak TFLOP/s, for MFU in the step line and\n"
                 "the metrics (default: a table of known GPUs; none on CPUs)"},
        {MAL_OPT_FLAG, "quiet", .target = &cli.quiet, .ival = 1,
         .help = "no start-up table or step lines"},
        {MAL_OPT_FLAG, "verbose", .target = &cli.quiet, .ival = -1,
         .help = "also debug detail (every rank's share of an online\nmigration)"},
        {MAL_OPT_HELP, "help", 'h', .label = "-h, --help", .help = "this text"},
        {MAL_OPT_VERSION, "version", .help = "print the version"},
        {.kind = MAL_OPT_END},
    };
    static unsigned char given[MAL_ARRAY_SIZE(opts)];
    const mal_opts_spec spec = {
        .prog = "malleus-train",
        .version = PACKAGE_VERSION,
        .usage = "Usage: malleus-train [OPTIONS]\n"
                 "Train a LLaMA-style transformer language model.\n",
        .footer = "\nExamples:\n"
                  "  malleus-train --model tiny --steps 200 --snapshot-dir snap --metrics m.jsonl\n"
                  "  mpiexec -n 8 malleus-train --model tiny --dp 2 --tp 2 --pp 2 --steps 50\n"
                  "  mpiexec -n 8 malleus-train --model tiny --plan plan.json --metrics m.jsonl\n"
                  "\nExit status: 0 done; 1 the run failed (I/O, memory, MPI; also bad input\n"
                  "found only after steps were trained); 2 bad usage or input, refused before\n"
                  "anything is written (flags, model config, plan, data, snapshot; a snapshot\n"
                  "directory in use, not writable or holding another run's snapshots; --resume\n"
                  "with --steps below the snapshot's step; a resume that differs from its\n"
                  "snapshot's run; at its step, the run is complete: said, status 0); 3 stopped\n"
                  "with a snapshot because a re-plan is needed (--adapt restart); 4 stopped by\n"
                  "a signal with a snapshot of the last step done (--resume continues).\n",
        .opts = opts,
        .ctx = &cli,
        .given = given,
    };
    int rc = mal_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) return rc;
    return mal_train_cli_run(&cli, &spec, &argc, &argv);
}
