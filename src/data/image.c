/* Images: PNG through libpng, JPEG through libjpeg(-turbo), both decoded from memory to 8-bit
 * interleaved pixels; conversion to CHW with a box filter (shrinking) or bilinear (growing); and
 * torchvision's ImageFolder layout.
 *
 * Both libraries report errors by longjmp from a callback; each decoder keeps all its state in
 * one context struct reached through a pointer, so nothing the jump skips over lives in a
 * register (no -Wclobbered surprises), and frees what it allocated on the way out. libjpeg's
 * default error_exit calls exit(): it is replaced, library code never exits. */
#include <dirent.h>
#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jerror.h>
#include <jpeglib.h>

#include "data/array.h"

/* Far above any training image, and it bounds what a corrupt header can make us allocate. */
#define IMAGE_MAX_SIDE   32768u
#define IMAGE_MAX_PIXELS ((uint64_t)1 << 26)
/* A progressive JPEG's scans each pass over the whole image, and an empty scan costs a few bytes
 * of file: a 362 KB file of repeated scans held a data load for 395 s. Encoders write about 10
 * (libjpeg's default script) and rarely more than a few dozen; libjpeg-turbo's own tools stop
 * at 500. The work bound keeps a large image's scans to seconds: at most
 * JPEG_MAX_SCAN_PIXELS pixels over all scans (64 scans of the largest image tandem decodes). */
#define JPEG_MAX_SCANS       500
#define JPEG_MAX_SCAN_PIXELS ((uint64_t)1 << 32)
/* libpng: the ancillary chunks it keeps (text, unknown, sPLT) and the memory one chunk may
 * decompress to (zTXt, iCCP); libpng 1.6's defaults, stated so they hold whatever the build. */
#define PNG_MAX_CHUNKS      1000
#define PNG_MAX_CHUNK_BYTES (8u << 20)

static td_status too_large(const char *name, uint64_t w, uint64_t h) {
    return td_error(TD_ERR_UNSUPPORTED,
                    "image %s is %llux%llu; tandem decodes at most %u pixels a side and %llu in "
                    "all: resize it first",
                    name, (unsigned long long)w, (unsigned long long)h, IMAGE_MAX_SIDE,
                    (unsigned long long)IMAGE_MAX_PIXELS);
}

static bool size_ok(uint64_t w, uint64_t h) {
    return w > 0 && h > 0 && w <= IMAGE_MAX_SIDE && h <= IMAGE_MAX_SIDE &&
           w * h <= IMAGE_MAX_PIXELS;
}

/* ---- PNG ---- */

typedef struct {
    const uint8_t *bytes;
    size_t n, off;
    char msg[256];
    png_structp png;
    png_infop info;
    uint8_t *pixels;
    png_bytep *rows;
    td_image img;
    bool too_large;
} png_ctx;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png, (void)msg; /* ancillary-chunk complaints; the pixels are still right */
}

static void png_read_mem(png_structp png, png_bytep out, size_t len) {
    png_ctx *c = png_get_io_ptr(png);
    if (len > c->n - c->off) png_error(png, "the file is truncated");
    memcpy(out, c->bytes + c->off, len);
    c->off += len;
}

