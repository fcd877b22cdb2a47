/* data: the archive rules of issue 29 ("Nothing lost, no one in"), against the references.
 *
 * .npz (src/data/npy.c), on archives written by NumPy and zipfile (tests/data/npz_refs.py), with
 * what np.load makes of each:
 *   - a member named twice is refused, and the error's claim that np.load reads the last one is
 *     checked against np.load itself;
 *   - "x" and "x.npy" (both array x) are refused;
 *   - a deflated member whose central directory claims 1 GiB in a 1 MiB archive (plain and ZIP64)
 *     is refused with the member and both sizes, under an address-space limit of 512 MiB more
 *     than the process holds, so a reader that allocates the claim first fails the test.
 * safetensors (src/data/safetensors_read.c): crafted files, each with the verdict of the
 * safetensors library (the Rust crate, Python package 0.8.0) written down below; the script test
 * test_safetensors_ref.sh runs the same files through the library itself
 * (test_archive_rules --write DIR, then --check DIR against its verdicts).
 * The only intended difference, a key given twice, is refused here and kept by the library. */
#include <errno.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tandem/data.h"
#include "test.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

static char tmpdir[] = "/tmp/td_test_archive_XXXXXX";

/* ---- safetensors: crafted files and the reference library's verdicts ---- */

typedef struct {
    const char *name;
    const char *json;   /* the header; NULL: raw header length below */
    size_t data_bytes;  /* zero bytes after the header */
    bool reference_ok;  /* what safetensors.deserialize says (checked by test_safetensors_ref.sh) */
    bool tandem_ok;     /* what tandem says: the same, but for duplicate keys */
    uint64_t raw_len;   /* json NULL: this header length, then "{}" */
    const char *needle; /* in tandem's error */
} st_case;

#define T(dt, shape, b, e) "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" b "," e "]}"
static const st_case st_cases[] = {
    {"ok", "{\"a\":" T("F32", "[2]", "0", "8") "}", 8, true, true, 0, NULL},
    {"two", "{\"b\":" T("F32", "[1]", "4", "8") ",\"a\":" T("F32", "[1]", "0", "4") "}", 8, true,
     true, 0, NULL},
    {"overlap", "{\"a\":" T("F32", "[2]", "0", "8") ",\"b\":" T("F32", "[2]", "4", "12") "}", 12,
     false, false, 0, "overlaps"},
    {"same-range", "{\"a\":" T("F32", "[1]", "0", "4") ",\"b\":" T("F32", "[1]", "0", "4") "}", 4,
     false, false, 0, "overlaps"},
    {"gap", "{\"a\":" T("F32", "[1]", "0", "4") ",\"b\":" T("F32", "[1]", "8", "12") "}", 12,
     false, false, 0, "gap"},
    {"not-from-0", "{\"a\":" T("F32", "[1]", "4", "8") "}", 8, false, false, 0, "gap"},
    {"trailing", "{\"a\":" T("F32", "[1]", "0", "4") "}", 8, false, false, 0, "no tensor claims"},
    {"short", "{\"a\":" T("F32", "[2]", "0", "8") "}", 4, false, false, 0, "not within"},
    {"span", "{\"a\":" T("F32", "[1]", "0", "8") "}", 8, false, false, 0, "span 8 bytes"},
    {"reversed", "{\"a\":" T("U8", "[0]", "1", "0") "}", 1, false, false, 0, "not within"},
    {"zero-size", "{\"a\":" T("F32", "[0]", "0", "0") ",\"b\":" T("F32", "[1]", "0", "4")
     ",\"c\":" T("F32", "[0,3]", "4", "4") "}", 4, true, true, 0, NULL},
    {"scalar", "{\"a\":" T("F32", "[]", "0", "4") "}", 4, true, true, 0, NULL},
    {"empty", "{}", 0, true, true, 0, NULL},
    {"empty-data", "{}", 1, false, false, 0, "no tensor claims"},
    {"meta", "{\"__metadata__\":{\"k\":\"v\"},\"a\":" T("U8", "[1]", "0", "1") "}", 1, true, true,
     0, NULL},
    {"meta-null", "{\"__metadata__\":null,\"a\":" T("U8", "[1]", "0", "1") "}", 1, true, true, 0,
     NULL},
    {"meta-int", "{\"__metadata__\":{\"k\":1},\"a\":" T("U8", "[1]", "0", "1") "}", 1, false,
     false, 0, "__metadata__"},
    {"meta-list", "{\"__metadata__\":[],\"a\":" T("U8", "[1]", "0", "1") "}", 1, false, false, 0,
     "__metadata__"},
    {"extra-field", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1,
     true, true, 0, NULL},
    /* dtypes tandem does not read still count in the layout */
    {"u32-beside", "{\"a\":" T("U8", "[4]", "0", "4") ",\"u\":" T("U32", "[2]", "4", "12") "}", 12,
     true, true, 0, NULL},
    {"u32-overlap", "{\"a\":" T("U8", "[4]", "0", "4") ",\"u\":" T("U32", "[2]", "0", "8") "}", 8,
     false, false, 0, "overlaps"},
    {"f4", "{\"a\":" T("F4", "[4]", "0", "2") "}", 2, true, true, 0, NULL},
    {"bad-dtype", "{\"a\":" T("Q9", "[1]", "0", "1") "}", 1, false, false, 0, "Q9"},
    {"neg-shape", "{\"a\":" T("U8", "[-1]", "0", "1") "}", 1, false, false, 0, "non-negative"},
    {"float-shape", "{\"a\":" T("U8", "[1.0]", "0", "1") "}", 1, false, false, 0, "non-negative"},
    {"no-shape", "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, false, false, 0,
     "\"shape\""},
    {"three-offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,1]}}", 1, false,
     false, 0, "data_offsets"},
    {"not-object", "[]", 0, false, false, 0, "not a JSON object"},
    {"spaces", " {\"a\":" T("U8", "[1]", "0", "1") "}   ", 1, true, true, 0, NULL},
    {"duplicate-key", "{\"a\":" T("U8", "[1]", "0", "1") ",\"a\":" T("U8", "[1]", "0", "1") "}", 1,
     true, false, 0, "does not parse"},
    {"header-100MB", NULL, 0, false, false, 100000001, "100,000,000"},
    {"header-past-end", NULL, 0, false, false, 50, "header length"},
};
#undef T

