/* Which build of tandem's kernels this process runs (isa.c). */
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

#endif
