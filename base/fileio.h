/* File helpers every module uses for files the user names: outputs written
 * atomically when that is safe, and inputs read with a bound.
 *
 * Outputs.  A regular file (or a name that does not exist yet) is written
 * through a temporary file beside it, fsync'ed, renamed over the target and
 * the directory fsync'ed: readers see the old file or the new one, never
 * half of it, and a failure leaves an existing file untouched.  An existing
 * target that is *not* a regular file -- a character or block device such as
 * /dev/null, a FIFO, a Unix socket -- is written directly instead: renaming
 * over it would replace the device node itself with a regular file (run as
 * root, `-o /dev/null` would break every program on the machine that writes
 * there).  A directory is refused.
 *
 * Inputs.  mal_file_read() reads a whole file into memory, refusing more
 * than a caller-given number of bytes, so a device that never ends
 * (/dev/zero, /dev/urandom) or a runaway pipe ends in a message rather than
 * in the out-of-memory killer.
 *
 * Large inputs (token files) are mapped instead: mal_file_map() maps a
 * regular file read-only, so only the pages a reader touches are ever in
 * memory, and they stay the kernel's page cache, shared by every process
 * of the machine that maps the same file.
 *
 * Every function here is Local.
 */
#ifndef MAL_FILEIO_H
#define MAL_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* One output being written.  Caller-owned storage: mal_output_open()
 * initialises it, mal_output_commit() or mal_output_discard() releases
 * everything it holds (exactly one of them must be called after a
 * successful open). */
typedef struct {
    char *path;   /* the target, as given */
    char *tmp;    /* temporary file beside it; NULL when writing directly */
    int fd;       /* open descriptor (the temporary file or the target) */
    FILE *stream; /* made by mal_output_stream(), or NULL */
} mal_output;

/* Start writing `path`.  Errors: MAL_EINVAL (the target is a directory),
 * MAL_ENOENT (its directory does not exist), MAL_EIO (cannot create the
 * temporary file or open the target), MAL_ENOMEM; nothing is left behind
 * then.  A FIFO blocks here until a reader opens it, as `cmd > fifo` does. */
int mal_output_open(mal_output *o, const char *path);

/* 1 when the output goes straight to the target (not a regular file). */
int mal_output_is_direct(const mal_output *o);

/* A stdio stream over the output (made on first call, owned by `o`; do not
 * fclose it).  NULL with an error message when it cannot be made. */
FILE *mal_output_stream(mal_output *o);

/* Append `len` bytes (retries short writes and EINTR).  MAL_EIO. */
int mal_output_write(mal_output *o, const void *buf, size_t len);

/* Finish: flush, fsync, close; for a regular file rename the temporary file
 * over the target and fsync the directory.  Releases `o` whether it
 * succeeds or not; on failure the temporary file is removed and an existing
 * target is unchanged (a direct target may have received part of the
 * data). */
int mal_output_commit(mal_output *o);

/* Abandon: close, remove the temporary file, release `o`.  A regular target
 * is left as it was.  Safe on a zeroed or already released mal_output. */
void mal_output_discard(mal_output *o);

/* open + write + commit of one buffer. */
int mal_output_write_file(const char *path, const void *buf, size_t len);

/* An input a command reads, for mal_output_check_inputs: `what` names it
 * in messages ("--data", "INPUT.txt"); `path` may be NULL (not given). */
typedef struct {
    const char *what;
    const char *path;
} mal_input_ref;

/* MAL_EINVAL when the output `out` (named `out_what` in messages) is the
 * same file as one of the `n` inputs: by identity (device and inode, so a
 * hard or symbolic link to an input, or another spelling of its path,
 * counts), since writing the output would destroy that input -- and, read
 * whole before the output is written, an input it replaced would be lost
 * silently.  An output or input that does not exist yet, or an output
 * that is not a regular file (/dev/null), is no input's. */
int mal_output_check_inputs(const char *out_what, const char *out, const mal_input_ref *in, int n);

