/* malleus-tokenize: turn a text file (or the built-in corpus) into a token
 * file that malleus-train reads, with the byte-level tokenizer (vocab 256).
 * A thin shell over data.c. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/mal.h"
#include "src/corpus.h"
#include "src/data.h"

enum { EXIT_USAGE = 2 };

static void usage(FILE *f)
{
    fprintf(f, "Usage: malleus-tokenize [--format llmc|raw16] INPUT.txt OUTPUT.bin\n"
               "       malleus-tokenize [--format llmc|raw16] --default OUTPUT.bin\n"
               "\n"
               "Tokenize a text file byte by byte (each byte is one token, vocabulary 256)\n"
               "and write the tokens to OUTPUT.bin, atomically.\n"
               "\n"
               "  -f, --format FMT  llmc (llm.c format: 1024-byte header, then uint16 tokens;\n"
               "                    the default) or raw16 (headerless uint16, nanoGPT)\n"
               "  -d, --default     write the built-in corpus instead of reading INPUT.txt\n"
               "  -h, --help        show this help and exit\n"
               "  -V, --version     show the version and exit\n"
               "\n"
               "Exit status: 0 done; 2 bad usage or input (a missing, empty or non-regular\n"
               "INPUT.txt, an OUTPUT.bin that is a directory or in a missing directory);\n"
               "1 any other failure (I/O, memory).\n");
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"format", required_argument, NULL, 'f'},
        {"default", no_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int format = MAL_DATA_LLMC, use_default = 0, c;
    while ((c = getopt_long(argc, argv, "f:dhV", longopts, NULL)) != -1) {
        switch (c) {
        case 'f':
            if (mal_data_parse_format(optarg, &format) != 0 || format == MAL_DATA_AUTO) {
                fprintf(stderr, "malleus-tokenize: unknown output format '%s': use llmc or raw16\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case 'd':
            use_default = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("malleus-tokenize (malleus) %s\n", PACKAGE_VERSION);
            return 0;
        default:
            fprintf(stderr, "Try 'malleus-tokenize --help' for more information.\n");
            return EXIT_USAGE;
        }
    }
    int n_args = argc - optind;
    if (n_args != (use_default ? 1 : 2)) {
        fprintf(stderr,
                use_default ? "malleus-tokenize: --default takes only OUTPUT.bin (got %d "
                              "arguments)\n"
                            : "malleus-tokenize: expected INPUT.txt and OUTPUT.bin (got %d "
                              "arguments)\n",
                n_args);
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *input = use_default ? NULL : argv[optind];
    const char *output = argv[argc - 1];

    uint16_t *tokens = NULL;
    size_t n = 0;
    int rc;
    /* the input is read whole before the output replaces it: the same
     * file (or a link to it) would be lost */
    const mal_input_ref in = {"INPUT.txt", input};
    if ((rc = mal_output_check_inputs("OUTPUT.bin", output, &in, 1))) {
        fprintf(stderr, "malleus-tokenize: %s\n", mal_errmsg());
        return mal_exit_status(rc);
    }
    if (use_default) {
        char *text = NULL;
        rc = mal_corpus_generate(&text, &n);
        if (rc == 0) {
            tokens = malloc(n * sizeof *tokens);
            if (!tokens) rc = MAL_ERR(MAL_ENOMEM, "out of memory (%zu tokens)", n);
            for (size_t i = 0; tokens && i < n; i++)
                tokens[i] = (unsigned char)text[i];
        }
        free(text);
    } else {
        rc = mal_data_tokenize_bytes(input, &tokens, &n);
    }
    if (rc == 0) rc = mal_data_write(output, format, tokens, n);
    if (rc != 0) {
        fprintf(stderr, "malleus-tokenize: %s (%s)\n", mal_errmsg(), mal_strerror(rc));
        free(tokens);
        return mal_exit_status(rc);
    }
    int mx = 0;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] > mx) mx = tokens[i];
    free(tokens);
    printf("malleus-tokenize: wrote %zu tokens (%s, vocab %d, max id %d) from %s to %s\n", n,
           mal_data_format_name(format), MAL_DATA_BYTE_VOCAB, mx,
           use_default ? "the built-in corpus" : input, output);
    return 0;
}
