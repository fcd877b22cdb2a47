/* data: the class numbering of an image folder (src/data/image.c) against torchvision's rule.
 * ImageFolder numbers classes in the order of Python's sorted() on the folder names, which is
 * codepoint (for UTF-8 names, byte) order: "Zebra" < "apple", "B" < "_x" < "b", "10" < "9".
 * A reader that sorted case-insensitively (strcasecmp) or naturally would give a model trained
 * here different class indices from the same folder read by PyTorch. The reference is computed
 * independently twice: a list written out by hand here, and /usr/bin/python3 running
 * imagefolder_order.py (ImageFolder's find_classes/make_dataset) over the same folder. Each
 * image holds one pixel whose value says which file it is, so every sample's label and pixels
 * are checked, through td_image_folder_read and through td_dataset_open. */
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/data.h"
#include "test.h"

static char tmpdir[] = "/tmp/td_test_class_order_XXXXXX";

/* The folders and files made, in creation order; pixel value = 10 * class + file + 1. */
#define NCLASS 11
static const char *const CLASSES[NCLASS] = {"Zebra", "apple", "b",  "B",  "_x", "10",
                                            "9",     "\xc3\xa9t\xc3\xa9" /* été */,
                                            "Apple", "a b",   "~"};
/* Every class holds "b.png"; "apple" also holds "a.png" and "B.png" (sorted: B.png a.png b.png). */
#define NFILE 3
static const char *const FILES[NFILE] = {"b.png", "a.png", "B.png"};

/* sorted() of CLASSES, worked out by hand from the codepoints:
 * '1' 0x31 < '9' 0x39 < 'A' 0x41 < 'B' 0x42 < 'Z' 0x5a < '_' 0x5f < 'a' 0x61 ("a b" < "apple":
 * ' ' 0x20 < 'p') < 'b' 0x62 < '~' 0x7e < 'é' U+00E9. */
static const char *const SORTED[NCLASS] = {"10",    "9", "Apple", "B", "Zebra",
                                           "_x",    "a b", "apple", "b", "~",
                                           "\xc3\xa9t\xc3\xa9"};

static int class_made(const char *name) {
    for (int i = 0; i < NCLASS; i++)
        if (!strcmp(CLASSES[i], name)) return i;
    TEST_FAIL("class folder '%s' was not made by this test", name);
}

static int file_made(const char *name) {
    for (int i = 0; i < NFILE; i++)
        if (!strcmp(FILES[i], name)) return i;
    TEST_FAIL("file '%s' was not made by this test", name);
}

static void write_png1(const char *path, uint8_t value) {
    FILE *f = fopen(path, "wb");
    if (!f) TEST_FAIL("cannot create %s", path);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    ASSERT(png && info);
    if (setjmp(png_jmpbuf(png))) TEST_FAIL("libpng failed writing %s", path);
    png_init_io(png, f);
    png_set_IHDR(png, info, 1, 1, 8, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    png_write_row(png, &value);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    ASSERT_EQ(fclose(f), 0);
}

/* One expected sample: its class index and its pixel. */
typedef struct {
    int label;
    uint8_t pixel;
} sample;

/* ImageFolder's samples by the hand-written rule. */
static int expected_by_hand(sample *s) {
    int n = 0;
    for (int c = 0; c < NCLASS; c++) {
        int made = class_made(SORTED[c]);
        if (!strcmp(SORTED[c], "apple")) {
            const char *order[NFILE] = {"B.png", "a.png", "b.png"};
            for (int k = 0; k < NFILE; k++)
                s[n++] = (sample){c, (uint8_t)(10 * made + file_made(order[k]) + 1)};
        } else {
            s[n++] = (sample){c, (uint8_t)(10 * made + 1)};
        }
    }
    return n;
}

/* ImageFolder's samples as Python computes them; -1 when /usr/bin/python3 cannot run. Also
 * checks that Python's class order is SORTED (the hand-written list is right). */
static int expected_by_python(const char *root, sample *s, int max) {
    const char *py = "/usr/bin/python3";
    if (access(py, X_OK) != 0) return -1;
    char *script = td_xasprintf("%s", __FILE__);
    char *slash = strrchr(script, '/');
    char *helper = td_xasprintf("%.*s/imagefolder_order.py", slash ? (int)(slash - script) : 1,
                                slash ? script : ".");
    if (access(helper, R_OK) != 0) TEST_FAIL("%s is missing", helper);
    char *out = td_xasprintf("%s/python_order.txt", tmpdir);
    char *cmd = td_xasprintf("%s %s %s > %s", py, helper, root, out);
    int rc = system(cmd);
    if (rc != 0) TEST_FAIL("%s failed (status %d)", cmd, rc);
    FILE *f = fopen(out, "r");
    ASSERT(f);
    char line[512], prev[512] = "";
    int n = 0, c = -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *sep = strrchr(line, '/');
        if (!sep) TEST_FAIL("python printed '%s', not <class>/<file>", line);
        *sep = '\0';
        if (c < 0 || strcmp(prev, line)) {
            c++;
            snprintf(prev, sizeof prev, "%s", line);
            ASSERT(c < NCLASS);
            ASSERT_STREQ(line, SORTED[c]); /* Python's sorted() agrees with the list by hand */
        }
        ASSERT(n < max);
        s[n++] = (sample){c, (uint8_t)(10 * class_made(line) + file_made(sep + 1) + 1)};
    }
    fclose(f);
    ASSERT_EQ(c + 1, NCLASS);
    free(cmd);
    free(out);
    free(helper);
    free(script);
    return n;
}

