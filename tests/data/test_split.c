/* data: the held-out split (--val-fraction, td_dataset_split) and the statistics computed over
 * it (td_dataset_compute_norm), through the public API, in memory and file-backed
 * (TANDEM_DATA_IN_MEMORY=1 / 0), for float32 tables and uint8 images (the two ways statistics
 * are computed: sums, and a histogram per channel).
 *   - Every sample carries its own index as feature 0, so the ids each part gathers are known:
 *     train and held-out must be disjoint and together cover every sample, the held-out part
 *     exactly the last ceil(F * n) of the split's fixed permutation (data.h), the same on both
 *     storage paths.
 *   - The statistics must be those of the training part alone (computed here in double from the
 *     gathered samples), and the same bits in memory and file-backed.
 *   - td_dataset_pack gives the training part's records in its order with their labels, and
 *     a set with real targets (regression, multi-label) its target rows. */
#include <stdlib.h>

#include "tandem/data.h"
#include "test.h"

/* data.h's "fixed shuffle of ds (independent of the run's seed)": the seed of that shuffle
 * (src/data/dataset.c, SPLIT_SEED, "SPLIT"). A change to it moves every user's held-out set. */
#define SPLIT_SEED 0x53504c4954000001ull

enum { N = 203, FEAT = 3 };
static char tmpdir[] = "/tmp/td_test_split_XXXXXX";
static float xf[N][FEAT];        /* the float table's rows */
static uint8_t xb[N][1][2][2];   /* the uint8 images */

static char *write_npy(const char *name, const char *descr, const char *shape, const void *data,
                       size_t nbytes) {
    char dict[200];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
             shape);
    size_t dlen = strlen(dict), total = (10 + dlen + 1 + 63) / 64 * 64, hl = total - 10;
    char *p = td_xasprintf("%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    ASSERT(f);
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)hl, (uint8_t)(hl >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, dlen, f);
    for (size_t i = 10 + dlen; i < total - 1; i++) fputc(' ', f);
    fputc('\n', f);
    ASSERT_EQ(fwrite(data, 1, nbytes, f), nbytes);
    ASSERT_EQ(fclose(f), 0);
    return p;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Gathers every sample of ds (unnormalised: mean 0, std 1 until set) into x [count, S]; the id
 * of each is feature 0 (times 255 for uint8, whose gather scales by 1/255). */
static float *gather_all(const td_dataset_t *ds, bool u8, uint64_t *ids_out) {
    uint64_t n = td_dataset_count(ds);
    int S = td_dataset_sample_size(ds);
    float *x = malloc(n * (size_t)S * sizeof *x);
    uint64_t *ids = malloc(n * sizeof *ids);
    int32_t *y = malloc(n * sizeof *y);
    ASSERT(x && ids && y);
    for (uint64_t i = 0; i < n; i++) ids[i] = i;
    ASSERT_OK(td_dataset_gather(ds, ids, (int)n, x, y, NULL));
    for (uint64_t i = 0; i < n; i++) {
        double v = x[i * (size_t)S] * (u8 ? 255.0 : 1.0);
        ids_out[i] = (uint64_t)(v + 0.5); /* no libm in the tests */
        ASSERT_NEAR(v, (double)ids_out[i], 1e-3);
        ASSERT_EQ(y[i], (int32_t)(ids_out[i] % 3)); /* the target travels with its sample */
    }
    free(ids);
    free(y);
    return x;
}

