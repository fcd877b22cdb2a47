/* Atomic file writes for checkpoints and safetensors: a temporary file in the target's directory,
 * every byte written and fsync'd, rename over the target, fsync of the directory. A crash or a
 * full disk at any point leaves either the old file or the new one, never a torn one. Only a
 * regular file is ever replaced. */
#ifndef TANDEM_TRAIN_FILEIO_H
#define TANDEM_TRAIN_FILEIO_H

#include <stddef.h>

#include "tandem/core.h"

typedef struct {
    const void *data;
    size_t nbytes;
} td__chunk;

/* Writes the chunks in order as `path`. On failure removes the temporary file and returns
 * TD_ERR_NOSPACE (full disk) or TD_ERR_IO naming the path. `what` names the file's role in
 * messages ("checkpoint", "safetensors file"). */
td_status td__write_atomic(const char *path, const char *what, const td__chunk *chunks,
                           int nchunks);

/* Checks before the first step that `path` can be written as a new regular file: its directory
 * exists and takes a new file, and `path` is absent or a regular file. A directory, a device or
 * a symlink at `path` is refused (an atomic replace would swap it for a file, not write through
 * it), naming the path, what is there, and the fix. `flag` names the option ("--save"). */
td_status td__check_output_file(const char *path, const char *flag);
/* Creates `dir` and its missing parents and checks that it takes a new file. */
td_status td__check_output_dir(const char *dir, const char *flag);

#endif
