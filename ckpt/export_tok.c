/* The tokenizer that goes with a snapshot: found through its training
 * settings, checked, copied next to an export; see export_tok.h. */
#include "export_tok.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/mal.h"
#include "snapshot.h"

int mal_export_tokenizer_ref(const char *train_json, const char *override, const char *where,
                             mal_tokenizer_ref *r, int *found)
{
    int rc;
    *found = 0;
    if (override) {
        if ((rc = mal_tokenizer_ref_of(r, override))) return rc;
        *found = 1;
        return 0;
    }
    json_t *tj = train_json ? json_loads(train_json, 0, NULL) : NULL;
    const json_t *tok = tj ? json_object_get(tj, "tokenizer") : NULL;
    if (!tok) {
        json_decref(tj);
        return 0; /* no record named one: ids are the model's only text */
    }
    rc = mal_tokenizer_ref_parse(r, tok, where);
    json_decref(tj);
    if (rc) return rc;
    if ((rc = mal_tokenizer_ref_check(r))) {
        mal_tokenizer_ref_fini(r);
        return rc;
    }
    *found = 1;
    return 0;
}

/* Copy the file `src` to out_dir/name. */
static int copy_into(const char *src, const char *out_dir, const char *name)
{
    char dst[4096];
    unsigned char *buf = NULL;
    size_t len = 0;
    if (snprintf(dst, sizeof dst, "%s/%s", out_dir, name) >= (int)sizeof dst)
        return MAL_ERR(MAL_EINVAL, "export: output path %s too long", out_dir);
    int rc = mal_file_read(src, "tokenizer file", (size_t)256 << 20, MAL_READ_REGULAR, &buf, &len);
    if (!rc) rc = mal_output_write_file(dst, buf, len);
    free(buf);
    return rc;
}

int mal_export_tokenizer_write(const mal_tokenizer_ref *r, const char *out_dir, int max_len)
{
    int rc;
    if ((rc = copy_into(r->file, out_dir, "tokenizer.json"))) return rc;
    if (r->special && (rc = copy_into(r->special, out_dir, "special_tokens_map.json"))) return rc;
    if (r->config) return copy_into(r->config, out_dir, "tokenizer_config.json");
    /* No config of its own (a bare tokenizer.json): one that names the
     * fast tokenizer class, so AutoTokenizer does not guess a LLaMA
     * tokenizer from config.json's model type. */
    json_t *c = json_pack("{s:s, s:i, s:b}", "tokenizer_class", "PreTrainedTokenizerFast",
                          "model_max_length", max_len, "clean_up_tokenization_spaces", 0);
    if (c && r->eos_token) json_object_set_new(c, "eos_token", json_string(r->eos_token));
    char *text = c ? json_dumps(c, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(c);
    if (!text) return MAL_ERR(MAL_ENOMEM, "export: out of memory");
    char dst[4096];
    if (snprintf(dst, sizeof dst, "%s/tokenizer_config.json", out_dir) >= (int)sizeof dst)
        rc = MAL_ERR(MAL_EINVAL, "export: output path %s too long", out_dir);
    else
        rc = mal_output_write_file(dst, text, strlen(text));
    free(text);
    return rc;
}

int mal_snapshot_tokenizer(const char *snapshot, const char *override, mal_tokenizer **out)
{
    char step_dir[4096];
    mal_snapshot *s = NULL;
    mal_tokenizer_ref r;
    int found = 0, rc;
    *out = NULL;
    if ((rc = mal_snapshot_resolve(snapshot, step_dir, sizeof step_dir)) ||
        (rc = mal_snapshot_open(&s, step_dir)))
        return rc;
    rc = mal_export_tokenizer_ref(mal_snapshot_meta(s)->train_json, override, step_dir, &r, &found);
    mal_snapshot_close(s);
    if (rc || !found) return rc;
    rc = mal_tokenizer_load(out, r.file);
    mal_tokenizer_ref_fini(&r);
    return rc;
}
