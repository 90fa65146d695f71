/* Tokenizer references (which tokenizer.json a data set was made with, and
 * whether a file is still it) and decoding token ids with a tokenizer.json;
 * see tokenizer.h.  Decoding follows the `tokenizers` library's decoders:
 * every token's text goes through the decoder's per-token steps once, at
 * load, into the bytes it contributes; the steps that act on the whole
 * text (a Strip after Fuse, Metaspace's leading space) become one rule
 * applied at the start of the text. */
#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/json.h"
#include "base/mal.h"

/* ---- CRC-32 and file identity ------------------------------------------ */

uint32_t mal_crc32_update(uint32_t crc, const void *buf, size_t len)
{
    static uint32_t table[256];
    static int ready;
    if (!ready) { /* benign race: every thread computes the same table */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    const unsigned char *p = buf;
    crc = ~crc;
    for (size_t i = 0; i < len; i++)
        crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

int mal_file_crc32(const char *path, uint64_t *bytes, uint32_t *crc)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? MAL_ERR(MAL_ENOENT, "%s does not exist", path)
                               : MAL_ERR(MAL_EINVAL, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return MAL_ERR(MAL_EINVAL, "%s is not a regular file", path);
    }
    unsigned char buf[1 << 16];
    uint32_t c = 0;
    uint64_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return MAL_ERR(MAL_EIO, "cannot read %s: %s", path, strerror(e));
        }
        if (r == 0) break;
        c = mal_crc32_update(c, buf, (size_t)r);
        n += (uint64_t)r;
    }
    close(fd);
    *bytes = n;
    *crc = c;
    return 0;
}

/* ---- references -------------------------------------------------------- */

void mal_tokenizer_ref_fini(mal_tokenizer_ref *r)
{
    free(r->file);
    free(r->config);
    free(r->special);
    free(r->eos_token);
    memset(r, 0, sizeof *r);
}

/* A copy of the string field `key` of obj into *out (NULL when absent or
 * null); MAL_EFORMAT when it is something else. */
static int opt_string(const json_t *obj, const char *key, char **out, const char *where)
{
    const json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return MAL_ERR(MAL_EFORMAT, "%s: the tokenizer's \"%s\" is not a string", where, key);
    if (!(*out = strdup(json_string_value(v)))) return MAL_ERR(MAL_ENOMEM, "out of memory");
    return 0;
}

int mal_tokenizer_ref_parse(mal_tokenizer_ref *r, const json_t *obj, const char *where)
{
    int rc;
    memset(r, 0, sizeof *r);
    r->eos_id = -1;
    const json_t *b = json_object_get(obj, "bytes"), *c = json_object_get(obj, "crc32");
    if (!json_is_object(obj) || !json_is_string(json_object_get(obj, "file")) ||
        !json_is_integer(b) || json_integer_value(b) < 0 || !json_is_integer(c) ||
        json_integer_value(c) < 0 || json_integer_value(c) > (json_int_t)UINT32_MAX)
        return MAL_ERR(MAL_EFORMAT,
                       "%s: the tokenizer is not an object with \"file\", \"bytes\" and "
                       "\"crc32\"",
                       where);
    r->bytes = (uint64_t)json_integer_value(b);
    r->crc32 = (uint32_t)json_integer_value(c);
    const json_t *v = json_object_get(obj, "vocab_size"), *e = json_object_get(obj, "eos_id");
    r->vocab_size = json_is_integer(v) ? (int)json_integer_value(v) : 0;
    r->eos_id = json_is_integer(e) ? (int)json_integer_value(e) : -1;
    if ((rc = opt_string(obj, "file", &r->file, where)) ||
        (rc = opt_string(obj, "config", &r->config, where)) ||
        (rc = opt_string(obj, "special_tokens_map", &r->special, where)) ||
        (rc = opt_string(obj, "eos_token", &r->eos_token, where)))
        mal_tokenizer_ref_fini(r);
    return rc;
}

int mal_tokenizer_ref_same(const mal_tokenizer_ref *a, const mal_tokenizer_ref *b)
{
    return a->bytes == b->bytes && a->crc32 == b->crc32;
}