static char *st_write(const char *dir, const st_case *c) {
    char *p = td_xasprintf("%s/%s.safetensors", dir, c->name);
    FILE *f = fopen(p, "wb");
    ASSERT(f);
    uint64_t n = c->json ? strlen(c->json) : c->raw_len;
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(n >> (8 * i));
    ASSERT_EQ(fwrite(len, 1, 8, f), 8);
    const char *body = c->json ? c->json : "{}";
    ASSERT_EQ(fwrite(body, 1, strlen(body), f), strlen(body));
    for (size_t i = 0; i < c->data_bytes; i++) ASSERT_EQ(fputc(0, f), 0);
    ASSERT_EQ(fclose(f), 0);
    return p;
}

/* Whether tandem accepts the file: listed, and every tensor of a dtype it reads read both ways. */
static bool st_tandem_ok(const char *p) {
    char **names;
    int n;
    td_status st = td_safetensors_list(p, &names, &n);
    if (st != TD_OK) {
        ASSERT_CONTAINS(td_error_msg(), p);
        return false;
    }
    bool ok = true;
    for (int i = 0; i < n; i++) {
        for (int backed = 0; backed < 2; backed++) {
            td_array a;
            st = td_safetensors_read(p, names[i], backed, &a);
            /* U32, F4: the layout is valid, tandem just does not read the dtype */
            if (st != TD_OK && st != TD_ERR_UNSUPPORTED) ok = false;
            td_array_free(&a);
        }
        free(names[i]);
    }
    free(names);
    return ok;
}

static void test_safetensors_rules(void) {
    for (size_t i = 0; i < sizeof st_cases / sizeof st_cases[0]; i++) {
        const st_case *c = &st_cases[i];
        char *p = st_write(tmpdir, c);
        bool ok = st_tandem_ok(p);
        if (ok != c->tandem_ok)
            TEST_FAIL("safetensors case '%s': tandem %s it, the rule says %s (%s)", c->name,
                      ok ? "accepts" : "refuses", c->tandem_ok ? "accept" : "refuse",
                      ok ? "" : td_error_msg());
        if (!ok && c->needle) ASSERT_CONTAINS(td_error_msg(), c->needle);
        td_error_clear();
        free(p);
    }
    /* the overlap is reported on both tensors' reads, not only on a listing */
    char *p = st_write(tmpdir, &st_cases[2]);
    td_array a;
    ASSERT_STATUS(td_safetensors_read(p, "a", true, &a), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "tensor 'b' has data_offsets [4, 12]");
    ASSERT_CONTAINS(td_error_msg(), "end at 8");
    free(p);
}