/* 0 on success; 1 with c->msg set. Everything it allocates is in c. */
static int png_decode(png_ctx *c) {
    c->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, c, png_on_error, png_on_warning);
    if (!c->png) {
        snprintf(c->msg, sizeof c->msg, "libpng could not allocate");
        return 1;
    }
    c->info = png_create_info_struct(c->png);
    if (!c->info) {
        snprintf(c->msg, sizeof c->msg, "libpng could not allocate");
        return 1;
    }
    if (setjmp(png_jmpbuf(c->png))) return 1;
    png_set_read_fn(c->png, c, png_read_mem);
    png_set_user_limits(c->png, IMAGE_MAX_SIDE, IMAGE_MAX_SIDE);
    png_set_chunk_cache_max(c->png, PNG_MAX_CHUNKS);
    png_set_chunk_malloc_max(c->png, PNG_MAX_CHUNK_BYTES);
    png_read_info(c->png, c->info);
    png_uint_32 w = png_get_image_width(c->png, c->info), h = png_get_image_height(c->png, c->info);
    if (!size_ok(w, h)) {
        c->img.width = (int)w, c->img.height = (int)h;
        c->too_large = true;
        return 1;
    }
    int type = png_get_color_type(c->png, c->info), depth = png_get_bit_depth(c->png, c->info);
    if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(c->png);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(c->png);
    if (png_get_valid(c->png, c->info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(c->png);
    /* the high byte, as PIL reduces 16-bit RGB */
    if (depth == 16) png_set_strip_16(c->png);
    png_set_interlace_handling(c->png);
    png_read_update_info(c->png, c->info);
    int ch = png_get_channels(c->png, c->info);
    if (ch < 1 || ch > 4 || png_get_rowbytes(c->png, c->info) != (size_t)w * (size_t)ch)
        png_error(c->png, "unexpected pixel layout after conversion to 8 bits");
    c->pixels = malloc((size_t)w * h * (size_t)ch);
    c->rows = malloc((size_t)h * sizeof *c->rows);
    if (!c->pixels || !c->rows) png_error(c->png, "out of memory for the pixels");
    for (png_uint_32 y = 0; y < h; y++) c->rows[y] = c->pixels + (size_t)y * w * (size_t)ch;
    png_read_image(c->png, c->rows);
    c->img.width = (int)w;
    c->img.height = (int)h;
    c->img.channels = ch;
    return 0;
}

static td_status decode_png(const uint8_t *bytes, size_t n, const char *name, td_image *out) {
    png_ctx *c = td_xcalloc(1, sizeof *c);
    c->bytes = bytes;
    c->n = n;
    td_status rc = TD_OK;
    if (png_decode(c) != 0) {
        if (c->too_large)
            rc = too_large(name, (uint64_t)c->img.width, (uint64_t)c->img.height);
        else
            rc = td_error(TD_ERR_FORMAT,
                          "image %s: cannot decode the PNG (libpng: %s); the file is damaged, "
                          "export it again",
                          name, c->msg);
        free(c->pixels);
    } else {
        *out = c->img;
        out->pixels = c->pixels;
    }
    png_destroy_read_struct(c->png ? &c->png : NULL, c->info ? &c->info : NULL, NULL);
    free(c->rows);
    free(c);
    return rc;
}

/* ---- JPEG ---- */

typedef struct {
    struct jpeg_error_mgr pub; /* first: libjpeg's err pointer is cast back to this */
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
    struct jpeg_decompress_struct cinfo;
    struct jpeg_progress_mgr progress;
    int max_scans; /* JPEG_MAX_SCANS, less for a large image */
    bool created;
    uint8_t *pixels;
    td_image img;
    bool too_large, cmyk, too_many_scans;
} jpeg_ctx;

static void jpeg_on_error(j_common_ptr ci) {
    jpeg_ctx *c = (jpeg_ctx *)ci->err;
    ci->err->format_message(ci, c->msg);
    longjmp(c->jump, 1);
}

/* Warnings: image data that ends early, at the end of the file (JWRN_JPEG_EOF) or at a marker
 * (JWRN_HIT_MARKER), is an error: libjpeg would fill the rest of the image with grey, and a
 * training set should not silently hold half-grey images (a 145-byte file would decode to 2000 x
 * 2000 grey pixels). Other corrupt-data warnings that libjpeg recovers from (extraneous bytes
 * before a marker) are let through, as PIL does. */
static void jpeg_on_message(j_common_ptr ci, int level) {
    if (level < 0 && (ci->err->msg_code == JWRN_JPEG_EOF || ci->err->msg_code == JWRN_HIT_MARKER))
        jpeg_on_error(ci);
}

static void jpeg_quiet(j_common_ptr ci) {
    (void)ci;
}

/* Called as libjpeg reads the input (each row of blocks of every scan): stops at the scan limit,
 * before the next scan's pass over the image. */
static void jpeg_on_progress(j_common_ptr ci) {
    jpeg_ctx *c = (jpeg_ctx *)ci->err;
    if (((j_decompress_ptr)ci)->input_scan_number <= c->max_scans) return;
    c->too_many_scans = true;
    longjmp(c->jump, 1);
}

static int jpeg_decode(jpeg_ctx *c, const uint8_t *bytes, size_t n) {
    c->cinfo.err = jpeg_std_error(&c->pub);
    c->pub.error_exit = jpeg_on_error;
    c->pub.emit_message = jpeg_on_message;
    c->pub.output_message = jpeg_quiet;
    if (setjmp(c->jump)) return 1;
    jpeg_create_decompress(&c->cinfo);
    c->created = true;
    jpeg_mem_src(&c->cinfo, bytes, (unsigned long)n);
    jpeg_read_header(&c->cinfo, TRUE);
    uint64_t w = c->cinfo.image_width, h = c->cinfo.image_height;
    if (!size_ok(w, h)) {
        c->img.width = (int)w, c->img.height = (int)h;
        c->too_large = true;
        return 1;
    }
    c->img.width = (int)w, c->img.height = (int)h; /* for the scan limit's message */
    c->max_scans = (int)TD_MIN((uint64_t)JPEG_MAX_SCANS, JPEG_MAX_SCAN_PIXELS / (w * h));
    c->progress.progress_monitor = jpeg_on_progress;
    c->cinfo.progress = &c->progress;
    switch (c->cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
        c->cinfo.out_color_space = JCS_GRAYSCALE;
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        c->cmyk = true;
        return 1;
    default:
        c->cinfo.out_color_space = JCS_RGB;
        break;
    }
    jpeg_start_decompress(&c->cinfo);
    int ch = c->cinfo.output_components;
    size_t stride = (size_t)c->cinfo.output_width * (size_t)ch;
    c->pixels = malloc(stride * c->cinfo.output_height);
    if (!c->pixels) {
        snprintf(c->msg, sizeof c->msg, "out of memory for the pixels");
        return 1;
    }
    while (c->cinfo.output_scanline < c->cinfo.output_height) {
        JSAMPROW row = c->pixels + (size_t)c->cinfo.output_scanline * stride;
        jpeg_read_scanlines(&c->cinfo, &row, 1);
    }
    c->img.width = (int)c->cinfo.output_width;
    c->img.height = (int)c->cinfo.output_height;
    c->img.channels = ch;
    jpeg_finish_decompress(&c->cinfo);
    return 0;
}

static td_status decode_jpeg(const uint8_t *bytes, size_t n, const char *name, td_image *out) {
    jpeg_ctx *c = td_xcalloc(1, sizeof *c);
    td_status rc = TD_OK;
    if (jpeg_decode(c, bytes, n) != 0) {
        if (c->too_large)
            rc = too_large(name, (uint64_t)c->img.width, (uint64_t)c->img.height);
        else if (c->too_many_scans)
            rc = td_error(TD_ERR_UNSUPPORTED,
                          "image %s: a progressive JPEG (%dx%d) of more than %d scans; encoders "
                          "write about 10, so the file is damaged or made to stall decoders: "
                          "re-encode it (PIL: Image.open(p).save(p, quality=95)) or remove it",
                          name, c->img.width, c->img.height, c->max_scans);
        else if (c->cmyk)
            rc = td_error(TD_ERR_UNSUPPORTED,
                          "image %s is a CMYK JPEG; convert it to RGB (PIL: "
                          "Image.open(p).convert('RGB').save(p))",
                          name);
        else
            rc = td_error(TD_ERR_FORMAT,
                          "image %s: cannot decode the JPEG (libjpeg: %s); the file is damaged "
                          "or truncated, export it again",
                          name, c->msg);
        free(c->pixels);
    } else {
        *out = c->img;
        out->pixels = c->pixels;
    }
    if (c->created) jpeg_destroy_decompress(&c->cinfo);
    free(c);
    return rc;
}

td_status td_image_decode(const uint8_t *bytes, size_t n, const char *name, td_image *out) {
    memset(out, 0, sizeof *out);
    if (n >= 8 && memcmp(bytes, "\x89PNG\r\n\x1a\n", 8) == 0)
        return decode_png(bytes, n, name, out);
    if (n >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff)
        return decode_jpeg(bytes, n, name, out);
    uint8_t head[4] = {0};
    memcpy(head, bytes, n < 4 ? n : 4);
    return td_error(TD_ERR_FORMAT,
                    "image %s is neither PNG nor JPEG (it starts with %02x %02x %02x %02x); "
                    "convert it to PNG",
                    name, head[0], head[1], head[2], head[3]);
}

void td_image_free(td_image *img) {
    if (!img) return;
    free(img->pixels);
    memset(img, 0, sizeof *img);
}

/* ---- conversion ---- */

typedef struct {
    int first, count; /* source indices first .. first+count-1 */
    float *w;         /* their weights, summing to 1 */
} taps;

/* 1-D resampling weights from n_in to n_out samples: a box filter when shrinking, bilinear
 * between pixel centres when growing, identity when equal. */
static taps *make_taps(int n_in, int n_out) {
    taps *t = td_xcalloc((size_t)n_out, sizeof *t);
    double scale = (double)n_in / n_out;
    for (int i = 0; i < n_out; i++) {
        if (n_in > n_out) {
            /* the mean of the source pixels whose centres fall in (i, i + 1] * scale, computed
             * as PIL's Image.BOX resize computes it (precompute_coeffs, box_filter), so that
             * tandem and torchvision on PIL images see the same pixels */
            double centre = (i + 0.5) * scale, support = 0.5 * scale;
            int lo = (int)(centre - support + 0.5), hi = (int)(centre + support + 0.5);
            if (lo < 0) lo = 0;
            if (hi > n_in) hi = n_in;
            int j0 = -1, j1 = -1;
            for (int j = lo; j < hi; j++) {
                double d = (j - centre + 0.5) / scale;
                if (d > -0.5 && d <= 0.5) {
                    if (j0 < 0) j0 = j;
                    j1 = j;
                }
            }
            if (j0 < 0) j0 = j1 = lo < n_in ? lo : n_in - 1;
            t[i].first = j0;
            t[i].count = j1 - j0 + 1;
            t[i].w = td_xmalloc((size_t)t[i].count * sizeof(float));
            for (int j = 0; j < t[i].count; j++) t[i].w[j] = 1.0f / (float)t[i].count;
        } else {
            double x = (i + 0.5) * scale - 0.5;
            if (x < 0) x = 0;
            int j = (int)x;
            if (j >= n_in - 1) {
                t[i].first = n_in - 1;
                t[i].count = 1;
                t[i].w = td_xmalloc(sizeof(float));
                t[i].w[0] = 1;
                continue;
            }
            float f = (float)(x - j);
            t[i].first = j;
            t[i].count = 2;
            t[i].w = td_xmalloc(2 * sizeof(float));
            t[i].w[0] = 1 - f;
            t[i].w[1] = f;
        }
    }
    return t;
}

static void free_taps(taps *t, int n) {
    for (int i = 0; i < n; i++) free(t[i].w);
    free(t);
}

void td_image_convert(const td_image *img, int channels, int h, int w, uint8_t *dst) {
    int H = img->height, W = img->width, C = img->channels;
    uint8_t *plane = td_xmalloc((size_t)H * (size_t)W);
    float *tmp = td_xmalloc((size_t)H * (size_t)w * sizeof(float));
    taps *tx = make_taps(W, w), *ty = make_taps(H, h);
    bool colour = C >= 3;
    for (int c = 0; c < channels; c++) {
        /* the source plane of output channel c */
        for (size_t i = 0; i < (size_t)H * W; i++) {
            const uint8_t *p = img->pixels + i * (size_t)C;
            if (channels == 1 && colour) /* PIL's "L": ITU-R 601-2 luma, fixed point */
                plane[i] =
                    (uint8_t)((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
            else
                plane[i] = colour ? p[c < 3 ? c : 2] : p[0];
        }
        for (int y = 0; y < H; y++)
            for (int x = 0; x < w; x++) {
                float s = 0;
                const uint8_t *row = plane + (size_t)y * W + tx[x].first;
                for (int k = 0; k < tx[x].count; k++) s += tx[x].w[k] * row[k];
                tmp[(size_t)y * w + x] = s;
            }
        uint8_t *out = dst + (size_t)c * h * w;
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                float s = 0;
                for (int k = 0; k < ty[y].count; k++)
                    s += ty[y].w[k] * tmp[(size_t)(ty[y].first + k) * w + x];
                s += 0.5f;
                out[(size_t)y * w + x] = (uint8_t)(s < 0 ? 0 : s > 255 ? 255 : s);
            }
    }
    free_taps(tx, w);
    free_taps(ty, h);
    free(tmp);
    free(plane);
}

/* ---- ImageFolder ---- */

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_image_name(const char *n) {
    const char *dot = strrchr(n, '.');
    return dot &&
           (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

/* The sorted, non-hidden entries of dir that are directories (want_dirs) or image files. */
static td_status list_dir(const char *dir, bool want_dirs, char ***names, int *count) {
    *names = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return td_error_errno(TD_ERR_NOTFOUND, "image folder %s does not exist; check the path",
                                  dir);
        return td_error_errno(TD_ERR_IO, "cannot list image folder %s", dir);
    }
    int n = 0, cap = 0;
    char **out = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (!want_dirs && !is_image_name(e->d_name)) continue;
        char *p = td_xasprintf("%s/%s", dir, e->d_name);
        struct stat sb;
        bool keep = stat(p, &sb) == 0 && (want_dirs ? S_ISDIR(sb.st_mode) : S_ISREG(sb.st_mode));
        free(p);
        if (!keep) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            out = td_xrealloc(out, (size_t)cap * sizeof *out);
        }
        out[n++] = td_xstrdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(out, (size_t)n, sizeof *out, cmp_name);
    *names = out;
    *count = n;
    return TD_OK;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

static td_status read_image_file(const char *path, td_image *img) {
    int fd;
    uint64_t n;
    TD_CHECK(td__file_open(path, "image", &fd, &n));
    uint8_t *b = n <= SIZE_MAX ? malloc(n ? (size_t)n : 1) : NULL;
    if (!b) {
        close(fd);
        return td_error(TD_ERR_NOMEM, "image %s: cannot allocate %llu bytes to read it", path,
                        (unsigned long long)n);
    }
    td_status rc = TD_OK;
    if (td__pread_full(fd, b, n, 0) != 0)
        rc = td_error_errno(TD_ERR_IO, "cannot read image %s", path);
    close(fd);
    if (rc == TD_OK) rc = td_image_decode(b, (size_t)n, path, img);
    free(b);
    return rc;
}

td_status td_image_folder_read(const char *dir, int channels, int h, int w, td_array *x,
                               int32_t **labels, char ***class_names, int *num_classes) {
    memset(x, 0, sizeof *x);
    *labels = NULL;
    *class_names = NULL;
    *num_classes = 0;
    if (channels != 0 && channels != 1 && channels != 3)
        return td_error(TD_ERR_INVALID,
                        "image folder %s: %d channels asked for; use 1 (grey), 3 (RGB) or 0 (as "
                        "the first image)",
                        dir, channels);
    if (h < 0 || w < 0)
        return td_error(TD_ERR_INVALID, "image folder %s: size %dx%d is negative", dir, h, w);
    td_status rc = TD_OK;
    char **classes = NULL, ***files = NULL;
    int nclasses = 0, *nfiles = NULL;
    int32_t *lab = NULL;
    uint64_t total = 0;
    TD_CHECK(list_dir(dir, true, &classes, &nclasses));
    if (nclasses == 0) {
        rc = td_error(TD_ERR_FORMAT,
                      "image folder %s has no class subfolders; expected %s/<class>/<image>.png "
                      "(or .jpg), one subfolder per class, as torchvision's ImageFolder reads",
                      dir, dir);
        goto out;
    }
    files = td_xcalloc((size_t)nclasses, sizeof *files);
    nfiles = td_xcalloc((size_t)nclasses, sizeof *nfiles);
    for (int c = 0; c < nclasses; c++) {
        char *sub = td_xasprintf("%s/%s", dir, classes[c]);
        rc = list_dir(sub, false, &files[c], &nfiles[c]);
        free(sub);
        if (rc != TD_OK) goto out;
        if (nfiles[c] == 0) {
            rc = td_error(TD_ERR_FORMAT,
                          "image folder %s: class folder '%s' holds no .png or .jpg images; add "
                          "some or remove the folder",
                          dir, classes[c]);
            goto out;
        }
        total += (uint64_t)nfiles[c];
    }
    lab = td_xmalloc((size_t)total * sizeof *lab);
    uint64_t i = 0, per = 0;
    for (int c = 0; c < nclasses; c++)
        for (int k = 0; k < nfiles[c]; k++, i++) {
            char *p = td_xasprintf("%s/%s/%s", dir, classes[c], files[c][k]);
            td_image img;
            rc = read_image_file(p, &img);
            free(p);
            if (rc != TD_OK) goto out;
            if (i == 0) {
                if (channels == 0) channels = img.channels >= 3 ? 3 : 1;
                if (h == 0) h = img.height;
                if (w == 0) w = img.width;
                per = (uint64_t)channels * (uint64_t)h * (uint64_t)w;
                x->data =
                    per && total <= (SIZE_MAX / 2) / per ? malloc((size_t)(total * per)) : NULL;
                if (!x->data) {
                    td_image_free(&img);
                    rc = td_error(TD_ERR_NOMEM,
                                  "image folder %s: cannot allocate %llu images of %dx%dx%d; "
                                  "choose a smaller size",
                                  dir, (unsigned long long)total, channels, h, w);
                    goto out;
                }
            }
            td_image_convert(&img, channels, h, w, (uint8_t *)x->data + i * per);
            td_image_free(&img);
            lab[i] = c;
        }
    x->dtype = TD_DTYPE_U8;
    x->ndim = 4;
    x->shape[0] = total;
    x->shape[1] = (uint64_t)channels;
    x->shape[2] = (uint64_t)h;
    x->shape[3] = (uint64_t)w;
    *labels = lab;
    lab = NULL;
    *class_names = classes;
    *num_classes = nclasses;
    classes = NULL;
out:
    for (int c = 0; files && c < nclasses; c++) free_names(files[c], nfiles[c]);
    free(files);
    free(nfiles);
    free(lab);
    if (classes) free_names(classes, nclasses);
    if (rc != TD_OK) td_array_free(x);
    return rc;
}
