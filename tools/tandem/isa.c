/* Which build of tandem's own kernels runs, and OpenBLAS's core where OpenBLAS does not know the
 * CPU. tandem's kernels (Winograd transforms, batchnorm, AdamW, the loader's conversions...) are
 * compiled, not dispatched: a baseline x86-64 build runs them with SSE2 and fmaf through libm,
 * 1.4x-1.9x the CPU time of an AVX-512 build per training step (docs/benchmarks.md). A wheel
 * for every x86-64 machine therefore holds one binary per level (scripts/wheel.sh, CMake's
 * TANDEM_ISA_VARIANTS), and the baseline one, the `tandem` users run, execs the best of them
 * before doing anything else. One process runs one build through and through, so a level's
 * bits are the bits of a plain build for that level (-march=x86-64-v4 ...), and ranks compare
 * which one they run before their first step (tensor.h, numerics). */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "isa.h"
#include "tandem/core.h"
#include "tandem/tensor.h"

/* Set across our own exec to the level the exec'd build must be (and removed by it at once, so
 * the processes it starts choose afresh): a sibling whose build does not match its name stops
 * here instead of exec'ing again. */
#define HOP_VAR "TANDEM__ISA_EXEC"

/* ---- OpenBLAS's core ----
 * OpenBLAS picks its core as it loads, before main(), from the CPU's family and model or from
 * OPENBLAS_CORETYPE. A CPU it does not know by name gets its SSE3 kernels (tensor.h,
 * td_blas_core_for); there, with OPENBLAS_CORETYPE unset, tandem runs itself again under the
 * core of the CPU's class, in the same exec as the build's when it picks another. The process
 * it execs takes the variable out of its environment at once (BLAS_VAR says it was ours), so
 * what it starts, a user's script included, gets the environment the user gave and picks
 * afresh; `tandem launch` pins its workers' core where it must (launch.h). */
#define BLAS_VAR "TANDEM__BLAS_EXEC" /* across our exec: the core OpenBLAS had picked */
static char blas_fallback[32];       /* that core, in the process exec'd: for --version */

/* Whether this process is our exec for the core; if so, its environment is put back. */
static bool blas_arrived(void) {
    const char *from = getenv(BLAS_VAR);
    if (!from) return false;
    snprintf(blas_fallback, sizeof blas_fallback, "%s", from);
    unsetenv(BLAS_VAR);
    unsetenv("OPENBLAS_CORETYPE");
    return true;
}

const char *td_cli_blas_fallback(void) {
    return blas_fallback[0] ? blas_fallback : NULL;
}

#if defined(__x86_64__)

static void blas_leave(const char *core) {
    setenv(BLAS_VAR, td_blas_core(), 1);
    setenv("OPENBLAS_CORETYPE", core, 1);
}

/* The exec for the core failed: run on, on OpenBLAS's pick, saying so. */
static void blas_stay(const char *core, const char *why) {
    unsetenv(BLAS_VAR);
    unsetenv("OPENBLAS_CORETYPE");
    fprintf(stderr,
            "tandem: warning: OpenBLAS does not know this CPU and runs its SSE3 kernels (core %s); "
            "tandem could not run itself again under OPENBLAS_CORETYPE=%s (%s): set "
            "OPENBLAS_CORETYPE=%s for its %s kernels, 4-5x faster here\n",
            td_blas_core(), core, why, core, core);
}

