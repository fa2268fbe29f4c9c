/*
 * replay_main.c — runs a libFuzzer target without libFuzzer: calls
 * LLVMFuzzerTestOneInput() once on the contents of each file named on the
 * command line (the committed corpus in tests/fuzz/corpus/<name>/). Built
 * with the ASan+UBSan gcc build by `make test`; a crash aborts the run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    int i;

    for (i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0, n;

        if (!f) {
            perror(argv[i]);
            return 1;
        }
        do {
            if (len == cap) {
                uint8_t *nb = realloc(buf, cap = cap ? cap * 2 : 4096);

                if (!nb) {
                    fprintf(stderr, "%s: out of memory\n", argv[i]);
                    return 1;
                }
                buf = nb;
            }
            n = fread(buf + len, 1, cap - len, f);
            len += n;
        } while (n > 0);
        if (ferror(f)) {
            perror(argv[i]);
            return 1;
        }
        fclose(f);
        LLVMFuzzerTestOneInput(buf, len);
        free(buf);
    }
    printf("replayed %d input(s)\n", argc - 1);
    return 0;
}