static void check_split(const char *spec, bool u8) {
    float mean_saved[FEAT], std_saved[FEAT];
    uint64_t val_saved[N];
    for (int pass = 0; pass < 2; pass++) {
        setenv("TANDEM_DATA_IN_MEMORY", pass == 0 ? "1" : "0", 1);
        td_data_options o = {.class_targets = true};
        td_dataset_t *all = NULL, *test = NULL, *tr = NULL, *va = NULL;
        ASSERT_OK(td_dataset_open(spec, &o, &all, &test));
        ASSERT(test == NULL);
        ASSERT_EQ(td_dataset_file_backed(all), pass == 1);
        ASSERT_EQ(td_dataset_count(all), N);
        const double fraction = 0.3;
        ASSERT_OK(td_dataset_split(all, fraction, &tr, &va));
        double fv = fraction * N; /* ceil, as data.h's "last fraction" rounds */
        uint64_t nval = (uint64_t)fv + ((double)(uint64_t)fv < fv), ntr = td_dataset_count(tr);
        ASSERT_EQ(td_dataset_count(va), nval);
        ASSERT_EQ(ntr + nval, N);

        /* (a) disjoint, covering, and the held-out part the permutation's tail */
        uint64_t tr_ids[N], va_ids[N], perm[N];
        int C = td_dataset_channels(tr), S = td_dataset_sample_size(tr), plane = S / C;
        float *xt = gather_all(tr, u8, tr_ids);
        free(gather_all(va, u8, va_ids));
        int seen[N] = {0};
        for (uint64_t i = 0; i < ntr; i++) {
            ASSERT_LT(tr_ids[i], N);
            seen[tr_ids[i]]++;
        }
        for (uint64_t i = 0; i < nval; i++) {
            ASSERT_LT(va_ids[i], N);
            if (seen[va_ids[i]]) TEST_FAIL("%s: sample %llu is in training and held out", spec,
                                           (unsigned long long)va_ids[i]);
            seen[va_ids[i]]++;
        }
        for (int i = 0; i < N; i++)
            if (seen[i] != 1) TEST_FAIL("%s: sample %d is in %d parts, not 1", spec, i, seen[i]);
        td_sampler_permutation(SPLIT_SEED, 0, N, perm);
        qsort(perm + (N - nval), nval, sizeof *perm, cmp_u64);
        qsort(va_ids, nval, sizeof *va_ids, cmp_u64);
        for (uint64_t i = 0; i < nval; i++) ASSERT_EQ(va_ids[i], perm[N - nval + i]);

        /* (c) td_dataset_pack (what the CUDA engine uploads): the training part's samples in
         * its order, each the file's values of its record (as bytes or floats) and its label */
        void *packed = NULL;
        int32_t *plabels = NULL;
        float *ptargets = (float *)&packed; /* must come back NULL for class targets */
        bool packed_u8 = !u8;
        ASSERT_OK(td_dataset_pack(tr, &packed, &packed_u8, &plabels, &ptargets));
        ASSERT_EQ(packed_u8, u8);
        ASSERT(ptargets == NULL);
        for (uint64_t i = 0; i < ntr; i++) {
            uint64_t id = tr_ids[i];
            ASSERT_EQ(plabels[i], (int32_t)(id % 3));
            for (int k = 0; k < S; k++) {
                size_t e = i * (size_t)S + (size_t)k;
                if (u8 ? ((const uint8_t *)packed)[e] != xb[id][0][k / 2][k % 2]
                       : memcmp((const float *)packed + e, &xf[id][k], sizeof(float)))
                    TEST_FAIL("%s: packed sample %llu (record %llu) element %d differs", spec,
                              (unsigned long long)i, (unsigned long long)id, k);
            }
        }
        /* td_dataset_pack_ids (what a device streams with): any ids, here in reverse, give
         * those samples' packed values and labels */
        size_t rb = td_dataset_packed_bytes(tr);
        ASSERT_EQ(rb, (size_t)S * (u8 ? 1 : sizeof(float)));
        uint64_t rev[N];
        for (uint64_t i = 0; i < ntr; i++) rev[i] = ntr - 1 - i;
        uint8_t *some = malloc(ntr * rb);
        int32_t some_labels[N];
        ASSERT_OK(td_dataset_pack_ids(tr, rev, (int)ntr, some, some_labels, NULL));
        for (uint64_t i = 0; i < ntr; i++) {
            ASSERT_EQ(some_labels[i], plabels[rev[i]]);
            if (memcmp(some + i * rb, (uint8_t *)packed + rev[i] * rb, rb))
                TEST_FAIL("%s: td_dataset_pack_ids sample %llu differs from td_dataset_pack's",
                          spec, (unsigned long long)rev[i]);
        }
        free(some);
        free(packed), free(plabels);
        if (pass == 1)
            for (uint64_t i = 0; i < nval; i++) ASSERT_EQ(va_ids[i], val_saved[i]);
        memcpy(val_saved, va_ids, nval * sizeof *va_ids);

        /* (b) statistics of the training part only, in double here */
        float mean[FEAT], sd[FEAT];
        ASSERT(C <= FEAT);
        td_dataset_compute_norm(tr, mean, sd);
        for (int ch = 0; ch < C; ch++) {
            double s = 0, q = 0, cnt = (double)ntr * plane;
            for (uint64_t i = 0; i < ntr; i++)
                for (int k = 0; k < plane; k++) s += xt[i * (size_t)S + (size_t)ch * plane + k];
            double m = s / cnt;
            for (uint64_t i = 0; i < ntr; i++)
                for (int k = 0; k < plane; k++) {
                    double d = xt[i * (size_t)S + (size_t)ch * plane + k] - m;
                    q += d * d;
                }
            double var = q / cnt, am = m < 0 ? -m : m; /* compared squared: no libm here */
            ASSERT_NEAR(mean[ch], m, 1e-6 * (am > 1 ? am : 1));
            ASSERT_NEAR((double)sd[ch] * sd[ch], var, 4e-6 * (var > 1 ? var : 1));
            if (pass == 1 && (memcmp(&mean[ch], &mean_saved[ch], 4) || memcmp(&sd[ch], &std_saved[ch], 4)))
                TEST_FAIL("%s channel %d: file-backed statistics %.9g/%.9g, in memory %.9g/%.9g", spec,
                          ch, (double)mean[ch], (double)sd[ch], (double)mean_saved[ch],
                          (double)std_saved[ch]);
        }
        memcpy(mean_saved, mean, sizeof mean);
        memcpy(std_saved, sd, sizeof sd);
        free(xt);
        td_dataset_free(tr);
        td_dataset_free(va);
    }
    unsetenv("TANDEM_DATA_IN_MEMORY");
}

