/* Malleus common definitions: error codes, error messages, logging, small
 * helpers shared by every module.
 *
 * Library functions return 0 on success or a negative MAL_E* code.  When they
 * fail they also record a human-readable message (with the file:line where the
 * failure was detected) that the caller can fetch with mal_errmsg(); mains
 * print it.  Library code never calls exit().
 */
#ifndef MAL_H
#define MAL_H

#include <stddef.h>
#include <stdint.h>

/* Error codes.  Keep mal_strerror() in error.c in sync. */
enum {
    MAL_OK = 0,
    MAL_EINVAL = -1,   /* invalid argument or configuration (a user mistake) */
    MAL_ENOMEM = -2,   /* out of memory */
    MAL_EIO = -3,      /* file or HDF5 I/O failure */
    MAL_EFORMAT = -4,  /* malformed input file (data, config, snapshot, plan) */
    MAL_ENOENT = -5,   /* a file or snapshot that should exist does not */
    MAL_ECORRUPT = -6, /* checksum mismatch or incomplete snapshot */
    MAL_EMPI = -7,     /* MPI reported an error */
    MAL_ELP = -8,      /* lp_solve failed or found no solution */
    MAL_EDEVICE = -9,  /* CUDA / NCCL / accelerator failure */
    MAL_ENOTSUP = -10, /* feature not available in this build */
    MAL_EMISMATCH = -11, /* two things that must agree do not (config, plan) */
};

const char *mal_strerror(int err);

/* The exit status a program reports for library error `err` (the README's
 * rule for every command): 0 for 0; 2 for a mistake in the user's usage or
 * input (MAL_EINVAL, MAL_EFORMAT, MAL_ENOENT, MAL_ECORRUPT, MAL_EMISMATCH,
 * MAL_ENOTSUP); 1 for a failure of the run itself (I/O, memory, MPI,
 * lp_solve, device). */
int mal_exit_status(int err);

/* Record an error message for the calling thread and return `err`, so that
 * a failing function can `return mal_seterr(MAL_EINVAL, ...)`.  The message
 * is prefixed with file:line by the MAL_ERR macro. */
int mal_seterr_at(const char *file, int line, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define MAL_ERR(err, ...) mal_seterr_at(__FILE__, __LINE__, (err), __VA_ARGS__)

/* The last message recorded by MAL_ERR on this thread ("" if none). */
const char *mal_errmsg(void);
void mal_clearerr(void);

/* Logging.  Level is checked before formatting. */
enum { MAL_LOG_ERROR = 0, MAL_LOG_WARN = 1, MAL_LOG_INFO = 2, MAL_LOG_DEBUG = 3 };
extern int mal_log_level;
void mal_log_at(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define mal_log(level, ...)                                                    \
    do {                                                                       \
        if ((level) <= mal_log_level) mal_log_at((level), __VA_ARGS__);        \
    } while (0)

/* Monotonic wall clock in seconds. */
double mal_now(void);

/* Local.  Room for element n (0-based) in the growable array whose pointer
 * is at `array_ptr` (e.g. &v, v of any element type), with *cap elements of
 * `elem_size` bytes allocated: the capacity doubles (starting at `first`)
 * when n reaches it.  0, or -1 when out of memory (the array unchanged). */
int mal_grow(void *array_ptr, int *cap, int n, size_t elem_size, int first);

/* Checked size arithmetic: a * b (a + b), or SIZE_MAX with *overflow set
 * to 1 when the exact result does not fit.  *overflow is never cleared, so
 * a chain of operations needs one check at its end:
 *     int ovf = 0;
 *     size_t bytes = mal_size_mul(mal_size_mul(rows, cols, &ovf), 4, &ovf);
 *     if (ovf) return MAL_ERR(...); */
static inline size_t mal_size_mul(size_t a, size_t b, int *overflow)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) {
        *overflow = 1;
        return SIZE_MAX;
    }
    return r;
}
static inline size_t mal_size_add(size_t a, size_t b, int *overflow)
{
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) {
        *overflow = 1;
        return SIZE_MAX;
    }
    return r;
}

/* Local.  Bytes of memory this process may use on its machine: physical
 * memory, or the memory limit of its control group (containers, Slurm jobs
 * with memory limits) when that is smaller, or MALLEUS_MEMORY_MB (the
 * environment) when that is smaller still.  0 if unknown. */
size_t mal_phys_memory_bytes(void);

#define MAL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAL_MAX(a, b) ((a) > (b) ? (a) : (b))
#define MAL_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#endif /* MAL_H */