/* fsync the directory that holds `path`, so that a rename into it is
 * durable.  File systems that cannot sync directories (EINVAL, ENOTSUP) are
 * not an error. */
int mal_fsync_parent_dir(const char *path);

/* Flags of mal_file_read(). */
enum {
    /* Refuse anything but a regular file (devices, FIFOs, sockets): for
     * inputs that must have a size known in advance (token files). */
    MAL_READ_REGULAR = 1,
};

/* Read all of `path` into a malloc'ed buffer (*buf, *len), NUL-terminated
 * (one byte beyond *len), so text can be parsed in place.  `what` names the
 * kind of file in messages ("token file", "model config").  Refuses a
 * directory, a file of more than `max_bytes` bytes (for streams: once that
 * many have arrived), and with MAL_READ_REGULAR any non-regular file.
 * Errors: MAL_ENOENT (missing), MAL_EINVAL (directory, not regular, too
 * large), MAL_EIO, MAL_ENOMEM.  On error *buf is NULL. */
int mal_file_read(const char *path, const char *what, size_t max_bytes, int flags,
                  unsigned char **buf, size_t *len);

/* A read-only mapping of a whole regular file (mal_file_map).  Caller-owned
 * storage; mal_file_unmap() releases it. */
typedef struct {
    const unsigned char *data; /* the file's bytes (NULL for an empty file) */
    size_t bytes;              /* its size */
} mal_file_map;

/* Map all of `path` read-only (shared, so its pages are the page cache's:
 * mapping costs no memory until a page is touched, and unused pages are
 * dropped under pressure).  `advice`: MAL_MAP_RANDOM for data read at
 * scattered places (no read-ahead of pages nobody asked for), MAL_MAP_SEQUENTIAL
 * for a scan.  Refuses like mal_file_read with MAL_READ_REGULAR: MAL_ENOENT
 * (missing), MAL_EINVAL (a directory, not a regular file, no permission),
 * MAL_EIO (mmap failed).  An empty file maps to data NULL, bytes 0. */
enum { MAL_MAP_RANDOM = 0, MAL_MAP_SEQUENTIAL = 1 };
int mal_file_map_open(mal_file_map *m, const char *path, const char *what, int advice);

/* Release a mapping (safe on a zeroed one). */
void mal_file_unmap(mal_file_map *m);

/* Drop the pages of [off, off+len) of a mapping from this process's
 * resident set (they stay in the page cache): after a scan, so that
 * reading a file through its mapping once does not leave it counted in
 * the process's memory. */
void mal_file_map_release(const mal_file_map *m, size_t off, size_t len);

/* What kind of file a stat mode is, for messages ("a character device",
 * "a FIFO", "a directory", ...). */
const char *mal_file_kind(unsigned mode);

/* Identities of inputs: enough to tell whether a file is the one a run
 * recorded (a resumed run's data, the checkpoint a fine-tuning run started
 * from) without reading it whole. */

/* FNV-1a 64 of `n` bytes. */
uint64_t mal_fnv1a64(const void *p, size_t n);

enum { MAL_FILE_ID_BLOCK = 4096, MAL_FILE_ID_SAMPLES = 16 };

/* The fingerprint of `bytes` bytes at `p`: FNV-1a 64 of the size, the
 * first MAL_FILE_ID_BLOCK bytes and MAL_FILE_ID_SAMPLES blocks of that
 * size spread evenly over the rest, so contents replaced, regenerated,
 * truncated or extended are told apart with a few reads of data of any
 * size. */
uint64_t mal_fingerprint_memory(const void *p, uint64_t bytes);

/* The same of the file at `path` (a regular file), read again with
 * MAL_FILE_ID_SAMPLES + 1 preads; *bytes its size.  `what` names it in
 * messages ("data file").  MAL_EIO naming it when it cannot be opened or
 * read, or is no regular file. */
int mal_file_fingerprint(const char *path, const char *what, uint64_t *bytes, uint64_t *fp);

#endif /* MAL_FILEIO_H */
