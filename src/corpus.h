/* The built-in default corpus: English-like text generated deterministically
 * in memory, so that Malleus can train (and its tests can watch a loss fall)
 * without any data file.  Byte-level: every byte is one token 0..255. */
#ifndef MAL_CORPUS_H
#define MAL_CORPUS_H

#include <stddef.h>

/* Approximate size of the generated text: it stops at the first paragraph
 * end at or after this many bytes. */
#define MAL_CORPUS_TARGET_BYTES 1500000

/* Local.  Generate the corpus: always the same bytes (a fixed seed through
 * base/rng.h), printable ASCII plus '\n'.  On success *text is a malloc'ed,
 * NUL-terminated buffer that the caller frees, and *len its length without
 * the NUL.  The text is made of paragraphs of templated sentences with
 * subject-verb agreement, arithmetic facts written in words ("seven plus
 * five is twelve."), fixed facts, key-value records, counting and ordered
 * lists, and question/answer pairs: structure a small model learns within a
 * few hundred steps. */
int mal_corpus_generate(char **text, size_t *len);

/* Approximate size of the held-out text that follows the corpus. */
#define MAL_CORPUS_HELDOUT_BYTES 150000

/* Local.  The held-out continuation of the corpus (the default validation
 * data): the same generator run on past the corpus's last paragraph, to
 * the first paragraph end at or after MAL_CORPUS_HELDOUT_BYTES more bytes.
 * The corpus itself is unchanged by it and never contains these bytes, so
 * a run that trains on the corpus never sees them.  Ownership as
 * mal_corpus_generate. */
int mal_corpus_generate_heldout(char **text, size_t *len);

#endif /* MAL_CORPUS_H */
