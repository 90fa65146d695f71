/* What --data names: a comma-separated list of items, each a path or a
 * glob with an optional weight (PATH[:WEIGHT]), turned into the list of
 * token files and the blend components they belong to (data.h describes
 * the grammar).  Globs are expanded here, sorted byte-wise so that every
 * rank and every locale sees the same files in the same order. */
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mal.h"
#include "data_internal.h"

void mal_data_spec_fini(mal_data_spec *s)
{
    for (int i = 0; i < s->n_files; i++)
        free(s->paths[i]);
    free(s->paths);
    free(s->comp_of);
    free(s->weights);
    memset(s, 0, sizeof *s);
}

static int add_file(mal_data_spec *s, const char *path, int comp, int *cap)
{
    if (s->n_files >= MAL_DATA_MAX_FILES)
        return MAL_ERR(MAL_EINVAL, "--data names more than %d token files: merge some of them",
                       MAL_DATA_MAX_FILES);
    if (s->n_files == *cap) {
        int nc = *cap ? 2 * *cap : 16;
        char **p = realloc(s->paths, (size_t)nc * sizeof *p);
        if (p) s->paths = p;
        int *c = p ? realloc(s->comp_of, (size_t)nc * sizeof *c) : NULL;
        if (c) s->comp_of = c;
        if (!p || !c) return MAL_ERR(MAL_ENOMEM, "out of memory listing the token files");
        *cap = nc;
    }
    if (!(s->paths[s->n_files] = strdup(path)))
        return MAL_ERR(MAL_ENOMEM, "out of memory listing the token files");
    s->comp_of[s->n_files++] = comp;
    return 0;
}

static int byte_order(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A glob's match that is not a token file of its own: a Megatron index
 * whose .bin is beside it (a glob matching everything in a folder stands
 * for the data set once, through its .bin), or a token record. */
static int is_companion(const char *path)
{
    size_t n = strlen(path), r = strlen(MAL_DATA_RECORD_SUFFIX);
    if (n > r && strcmp(path + n - r, MAL_DATA_RECORD_SUFFIX) == 0) return 1;
    if (n < 5 || strcmp(path + n - 4, ".idx") != 0) return 0;
    char *bin = strdup(path);
    if (!bin) return 0;
    strcpy(bin + n - 4, ".bin");
    int yes = access(bin, F_OK) == 0;
    free(bin);
    return yes;
}

/* The files of one item: the path itself, or a glob's matches. */
static int expand(mal_data_spec *s, const char *item, const char *path, int comp, int *cap)
{
    if (!strpbrk(path, "*?[")) return add_file(s, path, comp, cap);
    glob_t g;
    memset(&g, 0, sizeof g);
    /* GLOB_NOSORT and our own byte-wise sort: glob's order follows the
     * locale's collation, which may differ between the ranks' nodes. */
    int grc = glob(path, GLOB_NOSORT, NULL, &g), rc = 0;
    if (grc == GLOB_NOMATCH) {
        rc = MAL_ERR(MAL_ENOENT, "--data item '%s': the pattern %s matches no file", item, path);
    } else if (grc != 0) {
        rc = MAL_ERR(grc == GLOB_NOSPACE ? MAL_ENOMEM : MAL_EIO,
                     "--data item '%s': cannot expand the pattern %s", item, path);
    } else {
        qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, byte_order);
        for (size_t i = 0; i < g.gl_pathc && !rc; i++)
            if (!is_companion(g.gl_pathv[i])) rc = add_file(s, g.gl_pathv[i], comp, cap);
    }
    globfree(&g);
    return rc;
}

/* Split "PATH:WEIGHT" when the text after the last ':' is a number
 * (anything strtod reads whole, so "nan" and "0" too: they are refused
 * below, with the item named, rather than read as part of a path). */
static int split_weight(char *item, double *w)
{
    char *colon = strrchr(item, ':');
    if (!colon || colon == item || !colon[1]) return 0;
    char *end = NULL;
    errno = 0;
    double v = strtod(colon + 1, &end);
    if (*end || end == colon + 1) return 0;
    *colon = '\0';
    *w = v;
    return 1;
}

int mal_data_spec_parse(mal_data_spec *s, const char *spec)
{
    int rc = 0, cap = 0, weighted = -1;
    char *copy = NULL;
    memset(s, 0, sizeof *s);
    if (!spec || !*spec) return MAL_ERR(MAL_EINVAL, "--data is empty: name a token file");
    if (!(copy = strdup(spec))) return MAL_ERR(MAL_ENOMEM, "out of memory reading --data");
    int n_items = 1;
    for (const char *p = spec; *p; p++)
        n_items += *p == ',';
    if (!(s->weights = calloc((size_t)n_items, sizeof *s->weights))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory reading --data");
        goto fail;
    }
    char *save = NULL;
    int k = 0;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save), k++) {
        /* a copy of the item as written, for messages */
        char shown[512];
        snprintf(shown, sizeof shown, "%s", item);
        double w = 1;
        int has_w = split_weight(item, &w);
        if (weighted >= 0 && has_w != weighted) {
            rc = MAL_ERR(MAL_EINVAL,
                         "--data item '%s' %s a weight but an earlier one %s: give every item "
                         "a weight (PATH:WEIGHT, a blend) or none (the files are read as one)",
                         shown, has_w ? "has" : "has no", has_w ? "has none" : "has one");
            goto fail;
        }
        weighted = has_w;
        if (!(w > 0) || !isfinite(w)) {
            rc = MAL_ERR(MAL_EINVAL,
                         "--data item '%s': weight %g must be a positive finite number (a "
                         "component that should not be read is left out of the list)",
                         shown, w);
            goto fail;
        }
        int dummy;
        if (mal_data_synth_spec(item, &dummy) != 0) {
            rc = MAL_ERR(MAL_EINVAL,
                         "--data item '%s': synthetic data cannot be listed with token files "
                         "(a file with that name can be given as ./%s)",
                         shown, item);
            goto fail;
        }
        /* unweighted items are one component: the files read as one */
        int comp = has_w ? k : 0;
        s->weights[comp] = w;
        if ((rc = expand(s, shown, item, comp, &cap))) goto fail;
    }
    if (k == 0) {
        rc = MAL_ERR(MAL_EINVAL, "--data '%s' names no file", spec);
        goto fail;
    }
    s->n_comps = weighted ? k : 1;
    /* weights as shares of the whole */
    double total = 0;
    for (int c = 0; c < s->n_comps; c++)
        total += s->weights[c];
    for (int c = 0; c < s->n_comps; c++)
        s->weights[c] /= total;
    free(copy);
    return 0;
fail:
    free(copy);
    mal_data_spec_fini(s);
    return rc;
}
