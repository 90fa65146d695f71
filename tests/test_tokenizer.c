/* Tests for src/tokenizer.c and the token records of src/data_file.c:
 * CRC-32 against its standard check value; the C decoder against the
 * tokenizers library's decodes of the committed fixtures
 * (tests/tokenizers/: a byte-level BPE and a LLaMA-2-style byte-fallback
 * BPE, expected.json made by make_fixtures.py), control bytes escaped when
 * printed, unsupported decoders refused by name; tokenizer references
 * (a changed or missing file refused); and the record beside a token file:
 * its largest id used without reading the file, a stale record refused,
 * files of two tokenizers refused together.  Runs without Python. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/mal.h"
#include "mal_test.h"
#include "src/data.h"
#include "src/tokenizer.h"

static char dir[64];
static const char *srcdir;

static const char *in_dir(const char *name)
{
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static void write_text(const char *path, const char *text)
{
    CHECK_OK(mal_output_write_file(path, text, strlen(text)));
}

static void test_crc32(void)
{
    CHECK(mal_crc32_update(0, "123456789", 9) == 0xCBF43926u);
    CHECK(mal_crc32_update(mal_crc32_update(0, "1234", 4), "56789", 5) == 0xCBF43926u);
    write_text(in_dir("nine"), "123456789");
    uint64_t n;
    uint32_t c;
    CHECK_OK(mal_file_crc32(in_dir("nine"), &n, &c));
    CHECK(n == 9 && c == 0xCBF43926u);
    CHECK_EQ_INT(mal_file_crc32(in_dir("none"), &n, &c), MAL_ENOENT);
}

/* Every case of expected.json decodes to the library's text. */
static void test_decode_fixtures(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/tests/tokenizers/expected.json", srcdir);
    json_error_t err;
    json_t *cases = json_load_file(path, 0, &err);
    CHECK(cases != NULL && json_array_size(cases) >= 40);
    mal_tokenizer *tok[2] = {NULL, NULL};
    const char *names[2] = {"bytelevel.json", "metaspace.json"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/tests/tokenizers/%s", srcdir, names[k]);
        CHECK_OK(mal_tokenizer_load(&tok[k], path));
        CHECK(mal_tokenizer_vocab_size(tok[k]) >= 300);
    }
    size_t i;
    json_t *c;
    int checked = 0;
    json_array_foreach(cases, i, c)
    {
        int k = strcmp(json_string_value(json_object_get(c, "tokenizer")), names[0]) ? 1 : 0;
        json_t *ids = json_object_get(c, "ids");
        int n = (int)json_array_size(ids), id[64];
        CHECK(n <= 64);
        for (int j = 0; j < n; j++)
            id[j] = (int)json_integer_value(json_array_get(ids, (size_t)j));
        char *text;
        size_t len;
        CHECK_OK(mal_tokenizer_decode(tok[k], id, n, &text, &len));
        const char *want = json_string_value(json_object_get(c, "text"));
        if (len != strlen(want) || memcmp(text, want, len) != 0) {
            fprintf(stderr, "%s case %zu: decoded '%s', the library '%s'\n", names[k], i, text,
                    want);
            exit(1);
        }
        /* streamed one token at a time: the same bytes */
        FILE *f = tmpfile();
        for (int j = 0; j < n; j++)
            CHECK_OK(mal_tokenizer_print(tok[k], f, &id[j], 1, j));
        rewind(f);
        char got[4096];
        size_t m = fread(got, 1, sizeof got, f);
        fclose(f);
        int control = 0; /* printed as \xNN instead */
        for (size_t j = 0; j < len; j++)
            control |= (unsigned char)text[j] < 32 && text[j] != '\n' && text[j] != '\t';
        if (!control) CHECK(m == len && memcmp(got, text, len) == 0);
        free(text);
        checked++;
    }
    printf("decoded %d id sequences as the tokenizers library does\n", checked);
    /* an id outside the vocabulary */
    int bad = 100000;
    char *text;
    size_t len;
    CHECK_EQ_INT(mal_tokenizer_decode(tok[0], &bad, 1, &text, &len), MAL_EINVAL);
    FILE *pf = tmpfile();
    CHECK_OK(mal_tokenizer_print(tok[0], pf, &bad, 1, 0));
    rewind(pf);
    char pb[16] = {0};
    CHECK(fread(pb, 1, sizeof pb - 1, pf) == 8 && !strcmp(pb, "[100000]"));
    fclose(pf);
    /* a control byte is escaped when printed (byte-level token for 0x1b) */
    FILE *f = tmpfile();
    int esc = -1;
    for (int id = 0; id < mal_tokenizer_vocab_size(tok[0]) && esc < 0; id++) {
        char *t;
        size_t l;
        if (mal_tokenizer_decode(tok[0], &id, 1, &t, &l) == 0) {
            if (l == 1 && t[0] == 0x1b) esc = id;
            free(t);
        }
    }
    CHECK(esc >= 0);
    CHECK_OK(mal_tokenizer_print(tok[0], f, &esc, 1, 3));
    rewind(f);
    char got[16] = {0};
    CHECK(fread(got, 1, sizeof got - 1, f) == 4 && !strcmp(got, "\\x1b"));
    fclose(f);
    mal_tokenizer_destroy(tok[0]);
    mal_tokenizer_destroy(tok[1]);
    json_decref(cases);

    /* what is not supported is refused by name */
    write_text(in_dir("wp.json"),
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"decoder\": "
               "{\"type\": \"WordPiece\", \"prefix\": \"##\"}}");
    mal_tokenizer *t;
    mal_clearerr();
    CHECK_EQ_INT(mal_tokenizer_load(&t, in_dir("wp.json")), MAL_ENOTSUP);
    CHECK(strstr(mal_errmsg(), "WordPiece") && strstr(mal_errmsg(), "--token-ids"));
    write_text(in_dir("nomodel.json"), "{\"version\": \"1.0\"}");
    CHECK_EQ_INT(mal_tokenizer_load(&t, in_dir("nomodel.json")), MAL_EFORMAT);
    CHECK_EQ_INT(mal_tokenizer_load(&t, in_dir("missing.json")), MAL_ENOENT);
}

