/* Table-driven command-line parsing and --help (opts.h). */
#include "opts.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mal.h"

/* --help's left column: "  --name METAVAR" padded to this width. */
enum { LABEL_W = 23, OPT_BASE = 256 };

int mal_opts_bad(const mal_opts_spec *spec, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", spec->prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help'.\n", spec->prog);
    return 2;
}

static int takes_arg(const mal_opt *o)
{
    switch (o->kind) {
    case MAL_OPT_INT:
    case MAL_OPT_INT64:
    case MAL_OPT_UINT64:
    case MAL_OPT_FLOAT:
    case MAL_OPT_DOUBLE:
    case MAL_OPT_STRING:
    case MAL_OPT_CHOICE:
    case MAL_OPT_FUNC: return o->metavar != NULL || o->kind != MAL_OPT_FUNC;
    default: return 0;
    }
}

static int is_flag(const mal_opt *o)
{
    return o->kind >= MAL_OPT_FLAG && o->name;
}

/* Print one help text, its later lines indented under the first. */
static void help_text(FILE *f, const char *text, int indent)
{
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        fprintf(f, "%.*s\n", (int)n, p);
        if (!nl || !nl[1]) break;
        p = nl + 1;
        fprintf(f, "%*s", indent, "");
    }
}

void mal_opts_usage(const mal_opts_spec *spec, FILE *f)
{
    fputs(spec->usage, f);
    for (const mal_opt *o = spec->opts; o->kind != MAL_OPT_END; o++) {
        if (o->kind == MAL_OPT_SECTION) {
            fprintf(f, "\n%s\n", o->help);
            continue;
        }
        if (o->kind == MAL_OPT_TEXT) {
            fputs(o->help, f);
            continue;
        }
        if (!o->help) continue;
        char label[128];
        if (o->label)
            snprintf(label, sizeof label, "%s", o->label);
        else if (o->short_name)
            snprintf(label, sizeof label, "-%c, --%s%s%s", o->short_name, o->name,
                     o->metavar ? " " : "", o->metavar ? o->metavar : "");
        else
            snprintf(label, sizeof label, "--%s%s%s", o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
        int w = (int)strlen(label) + 2 > LABEL_W ? (int)strlen(label) + 2 : LABEL_W;
        fprintf(f, "  %-*s", w, label);
        help_text(f, o->help, 2 + LABEL_W);
    }
    if (spec->footer) fputs(spec->footer, f);
}

/* "a, b or c" */
static void join_choices(const char *const *c, char *out, size_t len)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; c[i] && n < len; i++)
        n += (size_t)snprintf(out + n, len - n, "%s%s", i == 0 ? "" : c[i + 1] ? ", " : " or ",
                              c[i]);
}

