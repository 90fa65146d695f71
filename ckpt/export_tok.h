/* The tokenizer that goes with a snapshot: the one its training data was
 * tokenized with (recorded beside the data by scripts/tokenize_hf.py, and
 * in the snapshot's training settings by malleus-train), checked to be the
 * same file still (size and CRC-32, src/tokenizer.h).  malleus-export copies
 * its files next to the exported model, so that transformers'
 * AutoTokenizer loads them; malleus-sample decodes with it. */
#ifndef MAL_EXPORT_TOK_H
#define MAL_EXPORT_TOK_H

#include "src/tokenizer.h"

/* Local.  The tokenizer for a snapshot whose training settings are
 * `train_json` (may be NULL): `override` (a tokenizer.json or a directory
 * holding one) when given, else the one the settings name, checked
 * (mal_tokenizer_ref_check: MAL_ENOENT when it is gone, MAL_EMISMATCH when
 * it changed; messages say to name it with --tokenizer).  *found is 0 when
 * there is none (data without a record, the built-in corpus); *r is then
 * untouched, else the caller's (mal_tokenizer_ref_fini).  `where` names the
 * snapshot in messages. */
int mal_export_tokenizer_ref(const char *train_json, const char *override, const char *where,
                             mal_tokenizer_ref *r, int *found);

/* Local.  Copy r's tokenizer.json, and its tokenizer_config.json and
 * special_tokens_map.json when it has them, into out_dir (each written
 * atomically); without a tokenizer_config.json write one that makes
 * AutoTokenizer load tokenizer.json as a PreTrainedTokenizerFast with the
 * EOS token and `max_len` as model_max_length.  Each copied file is
 * checked against nothing more than its readability; r->file was checked
 * by mal_export_tokenizer_ref. */
int mal_export_tokenizer_write(const mal_tokenizer_ref *r, const char *out_dir, int max_len);

/* Local.  The decoder of the tokenizer that goes with the snapshot at
 * `snapshot` (a snapshot directory or a step directory): `override`, or the
 * one its training settings name, checked as above and loaded
 * (mal_tokenizer_load).  *out NULL when there is none; else the caller's
 * (mal_tokenizer_destroy). */
int mal_snapshot_tokenizer(const char *snapshot, const char *override, mal_tokenizer **out);

#endif /* MAL_EXPORT_TOK_H */