static void test_refs(void)
{
    char src[600];
    snprintf(src, sizeof src, "%s/tests/tokenizers/bytelevel.json", srcdir);
    unsigned char *buf;
    size_t len;
    CHECK_OK(mal_file_read(src, "fixture", 1 << 20, 0, &buf, &len));
    /* a directory with a tokenizer.json */
    CHECK(mkdir(in_dir("tok"), 0700) == 0);
    CHECK_OK(mal_output_write_file(in_dir("tok/tokenizer.json"), buf, len));
    mal_tokenizer_ref r;
    CHECK_OK(mal_tokenizer_ref_of(&r, in_dir("tok")));
    CHECK(r.bytes == len && r.crc32 == mal_crc32_update(0, buf, len) && r.vocab_size >= 300);
    CHECK(strstr(r.file, "tok/tokenizer.json") && r.file[0] == '/' && !r.config);
    CHECK_OK(mal_tokenizer_ref_check(&r));
    /* changed, then gone */
    buf[len / 2] ^= 1;
    CHECK_OK(mal_output_write_file(in_dir("tok/tokenizer.json"), buf, len));
    mal_clearerr();
    CHECK_EQ_INT(mal_tokenizer_ref_check(&r), MAL_EMISMATCH);
    CHECK(strstr(mal_errmsg(), "changed") && strstr(mal_errmsg(), "--tokenizer"));
    CHECK(unlink(in_dir("tok/tokenizer.json")) == 0);
    CHECK_EQ_INT(mal_tokenizer_ref_check(&r), MAL_ENOENT);
    mal_tokenizer_ref_fini(&r);
    free(buf);
}

