/* The finest common partition against brute force: for random holdings,
 * every point of the axis lies in exactly one piece iff somebody holds it,
 * that piece's holders are exactly the holdings covering the point, sorted
 * by (group, rank), and no two touching pieces have the same holders. */
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "mal_test.h"
#include "src/slices.h"

static void check_case(const mal_slice_holding *h, int n, int64_t len)
{
    mal_slice_map m;
    CHECK_OK(mal_slices_partition(h, n, len, &m));
    int *want = malloc(sizeof(int) * (size_t)(n + 1));
    for (int64_t x = 0; x < len; x++) {
        int nw = 0;
        for (int i = 0; i < n; i++)
            if (h[i].begin <= x && x < h[i].end) want[nw++] = i;
        int found = -1;
        for (int p = 0; p < m.n_pieces; p++)
            if (m.pieces[p].begin <= x && x < m.pieces[p].end) {
                CHECK(found < 0); /* disjoint */
                found = p;
            }
        if (nw == 0) {
            CHECK(found < 0);
            continue;
        }
        CHECK(found >= 0);
        const mal_slice_piece *pc = &m.pieces[found];
        CHECK_EQ_INT(pc->n_holders, nw);
        for (int j = 0; j < nw; j++) {
            int got = m.holders[pc->first + j];
            int present = 0;
            for (int k = 0; k < nw; k++) present |= want[k] == got;
            CHECK(present);
            if (j > 0) {
                const mal_slice_holding *a = &h[m.holders[pc->first + j - 1]], *b = &h[got];
                CHECK(a->group < b->group || (a->group == b->group && a->rank <= b->rank));
            }
        }
    }
    for (int p = 0; p + 1 < m.n_pieces; p++) {
        const mal_slice_piece *a = &m.pieces[p], *b = &m.pieces[p + 1];
        CHECK(a->end <= b->begin);
        if (a->end == b->begin && a->n_holders == b->n_holders)
            CHECK(memcmp(m.holders + a->first, m.holders + b->first,
                         sizeof(int) * (size_t)a->n_holders) != 0); /* maximal merge */
    }
    free(want);
    mal_slices_fini(&m);
}

int main(void)
{
    /* A worked example: wq rows [0, 64) held by a TP-2 stage (ranks 0, 1) in
     * pipeline 0 and a TP-4 stage (ranks 2..5) in pipeline 1. */
    mal_slice_holding ex[] = {{0, 0, 0, 32, 0},  {1, 0, 32, 64, 0}, {2, 1, 0, 16, 0},
                              {3, 1, 16, 32, 0}, {4, 1, 32, 48, 0}, {5, 1, 48, 64, 0}};
    mal_slice_map m;
    CHECK_OK(mal_slices_partition(ex, 6, 64, &m));
    CHECK_EQ_INT(m.n_pieces, 4);
    CHECK_EQ_INT(m.pieces[1].begin, 16);
    CHECK_EQ_INT(m.pieces[1].n_holders, 2);
    CHECK_EQ_INT(ex[m.holders[m.pieces[1].first]].rank, 0);
    CHECK_EQ_INT(ex[m.holders[m.pieces[1].first + 1]].rank, 3);
    mal_slices_fini(&m);

    /* Bad holdings are refused. */
    mal_slice_holding bad[] = {{0, 0, 10, 5, 0}};
    CHECK(mal_slices_partition(bad, 1, 64, &m) == MAL_EINVAL);
    mal_slice_holding out_of_range[] = {{0, 0, 0, 65, 0}};
    CHECK(mal_slices_partition(out_of_range, 1, 64, &m) == MAL_EINVAL);

    /* Random cases, including replicas (whole axis), gaps and duplicates. */
    for (uint64_t t = 0; t < 400; t++) {
        int n = 1 + (int)mal_rng_below(1, t, 0, 12);
        int64_t len = 1 + (int64_t)mal_rng_below(1, t, 1, 40);
        mal_slice_holding h[12];
        for (int i = 0; i < n; i++) {
            int64_t a = (int64_t)mal_rng_below(2, t, (uint64_t)i, (uint64_t)len);
            int64_t b = a + 1 + (int64_t)mal_rng_below(3, t, (uint64_t)i, (uint64_t)(len - a));
            if (mal_rng_below(4, t, (uint64_t)i, 4) == 0) a = 0, b = len;
            h[i] = (mal_slice_holding){(int)mal_rng_below(5, t, (uint64_t)i, 8),
                                       (int)mal_rng_below(6, t, (uint64_t)i, 3), a, b, 0};
        }
        check_case(h, n, len);
    }
    printf("slices: worked example and 400 random cases agree with brute force\n");
    return 0;
}
