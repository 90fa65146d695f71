/* JSON inputs: one bounded way to turn a file or a buffer the user gave
 * into a Jansson value, with Jansson's error converted to a MAL_E* code and
 * a message naming the file, the line and column, and what was wrong.
 *
 * A file is read whole through the bounded reader (fileio.h) first, never
 * with json_load_file(): a device or FIFO given by mistake is refused (or,
 * without MAL_READ_REGULAR, cut off at the bound) instead of read forever.
 *
 * Every function here is Local. */
#ifndef MAL_JSON_H
#define MAL_JSON_H

#include <jansson.h>
#include <stddef.h>

/* Parse `len` bytes (no terminating NUL needed) as one JSON value, an
 * object with a key twice refused; *root gets a new reference
 * (json_decref it), NULL on error.  Errors:
 * MAL_EFORMAT, with "WHAT: invalid JSON at line L column C: WHAT JANSSON
 * FOUND" when `what` (a path, "plan") is given; MAL_ENOMEM.  With `what`
 * NULL no message is recorded: for a caller that tries another reading of
 * the text, or words the failure itself (the JSON-lines rates reader). */
int mal_json_parse(const char *buf, size_t len, const char *what, json_t **root);

/* 1 when `len` bytes fail to parse because an object has a key twice
 * (which mal_json_parse refuses, its message naming the key). */
int mal_json_is_duplicate_key(const char *buf, size_t len);

/* Read all of `path` with mal_file_read(path, kind, max_bytes, flags) and
 * parse it as above, messages naming `path`.  `kind` names the file in the
 * reader's messages ("plan", "model config").  Errors: those of
 * mal_file_read() (MAL_ENOENT, MAL_EINVAL for a directory, a file over the
 * bound or, with MAL_READ_REGULAR, anything but a regular file; MAL_EIO,
 * MAL_ENOMEM) and of mal_json_parse(). */
int mal_json_read(const char *path, const char *kind, size_t max_bytes, int flags, json_t **root);

#endif /* MAL_JSON_H */
