/* libFuzzer harness: the token-file image parser (src/data.c,
 * mal_data_parse_image: llm.c header magic, version, count against the
 * length; raw uint16 files).  The first byte picks the format (auto, llmc,
 * raw16), the rest is the file.  Whatever it accepts must lie inside the
 * image. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "src/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const int formats[] = {MAL_DATA_AUTO, MAL_DATA_LLMC, MAL_DATA_RAW16};
    size_t start, n, len = size - 1;
    const unsigned char *img = data + 1;
    if (mal_data_parse_image("fuzz", formats[data[0] % 3], img, len, &start, &n)) return 0;
    if (n == 0 || start > len || n > (len - start) / 2) abort();
    /* touch every token the parser promised */
    unsigned sum = 0;
    for (size_t i = 0; i < 2 * n; i++)
        sum += img[start + i];
    return (int)(sum & 0);
}
