/* safetensors headers and sharded-checkpoint indexes parsed as outside
 * input, and the conversion of their element types to float
 * (safetensors.h). */
#include "safetensors.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/mal.h"

int mal_st_header_length(const unsigned char first8[8], uint64_t file_bytes, const char *what,
                         uint64_t *n)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = v << 8 | first8[k];
    if (file_bytes < 8)
        return MAL_ERR(MAL_EFORMAT, "%s: %llu bytes, too short for a safetensors file", what,
                       (unsigned long long)file_bytes);
    if (v > MAL_ST_MAX_HEADER_BYTES)
        return MAL_ERR(MAL_EFORMAT,
                       "%s: header length %llu is more than %llu bytes: not a safetensors file",
                       what, (unsigned long long)v, (unsigned long long)MAL_ST_MAX_HEADER_BYTES);
    if (v > file_bytes - 8)
        return MAL_ERR(MAL_EFORMAT,
                       "%s: header length %llu runs past the end of the file (%llu bytes): "
                       "truncated, or not a safetensors file",
                       what, (unsigned long long)v, (unsigned long long)file_bytes);
    *n = v;
    return 0;
}

static const struct {
    const char *name;
    int dtype, esize;
} dtypes[] = {
    {"F32", MAL_ST_F32, 4},           {"F16", MAL_ST_F16, 2},
    {"BF16", MAL_ST_BF16, 2},         {"F64", MAL_ST_F64, 8},
    {"BOOL", MAL_ST_OTHER_INT, 1},    {"U8", MAL_ST_OTHER_INT, 1},
    {"I8", MAL_ST_OTHER_INT, 1},      {"I16", MAL_ST_OTHER_INT, 2},
    {"U16", MAL_ST_OTHER_INT, 2},     {"I32", MAL_ST_OTHER_INT, 4},
    {"U32", MAL_ST_OTHER_INT, 4},     {"I64", MAL_ST_OTHER_INT, 8},
    {"U64", MAL_ST_OTHER_INT, 8},     {"F8_E5M2", MAL_ST_OTHER_INT, 1},
    {"F8_E4M3", MAL_ST_OTHER_INT, 1},
};

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const mal_st_tensor *)a)->name, ((const mal_st_tensor *)b)->name);
}