int mal_tokenizer_ref_check(const mal_tokenizer_ref *r)
{
    uint64_t bytes;
    uint32_t crc;
    int rc = mal_file_crc32(r->file, &bytes, &crc);
    if (rc == MAL_ENOENT)
        return MAL_ERR(MAL_ENOENT,
                       "the tokenizer the data was made with, %s, is gone: name it with "
                       "--tokenizer PATH (or leave it out with --no-tokenizer)",
                       r->file);
    if (rc) return rc;
    if (bytes != r->bytes || crc != r->crc32)
        return MAL_ERR(MAL_EMISMATCH,
                       "the tokenizer %s changed since the data was tokenized with it (%" PRIu64
                       " bytes, CRC-32 %08x then; %" PRIu64
                       " bytes, %08x now): name the right file with --tokenizer PATH",
                       r->file, r->bytes, r->crc32, bytes, crc);
    return 0;
}

/* "DIR/tokenizer.json" for a directory, else a copy of `path` */
static char *tokenizer_json_path(const char *path)
{
    struct stat st;
    size_t n = strlen(path);
    char *p = malloc(n + sizeof "/tokenizer.json");
    if (!p) return NULL;
    memcpy(p, path, n + 1);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) strcpy(p + n, "/tokenizer.json");
    return p;
}

/* The absolute path of `name` beside the file `file`, when it exists. */
static char *beside(const char *file, const char *name)
{
    const char *slash = strrchr(file, '/');
    size_t dir = slash ? (size_t)(slash - file) : 1;
    char *p = malloc(dir + strlen(name) + 2);
    if (!p) return NULL;
    if (slash)
        memcpy(p, file, dir);
    else
        p[0] = '.';
    p[dir] = '/';
    strcpy(p + dir + 1, name);
    char *abs = realpath(p, NULL);
    free(p);
    return abs;
}

int mal_tokenizer_ref_of(mal_tokenizer_ref *r, const char *path)
{
    int rc;
    mal_tokenizer *t = NULL;
    memset(r, 0, sizeof *r);
    r->eos_id = -1;
    char *json = tokenizer_json_path(path);
    if (!json) return MAL_ERR(MAL_ENOMEM, "out of memory");
    r->file = realpath(json, NULL);
    if (!r->file) {
        rc = MAL_ERR(MAL_ENOENT, "tokenizer %s does not exist", json);
        free(json);
        return rc;
    }
    free(json);
    if ((rc = mal_file_crc32(r->file, &r->bytes, &r->crc32)) ||
        (rc = mal_tokenizer_load(&t, r->file)))
        goto fail;
    r->vocab_size = mal_tokenizer_vocab_size(t);
    r->config = beside(r->file, "tokenizer_config.json");
    r->special = beside(r->file, "special_tokens_map.json");
    mal_tokenizer_destroy(t);
    return 0;
fail:
    mal_tokenizer_ref_fini(r);
    return rc;
}

/* ---- decoding ----------------------------------------------------------- */

struct mal_tokenizer {
    int n;        /* ids 0 .. n-1 */
    char **text;  /* [n] the bytes each token contributes (NULL: no such id) */
    size_t *len;  /* [n] */
    int strip_n;  /* at the start of the whole text: strip up to strip_n ... */
    char strip_c; /* ... leading strip_c bytes */
};

void mal_tokenizer_destroy(mal_tokenizer *t)
{
    if (!t) return;
    for (int i = 0; i < t->n; i++)
        free(t->text[i]);
    free(t->text);
    free(t->len);
    free(t);
}

int mal_tokenizer_vocab_size(const mal_tokenizer *t)
{
    return t->n;
}

/* A growable byte string. */
typedef struct {
    char *p;
    size_t n, cap;
} bytes_t;

static int put(bytes_t *b, const void *src, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return MAL_ERR(MAL_ENOMEM, "out of memory decoding tokens");
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

/* The next code point of UTF-8 text at *s (n bytes left); -1 for a
 * malformed sequence (one byte consumed). */
static long next_cp(const unsigned char **s, size_t *n)
{
    const unsigned char *p = *s;
    int k = p[0] < 0x80         ? 1
            : (p[0] >> 5) == 6  ? 2
            : (p[0] >> 4) == 14 ? 3
            : (p[0] >> 3) == 30 ? 4
                                : 0;
    if (k == 0 || (size_t)k > *n) {
        (*s)++;
        (*n)--;
        return -1;
    }
    long cp = k == 1 ? p[0] : p[0] & (0x7f >> k);
    for (int i = 1; i < k; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            (*s)++;
            (*n)--;
            return -1;
        }
        cp = cp << 6 | (p[i] & 0x3f);
    }
    *s += k;
    *n -= (size_t)k;
    return cp;
}

