/* Which build of tandem's kernels this process runs, and on which OpenBLAS core (isa.c). */
#ifndef TANDEM_CLI_ISA_H
#define TANDEM_CLI_ISA_H

/* Called first in main(). A portable build (scripts/wheel.sh) carries beside the baseline
 * x86-64 binary `tandem` builds of the same sources for higher x86-64 levels, named
 * tandem-x86-64-v3, tandem-x86-64-v4; this picks the one to run, as OpenBLAS picks its core:
 * TANDEM_ISA when set, else the highest level the CPU runs among the builds present, and execs
 * it with the same arguments. Returns when this binary is the one (always for a build without
 * siblings and a TANDEM_ISA it satisfies); exits 2 with a message naming TANDEM_ISA and what to
 * do when the level asked for cannot run (the CPU lacks it, or no build of it is here). */
void td_cli_pick_kernels(char **argv);
/* Where OpenBLAS did not know this CPU and picked its SSE3 fallback, td_cli_pick_kernels
 * also runs the process again under OPENBLAS_CORETYPE set to the core of the CPU's class
 * (tensor.h, td_blas_core_for), unless OPENBLAS_CORETYPE is set. In that process this returns
 * the core OpenBLAS had picked ("Prescott"), else NULL. */
const char *td_cli_blas_fallback(void);

#endif
