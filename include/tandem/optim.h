/* tandem optim: SGD and AdamW over the model's flat buffers.
 *
 * params, grads and the optimizer state are contiguous float arrays; the update is elementwise,
 * so it is the same bits whatever the thread count, and a checkpoint saves the state as one
 * buffer plus the step count. The arithmetic follows PyTorch 1.13's single-tensor paths
 * (torch.optim.SGD, torch.optim.AdamW) operation by operation, in float32 with the scalar
 * coefficients computed in double and rounded to float as PyTorch does for Python scalars.
 */
#ifndef TANDEM_OPTIM_H
#define TANDEM_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TD_OPTIM_SGD, TD_OPTIM_ADAMW } td_optim_kind;

typedef struct {
    td_optim_kind kind;
    double lr;
    double weight_decay; /* SGD: L2 added to the gradient; AdamW: decoupled, param *= 1 - lr*wd */
    /* SGD */
    double momentum;
    double dampening;
    bool nesterov;
    /* AdamW */
    double beta1, beta2, eps;
} td_optim_config;

/* PyTorch's defaults: SGD lr 1e-3 (PyTorch has none), momentum 0, dampening 0, weight_decay 0;
 * AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01. */
td_optim_config td_optim_defaults(td_optim_kind kind);
const char *td_optim_kind_name(td_optim_kind kind); /* "sgd", "adamw" */
td_status td_optim_parse_kind(const char *name, td_optim_kind *out);
/* Range checks with PyTorch's rules (lr >= 0, 0 <= beta < 1, nesterov needs momentum > 0 and
 * dampening 0, ...); TD_ERR_INVALID naming the hyperparameter and its value. */
td_status td_optim_validate(const td_optim_config *cfg);

typedef struct td_optim td_optim_t;

td_status td_optim_new(const td_optim_config *cfg, size_t num_params, td_optim_t **out);
void td_optim_free(td_optim_t *opt);

/* One update of params[0..num_params) from grads. */
void td_optim_step(td_optim_t *opt, float *params, const float *grads);

/* The scalar coefficients of the update after `steps_done` steps, computed in double and rounded
 * to float as PyTorch does for Python scalars. The CPU loop and the CUDA kernel both take them
 * from here, so the two devices do the same float arithmetic on the same inputs. */
typedef struct {
    /* AdamW: p = p * decay; m = g*omb1 + m*b1; v = (omb2*g)*g + v*b2;
     *        p = p + (neg_step * m) / (sqrt(v) / bc2_sqrt + eps) */
    float decay, b1, omb1, b2, omb2, bc2_sqrt, neg_step, eps;
    /* SGD: d = g + wd*p; buf = first ? d : d*damp + buf*mom; d = nesterov ? d + mom*buf : buf;
     *      p = p + neg_lr * d */
    float wd, mom, damp, neg_lr;
    int use_wd, first, nesterov, momentum;
} td_optim_coefs;
td_optim_coefs td_optim_coefs_at(const td_optim_config *cfg, uint64_t steps_done);

const td_optim_config *td_optim_get_config(const td_optim_t *opt);
size_t td_optim_num_params(const td_optim_t *opt);
/* Steps taken so far (AdamW's bias correction; SGD's first step initialises the momentum
 * buffer from the gradient when this is 0). */
uint64_t td_optim_step_count(const td_optim_t *opt);
void td_optim_set_step_count(td_optim_t *opt, uint64_t steps);
/* The state buffer, for checkpoints: SGD with momentum: [num_params] momentum buffer;
 * AdamW: [2 * num_params], exp_avg then exp_avg_sq; SGD without momentum: none (count 0). */
float *td_optim_state(td_optim_t *opt);
size_t td_optim_state_count(const td_optim_t *opt);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_OPTIM_H */
