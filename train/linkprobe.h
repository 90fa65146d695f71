/* The per-link monitor (linkprobe.c): an active ping-pong between the rank
 * pairs that share traffic in the plan in force, every K steps, and the
 * per-link slowness rates rank 0 derives from it.  Not installed. */
#ifndef MAL_TRAIN_LINKPROBE_H
#define MAL_TRAIN_LINKPROBE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

struct mal_trainer;
struct mal_policy;

/* Defaults (README "--link-probe-every"): a probe every 50 steps; per
 * pair the least of 3 bursts of 8 messages of 64 KiB, and of the last 4
 * probes; rates below 2.0 count as 1.0. */
enum {
    MAL_LINK_PROBE_EVERY_DEFAULT = 50,
    MAL_LINK_PROBE_BYTES_DEFAULT = 65536,
    MAL_LINK_PROBE_REPS = 3,
    MAL_LINK_PROBE_BURST = 8,
    MAL_LINK_PROBE_KEEP = 4
};
#define MAL_LINK_NOISE_FLOOR_DEFAULT 2.0
/* A link's rate has moved when it doubled or halved (--link-gap 1). */
#define MAL_LINK_GAP_DEFAULT 1.0

/* Owned by linkprobe.c (mal_linkprobe_init / _fini). */
typedef struct {
    int every;          /* probe every `every` steps (0: never) */
    size_t bytes;       /* the ping-pong's message size */
    int reps;           /* timed bursts per pair and probe */
    double noise_floor; /* rates below count as 1.0 */
    int burst;          /* messages per burst (at most MAL_LINK_PROBE_BURST) */
    void *buf[2];       /* device buffers of `bytes` */
    int n_pairs;        /* the pairs of the plan in force */
    int *pairs;         /* [2 n_pairs]: a < b, sorted */
    int *round;         /* [n_pairs]: the round each pair runs in */
    double *rtt_row;    /* [world]: this rank's least round trip to each higher peer */
    double cost_s;      /* wall time this rank's last probe took */
    /* rank 0 */
    double *rtt_all;           /* [world x world] gathered rows */
    double *rtt;               /* [n_pairs] the last probe's round trips, seconds */
    double *hist;              /* [n_pairs x MAL_LINK_PROBE_KEEP] the last probes' */
    double *least;             /* [n_pairs] the least of them */
    double *scratch;           /* [n_pairs] */
    double *rates;             /* [n_pairs] rates now: least over the median pair's
                                * (NaN: not measured) */
    struct mal_policy *policy; /* over the pairs, one sample per probe */
    double *known;             /* [world x world] each pair's latest windowed rate, kept
                                * across plan changes (0: never measured) */
    long n_probes;             /* probes so far (the policy's clock) */
    int advised;               /* the last probe advised a re-plan (a link moved) */
    int pending;               /* a link moved since the plan's baseline was set: the next
                                * check step advises a re-plan (--adapt) */
    int trigger_pair;          /* its pair (-1: none) */
} mal_linkprobe;

/* Local, on every rank (a no-op without MPI or with one rank): buffers,
 * the pairs of the plan in force and rank 0's policy.  _fini (local) frees
 * them; after a failed _init too. */
int mal_linkprobe_init(struct mal_trainer *tr);
void mal_linkprobe_fini(struct mal_trainer *tr);

/* Local: whether step `step` (0-based, the one just done) probes the links. */
int mal_linkprobe_due(const struct mal_trainer *tr, int64_t step);

/* Collective over the world, on every rank at the same step boundary
 * (after a step-wide collective released them together): ping-pong with
 * each peer of the plan in force, gather the round trips on rank 0 and
 * turn them into rates (tr->mon.link); *cost_s: this rank's wall time. */
int mal_linkprobe_run(struct mal_trainer *tr, double *cost_s);

struct mal_links;
/* Local; rank 0: the slow links now (each pair's windowed, floored rate
 * as last measured, under this plan or an earlier one, above 1) into *ln
 * (owned by the caller: mal_links_fini). */
int mal_linkprobe_links(const struct mal_trainer *tr, struct mal_links *ln);
/* Local; rank 0 (a no-op elsewhere): the links' rates now become the
 * policy's baseline (after a re-plan, or a decision to keep the plan). */
int mal_linkprobe_rebase(struct mal_trainer *tr);

/* Link figures of the whole job (malleus-train --profile): every rank
 * pair's latency (half the least round trip of a 1-byte message) and
 * bandwidth (a burst of 8 x 64 KiB, less that round trip), by the same
 * handshake and ping-pong as the monitor; the medians of the pairs within
 * a node and of those between nodes (0 where there are none). */
typedef struct mal_link_figures {
    double latency, bandwidth;           /* s, bytes/s */
    double node_latency, node_bandwidth; /* between nodes */
    int n;                               /* rank 0: the pairs */
    double *pair; /* rank 0: [n x 5] a, b, latency, bandwidth, 1 between nodes (else 0) */
} mal_link_figures;

/* Collective over `world` (every rank, its kernel instance k for the
 * buffers); the figures on rank 0 (*out owned by the caller, freed with
 * mal_link_figures_fini; zero for one rank). */
struct mal_comm;
int mal_linkprobe_figures(struct mal_comm *world, mal_kern k, mal_link_figures *out);
void mal_link_figures_fini(mal_link_figures *f);

#endif /* MAL_TRAIN_LINKPROBE_H */