static int cmp_range(const void *a, const void *b)
{
    const mal_st_tensor *x = *(const mal_st_tensor *const *)a,
                        *y = *(const mal_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* One tensor entry `e` named `name` into *t. */
static int parse_entry(const char *name, json_t *e, const mal_st_header *h, const char *what,
                       mal_st_tensor *t)
{
    if (strlen(name) == 0 || strlen(name) > MAL_ST_MAX_NAME)
        return MAL_ERR(MAL_EFORMAT, "%s: a tensor name is empty or longer than %d bytes", what,
                       MAL_ST_MAX_NAME);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!json_is_object(e))
        return MAL_ERR(MAL_EFORMAT, "%s: tensor '%s': its entry is not an object", what, name);
    const char *key;
    json_t *v;
    json_object_foreach(e, key, v)
    {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return MAL_ERR(MAL_EFORMAT, "%s: tensor '%s': unknown field '%s'", what, name, key);
    }
    json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"),
           *off = json_object_get(e, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
        return MAL_ERR(MAL_EFORMAT,
                       "%s: tensor '%s' needs a string \"dtype\" and arrays \"shape\" and "
                       "\"data_offsets\"",
                       what, name);
    size_t i;
    for (i = 0; i < MAL_ARRAY_SIZE(dtypes); i++)
        if (!strcmp(json_string_value(dt), dtypes[i].name)) break;
    if (i == MAL_ARRAY_SIZE(dtypes))
        return MAL_ERR(MAL_EFORMAT, "%s: tensor '%s': unknown dtype '%.16s'", what, name,
                       json_string_value(dt));
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dtypes[i].name);
    t->dtype = dtypes[i].dtype;
    t->esize = dtypes[i].esize;
    if (json_array_size(sh) > MAL_ST_MAX_NDIM)
        return MAL_ERR(MAL_EFORMAT, "%s: tensor '%s' has %zu dimensions (at most %d)", what, name,
                       json_array_size(sh), MAL_ST_MAX_NDIM);
    t->ndim = (int)json_array_size(sh);
    /* the element count, overflow-checked: it must come to the byte range */
    int ovf = 0;
    size_t count = 1;
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(sh, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return MAL_ERR(MAL_EFORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                           what, name, d);
        t->shape[d] = json_integer_value(x);
        count = mal_size_mul(count, (size_t)t->shape[d], &ovf);
    }
    size_t bytes = mal_size_mul(count, (size_t)t->esize, &ovf);
    json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (json_array_size(off) != 2 || !json_is_integer(b) || !json_is_integer(en) ||
        json_integer_value(b) < 0 || json_integer_value(en) < json_integer_value(b))
        return MAL_ERR(MAL_EFORMAT,
                       "%s: tensor '%s': data_offsets must be [BEGIN, END] with 0 <= BEGIN <= END",
                       what, name);
    uint64_t ob = (uint64_t)json_integer_value(b), oe = (uint64_t)json_integer_value(en);
    if (oe > h->file_bytes - h->data_start)
        return MAL_ERR(MAL_EFORMAT,
                       "%s: tensor '%s': its data [%llu, %llu) runs past the end of the file "
                       "(%llu bytes of data): truncated?",
                       what, name, (unsigned long long)ob, (unsigned long long)oe,
                       (unsigned long long)(h->file_bytes - h->data_start));
    if (ovf || (uint64_t)bytes != oe - ob)
        return MAL_ERR(MAL_EFORMAT,
                       "%s: tensor '%s': its shape and dtype %s make %s bytes but its data_offsets "
                       "hold %llu",
                       what, name, t->dtype_name, ovf ? "more than 2^64" : "another number of",
                       (unsigned long long)(oe - ob));
    t->begin = h->data_start + ob;
    t->end = h->data_start + oe;
    return 0;
}

int mal_st_parse_header(const char *json, size_t len, uint64_t file_bytes, const char *what,
                        mal_st_header *out)
{
    memset(out, 0, sizeof *out);
    if (len > MAL_ST_MAX_HEADER_BYTES || file_bytes < 8 || len > file_bytes - 8)
        return MAL_ERR(MAL_EFORMAT, "%s: header length %zu does not fit the file", what, len);
    json_t *root = NULL;
    mal_st_tensor **order = NULL;
    int rc = mal_json_parse(json, len, what, &root);
    if (rc) return rc;
    if (!json_is_object(root)) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: the safetensors header is not a JSON object", what);
        goto out;
    }
    out->data_start = 8 + (uint64_t)len;
    out->file_bytes = file_bytes;
    size_t cap = json_object_size(root);
    out->t = calloc(cap ? cap : 1, sizeof *out->t);
    if (!out->t) {
        rc = MAL_ERR(MAL_ENOMEM, "%s: out of memory for %zu tensor entries", what, cap);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (!strcmp(key, "__metadata__")) {
            /* the format's metadata: strings only */
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                rc = MAL_ERR(MAL_EFORMAT, "%s: __metadata__ is not an object", what);
                goto out;
            }
            json_object_foreach(v, mk, mv)
            {
                if (!json_is_string(mv)) {
                    rc = MAL_ERR(MAL_EFORMAT, "%s: __metadata__ value '%.64s' is not a string",
                                 what, mk);
                    goto out;
                }
            }
            continue;
        }
        if ((rc = parse_entry(key, v, out, what, &out->t[out->n]))) goto out;
        out->n++;
    }
    /* no two tensors share a byte (zero-sized ones sort first at their
     * offset, so they never count as overlapping) */
    order = malloc(sizeof *order * (size_t)(out->n ? out->n : 1));
    if (!order) {
        rc = MAL_ERR(MAL_ENOMEM, "%s: out of memory", what);
        goto out;
    }
    for (int i = 0; i < out->n; i++)
        order[i] = &out->t[i];
    qsort(order, (size_t)out->n, sizeof *order, cmp_range);
    for (int i = 1; i < out->n; i++)
        if (order[i]->begin < order[i - 1]->end) {
            rc = MAL_ERR(MAL_EFORMAT, "%s: tensors '%s' and '%s' overlap in the file", what,
                         order[i - 1]->name, order[i]->name);
            goto out;
        }
    qsort(out->t, (size_t)out->n, sizeof *out->t, cmp_name);
out:
    free(order);
    json_decref(root);
    if (rc) mal_st_header_fini(out);
    return rc;
}

void mal_st_header_fini(mal_st_header *h)
{
    free(h->t);
    memset(h, 0, sizeof *h);
}

const mal_st_tensor *mal_st_find(const mal_st_header *h, const char *name)
{
    mal_st_tensor key;
    if (strlen(name) > MAL_ST_MAX_NAME || h->n == 0) return NULL;
    snprintf(key.name, sizeof key.name, "%s", name);
    return bsearch(&key, h->t, (size_t)h->n, sizeof *h->t, cmp_name);
}

/* ---- the index of a sharded checkpoint ------------------------------------ */