/* Real targets [N, 2] (row i: i / 2, -i): td_dataset_pack of a held-out split's training part
 * gives each sample's own row, in memory and file-backed, and no labels. */
static void check_pack_real_targets(const char *xpath) {
    static float yr[N][2];
    for (int i = 0; i < N; i++) yr[i][0] = (float)i * 0.5f, yr[i][1] = -(float)i;
    char shape[64];
    snprintf(shape, sizeof shape, "(%d, 2)", N);
    char *yp = write_npy("yr.npy", "<f4", shape, yr, sizeof yr);
    char *spec = td_xasprintf("%s,%s", xpath, yp);
    for (int pass = 0; pass < 2; pass++) {
        setenv("TANDEM_DATA_IN_MEMORY", pass == 0 ? "1" : "0", 1);
        td_data_options o = {.class_targets = false};
        td_dataset_t *all = NULL, *test = NULL, *tr = NULL, *va = NULL;
        ASSERT_OK(td_dataset_open(spec, &o, &all, &test));
        ASSERT_EQ(td_dataset_target_dim(all), 2);
        ASSERT_OK(td_dataset_split(all, 0.3, &tr, &va));
        void *packed = NULL;
        int32_t *plabels = (int32_t *)&packed; /* must come back NULL for real targets */
        float *pt = NULL;
        bool u8 = true;
        ASSERT_OK(td_dataset_pack(tr, &packed, &u8, &plabels, &pt));
        ASSERT(!u8 && plabels == NULL && pt != NULL);
        uint64_t n = td_dataset_count(tr);
        for (uint64_t i = 0; i < n; i++) {
            int id = (int)((const float *)packed)[i * FEAT]; /* feature 0 is the sample's index */
            if (memcmp(&pt[2 * i], yr[id], sizeof yr[id]))
                TEST_FAIL("pass %d: packed sample %llu (record %d) has targets %g %g, not %g %g",
                          pass, (unsigned long long)i, id, (double)pt[2 * i],
                          (double)pt[2 * i + 1], (double)yr[id][0], (double)yr[id][1]);
        }
        free(packed), free(pt);
        td_dataset_free(tr), td_dataset_free(va);
    }
    unsetenv("TANDEM_DATA_IN_MEMORY");
    free(spec), free(yp);
}

