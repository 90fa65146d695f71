/* What malleus-train does once its flags are parsed: load the model config
 * and the plan, start the communication layer, check what needs the whole
 * job to check, build the trainer, run it, and turn the outcome into an
 * exit status (0 done, 1 failure, 2 bad usage or input, 3 stopped with a
 * snapshot for a re-plan, 4 stopped with a snapshot by a signal).  cmd/train_main.c holds the option table that
 * fills a mal_train_cli and calls mal_train_cli_run; a new flag is a field
 * here or in mal_train_options and a line there. */
#ifndef MAL_TRAIN_CLI_H
#define MAL_TRAIN_CLI_H

#include "base/opts.h"
#include "train.h"

enum { MAL_TRAIN_CLI_MAX_INJECT = 64, MAL_TRAIN_EXIT_REPLAN = 3, MAL_TRAIN_EXIT_STOPPED = 4 };

/* --stop-timeout's default, seconds (preempt.h): room for the step in
 * progress and a snapshot of a large model on a busy file system. */
enum { MAL_TRAIN_STOP_TIMEOUT_DEFAULT = 300 };

/* Everything the command line sets.  Caller-owned; strings point into argv. */
typedef struct {
    mal_train_options o;
    const char *model;          /* --model PRESET|FILE (default "tiny") */
    const char *plan_path;      /* --plan FILE */
    const char *baseline_rates; /* --baseline-rates FILE */
    const char *measure_path;   /* --profile FILE: measure a planner profile and exit */
    int quiet;                  /* 1: --quiet, -1: --verbose */
    int micro_given;            /* --micro-batch was given */
    int model_from_snapshot;    /* --resume or --init-from without --model: the source's */
    int stop_timeout;           /* --stop-timeout seconds (preempt.h) */
    double peer_timeout;        /* --peer-timeout seconds, 0 off (comm/watch.h) */
    int resume_from_given;      /* --resume-from was given (it implies --resume) */
    mal_inject injects[MAL_TRAIN_CLI_MAX_INJECT];
    mal_inject_link inject_links[MAL_TRAIN_CLI_MAX_INJECT];
} mal_train_cli;

/* Local.  Defaults: mal_train_defaults() and model "tiny". */
void mal_train_cli_init(mal_train_cli *cli);

/* Local.  The --inject option's handler (MAL_OPT_FUNC; spec->ctx is the
 * mal_train_cli): RANK:FACTOR[:FROM[:TO]], at most
 * MAL_TRAIN_CLI_MAX_INJECT times.  0, or exit status 2 with the message
 * printed. */
int mal_train_cli_inject(const mal_opts_spec *spec, const char *arg);
/* Local.  The --inject-link option's handler, the same way:
 * A:B:FACTOR[:FROM[:TO]] with A != B. */
int mal_train_cli_inject_link(const mal_opts_spec *spec, const char *arg);

/* Local.  --help texts for --device and --comm, listing the backends of
 * this build (kernels.h and comm.h registries). */
void mal_train_cli_backends_help(char *dev, size_t dev_len, char *comm, size_t comm_len);

/* Collective over all processes of the job (it initialises and finalises
 * the communication layer; argc/argv go to it).  Run what cli describes and
 * return the exit status; messages go to stdout/stderr (rank 0 speaks for
 * mistakes every rank detects alike).  With --resume, the flags the
 * command line left out (spec->given says which; without it, none) take
 * the snapshot's values.  Installs the stop-request handlers
 * (train/preempt.h) once the communication layer is up. */
int mal_train_cli_run(mal_train_cli *cli, const mal_opts_spec *spec, int *argc, char ***argv);

#endif /* MAL_TRAIN_CLI_H */
