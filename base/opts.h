/* Command-line options from one table: each entry names a flag, what it
 * stores where, its range and its help text, so a program's main is the
 * table and one call, and adding a flag is adding a line (IOR's
 * option_help tables do the same).  The parser builds getopt_long's array
 * from the table, checks every value (the whole argument, within range),
 * prints the standard messages for bad input ("PROG: --steps expects an
 * integer in [0, 9], got 'abc'" followed by "Try 'PROG --help'.") and
 * generates --help from the same entries, section by section.
 *
 * Base layer: no dependency on anything but mal.h. */
#ifndef MAL_OPTS_H
#define MAL_OPTS_H

#include <stdio.h>

typedef enum {
    MAL_OPT_END = 0, /* terminates the table */
    MAL_OPT_SECTION, /* a heading in --help ("Training:"); help = the heading */
    MAL_OPT_TEXT,    /* free text in --help (help), no flag */
    MAL_OPT_FLAG,    /* no argument: *(int *)target = ival */
    MAL_OPT_INT,     /* int in [lo, hi] */
    MAL_OPT_INT64,   /* int64_t in [lo, hi] */
    MAL_OPT_UINT64,  /* uint64_t in [lo, hi] (lo >= 0) */
    MAL_OPT_FLOAT,   /* float in [flo, fhi] (parsed as double, then rounded) */
    MAL_OPT_DOUBLE,  /* double in [flo, fhi] */
    MAL_OPT_STRING,  /* *(const char **)target = the argument (argv's storage) */
    MAL_OPT_CHOICE,  /* *(int *)target = values[i] for the argument == choices[i] */
    MAL_OPT_FUNC,    /* fn(ctx, arg): 0 to go on, or an exit status (it printed why) */
    MAL_OPT_HELP,    /* print --help to stdout, exit status 0 */
    MAL_OPT_VERSION, /* print "PROG VERSION", exit status 0 */
} mal_opt_kind;

typedef struct mal_opts_spec mal_opts_spec;

typedef struct mal_opt {
    mal_opt_kind kind;
    const char *name;           /* long name without the dashes ("steps") */
    char short_name;            /* 0: none (only -h is used today) */
    const char *metavar;        /* argument name in --help ("N", "FILE"); NULL: no argument */
    const char *help;           /* --help text; lines after the first are indented under it.
                                 * NULL: the flag works but is not listed (see label) */
    void *target;               /* where the value goes (type by kind) */
    long long lo, hi;           /* integer range */
    double flo, fhi;            /* real range */
    const char *const *choices; /* MAL_OPT_CHOICE: NULL-terminated names */
    const int *values;          /* MAL_OPT_CHOICE: the value of each name */
    int ival;                   /* MAL_OPT_FLAG: the value stored */
    /* MAL_OPT_FUNC: spec->ctx is the program's state */
    int (*fn)(const mal_opts_spec *spec, const char *arg);
    int *given;        /* when not NULL: set to 1 when the flag appears */
    const char *label; /* --help's left column instead of "--name METAVAR" */
} mal_opt;

/* How a program describes itself to the parser. */
struct mal_opts_spec {
    const char *prog;    /* "malleus-train" */
    const char *version; /* PACKAGE_VERSION */
    const char *usage;   /* first lines of --help ("Usage: ...\nTrain ...\n") */
    const char *footer;  /* last lines of --help (examples); may be NULL */
    const mal_opt *opts; /* the table, ending with MAL_OPT_END */
    void *ctx;           /* for MAL_OPT_FUNC entries */
    unsigned char *given; /* optional, one entry per table entry: set to 1 for each
                           * flag that appears (read with mal_opts_given) */
};

/* Local.  Parse argv by the table, storing values as they come (a later
 * flag overrides an earlier one).  Returns -1 when the program should go on
 * (then *first_arg, when not NULL, is the index of the first non-option
 * argument; any such argument is refused unless first_arg is given), or an
 * exit status: 0 after --help / --version, 2 after a bad flag or value
 * (message on stderr already printed). */
int mal_opts_parse(const mal_opts_spec *spec, int argc, char **argv, int *first_arg);

/* Local.  1 when flag `name` (long name, no dashes) appeared in the last
 * parse (needs spec->given), else 0. */
int mal_opts_given(const mal_opts_spec *spec, const char *name);

/* Local.  Write --help for the table to f. */
void mal_opts_usage(const mal_opts_spec *spec, FILE *f);

/* Local.  Print "PROG: <message>\nTry 'PROG --help'.\n" to stderr and
 * return 2: the one way every program reports a usage mistake. */
int mal_opts_bad(const mal_opts_spec *spec, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif /* MAL_OPTS_H */
