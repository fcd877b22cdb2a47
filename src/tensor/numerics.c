/* What decides the bits of this process's float kernels (tensor.h, "numerics"): OpenBLAS's core
 * and the instruction set this file was compiled for, which is the one of every kernel of the
 * tensor layer (they share the layer's compile flags, -march included). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tandem/tensor.h"

#ifndef TD_KERNELS_ID /* set by CMakeLists.txt: the hash of the sources that decide the bits */
#define TD_KERNELS_ID "unknown"
#endif

/* The id as one object in the binary's writable data, read where it is: a constant string would
 * be folded into the code that copies it (immediate stores), so that the bytes the ranks
 * compare would be nowhere one could point at; tests/launch/test_numerics.sh changes them in a
 * copy of the binary to make a build of other kernels. External, so no unit may assume it. */
extern char td__kernels_id[TD_NUMERICS_FIELD];
char td__kernels_id[TD_NUMERICS_FIELD] = TD_KERNELS_ID;

/* Not in every cblas.h: OpenBLAS's extensions. */
char *openblas_get_corename(void);
char *openblas_get_config(void);

/* The x86-64 micro-architecture level this file was compiled for, by the psABI's feature sets
 * (gcc defines a macro per feature -march enables), named as -march takes it. */
#if defined(__x86_64__)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512CD__) &&                      \
    defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__AVX2__) && defined(__FMA__)
#define LEVEL "x86-64-v4"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__BMI2__) && defined(__F16C__) &&           \
    defined(__LZCNT__) && defined(__MOVBE__)
#define LEVEL "x86-64-v3"
#elif defined(__SSE4_2__) && defined(__POPCNT__) && defined(__SSSE3__)
#define LEVEL "x86-64-v2"
#else
#define LEVEL "x86-64"
#endif
#elif defined(__aarch64__)
#define LEVEL "aarch64"
#else
#define LEVEL "other"
#endif

const char *td_isa_level(void) {
    return LEVEL;
}

/* The level, then the features beyond it that decide bits (vector width, FMA contraction). */
static const char *isa(void) {
    return LEVEL
#if defined(__x86_64__)
#if defined(__AVX512F__)
        " avx512f"
#endif
#if defined(__AVX2__)
        " avx2"
#elif defined(__AVX__)
        " avx"
#endif
#if defined(__FMA__)
        " fma"
#endif
#elif defined(__aarch64__)
#if defined(__ARM_FEATURE_SVE)
        " sve"
#endif
#if defined(__ARM_FEATURE_FMA)
        " fma"
#endif
#endif
        ;
}

void td_numerics_get(td_numerics *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->blas_core, sizeof out->blas_core, "%s", td_blas_core());
    snprintf(out->isa, sizeof out->isa, "%s", isa());
#if defined(__clang__)
    snprintf(out->compiler, sizeof out->compiler, "clang %d.%d.%d", __clang_major__,
             __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
    snprintf(out->compiler, sizeof out->compiler, "gcc %d.%d.%d", __GNUC__, __GNUC_MINOR__,
             __GNUC_PATCHLEVEL__);
#else
    snprintf(out->compiler, sizeof out->compiler, "unknown compiler");
#endif
    snprintf(out->kernels, sizeof out->kernels, "%s", td__kernels_id);
}

void td_numerics_describe(const td_numerics *n, char *buf, size_t cap) {
    snprintf(buf, cap, "OpenBLAS core %s, kernels for %s, %s, tandem kernels %s", n->blas_core,
             n->isa, n->compiler, n->kernels);
}

bool td_numerics_diff(const td_numerics *a, const td_numerics *b, char *buf, size_t cap) {
    const char *what[4];
    int k = 0;
    bool plural = false; /* "differ" */
    if (strncmp(a->blas_core, b->blas_core, sizeof a->blas_core)) what[k++] = "the OpenBLAS core";
    if (strncmp(a->isa, b->isa, sizeof a->isa)) what[k++] = "the instruction set";
    if (strncmp(a->compiler, b->compiler, sizeof a->compiler)) what[k++] = "the compiler";
    if (strncmp(a->kernels, b->kernels, sizeof a->kernels))
        what[k++] = "tandem's kernels", plural = true;
    if (!cap) return k > 0;
    buf[0] = '\0';
    for (int i = 0; i < k; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%s", i ? " and " : "", what[i]);
    }
    if (k) {
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, k > 1 || plural ? " differ" : " differs");
    }
    return k > 0;
}

const char *td_blas_core(void) {
    const char *core = openblas_get_corename();
    return core && *core ? core : "unknown";
}

static unsigned cpu_features(void) {
    unsigned f = 0;
#if defined(__x86_64__)
    __builtin_cpu_init(); /* libgcc checks XCR0 too: the kernel must save the AVX-512 state */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) f |= TD_CPU_AVX2_FMA;
    /* x86-64-v4's AVX-512 set, feature by feature: clang 14 knows no "x86-64-v4" here */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        f |= TD_CPU_AVX512;
    if (__builtin_cpu_supports("avx512bf16")) f |= TD_CPU_AVX512_BF16;
#endif
    return f;
}

const char *td_blas_core_for(const char *picked, unsigned features) {
    /* Prescott is OpenBLAS's fallback for an x86-64 CPU it does not know; any other core is a
     * pick it made for this CPU, left alone */
    if (!picked || strcasecmp(picked, "Prescott")) return NULL;
    if ((features & TD_CPU_AVX512) && (features & TD_CPU_AVX512_BF16)) return "Cooperlake";
    if (features & TD_CPU_AVX512) return "SkylakeX";
    if (features & TD_CPU_AVX2_FMA) return "Haswell";
    return NULL;
}

const char *td_blas_core_wanted(void) {
    const char *config = openblas_get_config();
    if (getenv("OPENBLAS_CORETYPE") || !config || !strstr(config, "DYNAMIC_ARCH")) return NULL;
    return td_blas_core_for(td_blas_core(), cpu_features());
}
