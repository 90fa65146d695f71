/* Planner input: the straggling rate of every rank, from a hand-written
 * {"rank": rate} map or from the JSON-lines metrics file of malleus-train
 * (the mean of each rank's last samples; schema in replan/README.md,
 * "Straggling rates"). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/json.h"
#include "base/mal.h"
#include "replan.h"

/* A rate value: a JSON number, or a string holding one (so that "nan" or
 * "inf" written by hand get a precise message instead of a parse error). */
static int rate_value(json_t *v, const char *what, long rank, double *out)
{
    double x;
    if (json_is_number(v)) {
        x = json_number_value(v);
    } else if (json_is_string(v)) {
        char *end;
        const char *s = json_string_value(v);
        x = strtod(s, &end);
        if (end == s || *end)
            return MAL_ERR(MAL_EINVAL, "%s: rank %ld has rate \"%s\", which is not a number", what,
                           rank, s);
    } else {
        return MAL_ERR(MAL_EINVAL, "%s: rank %ld: the rate must be a number, not %s", what, rank,
                       json_is_null(v) ? "null" : "a JSON array, object or boolean");
    }
    if (isnan(x) || isinf(x) || x <= 0)
        return MAL_ERR(
            MAL_EINVAL,
            "%s: rank %ld has rate %g; rates must be finite and > 0 (1.0 = healthy, 2.0 = "
            "twice as slow)",
            what, rank, x);
    *out = x;
    return 0;
}

static int parse_rank_key(const char *key, const char *what, int world, long *rank)
{
    /* the rank in decimal digits and nothing else: " 3", "+3" or "03"
     * would be a second key for rank 3, and one of the two would be lost */
    size_t n = strlen(key);
    if (n == 0 || strspn(key, "0123456789") != n || (key[0] == '0' && n > 1))
        return MAL_ERR(MAL_EINVAL,
                       "%s: key \"%s\" is not a rank number (decimal digits, no sign, spaces or "
                       "leading zeros)",
                       what, key);
    char *end;
    errno = 0;
    long r = strtol(key, &end, 10);
    /* the key as written: a number past long is out of range, not LONG_MAX */
    if (errno == ERANGE || r >= world)
        return MAL_ERR(MAL_EINVAL, "%s: rank %s is not in the cluster (world size %d, ranks 0..%d)",
                       what, key, world, world - 1);
    *rank = r;
    return 0;
}

