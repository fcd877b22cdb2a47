/* A tiny training set-up for the trainer tests that check what a step computes rather than how
 * well a model learns: random 4x4 images with random labels written as IDX files in a scratch
 * directory, and a one-layer model spec (flatten, linear 16 -> 10, fused cross-entropy) whose
 * gradient a test can compute on its own. Training on it takes milliseconds. */
#ifndef TANDEM_TESTS_TINY_TRAIN_H
#define TANDEM_TESTS_TINY_TRAIN_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tandem/core.h"
#include "test.h"

enum { TINY_ROWS = 4, TINY_COLS = 4, TINY_IN = TINY_ROWS * TINY_COLS, TINY_CLASSES = 10 };

static void tiny_put_be32(FILE *f, uint32_t v) {
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    ASSERT_EQ(fwrite(b, 1, 4, f), 4);
}

/* dir/{split}-images-idx3-ubyte and -labels-idx1-ubyte: n samples of random pixels and labels
 * drawn from a xorshift generator seeded with `seed` (the same files on every machine). */
static void tiny_write_split(const char *dir, const char *split, uint32_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    char *img = td_xasprintf("%s/%s-images-idx3-ubyte", dir, split);
    char *lab = td_xasprintf("%s/%s-labels-idx1-ubyte", dir, split);
    FILE *fi = fopen(img, "wb"), *fl = fopen(lab, "wb");
    ASSERT(fi && fl);
    tiny_put_be32(fi, 0x803);
    tiny_put_be32(fi, n);
    tiny_put_be32(fi, TINY_ROWS);
    tiny_put_be32(fi, TINY_COLS);
    tiny_put_be32(fl, 0x801);
    tiny_put_be32(fl, n);
    for (uint32_t i = 0; i < n; i++) {
        for (int p = 0; p < TINY_IN; p++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            ASSERT_NE(fputc((int)(s >> 56), fi), EOF);
        }
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        ASSERT_NE(fputc((int)((s >> 32) % TINY_CLASSES), fl), EOF);
    }
    ASSERT_EQ(fclose(fi), 0);
    ASSERT_EQ(fclose(fl), 0);
    free(img);
    free(lab);
}

static char tiny_dir[] = "/tmp/td_test_tiny_train_XXXXXX";

/* Removes the scratch directory at exit, a failed assertion's exit(1) included. */
static void tiny_rm(void) {
    char *cmd = td_xasprintf("rm -rf '%s'", tiny_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tiny_dir);
    free(cmd);
}

/* Makes the scratch directory and writes the data set (train: n_train samples, t10k: 20) and the
 * model spec into it; returns the directory, and the spec's path (malloc'd) in *spec_out. */
static const char *tiny_setup(uint32_t n_train, uint64_t seed, char **spec_out) {
    ASSERT(mkdtemp(tiny_dir));
    atexit(tiny_rm);
    const char *dir = tiny_dir;
    tiny_write_split(dir, "train", n_train, seed);
    tiny_write_split(dir, "t10k", 20, seed + 1);
    char *spec = td_xasprintf("%s/linear.yaml", dir);
    FILE *f = fopen(spec, "w");
    ASSERT(f);
    fprintf(f, "input: [1, %d, %d]\nlayers:\n  - flatten\n  - linear: {out: %d}\n", TINY_ROWS,
            TINY_COLS, TINY_CLASSES);
    ASSERT_EQ(fclose(f), 0);
    *spec_out = spec;
    return dir;
}

#endif /* TANDEM_TESTS_TINY_TRAIN_H */
