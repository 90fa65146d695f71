/* libFuzzer harness: the token-file image parser (src/data_file.c,
 * mal_data_parse_image: llm.c header magics, versions, count against the
 * length; raw uint16 and uint32 files).  The first byte picks the format
 * (auto, llmc, raw16, raw32), the rest is the file.  Whatever it accepts
 * must lie inside the image. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "src/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const int formats[] = {MAL_DATA_AUTO, MAL_DATA_LLMC, MAL_DATA_RAW16, MAL_DATA_RAW32};
    size_t start, n, len = size - 1;
    int w;
    const unsigned char *img = data + 1;
    if (mal_data_parse_image("fuzz", formats[data[0] % 4], img, len, &start, &n, &w)) return 0;
    if (n == 0 || (w != 2 && w != 4) || start > len || n > (len - start) / (size_t)w) abort();
    /* touch every token the parser promised */
    unsigned sum = 0;
    for (size_t i = 0; i < (size_t)w * n; i++)
        sum += img[start + i];
    return (int)(sum & 0);
}
