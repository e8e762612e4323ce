/* PNG reading and writing with libpng's simplified API (png_image), which
 * reports errors in the image's message instead of longjmp. */
#include "png.h"

#include <png.h>
#include <stdlib.h>
#include <string.h>

int lp_png_write(const char *path, const uint8_t *rgb, int width, int height, lp_error *err) {
    if (width < 1 || height < 1) return lp_fail(err, "%s: image of %dx%d pixels", path, width, height);
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)width;
    img.height = (png_uint_32)height;
    img.format = PNG_FORMAT_RGB;
    if (!png_image_write_to_file(&img, path, 0, rgb, (png_int_32)(width * 3), NULL)) {
        lp_error_set(err, LP_ERR_IO, "%s: cannot write PNG: %s", path, img.message);
        png_image_free(&img);
        return -1;
    }
    return 0;
}

int lp_png_read_memory(const void *data, size_t size, const char *name, int64_t max_pixels, uint8_t **rgb,
                       int *width, int *height, lp_error *err) {
    *rgb = NULL;
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, data, size)) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: not a readable PNG: %s", name, img.message);
        png_image_free(&img);
        return -1;
    }
    if (img.width == 0 || img.height == 0 || img.width > (1u << 16) || img.height > (1u << 16) ||
        (int64_t)img.width * img.height > max_pixels) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: %ux%u pixels (at most %lld)", name, img.width, img.height,
                     (long long)max_pixels);
        png_image_free(&img);
        return -1;
    }
    img.format = PNG_FORMAT_RGB;
    size_t bytes = (size_t)img.width * img.height * 3;
    uint8_t *buf = malloc(bytes);
    if (!buf) {
        png_image_free(&img);
        return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", name);
    }
    png_color black = {0, 0, 0};
    if (!png_image_finish_read(&img, &black, buf, (png_int_32)(img.width * 3), NULL)) {
        lp_error_set(err, LP_ERR_FORMAT, "%s: PNG decode failed: %s", name, img.message);
        png_image_free(&img);
        free(buf);
        return -1;
    }
    *rgb = buf;
    *width = (int)img.width;
    *height = (int)img.height;
    return 0;
}

int lp_png_read(const char *path, int64_t max_pixels, uint8_t **rgb, int *width, int *height, lp_error *err) {
    char *data;
    size_t size;
    *rgb = NULL;
    if (lp_read_file(path, &data, &size, (size_t)256 << 20, err)) return -1;
    int rc = lp_png_read_memory(data, size, path, max_pixels, rgb, width, height, err);
    free(data);
    return rc;
}