/* GPT-2's byte-to-character map, inverted: the byte a character of a
 * ByteLevel token stands for, or -1.  Bytes 33..126, 161..172 and 174..255
 * stand for themselves; the other 68 were moved to 256, 257, ... in order. */
static int byte_of_char(long cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    int k = (int)(cp - 256);
    for (int b = 0; b < 256; b++) {
        int self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (!self && k-- == 0) return b;
    }
    return -1;
}

/* ByteLevel: every character back to its byte; a token with a character
 * outside the map stays as it is (as the library does). */
static int step_bytelevel(bytes_t *b)
{
    bytes_t out = {0};
    const unsigned char *s = (const unsigned char *)b->p;
    size_t n = b->n;
    int rc = 0;
    while (n && !rc) {
        long cp = next_cp(&s, &n);
        int byte = byte_of_char(cp);
        if (byte < 0) {
            free(out.p);
            return 0;
        }
        unsigned char c = (unsigned char)byte;
        rc = put(&out, &c, 1);
    }
    if (rc) {
        free(out.p);
        return rc;
    }
    free(b->p);
    *b = out;
    return 0;
}

/* Replace every `pat` by `with`. */
static int step_replace(bytes_t *b, const char *pat, const char *with)
{
    size_t pl = strlen(pat), wl = strlen(with);
    if (!pl || !b->n || !strstr(b->p, pat)) return 0;
    bytes_t out = {0};
    int rc = 0;
    for (size_t i = 0; i < b->n && !rc;) {
        if (i + pl <= b->n && memcmp(b->p + i, pat, pl) == 0) {
            rc = put(&out, with, wl);
            i += pl;
        } else {
            rc = put(&out, b->p + i, 1);
            i++;
        }
    }
    if (rc) {
        free(out.p);
        return rc;
    }
    free(b->p);
    *b = out;
    return 0;
}

/* ByteFallback: a token "<0xHH>" is the byte HH. */
static void step_bytefallback(bytes_t *b)
{
    unsigned v;
    char tail;
    if (b->n == 6 && sscanf(b->p, "<0x%2X%c", &v, &tail) == 2 && tail == '>' &&
        strspn(b->p + 3, "0123456789ABCDEFabcdef") == 2) {
        b->p[0] = (char)v;
        b->n = 1;
        b->p[1] = '\0';
    }
}

/* Strip up to `start` leading and `stop` trailing `c` bytes of one token. */
static void step_strip(bytes_t *b, char c, int start, int stop)
{
    size_t a = 0;
    while ((int)a < start && a < b->n && b->p[a] == c)
        a++;
    size_t e = b->n;
    for (int k = 0; k < stop && e > a && b->p[e - 1] == c; k++)
        e--;
    memmove(b->p, b->p + a, e - a);
    b->n = e - a;
    if (b->p) b->p[b->n] = '\0';
}

/* One decoder step of the tokenizer.json (a member of a Sequence, or the
 * decoder itself), applied to token b; `fused` says whether a Fuse came
 * before it: a step after Fuse acts on the whole text, which for the
 * steps supported here means only at its start (t->strip_*). */