static const char *const level_name[] = {"", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"};
#define MAX_LEVEL 4

static int parse_level(const char *s) {
    for (int l = 1; l <= MAX_LEVEL; l++)
        if (!strcmp(s, level_name[l])) return l;
    return 0;
}

/* The level this binary's kernels were compiled for (tensor.h). */
static int built_level(void) {
    return parse_level(td_isa_level());
}

/* The highest level this CPU (and the kernel: libgcc checks XCR0 for the AVX state) runs. */
static int cpu_level(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return 4;
    if (__builtin_cpu_supports("x86-64-v3")) return 3;
    if (__builtin_cpu_supports("x86-64-v2")) return 2;
    return 1;
}

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tandem: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* This binary's directory into dir[PATH_MAX]; "" when /proc/self/exe cannot be read. */
static void self_dir(char *dir) {
    ssize_t n = readlink("/proc/self/exe", dir, PATH_MAX - 1);
    dir[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else dir[0] = '\0';
}

/* Whether DIR/tandem-<level> is there to run (dir read on the first call: a native build that
 * is the CPU's level never looks); its path into path[cap] either way. */
static bool sibling_exists(char *dir, bool *have_dir, int level, char *path, size_t cap) {
    if (!*have_dir) self_dir(dir), *have_dir = true;
    if (!dir[0]) return path[0] = '\0', false;
    snprintf(path, cap, "%s/tandem-%s", dir, level_name[level]);
    return access(path, X_OK) == 0;
}

/* The level of the build to run: 0 when it is this binary, else a sibling's, its path in
 * path[cap]. Exits 2 with what to do when the level asked for cannot run. */
static int pick_build(char *path, size_t cap) {
    const int own = built_level();
    const int cpu = cpu_level();
    const char *pin = td_env_str(TD_ENV_ISA);
    char dir[PATH_MAX];
    bool have_dir = false;
    int want = 0;
    if (strcmp(pin, "auto")) {
        want = parse_level(pin);
        if (!want)
            die("TANDEM_ISA=%s is not a level: use auto, x86-64, x86-64-v2, x86-64-v3 or "
                "x86-64-v4 (this CPU runs up to %s)",
                pin, level_name[cpu]);
        if (want > cpu)
            die("TANDEM_ISA=%s: this CPU runs x86-64 up to %s; set TANDEM_ISA=%s or lower (every "
                "rank must run one level to compute the same bits), or unset it",
                pin, level_name[cpu], level_name[cpu]);
        if (want == own) return 0;
        if (!sibling_exists(dir, &have_dir, want, path, cap))
            die("TANDEM_ISA=%s: this tandem is built for %s only (no %s beside it); unset "
                "TANDEM_ISA or set it to %s, or install the portable wheel (scripts/wheel.sh), "
                "which carries x86-64, x86-64-v3 and x86-64-v4",
                pin, level_name[own], path[0] ? path : "tandem-<level>", level_name[own]);
        return want;
    }
    /* The highest level the CPU runs that this binary is or that a sibling is built for. */
    for (int l = cpu; l >= 1; l--) {
        if (l == own) return 0;
        if (sibling_exists(dir, &have_dir, l, path, cap)) return l;
    }
    /* A build above the CPU's level (-march=native on another machine): said, in case CPUID
     * understates what the CPU runs, rather than refused. */
    fprintf(stderr,
            "tandem: warning: this tandem is built for %s, but this CPU runs x86-64 up to %s: it "
            "may stop on an illegal instruction; build tandem on this machine (scripts/build.sh) "
            "or install the portable wheel (scripts/wheel.sh)\n",
            level_name[own], level_name[cpu]);
    return 0;
}

void td_cli_pick_kernels(char **argv) {
    bool blas_hop = blas_arrived();
    const char *hop = getenv(HOP_VAR);
    if (hop) {
        int want = parse_level(hop), own = built_level();
        unsetenv(HOP_VAR);
        if (want != own)
            die("this tandem binary was exec'd as the build for %s but is built for %s: the "
                "files beside it are mixed up; reinstall tandem (or set TANDEM_ISA=%s)",
                want ? level_name[want] : hop, level_name[own], level_name[own]);
        return;
    }
    if (blas_hop) return; /* our own exec for the BLAS core alone: this build was picked */
    char path[PATH_MAX + 32];
    const int level = pick_build(path, sizeof path);
    const char *core = td_blas_core_wanted();
    if (!level && !core) return;
    if (core) blas_leave(core);
    if (!level) { /* this build, again, for OpenBLAS to load under the core */
        execv("/proc/self/exe", argv);
        blas_stay(core, strerror(errno));
        return;
    }
    setenv(HOP_VAR, level_name[level], 1);
    execv(path, argv);
    die("cannot run %s (the build of tandem for %s): %s; reinstall tandem, or set TANDEM_ISA=%s "
        "to run this binary's own kernels",
        path, level_name[level], strerror(errno), level_name[built_level()]);
}

#else /* not x86-64: one build per architecture, nothing to pick */

void td_cli_pick_kernels(char **argv) {
    (void)argv;
    blas_arrived();
    unsetenv(HOP_VAR);
}

#endif
