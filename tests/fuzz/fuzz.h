/* Shared by the libFuzzer targets (fuzz_<name>.c, docs/fuzzing.md) and replay.c, the main() that
 * feeds a corpus through a target in the normal test suite. Test code: helpers abort on a setup
 * failure, which is a broken test machine, never a finding. */
#ifndef TANDEM_TESTS_FUZZ_H
#define TANDEM_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Each target defines it; libFuzzer (or replay.c) calls it once per input. Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Once per process: quiet logs (a target that logs per input floods the fuzzer's output). */
void fuzz_init(void);

/* The process's in-memory file (a memfd), rewritten to hold exactly data[0..size): the path
 * (/proc/self/fd/N) opens it afresh at offset 0, for parsers that take a path. */
const char *fuzz_file(const void *data, size_t size);

/* A private directory in memory (/dev/shm, else $TMPDIR or /tmp) for parsers that need a real
 * one; removed with its files when the process exits. One per process, made on first use. */
const char *fuzz_dir(void);

/* The check failed: prints what and aborts, which libFuzzer reports as a crash with its input. */
#define FUZZ_ASSERT(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                            \
    } while (0)
void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));

#endif
