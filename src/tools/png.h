/* PNG files through libpng's simplified API: 8-bit RGB images. */
#ifndef LP_TOOLS_PNG_H
#define LP_TOOLS_PNG_H

#include <stddef.h>
#include <stdint.h>

#include "../base/base.h"

/* rgb: height rows of width * 3 bytes. */
int lp_png_write(const char *path, const uint8_t *rgb, int width, int height, lp_error *err);
/* Decodes any PNG libpng reads (palette, grey, 16-bit, alpha composited
 * on black) to 8-bit RGB: *rgb is malloc'd. Images over max_pixels are
 * rejected before decoding. name is for messages. */
int lp_png_read_memory(const void *data, size_t size, const char *name, int64_t max_pixels, uint8_t **rgb,
                       int *width, int *height, lp_error *err);
int lp_png_read(const char *path, int64_t max_pixels, uint8_t **rgb, int *width, int *height, lp_error *err);

#endif
