/* The benches' OpenBLAS core: the one `tandem` runs. Where OpenBLAS did not know the CPU and
 * loaded its SSE3 fallback (tensor.h, td_blas_core_for), tandem runs under the core of the CPU's
 * class (tools/tandem/isa.c); a bench measuring OpenBLAS beside tandem's kernels does the same,
 * else its sgemm peak and BLAS columns would be Prescott's (26 against 132 GFLOP/s on an Intel
 * Xeon of model 207). Called first in main(); OPENBLAS_CORETYPE set by the caller stands. */
#ifndef TANDEM_BENCH_BLAS_CORE_H
#define TANDEM_BENCH_BLAS_CORE_H

#include <stdlib.h>
#include <unistd.h>

#include "tandem/tensor.h"

static inline void bench_use_tandems_blas_core(char **argv) {
    const char *core = td_blas_core_wanted();
    if (!core) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    execv("/proc/self/exe", argv); /* on failure: measured on OpenBLAS's own pick, as named */
    unsetenv("OPENBLAS_CORETYPE");
}

#endif