static int apply_step(mal_tokenizer *t, const json_t *d, bytes_t *b, int *fused, const char *path)
{
    const char *type = json_string_value(json_object_get(d, "type"));
    if (!type) return MAL_ERR(MAL_EFORMAT, "tokenizer %s: a decoder without a type", path);
    if (!strcmp(type, "ByteLevel")) return step_bytelevel(b);
    if (!strcmp(type, "ByteFallback")) {
        step_bytefallback(b);
        return 0;
    }
    if (!strcmp(type, "Fuse")) {
        *fused = 1;
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        const char *pat =
            json_string_value(json_object_get(json_object_get(d, "pattern"), "String"));
        const char *with = json_string_value(json_object_get(d, "content"));
        if (!pat || !with)
            return MAL_ERR(MAL_ENOTSUP,
                           "tokenizer %s: a Replace decoder with a regular expression is not "
                           "supported here; print token ids (malleus-sample --token-ids) and "
                           "decode them with the tokenizers library",
                           path);
        return step_replace(b, pat, with);
    }
    if (!strcmp(type, "Strip")) {
        const char *c = json_string_value(json_object_get(d, "content"));
        int start = (int)json_integer_value(json_object_get(d, "start"));
        int stop = (int)json_integer_value(json_object_get(d, "stop"));
        if (!c || strlen(c) != 1 || start < 0 || stop < 0 || (*fused && stop > 0))
            return MAL_ERR(MAL_ENOTSUP,
                           "tokenizer %s: this Strip decoder is not supported here (content "
                           "of one ASCII character; after Fuse, at the start only)",
                           path);
        if (*fused) {
            t->strip_n = start;
            t->strip_c = c[0];
        } else {
            step_strip(b, c[0], start, stop);
        }
        return 0;
    }
    if (!strcmp(type, "Metaspace")) {
        const char *rep = json_string_value(json_object_get(d, "replacement"));
        const char *scheme = json_string_value(json_object_get(d, "prepend_scheme"));
        const json_t *aps = json_object_get(d, "add_prefix_space");
        int rc = step_replace(b, rep ? rep : "\xe2\x96\x81", " ");
        /* the first token loses the space the encoder prepended */
        if ((scheme && strcmp(scheme, "never") != 0) || (!scheme && (!aps || json_is_true(aps)))) {
            t->strip_n = 1;
            t->strip_c = ' ';
        }
        return rc;
    }
    return MAL_ERR(MAL_ENOTSUP,
                   "tokenizer %s: decoder %s is not supported here (ByteLevel, Metaspace, and "
                   "Sequence of Replace, ByteFallback, Fuse, Strip are); print token ids "
                   "(malleus-sample --token-ids) and decode them with the tokenizers library",
                   path, type);
}

/* Record token `text` for `id`, growing the table. */
static int set_token(mal_tokenizer *t, json_int_t id, const char *text, int *cap)
{
    if (id < 0 || id >= (1 << 24))
        return MAL_ERR(MAL_EFORMAT, "tokenizer: token id %lld out of range", (long long)id);
    if (id >= *cap) {
        int nc = *cap ? *cap : 1024;
        while (nc <= id)
            nc *= 2;
        char **p = realloc(t->text, (size_t)nc * sizeof *p);
        if (!p) return MAL_ERR(MAL_ENOMEM, "out of memory loading a tokenizer");
        memset(p + *cap, 0, (size_t)(nc - *cap) * sizeof *p);
        t->text = p;
        *cap = nc;
    }
    free(t->text[id]);
    if (!(t->text[id] = strdup(text))) return MAL_ERR(MAL_ENOMEM, "out of memory");
    if (id >= t->n) t->n = (int)id + 1;
    return 0;
}

