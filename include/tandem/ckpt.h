/* The checkpoint contract of a run's checkpoint directory (TANDEM_CHECKPOINT_DIR, by default
 * RUN/checkpoints): which names are checkpoints, of which step, and when one is committed.
 * One builder and parser for the trainer, the S3 mirror, the links and the SDK; the Python SDK
 * mirrors it in python/tandem/checkpoint.py, and both read tests/core/ckpt_names.txt.
 *
 *   ckpt-STEP.tdck          file  tandem train's own (train.h)
 *   step-STEP.pt            file  the SDK's tandem.checkpoint.save (STEP zero-padded to 12)
 *   NAME.ckpt               file  Lightning's ModelCheckpoint; STEP from "step=STEP" in NAME
 *                                 (its default "epoch=E-step=S.ckpt"), else none ("last.ckpt")
 *   checkpoint-STEP/        dir   the HF Trainer's (and Accelerate's save_state) output
 *
 * STEP is 1 to 18 decimal digits. A name beginning with '.' is never a checkpoint (writers'
 * temporaries live there). Committed: a file kind is a regular file (writers write aside and
 * rename into place, so a name that exists is whole); a directory kind holds its commit
 * marker, a regular file: TD_CKPT_MARKER (tandem writes it last when it restores a directory)
 * or the framework's own last file (HF's trainer_state.json, written after the weights,
 * optimizer and RNG states). Nothing else is mirrored, restored or resumed from. */
#ifndef TANDEM_CKPT_H
#define TANDEM_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

typedef enum {
    TD_CKPT_NONE = 0,
    TD_CKPT_TDCK = 1,      /* ckpt-STEP.tdck */
    TD_CKPT_SDK = 2,       /* step-STEP.pt */
    TD_CKPT_LIGHTNING = 4, /* NAME.ckpt */
    TD_CKPT_HF = 8,        /* checkpoint-STEP/ */
} td_ckpt_kind;
#define TD_CKPT_ANY (TD_CKPT_TDCK | TD_CKPT_SDK | TD_CKPT_LIGHTNING | TD_CKPT_HF)

/* The commit marker tandem writes into a directory checkpoint it restored, last. */
#define TD_CKPT_MARKER ".tandem-committed"
/* The HF Trainer's last file of a checkpoint-STEP/ directory. */
#define TD_CKPT_HF_MARKER "trainer_state.json"

typedef struct {
    td_ckpt_kind kind;
    int64_t step; /* -1: the name holds no step (Lightning's last.ckpt) */
    bool is_dir;  /* the kind is a directory */
} td_ckpt_name;

/* The kind and step of a directory entry's name; false (out->kind TD_CKPT_NONE) when it is no
 * checkpoint's name. */
bool td_ckpt_parse(const char *name, td_ckpt_name *out);
/* The name of kind's checkpoint of step into buf ("" and false for a kind tandem does not name:
 * Lightning's, or a step < 0). */
bool td_ckpt_build(td_ckpt_kind kind, int64_t step, char *buf, size_t nbytes);
/* "tdck", "sdk", "lightning", "hf" ("-" for none): the kinds' names in the test vectors. */
const char *td_ckpt_kind_name(td_ckpt_kind kind);
/* Whether dir/name is a committed checkpoint (a parsed name, and the rule above); fills out. */
bool td_ckpt_committed(const char *dir, const char *name, td_ckpt_name *out);

typedef struct {
    char *name;
    td_ckpt_name n;
} td_ckpt_entry;
/* The committed checkpoints in dir of the kinds in mask (TD_CKPT_ANY: all), newest step first
 * (those without a step last, by name); *count of them. A missing dir is an empty list. */
td_ckpt_entry *td_ckpt_list(const char *dir, unsigned mask, int *count);
void td_ckpt_list_free(td_ckpt_entry *v, int count);
/* The step of the newest committed checkpoint in dir of the kinds in mask, -1 when none; its
 * name into name_out (nbytes) when given. */
int64_t td_ckpt_newest(const char *dir, unsigned mask, char *name_out, size_t nbytes);

/* The files of the directory checkpoint dir/name to copy it elsewhere, as paths below dir
 * ("checkpoint-N/REL"), recursively: regular files only (no links), no hidden name (writers'
 * temporaries, tandem's TD_CKPT_MARKER: the receiver writes its own), and the framework's
 * marker (TD_CKPT_HF_MARKER at the top) last, as its writer wrote it, so that a copy that
 * writes them in this order is never committed early. *count of them (0: none, NULL). */
char **td_ckpt_dir_files(const char *dir, const char *name, int *count);
void td_ckpt_files_free(char **v, int count);

#endif