/* --write DIR: the files; --check DIR: tandem against DIR/reference.txt ("NAME ok|err"). */
static int st_write_all(const char *dir) {
    for (size_t i = 0; i < sizeof st_cases / sizeof st_cases[0]; i++) free(st_write(dir, &st_cases[i]));
    return 0;
}

static int st_check_all(const char *dir) {
    char *ref = td_xasprintf("%s/reference.txt", dir);
    FILE *f = fopen(ref, "r");
    if (!f) TEST_FAIL("cannot open %s: %s", ref, strerror(errno));
    char name[128], verdict[16];
    size_t seen = 0;
    while (fscanf(f, "%127s %15s", name, verdict) == 2) {
        const st_case *c = NULL;
        for (size_t i = 0; i < sizeof st_cases / sizeof st_cases[0]; i++)
            if (!strcmp(st_cases[i].name, name)) c = &st_cases[i];
        if (!c) TEST_FAIL("%s names an unknown case '%s'", ref, name);
        bool lib_ok = !strcmp(verdict, "ok");
        /* the verdicts written down here must be the library's own */
        if (lib_ok != c->reference_ok)
            TEST_FAIL("case '%s': the safetensors library %s it, this test says it %s", name,
                      lib_ok ? "accepts" : "refuses", c->reference_ok ? "accepts" : "refuses");
        char *p = td_xasprintf("%s/%s.safetensors", dir, name);
        bool ok = st_tandem_ok(p);
        bool want = c->tandem_ok == c->reference_ok ? lib_ok : c->tandem_ok;
        if (ok != want)
            TEST_FAIL("case '%s': the safetensors library %s it, tandem %s it (%s)", name,
                      lib_ok ? "accepts" : "refuses", ok ? "accepts" : "refuses",
                      ok ? "" : td_error_msg());
        printf("  %-16s library %-6s tandem %s\n", name, lib_ok ? "ok" : "refuse",
               ok ? "ok" : "refuse");
        td_error_clear();
        free(p);
        seen++;
    }
    fclose(f);
    free(ref);
    ASSERT_EQ(seen, sizeof st_cases / sizeof st_cases[0]);
    printf("%zu safetensors files: tandem agrees with the safetensors library\n", seen);
    return 0;
}

/* ---- .npz ---- */

static char fixdir[300];

static char *numpy_says(const char *archive) {
    char *p = td_xasprintf("%s/numpy.txt", fixdir);
    FILE *f = fopen(p, "r");
    ASSERT(f);
    char line[512], *found = NULL;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, archive, strlen(archive)) && line[strlen(archive)] == ' ') {
            line[strcspn(line, "\n")] = '\0';
            found = td_xstrdup(line + strlen(archive) + 1);
        }
    fclose(f);
    free(p);
    if (!found) TEST_FAIL("numpy.txt has no line for %s", archive);
    return found;
}

static void test_npz_duplicates(void) {
    char *p = td_xasprintf("%s/dup.npz", fixdir);
    char *np = numpy_says("dup.npz");
    /* what the error claims: np.load reads the last of the two entries ([7 8 9]) */
    ASSERT_STREQ(np, "ok 7 8 9");
    td_array a;
    for (int backed = 0; backed < 2; backed++) {
        ASSERT_STATUS(td_npz_read(p, "x", backed, &a), TD_ERR_FORMAT);
        ASSERT_CONTAINS(td_error_msg(), p);
        ASSERT_CONTAINS(td_error_msg(), "member 'x.npy' twice (central directory entries 0 and 1)");
        ASSERT_CONTAINS(td_error_msg(), "np.load would read the last one");
    }
    char **names;
    int n;
    ASSERT_STATUS(td_npz_list(p, &names, &n), TD_ERR_FORMAT);
    free(np);
    free(p);

    p = td_xasprintf("%s/dup_key.npz", fixdir);
    np = numpy_says("dup_key.npz");
    ASSERT_STREQ(np, "ok 1 2 3"); /* np.load prefers the exact name "x": another rule again */
    ASSERT_STATUS(td_npz_read(p, "x", false, &a), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "members 'x' (entry 0) and 'x.npy' (entry 1) are both array 'x'");
    free(np);
    free(p);
}

/* Reads archive's x in a child whose address space is limited to what it holds now plus 512 MiB,
 * so a reader that allocates the central directory's 1 GiB claim before checking it fails.
 * Returns the child's error message through a pipe. */
