/* Tiny assertion helpers for Malleus tests.  Each test is its own program:
 * exit 0 = pass, 77 = skip, 99 = hard error (automake conventions).  The
 * macros print both values and the location, then exit 1. */
#ifndef MAL_TEST_H
#define MAL_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/mal.h"

#define MAL_TEST_SKIP 77
#define MAL_TEST_ERROR 99

/* MAL_TEST_ASAN: 1 when built with AddressSanitizer (gcc says so with
 * __SANITIZE_ADDRESS__, clang 14 only through __has_feature), which
 * reserves terabytes of address space: an address-space limit
 * (RLIMIT_AS, ulimit -v) would stop it, not the code under test. */
#if defined(__SANITIZE_ADDRESS__)
#define MAL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MAL_TEST_ASAN 1
#endif
#endif
#ifndef MAL_TEST_ASAN
#define MAL_TEST_ASAN 0
#endif

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__,   \
                    #cond);                                                    \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

/* a library call that must succeed (returns 0); prints mal_errmsg() if not */
#define CHECK_OK(call)                                                         \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ != 0) {                                                        \
            fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__,      \
                    __LINE__, #call, rc_, mal_strerror(rc_), mal_errmsg());    \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                     \
    do {                                                                       \
        long long a_ = (long long)(a), b_ = (long long)(b);                     \
        if (a_ != b_) {                                                        \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld vs %lld\n",          \
                    __FILE__, __LINE__, #a, #b, a_, b_);                       \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, rtol, atol)                                          \
    do {                                                                       \
        double a_ = (double)(a), b_ = (double)(b);                             \
        if (!(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_))) {                    \
            fprintf(stderr,                                                    \
                    "%s:%d: %s ~= %s failed: %.9g vs %.9g (diff %.3g)\n",      \
                    __FILE__, __LINE__, #a, #b, a_, b_, fabs(a_ - b_));        \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#endif /* MAL_TEST_H */