/* float64 features (the dtype converted on packing): td_dataset_pack_ids gives each sample's
 * values as floats, in memory and file-backed. */
static void check_pack_f64(const char *ypath) {
    static double xd[N][FEAT];
    for (int i = 0; i < N; i++)
        for (int k = 0; k < FEAT; k++) xd[i][k] = (double)xf[i][k];
    char shape[64];
    snprintf(shape, sizeof shape, "(%d, %d)", N, FEAT);
    char *xp = write_npy("x64.npy", "<f8", shape, xd, sizeof xd);
    char *spec = td_xasprintf("%s,%s", xp, ypath);
    for (int pass = 0; pass < 2; pass++) {
        setenv("TANDEM_DATA_IN_MEMORY", pass == 0 ? "1" : "0", 1);
        td_data_options o = {.class_targets = true};
        td_dataset_t *all = NULL, *test = NULL;
        ASSERT_OK(td_dataset_open(spec, &o, &all, &test));
        ASSERT_EQ(td_dataset_packed_bytes(all), FEAT * sizeof(float));
        uint64_t ids[3] = {7, 0, N - 1};
        float got[3][FEAT];
        int32_t lab[3];
        ASSERT_OK(td_dataset_pack_ids(all, ids, 3, got, lab, NULL));
        for (int i = 0; i < 3; i++) {
            ASSERT_EQ(lab[i], (int32_t)(ids[i] % 3));
            if (memcmp(got[i], xf[ids[i]], sizeof got[i]))
                TEST_FAIL("pass %d: float64 sample %llu packed as %g, not %g", pass,
                          (unsigned long long)ids[i], (double)got[i][1], (double)xf[ids[i]][1]);
        }
        td_dataset_free(all);
    }
    unsetenv("TANDEM_DATA_IN_MEMORY");
    free(spec), free(xp);
}

int main(void) {
    ASSERT(mkdtemp(tmpdir));
    static int64_t y[N];
    for (int i = 0; i < N; i++) {
        xf[i][0] = (float)i;
        xf[i][1] = (float)((i * 37) % 101) * 0.25f - 3.0f;
        xf[i][2] = (float)(i % 7) * 1.5f + 100.0f;
        for (int k = 0; k < 4; k++) xb[i][0][k / 2][k % 2] = (uint8_t)(k ? (i * 37 + k * 11) % 251 : i);
        y[i] = i % 3;
    }
    char shape[64];
    snprintf(shape, sizeof shape, "(%d, %d)", N, FEAT);
    char *xp = write_npy("x.npy", "<f4", shape, xf, sizeof xf);
    snprintf(shape, sizeof shape, "(%d, 1, 2, 2)", N);
    char *bp = write_npy("xb.npy", "|u1", shape, xb, sizeof xb);
    snprintf(shape, sizeof shape, "(%d,)", N);
    char *yp = write_npy("y.npy", "<i8", shape, y, sizeof y);
    char *spec = td_xasprintf("%s,%s", xp, yp);
    check_split(spec, false);
    free(spec);
    spec = td_xasprintf("%s,%s", bp, yp);
    check_split(spec, true);
    free(spec);
    check_pack_real_targets(xp);
    check_pack_f64(yp);
    free(xp), free(bp), free(yp);
    char *cmd = td_xasprintf("rm -rf %s", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