static char *read_limited(const char *p, td_status *st) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
#ifndef UNDER_ASAN /* ASan reserves terabytes of shadow; its own allocator reports instead */
        unsigned long vm_kb = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        unsigned long pages = 0;
        if (f && fscanf(f, "%lu", &pages) == 1) vm_kb = pages * (unsigned long)(sysconf(_SC_PAGESIZE) / 1024);
        if (f) fclose(f);
        struct rlimit rl = {(rlim_t)vm_kb * 1024 + (512ul << 20), (rlim_t)vm_kb * 1024 + (512ul << 20)};
        if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(99);
#endif
        td_array a;
        td_status s = td_npz_read(p, "x", false, &a);
        td_array_free(&a);
        const char *msg = s == TD_OK ? "" : td_error_msg();
        int32_t code = (int32_t)s;
        if (write(fds[1], &code, sizeof code) != sizeof code) _exit(98);
        if (write(fds[1], msg, strlen(msg)) < 0) _exit(98);
        _exit(0);
    }
    close(fds[1]);
    int32_t code = 0;
    ASSERT_EQ(read(fds[0], &code, sizeof code), sizeof code);
    char *msg = calloc(1, 4096);
    ASSERT(msg);
    size_t got = 0;
    ssize_t r;
    while (got < 4095 && (r = read(fds[0], msg + got, 4095 - got)) > 0) got += (size_t)r;
    close(fds[0]);
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        TEST_FAIL("the reading child of %s died (status 0x%x)", p, status);
    *st = (td_status)code;
    return msg;
}

static void test_npz_size_claims(void) {
    const char *liars[] = {"liar.npz", "liar64.npz"};
    for (int i = 0; i < 2; i++) {
        char *p = td_xasprintf("%s/%s", fixdir, liars[i]);
        char *np = numpy_says(liars[i]);
        /* NumPy reads the elements its .npy header declares and never looks at the claim;
         * tandem refuses an archive whose directory and member disagree */
        ASSERT(!strncmp(np, "ok ", 3));
        td_status st;
        char *msg = read_limited(p, &st);
        if (st != TD_ERR_FORMAT)
            TEST_FAIL("%s: %s, expected TD_ERR_FORMAT naming both sizes: %s", liars[i],
                      td_status_name(st), msg);
        ASSERT_CONTAINS(msg, p);
        ASSERT_CONTAINS(msg, "member x.npy");
        ASSERT_CONTAINS(msg, "float32 [294912] (1179648 bytes of elements)");
        ASSERT_CONTAINS(msg, "gives the member 1073741824 bytes");
        free(msg);
        free(np);
        free(p);
    }
    char *p = td_xasprintf("%s/liar_stored.npz", fixdir);
    char *np = numpy_says("liar_stored.npz");
    ASSERT(!strncmp(np, "refused", 7));
    td_status st;
    char *msg = read_limited(p, &st);
    ASSERT_EQ(st, TD_ERR_FORMAT);
    ASSERT_CONTAINS(msg, "member x.npy");
    ASSERT_CONTAINS(msg, "(1073741824 bytes of elements)");
    free(msg);
    free(np);
    free(p);
}

static bool make_npz_fixtures(void) {
    const char *py = "/usr/bin/python3";
    char *script = td_xasprintf("%s", __FILE__);
    char *slash = strrchr(script, '/');
    char *src = td_xasprintf("%.*s/npz_refs.py", slash ? (int)(slash - script) : 1,
                             slash ? script : ".");
    snprintf(fixdir, sizeof fixdir, "%s/npz", tmpdir);
    ASSERT_EQ(mkdir(fixdir, 0700), 0);
    if (access(src, R_OK) != 0) TEST_FAIL("%s is missing", src);
    char *cmd = td_xasprintf("%s %s %s", py, src, fixdir);
    int rc = access(py, X_OK) == 0 ? system(cmd) : -1;
    if (rc != -1 && !(WIFEXITED(rc) && WEXITSTATUS(rc) == 77) && rc != 0)
        TEST_FAIL("%s failed (status %d)", cmd, rc);
    free(cmd);
    free(src);
    free(script);
    if (rc != 0) printf("NOTE: no NumPy (%s): skipping the .npz checks against NumPy\n", py);
    return rc == 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write")) return st_write_all(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "--check")) return st_check_all(argv[2]);
    ASSERT(mkdtemp(tmpdir));
    test_safetensors_rules();
    if (make_npz_fixtures()) {
        test_npz_size_claims();
        test_npz_duplicates();
    }
    char *cmd = td_xasprintf("rm -rf %s", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
