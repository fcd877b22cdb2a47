/* data: float16 features, every finite bit pattern (65536 minus the 2048 infinities and NaNs),
 * gathered through a .npy data set and compared bit for bit with NumPy's float16 -> float32
 * (np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)), subnormals and
 * signed zeros included. Without NumPy (/usr/bin/python3) the comparison cannot be made and the
 * test says so. */
#include <stdlib.h>
#include <sys/wait.h>

#include "tandem/data.h"
#include "test.h"

static char tmpdir[] = "/tmp/td_test_f16_XXXXXX";

int main(void) {
    ASSERT(mkdtemp(tmpdir));
    const char *py = "/usr/bin/python3";
    /* NumPy writes the features (finite patterns in order), the targets and its own conversion */
    char *cmd = td_xasprintf(
        "%s -c \"import sys\ntry:\n import numpy as np\nexcept ImportError:\n sys.exit(77)\n"
        "h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)\n"
        "h = h[np.isfinite(h)]\nnp.save('%s/x.npy', h.reshape(-1, 1))\n"
        "np.save('%s/y.npy', np.zeros(len(h), dtype=np.float32))\n"
        "h.astype(np.float32).tofile('%s/want.f32')\"",
        py, tmpdir, tmpdir, tmpdir);
    int rc = access(py, X_OK) == 0 ? system(cmd) : -1;
    free(cmd);
    if (rc != 0) {
        if (rc != -1 && !(WIFEXITED(rc) && WEXITSTATUS(rc) == 77)) TEST_FAIL("NumPy failed: %d", rc);
        printf("NOTE: no NumPy (%s): float16 not compared with NumPy\n", py);
        TEST_PASS();
    }
    enum { FINITE = 65536 - 2048 };
    char *spec = td_xasprintf("%s/x.npy,%s/y.npy", tmpdir, tmpdir);
    td_data_options o = {.class_targets = false};
    td_dataset_t *ds = NULL, *test = NULL;
    ASSERT_OK(td_dataset_open(spec, &o, &ds, &test));
    ASSERT_EQ(td_dataset_count(ds), FINITE);
    ASSERT_EQ(td_dataset_dtype(ds), TD_DTYPE_F16);
    float mean = 0.0f, sd = 1.0f; /* x' = (x - 0) / 1: the conversion alone, bit for bit */
    ASSERT_OK(td_dataset_set_norm(ds, &mean, &sd, 1));
    static uint64_t ids[FINITE];
    static float got[FINITE], want[FINITE], t[FINITE];
    for (uint64_t i = 0; i < FINITE; i++) ids[i] = i;
    ASSERT_OK(td_dataset_gather(ds, ids, FINITE, got, NULL, t));
    char *wp = td_xasprintf("%s/want.f32", tmpdir);
    FILE *f = fopen(wp, "rb");
    ASSERT(f);
    ASSERT_EQ(fread(want, sizeof(float), FINITE, f), FINITE);
    fclose(f);
    int bad = 0;
    for (int i = 0; i < FINITE; i++) {
        uint32_t g, w;
        memcpy(&g, &got[i], 4), memcpy(&w, &want[i], 4);
        if (g != w && bad++ < 5)
            fprintf(stderr, "sample %d: tandem %a (0x%08x), NumPy %a (0x%08x)\n", i,
                    (double)got[i], g, (double)want[i], w);
    }
    if (bad) TEST_FAIL("%d of %d float16 values differ from NumPy's float32", bad, FINITE);
    td_dataset_free(ds);
    td_dataset_free(test);
    free(spec);
    free(wp);
    cmd = td_xasprintf("rm -rf %s", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
