/* A main() for the libFuzzer harnesses built with any compiler: run
 * LLVMFuzzerTestOneInput once on each file named (a directory: on each file
 * in it), as libFuzzer does when given files instead of a corpus to grow.
 * make check links every harness with this and replays the committed seed
 * corpus and regression inputs (tests/test_fuzz_corpus.sh), so the inputs
 * that once crashed a parser stay tested with gcc, under the sanitizer
 * build, and on machines without clang's libFuzzer.  A harness reports a
 * broken promise by abort(): the replay then dies with SIGABRT, naming the
 * input it was on. */
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Read `path` whole into a buffer of exactly its size (malloc'ed, so that
 * AddressSanitizer sees a read past the input's last byte). */
static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fprintf(stderr, "%s: out of memory\n", path);
            fclose(f);
            return 1;
        }
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        uint8_t *nb = realloc(buf, cap *= 2);
        if (!nb) free(buf);
        buf = nb;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        fprintf(stderr, "%s: read error\n", path);
        free(buf);
        return 1;
    }
    /* Exactly `len` bytes, as libFuzzer passes them. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return 1;
    }
    memcpy(exact, buf, len);
    free(buf);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file in `dir`, in name order (so runs are repeatable). */
static int replay_dir(const char *dir, int *n_done)
{
    DIR *d = opendir(dir);
    if (!d) {
        perror(dir);
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = 1;
                break;
            }
            names = nn;
        }
        size_t sz = strlen(dir) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(sz))) {
            rc = 1;
            break;
        }
        snprintf(names[n++], sz, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (!rc && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            rc = replay_file(names[i]);
            ++*n_done;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n"
                        "Run this fuzz harness once on each input file (each file of a "
                        "directory).\n",
                argv[0]);
        return 2;
    }
    int n_done = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        int rc = S_ISDIR(st.st_mode) ? replay_dir(argv[i], &n_done) : replay_file(argv[i]);
        if (!S_ISDIR(st.st_mode)) n_done++;
        if (rc) return rc;
    }
    printf("%s: %d inputs replayed\n", argv[0], n_done);
    return 0;
}