static void check_samples(const char *how, const sample *want, int n, const int32_t *labels,
                          const uint8_t *pixels, uint64_t count) {
    ASSERT_EQ(count, n);
    for (int i = 0; i < n; i++)
        if (labels[i] != want[i].label || pixels[i] != want[i].pixel)
            TEST_FAIL("%s: sample %d has label %d and pixel %d; ImageFolder's order gives label "
                      "%d (class '%s') and pixel %d",
                      how, i, labels[i], pixels[i], want[i].label, SORTED[want[i].label],
                      want[i].pixel);
}

int main(void) {
    ASSERT(mkdtemp(tmpdir));
    char *root = td_xasprintf("%s/folder", tmpdir);
    ASSERT_EQ(mkdir(root, 0700), 0);
    for (int c = 0; c < NCLASS; c++) {
        char *d = td_xasprintf("%s/%s", root, CLASSES[c]);
        ASSERT_EQ(mkdir(d, 0700), 0);
        int nf = !strcmp(CLASSES[c], "apple") ? NFILE : 1;
        for (int k = 0; k < nf; k++) {
            char *p = td_xasprintf("%s/%s", d, FILES[k]);
            write_png1(p, (uint8_t)(10 * c + k + 1));
            free(p);
        }
        free(d);
    }

    sample by_hand[NCLASS + NFILE], by_python[NCLASS + NFILE];
    int n = expected_by_hand(by_hand);
    int np = expected_by_python(root, by_python, NCLASS + NFILE);
    if (np < 0)
        printf("NOTE: no /usr/bin/python3: checking against the hand-written order only\n");
    else
        ASSERT_EQ(np, n);

    /* the reader: class names and every sample's label and pixel */
    td_array x;
    int32_t *labels;
    char **classes;
    int nc;
    ASSERT_OK(td_image_folder_read(root, 1, 1, 1, &x, &labels, &classes, &nc));
    ASSERT_EQ(nc, NCLASS);
    for (int c = 0; c < NCLASS; c++)
        if (strcmp(classes[c], SORTED[c]))
            TEST_FAIL("class %d is '%s'; Python's sorted() of the folder names puts '%s' there "
                      "(codepoint order, as torchvision's ImageFolder)",
                      c, classes[c], SORTED[c]);
    check_samples("td_image_folder_read (by hand)", by_hand, n, labels, x.data, x.shape[0]);
    if (np >= 0)
        check_samples("td_image_folder_read (python)", by_python, n, labels, x.data, x.shape[0]);
    td_array_free(&x);
    free(labels);
    for (int c = 0; c < nc; c++) free(classes[c]);
    free(classes);

    /* the data set the trainer opens from the same folder: the same labels */
    td_data_options o = {.format = "images", .class_targets = true, .channels = 1, .height = 1,
                         .width = 1};
    td_dataset_t *train, *test;
    ASSERT_OK(td_dataset_open(root, &o, &train, &test));
    ASSERT(test == NULL);
    ASSERT_EQ(td_dataset_num_classes(train), NCLASS);
    const int32_t *dl = td_dataset_labels(train);
    const uint8_t *dp = td_dataset_pixels(train);
    ASSERT(dl && dp);
    check_samples("td_dataset_open", np >= 0 ? by_python : by_hand, n, dl, dp,
                  td_dataset_count(train));
    td_dataset_free(train);

    char *cmd = td_xasprintf("rm -rf %s", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    free(root);
    TEST_PASS();
}