int mal_tokenizer_load(mal_tokenizer **out, const char *path)
{
    int rc = 0, cap = 0;
    json_t *root = NULL;
    mal_tokenizer *t = NULL;
    char *file = tokenizer_json_path(path);
    *out = NULL;
    if (!file) return MAL_ERR(MAL_ENOMEM, "out of memory");
    if ((rc = mal_json_read(file, "tokenizer", (size_t)256 << 20, MAL_READ_REGULAR, &root)))
        goto done;
    if (!(t = calloc(1, sizeof *t))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        goto done;
    }
    const json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(model) || !vocab) {
        rc = MAL_ERR(MAL_EFORMAT, "%s is not a tokenizer.json: no model vocabulary", file);
        goto done;
    }
    if (json_is_object(vocab) && (!mtype || !strcmp(mtype, "BPE") || !strcmp(mtype, "WordLevel"))) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vocab, k, v)
        {
            if (!json_is_integer(v)) {
                rc = MAL_ERR(MAL_EFORMAT, "%s: the id of token '%s' is not an integer", file, k);
                goto done;
            }
            if ((rc = set_token(t, json_integer_value(v), k, &cap))) goto done;
        }
    } else if (json_is_array(vocab) && mtype && !strcmp(mtype, "Unigram")) {
        size_t i;
        json_t *v;
        json_array_foreach(vocab, i, v)
        {
            const char *piece = json_string_value(json_array_get(v, 0));
            if (!piece) {
                rc = MAL_ERR(MAL_EFORMAT, "%s: Unigram piece %zu is not [text, score]", file, i);
                goto done;
            }
            if ((rc = set_token(t, (json_int_t)i, piece, &cap))) goto done;
        }
    } else {
        rc = MAL_ERR(MAL_ENOTSUP,
                     "%s: a %s model is not supported here (BPE, WordLevel and Unigram are)", file,
                     mtype ? mtype : "typeless");
        goto done;
    }
    /* added tokens (special ones included) are decoded like the others */
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(root, "added_tokens"), i, a)
    {
        const char *content = json_string_value(json_object_get(a, "content"));
        const json_t *id = json_object_get(a, "id");
        if (!content || !json_is_integer(id)) {
            rc = MAL_ERR(MAL_EFORMAT, "%s: added token %zu has no id or content", file, i);
            goto done;
        }
        if ((rc = set_token(t, json_integer_value(id), content, &cap))) goto done;
    }
    if (!(t->len = calloc((size_t)t->n + 1, sizeof *t->len))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        goto done;
    }
    /* every token through the decoder's per-token steps */
    const json_t *dec = json_object_get(root, "decoder");
    const json_t *steps =
        json_is_object(dec) && json_string_value(json_object_get(dec, "type")) &&
                !strcmp(json_string_value(json_object_get(dec, "type")), "Sequence")
            ? json_object_get(dec, "decoders")
            : NULL;
    for (int id = 0; id < t->n && !rc; id++) {
        if (!t->text[id]) continue;
        bytes_t b = {0};
        int fused = 0;
        if ((rc = put(&b, t->text[id], strlen(t->text[id])))) break;
        if (steps) {
            size_t k;
            json_t *d;
            json_array_foreach(steps, k, d)
            {
                if ((rc = apply_step(t, d, &b, &fused, file))) break;
            }
        } else if (json_is_object(dec)) {
            rc = apply_step(t, dec, &b, &fused, file);
        }
        free(t->text[id]);
        t->text[id] = b.p ? b.p : strdup("");
        t->len[id] = b.n;
        if (!t->text[id] && !rc) rc = MAL_ERR(MAL_ENOMEM, "out of memory");
    }
done:
    json_decref(root);
    free(file);
    if (rc) {
        mal_tokenizer_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* The bytes of ids[0..n) after `done` tokens, the start rule applied. */
static int decode_into(const mal_tokenizer *t, const int *ids, int n, int done, bytes_t *b)
{
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (ids[i] < 0 || ids[i] >= t->n || !t->text[ids[i]])
            return MAL_ERR(MAL_EINVAL, "token id %d is not in the tokenizer's vocabulary (%d)",
                           ids[i], t->n);
        const char *s = t->text[ids[i]];
        size_t len = t->len[ids[i]];
        if (done + i == 0) /* the start of the whole text */
            for (int k = 0; k < t->strip_n && len && *s == t->strip_c; k++)
                s++, len--;
        rc = put(b, s, len);
    }
    return rc;
}

int mal_tokenizer_decode(const mal_tokenizer *t, const int *ids, int n, char **text, size_t *len)
{
    bytes_t b = {0};
    int rc = put(&b, "", 0);
    if (!rc) rc = decode_into(t, ids, n, 0, &b);
    if (rc) {
        free(b.p);
        return rc;
    }
    *text = b.p;
    *len = b.n;
    return 0;
}

int mal_tokenizer_print(const mal_tokenizer *t, FILE *f, const int *ids, int n, int done)
{
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (ids[i] < 0 || ids[i] >= t->n || !t->text[ids[i]]) {
            /* a model's vocabulary may be larger than its tokenizer's */
            fprintf(f, "[%d]", ids[i]);
            continue;
        }
        bytes_t b = {0};
        rc = decode_into(t, &ids[i], 1, done + i, &b);
        for (size_t k = 0; k < b.n && !rc; k++) {
            unsigned char c = (unsigned char)b.p[k];
            if (c < 32 && c != '\n' && c != '\t')
                fprintf(f, "\\x%02x", c);
            else
                fputc(c, f);
        }
        free(b.p);
    }
    return rc;
}
