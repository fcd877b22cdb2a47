/* Checkpoints (src/train/checkpoint.c, docs/checkpoint-format.md): the input as a checkpoint file,
 * then the same bytes with the header's payload length and CRC-32 made to match, so mutations
 * get past the checksum into the section sizes and the JSON metadata. A checkpoint that loads is
 * saved again and must load back to the same fields and bits. */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tandem/train.h"

#define HEADER_BYTES 64
#define OFF_CRC      20
#define OFF_PAYLOAD  40

static void put_le(uint8_t *b, uint64_t v, int nbytes) {
    for (int i = 0; i < nbytes; i++) b[i] = (uint8_t)(v >> (8 * i));
}

static void same(const td_checkpoint *a, const td_checkpoint *b) {
    FUZZ_ASSERT(
        !strcmp(a->model, b->model) && a->num_params == b->num_params && a->batch == b->batch &&
            a->accum == b->accum && a->world_size == b->world_size && a->seed == b->seed &&
            a->step == b->step && a->epoch == b->epoch && a->step_in_epoch == b->step_in_epoch &&
            a->optim_steps == b->optim_steps && a->optim_state_count == b->optim_state_count,
        "%s", "a saved checkpoint loads back different");
    const td_optim_config *x = &a->optim, *y = &b->optim;
    FUZZ_ASSERT(
        x->kind == y->kind && x->nesterov == y->nesterov && !memcmp(&x->lr, &y->lr, sizeof x->lr) &&
            !memcmp(&x->weight_decay, &y->weight_decay, sizeof x->lr) &&
            !memcmp(&x->momentum, &y->momentum, sizeof x->lr) &&
            !memcmp(&x->dampening, &y->dampening, sizeof x->lr) &&
            !memcmp(&x->beta1, &y->beta1, sizeof x->lr) &&
            !memcmp(&x->beta2, &y->beta2, sizeof x->lr) && !memcmp(&x->eps, &y->eps, sizeof x->lr),
        "%s", "optimizer settings do not round-trip");
    FUZZ_ASSERT(!memcmp(a->params, b->params, a->num_params * sizeof(float)) &&
                    !memcmp(a->optim_state, b->optim_state, a->optim_state_count * sizeof(float)),
                "%s", "buffers do not round-trip");
}

static void load(const uint8_t *data, size_t size) {
    td_checkpoint ck, again;
    if (td_checkpoint_load(fuzz_file(data, size), &ck) != TD_OK) {
        FUZZ_ASSERT(td_error_msg()[0], "%s", "an error without a message");
        td_error_clear();
        return;
    }
    FUZZ_ASSERT(HEADER_BYTES + 4 * (ck.num_params + ck.optim_state_count) <= size,
                "%llu params and %llu state floats from %zu bytes",
                (unsigned long long)ck.num_params, (unsigned long long)ck.optim_state_count, size);
    const char *dir = fuzz_dir();
    FUZZ_ASSERT(td_checkpoint_save(dir, &ck, 0) == TD_OK, "save: %s", td_error_msg());
    char path[512];
    snprintf(path, sizeof path, "%s/ckpt-%lld.tdck", dir, (long long)ck.step);
    FUZZ_ASSERT(td_checkpoint_load(path, &again) == TD_OK, "reload: %s", td_error_msg());
    same(&ck, &again);
    unlink(path);
    td_checkpoint_free(&again);
    td_checkpoint_free(&ck);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    load(data, size);
    if (size < HEADER_BYTES) return 0;
    uint8_t *fixed = malloc(size);
    FUZZ_ASSERT(fixed, "%s", "malloc");
    memcpy(fixed, data, size);
    put_le(fixed + OFF_PAYLOAD, size - HEADER_BYTES, 8);
    put_le(fixed + OFF_CRC, 0, 4);
    put_le(fixed + OFF_CRC, td_crc32(0, fixed, size), 4);
    load(fixed, size);
    free(fixed);
    return 0;
}
