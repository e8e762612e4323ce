/* Fuzzes the PNG reader (src/tools/png.c, libpng's simplified API): any
 * input either fails with a message or decodes to width x height RGB pixels
 * that are all readable. Seed: a 3x2 8-bit RGB PNG (fuzz/seeds/README.md). */
#include <stdint.h>
#include <stdlib.h>

#include "tools/png.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *rgb;
    int w, h;
    lp_error err;
    if (lp_png_read_memory(data, size, "fuzz.png", 1 << 20, &rgb, &w, &h, &err) == 0) {
        volatile unsigned sum = 0;
        for (int64_t i = 0; i < (int64_t)w * h * 3; i++) sum += rgb[i];
        (void)sum;
        free(rgb);
    }
    return 0;
}