/* Store one flag's value; -1 to go on, else an exit status. */
static int apply(const mal_opts_spec *spec, const mal_opt *o, const char *arg)
{
    char *end;
    if (o->given) *o->given = 1;
    switch (o->kind) {
    case MAL_OPT_FLAG: *(int *)o->target = o->ival; return -1;
    case MAL_OPT_STRING: *(const char **)o->target = arg; return -1;
    case MAL_OPT_FUNC: {
        int rc = o->fn(spec, arg);
        return rc ? rc : -1;
    }
    case MAL_OPT_HELP: mal_opts_usage(spec, stdout); return 0;
    case MAL_OPT_VERSION: printf("%s %s\n", spec->prog, spec->version); return 0;
    case MAL_OPT_CHOICE:
        for (int i = 0; o->choices[i]; i++)
            if (!strcmp(arg, o->choices[i])) {
                *(int *)o->target = o->values[i];
                return -1;
            }
        {
            char all[256];
            join_choices(o->choices, all, sizeof all);
            return mal_opts_bad(spec, "--%s must be %s, got '%s'", o->name, all, arg);
        }
    case MAL_OPT_INT:
    case MAL_OPT_INT64:
    case MAL_OPT_UINT64: {
        errno = 0;
        long long v = strtoll(arg, &end, 10);
        if (end == arg || *end)
            return mal_opts_bad(spec, "--%s expects an integer in [%lld, %lld], got '%s'", o->name,
                                o->lo, o->hi, arg);
        /* past long long (strtoll clamps, ERANGE), past the table's range,
         * or past the target's type (an int entry whose range were wider):
         * out of range, never stored wrapped */
        if (errno == ERANGE || v < o->lo || v > o->hi ||
            (o->kind == MAL_OPT_INT && (v < INT_MIN || v > INT_MAX)) ||
            (o->kind == MAL_OPT_UINT64 && v < 0))
            return mal_opts_bad(spec, "--%s expects an integer in [%lld, %lld]: %s is out of range",
                                o->name, o->lo, o->hi, arg);
        if (o->kind == MAL_OPT_INT)
            *(int *)o->target = (int)v;
        else if (o->kind == MAL_OPT_INT64)
            *(int64_t *)o->target = v;
        else
            *(uint64_t *)o->target = (uint64_t)v;
        return -1;
    }
    case MAL_OPT_FLOAT:
    case MAL_OPT_DOUBLE: {
        errno = 0;
        double v = strtod(arg, &end);
        if (end == arg || *end || isnan(v))
            return mal_opts_bad(spec, "--%s expects a number in [%g, %g], got '%s'", o->name,
                                o->flo, o->fhi, arg);
        /* ERANGE: past double (1e999) or below its smallest (1e-999) */
        if (errno == ERANGE || !(v >= o->flo && v <= o->fhi))
            return mal_opts_bad(spec, "--%s expects a number in [%g, %g]: %s is out of range",
                                o->name, o->flo, o->fhi, arg);
        if (o->kind == MAL_OPT_FLOAT)
            *(float *)o->target = (float)v;
        else
            *(double *)o->target = v;
        return -1;
    }
    default: return -1;
    }
}

int mal_opts_parse(const mal_opts_spec *spec, int argc, char **argv, int *first_arg)
{
    int n = 0;
    char shorts[64] = ":";
    size_t ns = 1;
    for (const mal_opt *o = spec->opts; o->kind != MAL_OPT_END; o++)
        n++;
    struct option *lo = calloc((size_t)n + 1, sizeof *lo);
    if (!lo) {
        fprintf(stderr, "%s: out of memory\n", spec->prog);
        return 1;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        const mal_opt *o = &spec->opts[i];
        if (!is_flag(o)) continue;
        lo[k++] = (struct option){o->name, takes_arg(o) ? required_argument : no_argument, NULL,
                                  OPT_BASE + i};
        if (o->short_name && ns + 3 < sizeof shorts) {
            shorts[ns++] = o->short_name;
            if (takes_arg(o)) shorts[ns++] = ':';
        }
    }
    shorts[ns] = '\0';
    int c, rc = -1;
    opterr = 0;
    optind = 1;
    while (rc < 0 && (c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
        const mal_opt *o = NULL;
        if (c >= OPT_BASE)
            o = &spec->opts[c - OPT_BASE];
        else if (c != ':' && c != '?')
            for (int i = 0; i < n && !o; i++)
                if (spec->opts[i].short_name == c && is_flag(&spec->opts[i])) o = &spec->opts[i];
        if (o)
            rc = apply(spec, o, optarg);
        else if (c == ':')
            rc = mal_opts_bad(spec, "option '%s' needs a value", argv[optind - 1]);
        else
            rc = mal_opts_bad(spec, "unknown option '%s'", argv[optind - 1]);
    }
    free(lo);
    if (rc >= 0) return rc;
    if (first_arg)
        *first_arg = optind;
    else if (optind < argc)
        return mal_opts_bad(spec, "unexpected argument '%s'", argv[optind]);
    return -1;
}
