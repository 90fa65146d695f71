/* A resumed run is the run its snapshot was written by (resume.c).
 *
 * A snapshot stores the model config and every setting that gives the run
 * its meaning: the data (its files' paths, sizes and fingerprints, data.h),
 * the seed, the global batch, the learning rate and its schedule, AdamW's
 * settings, the clip and the number of steps.  On --resume they become the
 * defaults of the flags the command line leaves out
 * (mal_resume_source_read, mal_resume_apply_defaults), and the run is
 * checked against them (mal_train_resume_check): a difference is refused
 * with the list of every difference, unless --override names it; accepted
 * differences are logged, in the metrics (the first row after the resume)
 * and in the events file.
 *
 * --steps beyond the snapshot's is a difference like the others: the
 * schedule is part of the run, so a longer run keeps the snapshot's decay
 * length (--decay-steps; the learning rate stays at its floor after it)
 * and must say so, with --override steps or an explicit --decay-steps
 * (itself a difference when it is not the snapshot's).  --steps below the
 * snapshot's only stops earlier on the same curve.
 *
 * Also here: the settings stored in each snapshot (mal_train_settings_json),
 * the metrics file of a resumed run, whose rows after the snapshot's step
 * (written before a crash) move to METRICS.superseded so that every step
 * appears once, and the events file (--events).  Not installed. */
#ifndef MAL_TRAIN_RESUME_H
#define MAL_TRAIN_RESUME_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/snapshot.h"
#include "comm/comm.h"
#include "src/config.h"
#include "src/data.h"
#include "train.h"

struct mal_trainer;

/* What a snapshot says about the run that wrote it. */
typedef struct {
    char path[4096];        /* the step directory */
    int64_t step;           /* its step */
    mal_model_config model; /* its model */
    json_t *settings;       /* its training settings (owned) */
} mal_resume_source;

/* Collective over `world` (NULL: one process).  Read the snapshot a
 * --resume from `snapshot_dir` continues: the newest committed one, or
 * that of `step` (>= 0: --resume-from) (rank 0 reads, every rank gets the
 * same); every rank returns the same code.  _fini releases it (after the
 * options that point into it are no longer used). */
int mal_resume_source_read(mal_resume_source *rs, const char *snapshot_dir, int64_t step,
                           mal_comm *world);
void mal_resume_source_fini(mal_resume_source *rs);

/* Local.  Fill every option that the command line did not give
 * (given(ctx, FLAG) == 0, FLAG a long flag name: "model", "data", "steps",
 * "lr", ...) from the snapshot's run; strings point into rs.  The names of
 * the flags so filled go to `taken` ("model, data, steps, ..."). */
int mal_resume_apply_defaults(const mal_resume_source *rs, mal_train_options *o,
                              int (*given)(void *ctx, const char *flag), void *ctx, char *taken,
                              size_t taken_len);

/* Owned by resume.c (mal_train_resume_init / _fini). */
typedef struct {
    mal_data_file_id *data_ids; /* the training data's identity */
    int n_data_ids;
    int64_t resumed_from; /* the snapshot's step, until the first metrics row says so
                           * (-1: nothing to record) */
    char *overrides_json; /* {"KEY": [snapshot, this run], ...} of the accepted
                           * differences (NULL: none) */
    char *init_from_json; /* where the run's parameters came from (init_from.h), stored
                           * in every snapshot's settings as "init_from" and carried on
                           * by a resume (NULL: drawn at random) */
} mal_train_resume;

/* Local.  Check o->overrides names known settings (MAL_EINVAL naming the
 * ones there are), and only with o->resume. */
int mal_train_resume_check_options(const mal_train_options *o);

/* Local.  After the data is open: its identity.  _fini releases it. */
int mal_train_resume_init(struct mal_trainer *tr);
void mal_train_resume_fini(struct mal_trainer *tr);

/* Local; every rank checks alike.  Check the run against the snapshot at
 * `path` it resumes from (meta read from it): MAL_EMISMATCH when a setting
 * differs that o->overrides does not name (rank 0 prints the list of all
 * differences; the error message names them too), MAL_EFORMAT when the
 * snapshot's settings are unreadable, MAL_EINVAL for a weights-only
 * snapshot (an import: no run to continue; --init-from starts one); the
 * accepted differences are logged and recorded for the metrics and the
 * events file, and the record of where the run's weights came from is
 * carried on. */
int mal_train_resume_check(struct mal_trainer *tr, const mal_snap_meta *meta, const char *path);

/* Local.  The training settings stored in a snapshot (JSON text; caller
 * frees), NULL when out of memory. */
char *mal_train_settings_json(const struct mal_trainer *tr);

/* Local (rank 0).  Open the metrics file: truncated for a new run; for a
 * resumed one appended to, after its rows past the resumed step (written
 * before a crash, now superseded) have moved to METRICS.superseded, each
 * marked "superseded": true and "resumed_from": STEP, so that every step
 * appears once. */
int mal_train_metrics_open(struct mal_trainer *tr, FILE **out);

/* Local (rank 0).  Append the resume's record to the metrics row being
 * written (", \"resumed_from\": S[, \"overrides\": {...}]"), once. */
void mal_train_resume_metrics(struct mal_trainer *tr, FILE *f);

/* Local; rank 0 only, others return.  Log `fmt` at `level` and append it
 * to the events file (--events), "malleus-train: " in front. */
void mal_train_event(const struct mal_trainer *tr, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* MAL_TRAIN_RESUME_H */
