/* Interval arithmetic over how layouts shard a tensor.
 *
 * Each rank that holds (part of) a tensor holds one interval [begin, end)
 * along the tensor's split axis (the whole axis if it holds a replica).  Given
 * every holding of one tensor — across the pipelines of one plan, or across
 * two plans — the *finest common partition* cuts the axis at every holding's
 * boundaries; each resulting piece has one set of holders.  Data-parallel
 * gradient sync (sum each piece over its holders), offline resharding and
 * online migration (copy each piece from an old holder to its new holders)
 * are all computations over these pieces.
 */
#ifndef MAL_SLICES_H
#define MAL_SLICES_H

#include <stdint.h>

typedef struct {
    int rank;            /* world rank */
    int group;           /* pipeline index (replica), or layout id (0 old, 1 new) */
    int64_t begin, end;  /* [begin, end) along the split axis */
    int sub;             /* within a group: holders with the same sub hold
                          * copies of the same gradient (a TP group's
                          * replicas of a norm weight); holders with
                          * different subs each hold a part of it (the
                          * replicas of a key/value head that TP ranks
                          * share, the two stages that hold a tied
                          * embedding), summed by the gradient sync */
} mal_slice_holding;

typedef struct {
    int64_t begin, end; /* the piece */
    int n_holders;
    int first;          /* its holders are map->holders[first .. first+n_holders) */
} mal_slice_piece;

typedef struct {
    int n_pieces;
    mal_slice_piece *pieces;  /* ascending, disjoint, covering every held point */
    int *holders;             /* indices into the holdings array, sorted by (group, rank) */
} mal_slice_map;

/* Local.  Partition [0, axis_len) by the n holdings.  Adjacent elementary
 * intervals with the same holder set are merged, so the pieces are as few
 * as possible; points nobody holds produce no piece.  Holdings must lie
 * inside [0, axis_len) and be non-empty (MAL_EINVAL otherwise).  `out` is
 * caller storage; free with mal_slices_fini. */
int mal_slices_partition(const mal_slice_holding *h, int n, int64_t axis_len, mal_slice_map *out);
void mal_slices_fini(mal_slice_map *m);

#endif /* MAL_SLICES_H */
