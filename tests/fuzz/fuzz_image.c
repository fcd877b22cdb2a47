/* Images (src/data/image.c): td_image_decode on the input (PNG or JPEG by its magic), and every
 * image that decodes converted to grey and to RGB at sizes derived from its own (shrinking and
 * growing). An image that decodes has sane dimensions and every pixel readable; an error names
 * the image. A PNG is decoded a second time with every chunk's CRC-32 recomputed: otherwise
 * almost every mutation of a chunk dies at libpng's CRC check, and never reaches the chunk
 * parsers, the inflate of the image data, or our conversions. */
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "tandem/data.h"

static void decode(const uint8_t *data, size_t size) {
    td_image img;
    td_status st = td_image_decode(data, size, "fuzz-input.img", &img);
    if (st != TD_OK) {
        FUZZ_ASSERT(strstr(td_error_msg(), "fuzz-input.img"), "error without the name: %s",
                    td_error_msg());
        FUZZ_ASSERT(!img.pixels, "%s", "pixels left after an error");
        td_error_clear();
        return;
    }
    FUZZ_ASSERT(img.width > 0 && img.height > 0 && img.channels >= 1 && img.channels <= 4,
                "%dx%dx%d", img.width, img.height, img.channels);
    size_t n = (size_t)img.width * img.height * img.channels;
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++) sum += img.pixels[i];
    (void)sum;
    int h = 1 + img.height % 17, w = 1 + img.width % 13;
    uint8_t *dst = malloc((size_t)3 * h * w);
    FUZZ_ASSERT(dst, "%s", "malloc");
    td_image_convert(&img, 1, h, w, dst);
    td_image_convert(&img, 3, h, w, dst);
    free(dst);
    td_image_free(&img);
}

static uint32_t be32(const uint8_t *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    decode(data, size);
    if (size < 8 || memcmp(data, "\x89PNG\r\n\x1a\n", 8) != 0) return 0;
    uint8_t *fixed = malloc(size);
    FUZZ_ASSERT(fixed, "%s", "malloc");
    memcpy(fixed, data, size);
    size_t p = 8;
    while (size - p >= 12) { /* length, type, data, CRC-32 over type and data */
        uint32_t len = be32(fixed + p);
        if (len > size - p - 12) break;
        uint32_t crc = (uint32_t)crc32(0, fixed + p + 4, len + 4);
        uint8_t *c = fixed + p + 8 + len;
        c[0] = (uint8_t)(crc >> 24), c[1] = (uint8_t)(crc >> 16), c[2] = (uint8_t)(crc >> 8);
        c[3] = (uint8_t)crc;
        p += 12 + (size_t)len;
    }
    decode(fixed, size);
    free(fixed);
    return 0;
}