/* raw16 file of n tokens 0..n-1 and its record */
static void write_data(const char *name, int n, int rec_n, int rec_max, uint32_t crc)
{
    uint16_t t[256];
    for (int i = 0; i < n; i++)
        t[i] = (uint16_t)i;
    char path[600], rec[700], text[700];
    snprintf(path, sizeof path, "%s.bin", in_dir(name));
    CHECK_OK(mal_data_write(path, MAL_DATA_RAW16, t, (size_t)n));
    snprintf(rec, sizeof rec, "%s.tokens.json", in_dir(name));
    snprintf(text, sizeof text,
             "{\"format\": \"malleus-tokens/1\", \"n_tokens\": %d, \"max_token\": %d, "
             "\"tokenizer\": {\"file\": \"/x/tokenizer.json\", \"bytes\": 10, \"crc32\": %u, "
             "\"eos_id\": 0}}",
             rec_n, rec_max, crc);
    write_text(rec, text);
}

static void test_records(void)
{
    mal_data *d;
    char spec[1500];
    /* the record's largest id is used, not the file's (300, while the
     * tokens go to 99): proof that the file was not read for it */
    write_data("a", 100, 100, 300, 7);
    snprintf(spec, sizeof spec, "%s.bin", in_dir("a"));
    CHECK_OK(mal_data_open(&d, spec, MAL_DATA_AUTO));
    CHECK_EQ_INT(mal_data_max_token(d), 300);
    mal_clearerr();
    CHECK_EQ_INT(mal_data_check_vocab(d, 256), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), spec));
    const char *tj = mal_data_tokenizer(d);
    CHECK(tj && strstr(tj, "\"crc32\":7") && strstr(tj, "/x/tokenizer.json"));
    mal_data_destroy(d);
    /* a glob that matches the record too reads the token file alone */
    snprintf(spec, sizeof spec, "%s.*", in_dir("a"));
    CHECK_OK(mal_data_open(&d, spec, MAL_DATA_AUTO));
    CHECK_EQ_INT(mal_data_n_files(d), 1);
    mal_data_destroy(d);
    /* the same tokenizer in another file: fine; another one: refused */
    write_data("b", 50, 50, 49, 7);
    write_data("c", 50, 50, 49, 8);
    snprintf(spec, sizeof spec, "%s.bin,%s.bin", in_dir("a"), in_dir("b"));
    CHECK_OK(mal_data_open(&d, spec, MAL_DATA_AUTO));
    mal_data_destroy(d);
    snprintf(spec, sizeof spec, "%s.bin,%s.bin", in_dir("a"), in_dir("c"));
    mal_clearerr();
    CHECK_EQ_INT(mal_data_open(&d, spec, MAL_DATA_AUTO), MAL_EMISMATCH);
    CHECK(strstr(mal_errmsg(), "different tokenizers") && strstr(mal_errmsg(), "c.bin"));
    /* a stale record */
    write_data("s", 100, 90, 99, 7);
    snprintf(spec, sizeof spec, "%s.bin", in_dir("s"));
    mal_clearerr();
    CHECK_EQ_INT(mal_data_open(&d, spec, MAL_DATA_AUTO), MAL_EFORMAT);
    CHECK(strstr(mal_errmsg(), "s.tokens.json") && strstr(mal_errmsg(), "stale"));
    /* a record that is not one */
    write_text(in_dir("s.tokens.json"), "{\"format\": \"other\"}");
    CHECK_EQ_INT(mal_data_open(&d, spec, MAL_DATA_AUTO), MAL_EFORMAT);
}

int main(void)
{
    srcdir = getenv("top_srcdir");
    if (!srcdir) srcdir = ".";
    snprintf(dir, sizeof dir, "test_tokenizer.XXXXXX");
    if (!mkdtemp(dir)) return MAL_TEST_ERROR;
    test_crc32();
    test_decode_fixtures();
    test_refs();
    test_records();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return MAL_TEST_ERROR;
    printf("test_tokenizer: ok\n");
    return 0;
}