int mal_rates_parse_buffer(const char *buf, size_t len, const char *what, int world, int window,
                           double *rates)
{
    int rc = 0;
    double *ring = NULL;
    int *count = NULL;
    for (int r = 0; r < world; r++)
        rates[r] = 1.0;
    if (window < 1) window = 1;
    if (memchr(buf, '\0', len))
        return MAL_ERR(MAL_EFORMAT, "%s: the rates contain a NUL byte (not a text file?)", what);

    /* the whole text as one JSON value: a {"rank": rate} map (text that is
     * not one value is read as JSON lines below, so no message here) */
    json_t *root;
    mal_json_parse(buf, len, NULL, &root);
    /* a map is one JSON value; one that parses only with a key twice is
     * refused with the parser's message, which names the key (JSON lines
     * are read per line below, where the same holds) */
    if (!root && mal_json_is_duplicate_key(buf, len))
        return mal_json_parse(buf, len, what, &root);
    if (root && json_is_object(root) && !json_object_get(root, "step") &&
        !json_object_get(root, "rates") && !json_object_get(root, "rate")) {
        const char *key;
        json_t *val;
        json_object_foreach(root, key, val)
        {
            long r = 0;
            if ((rc = parse_rank_key(key, what, world, &r))) break;
            if ((rc = rate_value(val, what, r, &rates[r]))) break;
        }
        json_decref(root);
        return rc;
    }
    json_decref(root);

    /* JSON lines: keep the last `window` samples of every rank; there are
     * no more samples per rank than lines, which bounds the ring */
    size_t n_lines = 1;
    for (size_t i = 0; i < len; i++)
        n_lines += buf[i] == '\n';
    if ((size_t)window > n_lines) window = (int)n_lines;
    ring = calloc((size_t)world * (size_t)window, sizeof *ring);
    count = calloc((size_t)world, sizeof *count);
    if (!ring || !count) {
        rc = MAL_ERR(MAL_ENOMEM, "%s: out of memory", what);
        goto cleanup;
    }
    /* each line is parsed where it lies in the buffer, bounded by its end */
    const char *end = buf + len;
    int lineno = 0, n_samples = 0;
    for (const char *line = buf, *next; line; line = next) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        next = eol ? eol + 1 : NULL;
        if (!eol) eol = end;
        lineno++;
        const char *s = line;
        while (s < eol && (*s == ' ' || *s == '\t' || *s == '\r'))
            s++;
        if (s == eol) continue;
        json_t *o;
        mal_json_parse(s, (size_t)(eol - s), NULL, &o);
        if (!o && mal_json_is_duplicate_key(s, (size_t)(eol - s))) {
            char lw[600];
            snprintf(lw, sizeof lw, "%s: line %d", what, lineno);
            rc = mal_json_parse(s, (size_t)(eol - s), lw, &o);
            goto cleanup;
        }
        if (!o || !json_is_object(o)) {
            json_decref(o);
            rc =
                MAL_ERR(MAL_EFORMAT,
                        "%s: line %d is not a JSON object (expected a {\"rank\": rate} map or JSON "
                        "lines with \"rates\")",
                        what, lineno);
            goto cleanup;
        }
        json_t *arr = json_object_get(o, "rates");
        json_t *one = json_object_get(o, "rate");
        if (arr) {
            if (!json_is_array(arr)) {
                json_decref(o);
                rc = MAL_ERR(MAL_EFORMAT, "%s: line %d: \"rates\" must be an array indexed by rank",
                             what, lineno);
                goto cleanup;
            }
            size_t n_rates = json_array_size(arr); /* arr dies with o */
            if (n_rates > (size_t)world) {
                json_decref(o);
                rc = MAL_ERR(MAL_EINVAL,
                             "%s: line %d: rates for %zu ranks, but rank %d is not in the cluster "
                             "(world size %d)",
                             what, lineno, n_rates, world, world);
                goto cleanup;
            }
            for (size_t r = 0; r < json_array_size(arr); r++) {
                json_t *v = json_array_get(arr, r);
                if (json_is_null(v)) continue; /* not measured this step */
                double x;
                if ((rc = rate_value(v, what, (long)r, &x))) {
                    json_decref(o);
                    goto cleanup;
                }
                ring[r * (size_t)window + (size_t)(count[r] % window)] = x;
                count[r]++;
            }
            n_samples++;
        } else if (one) {
            json_t *rk = json_object_get(o, "rank");
            if (!json_is_integer(rk)) {
                json_decref(o);
                rc = MAL_ERR(MAL_EFORMAT, "%s: line %d: \"rate\" without an integer \"rank\"", what,
                             lineno);
                goto cleanup;
            }
            long r = (long)json_integer_value(rk);
            if (r < 0 || r >= world) {
                json_decref(o);
                rc = MAL_ERR(MAL_EINVAL,
                             "%s: line %d: rank %ld is not in the cluster (world size %d)", what,
                             lineno, r, world);
                goto cleanup;
            }
            double x;
            if ((rc = rate_value(one, what, r, &x))) {
                json_decref(o);
                goto cleanup;
            }
            ring[(size_t)r * (size_t)window + (size_t)(count[r] % window)] = x;
            count[r]++;
            n_samples++;
        }
        /* other lines (loss, throughput...) are not ours: skip them */
        json_decref(o);
    }
    if (n_samples == 0) {
        rc =
            MAL_ERR(MAL_EFORMAT,
                    "%s: no rates found (expected {\"rank\": rate} or lines with \"rates\")", what);
        goto cleanup;
    }
    for (int r = 0; r < world; r++) {
        int n = MAL_MIN(count[r], window);
        if (n == 0) continue;
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += ring[(size_t)r * (size_t)window + (size_t)i];
        rates[r] = sum / n;
    }
cleanup:
    free(ring);
    free(count);
    return rc;
}

int mal_rates_parse_string(const char *text, const char *what, int world, int window, double *rates)
{
    return mal_rates_parse_buffer(text, strlen(text), what, world, window, rates);
}

int mal_rates_read(const char *path, int world, int window, double *rates)
{
    unsigned char *buf;
    size_t len;
    /* the whole file is parsed; only its last samples count, but a metrics
     * file of a long run stays far below the bound.  Not mal_json_read():
     * a metrics file is JSON lines, not one JSON value. */
    int rc =
        mal_file_read(path, "rates file", MAL_REPLAN_MAX_RATES_BYTES, MAL_READ_REGULAR, &buf, &len);
    if (rc) return rc;
    rc = mal_rates_parse_buffer((const char *)buf, len, path, world, window, rates);
    free(buf);
    return rc;
}
