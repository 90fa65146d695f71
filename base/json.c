/* Bounded JSON inputs with Jansson's errors converted (see json.h). */
#include "json.h"

#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "mal.h"

/* Duplicate keys are refused: JSON leaves their meaning open, and Jansson
 * would keep the last one silently (a rates map with rank 3 twice loses
 * one of its rates). */
enum { MAL_JSON_FLAGS = JSON_REJECT_DUPLICATES };

int mal_json_is_duplicate_key(const char *buf, size_t len)
{
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, MAL_JSON_FLAGS, &jerr);
    if (root) {
        json_decref(root);
        return 0;
    }
#if JANSSON_VERSION_HEX >= 0x020b00
    return json_error_code(&jerr) == json_error_duplicate_key;
#else
    return strstr(jerr.text, "duplicate object key") != NULL;
#endif
}

int mal_json_parse(const char *buf, size_t len, const char *what, json_t **root)
{
    json_error_t jerr;
    *root = json_loadb(buf, len, MAL_JSON_FLAGS, &jerr);
    if (*root) return 0;
#if JANSSON_VERSION_HEX >= 0x020b00
    /* the one failure that is not the input's fault */
    if (json_error_code(&jerr) == json_error_out_of_memory)
        return what ? MAL_ERR(MAL_ENOMEM, "%s: out of memory parsing JSON", what) : MAL_ENOMEM;
#endif
    if (!what) return MAL_EFORMAT;
    return MAL_ERR(MAL_EFORMAT, "%s: invalid JSON at line %d column %d: %s", what, jerr.line,
                   jerr.column, jerr.text);
}

int mal_json_read(const char *path, const char *kind, size_t max_bytes, int flags, json_t **root)
{
    unsigned char *buf;
    size_t len;
    *root = NULL;
    int rc = mal_file_read(path, kind, max_bytes, flags, &buf, &len);
    if (rc) return rc;
    rc = mal_json_parse((const char *)buf, len, path, root);
    free(buf);
    return rc;
}