static int plain_file_name(const char *s)
{
    size_t n = strlen(s), ext = strlen(".safetensors");
    return n > ext && n <= MAL_ST_MAX_NAME && !strchr(s, '/') && strcmp(s, ".") &&
           strcmp(s, "..") && !strcmp(s + n - ext, ".safetensors");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int mal_st_parse_index(const char *json, size_t len, const char *what, mal_st_index *out)
{
    memset(out, 0, sizeof *out);
    if (len > MAL_ST_MAX_INDEX_BYTES)
        return MAL_ERR(MAL_EFORMAT, "%s: more than %zu bytes: not a checkpoint index", what,
                       MAL_ST_MAX_INDEX_BYTES);
    json_t *root = NULL;
    int rc = mal_json_parse(json, len, what, &root);
    if (rc) return rc;
    const char *key;
    json_t *v, *map = NULL;
    if (!json_is_object(root)) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: not a JSON object", what);
        goto out;
    }
    json_object_foreach(root, key, v)
    {
        if (!strcmp(key, "weight_map") && json_is_object(v)) {
            map = v;
        } else if (strcmp(key, "metadata") || !json_is_object(v)) {
            rc = MAL_ERR(MAL_EFORMAT,
                         "%s: unexpected field '%.64s' (an index holds the objects \"metadata\" "
                         "and \"weight_map\")",
                         what, key);
            goto out;
        }
    }
    if (!map || json_object_size(map) == 0) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: no \"weight_map\" naming the tensors' files", what);
        goto out;
    }
    size_t n = json_object_size(map);
    out->names = calloc(n, sizeof *out->names);
    out->file = calloc(n, sizeof *out->file);
    out->files = calloc(n, sizeof *out->files);
    if (!out->names || !out->file || !out->files) {
        rc = MAL_ERR(MAL_ENOMEM, "%s: out of memory", what);
        goto out;
    }
    /* names sorted first, then each mapped to its file */
    json_object_foreach(map, key, v)
    {
        if (strlen(key) == 0 || strlen(key) > MAL_ST_MAX_NAME ||
            !(out->names[out->n] = strdup(key))) {
            rc = strlen(key) == 0 || strlen(key) > MAL_ST_MAX_NAME
                     ? MAL_ERR(MAL_EFORMAT, "%s: a tensor name is empty or longer than %d bytes",
                               what, MAL_ST_MAX_NAME)
                     : MAL_ERR(MAL_ENOMEM, "%s: out of memory", what);
            goto out;
        }
        out->n++;
    }
    qsort(out->names, (size_t)out->n, sizeof *out->names, cmp_str);
    for (int i = 0; i < out->n; i++) {
        json_t *f = json_object_get(map, out->names[i]);
        if (!json_is_string(f) || !plain_file_name(json_string_value(f))) {
            rc = MAL_ERR(MAL_EFORMAT,
                         "%s: tensor '%s' is mapped to %s: a file of the checkpoint is a plain "
                         "name ending in .safetensors, in the index's directory",
                         what, out->names[i],
                         json_is_string(f) ? json_string_value(f) : "a non-string");
            goto out;
        }
        const char *fn = json_string_value(f);
        int k = 0;
        while (k < out->n_files && strcmp(out->files[k], fn))
            k++;
        if (k == out->n_files && !(out->files[out->n_files++] = strdup(fn))) {
            out->n_files--;
            rc = MAL_ERR(MAL_ENOMEM, "%s: out of memory", what);
            goto out;
        }
        out->file[i] = k;
    }
out:
    json_decref(root);
    if (rc) mal_st_index_fini(out);
    return rc;
}

void mal_st_index_fini(mal_st_index *x)
{
    for (int i = 0; x->names && i < x->n; i++)
        free(x->names[i]);
    for (int i = 0; x->files && i < x->n_files; i++)
        free(x->files[i]);
    free(x->names);
    free(x->files);
    free(x->file);
    memset(x, 0, sizeof *x);
}

/* ---- element types -------------------------------------------------------- */

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | man << 13; /* inf, NaN (payload kept) */
    } else if (exp) {
        u = sign | (exp + 112) << 23 | man << 13;
    } else if (man) {
        /* subnormal: normalise (the value man * 2^-24 is a normal float) */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        u = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int mal_st_to_f32(const void *src, int dtype, size_t n, float *dst)
{
    const unsigned char *b = src;
    switch (dtype) {
    case MAL_ST_F32:
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                         (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
            memcpy(&dst[i], &u, sizeof u);
        }
        return 0;
    case MAL_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t u = ((uint32_t)b[2 * i] | (uint32_t)b[2 * i + 1] << 8) << 16;
            memcpy(&dst[i], &u, sizeof u);
        }
        return 0;
    case MAL_ST_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = f16_to_f32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
        return 0;
    default:
        return MAL_ERR(MAL_EINVAL, "safetensors: dtype %d does not convert to float", dtype);
    }
}
