/* SGD and AdamW, elementwise over flat buffers, mirroring torch.optim 1.13's single-tensor
 * loops operation by operation so the results agree with PyTorch to float rounding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/optim.h"

/* Rounding follows PyTorch's CPU kernels op by op: each tensor op rounds once, and the ones
 * that PyTorch computes as a fused multiply-add (add with alpha: fmadd(b, alpha, a); addcmul:
 * self + (value * t1) * t2 contracted) are written as fmaf here. Every other a*b+c stays
 * unfused: contraction is off for this file so the compiler cannot add FMAs of its own. */
#pragma GCC optimize("fp-contract=off")

/* OpenMP splits the element range into chunks; each element's arithmetic is independent of
 * the split, so the bits do not depend on the thread count. The if clause names `parallel`: a
 * bare one binds to the simd construct too (OpenMP 5.0), and GCC then ran every model under
 * 65,536 parameters through the scalar loop (AdamW was half of a small MLP's step). */
#ifdef _OPENMP
#define TD_OMP_FOR _Pragma("omp parallel for simd schedule(static) if (parallel: n > 65536)")
#else
#define TD_OMP_FOR
#endif

struct td_optim {
    td_optim_config cfg;
    size_t num_params;
    uint64_t steps;
    float *state;
    size_t state_count;
};

td_optim_config td_optim_defaults(td_optim_kind kind) {
    td_optim_config c = {.kind = kind, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    c.weight_decay = kind == TD_OPTIM_ADAMW ? 0.01 : 0.0;
    return c;
}

const char *td_optim_kind_name(td_optim_kind kind) {
    return kind == TD_OPTIM_SGD ? "sgd" : kind == TD_OPTIM_ADAMW ? "adamw" : "unknown";
}

td_status td_optim_parse_kind(const char *name, td_optim_kind *out) {
    if (!strcmp(name, "sgd"))
        *out = TD_OPTIM_SGD;
    else if (!strcmp(name, "adamw"))
        *out = TD_OPTIM_ADAMW;
    else
        return td_error(TD_ERR_INVALID, "--optimizer '%s': use adamw or sgd", name);
    return TD_OK;
}

td_status td_optim_validate(const td_optim_config *c) {
    if (!(c->lr >= 0) || !isfinite(c->lr))
        return td_error(TD_ERR_INVALID, "learning rate %g: must be a finite number >= 0", c->lr);
    if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
        return td_error(TD_ERR_INVALID, "weight decay %g: must be a finite number >= 0",
                        c->weight_decay);
    if (c->kind == TD_OPTIM_SGD) {
        if (!(c->momentum >= 0) || !isfinite(c->momentum))
            return td_error(TD_ERR_INVALID, "momentum %g: must be a finite number >= 0",
                            c->momentum);
        if (!isfinite(c->dampening))
            return td_error(TD_ERR_INVALID, "dampening %g: must be finite", c->dampening);
        if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
            return td_error(TD_ERR_INVALID,
                            "nesterov momentum needs momentum > 0 and dampening 0 (got momentum "
                            "%g, dampening %g)",
                            c->momentum, c->dampening);
    } else if (c->kind == TD_OPTIM_ADAMW) {
        if (!(c->beta1 >= 0 && c->beta1 < 1))
            return td_error(TD_ERR_INVALID, "AdamW beta1 %g: must be in [0, 1)", c->beta1);
        if (!(c->beta2 >= 0 && c->beta2 < 1))
            return td_error(TD_ERR_INVALID, "AdamW beta2 %g: must be in [0, 1)", c->beta2);
        if (!(c->eps >= 0) || !isfinite(c->eps))
            return td_error(TD_ERR_INVALID, "AdamW eps %g: must be a finite number >= 0", c->eps);
    } else {
        return td_error(TD_ERR_INVALID, "optimizer kind %d: use TD_OPTIM_SGD or TD_OPTIM_ADAMW",
                        (int)c->kind);
    }
    return TD_OK;
}

td_status td_optim_new(const td_optim_config *cfg, size_t num_params, td_optim_t **out) {
    *out = NULL;
    TD_CHECK(td_optim_validate(cfg));
    td_optim_t *o = td_xcalloc(1, sizeof *o);
    o->cfg = *cfg;
    o->num_params = num_params;
    if (cfg->kind == TD_OPTIM_ADAMW)
        o->state_count = 2 * num_params;
    else if (cfg->momentum != 0)
        o->state_count = num_params;
    if (o->state_count) {
        o->state = td_xmalloc_aligned(o->state_count * sizeof(float));
        memset(o->state, 0, o->state_count * sizeof(float));
    }
    *out = o;
    return TD_OK;
}

void td_optim_free(td_optim_t *o) {
    if (!o) return;
    free(o->state);
    free(o);
}

/* torch.optim.SGD, _single_tensor_sgd:
 *   d_p = grad + wd * param                       (when wd != 0)
 *   buf = d_p (first step) | buf * momentum + (1 - dampening) * d_p
 *   d_p = d_p + momentum * buf (nesterov) | buf
 *   param = param + (-lr) * d_p */
static void sgd_step(td_optim_t *o, float *restrict p, const float *restrict g) {
    const size_t n = o->num_params;
    const td_optim_coefs k = td_optim_coefs_at(&o->cfg, o->steps);
    const float wd = k.wd, mom = k.mom, damp = k.damp, neg_lr = k.neg_lr;
    const int use_wd = k.use_wd, first = k.first, nesterov = k.nesterov;
    float *restrict buf = o->state;
    if (!buf) {
        TD_OMP_FOR
        for (size_t i = 0; i < n; i++) {
            float d = use_wd ? fmaf(p[i], wd, g[i]) : g[i];
            p[i] = fmaf(d, neg_lr, p[i]);
        }
        return;
    }
    /* the choices by td_pick (core.h): as ?: they kept the loop scalar at AVX2 */
    TD_OMP_FOR
    for (size_t i = 0; i < n; i++) {
        float d = td_pick(use_wd, fmaf(p[i], wd, g[i]), g[i]);
        float b = td_pick(first, d, fmaf(d, damp, buf[i] * mom));
        buf[i] = b;
        d = td_pick(nesterov, fmaf(b, mom, d), b);
        p[i] = fmaf(d, neg_lr, p[i]);
    }
}

/* torch.optim.AdamW, _single_tensor_adamw (amsgrad off):
 *   step += 1
 *   param *= 1 - lr * wd
 *   m = m * beta1 + (1 - beta1) * g
 *   v = v * beta2 + (1 - beta2) * g * g
 *   denom = sqrt(v) / sqrt(1 - beta2^step) + eps
 *   param = param + ((-lr / (1 - beta1^step)) * m) / denom */
static void adamw_step(td_optim_t *o, float *restrict p, const float *restrict g) {
    const size_t n = o->num_params;
    const td_optim_coefs k = td_optim_coefs_at(&o->cfg, o->steps);
    const float decay = k.decay, b1 = k.b1, omb1 = k.omb1, b2 = k.b2, omb2 = k.omb2;
    const float bc2_sqrt = k.bc2_sqrt, neg_step_size = k.neg_step, eps = k.eps;
    float *restrict m = o->state;
    float *restrict v = o->state + n;
    TD_OMP_FOR
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float pi = p[i] * decay;
        float mi = fmaf(gi, omb1, m[i] * b1);
        float vi = fmaf(omb2 * gi, gi, v[i] * b2);
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = pi + neg_step_size * mi / denom; /* addcdiv: self + (value * t1) / t2 */
    }
}

td_optim_coefs td_optim_coefs_at(const td_optim_config *c, uint64_t steps_done) {
    td_optim_coefs k;
    memset(&k, 0, sizeof k);
    double step = (double)steps_done + 1;
    k.decay = (float)(1.0 - c->lr * c->weight_decay);
    k.b1 = (float)c->beta1, k.omb1 = (float)(1.0 - c->beta1);
    k.b2 = (float)c->beta2, k.omb2 = (float)(1.0 - c->beta2);
    k.bc2_sqrt = (float)sqrt(1.0 - pow(c->beta2, step));
    k.neg_step = (float)-(c->lr / (1.0 - pow(c->beta1, step)));
    k.eps = (float)c->eps;
    k.wd = (float)c->weight_decay, k.mom = (float)c->momentum;
    k.damp = (float)(1.0 - c->dampening), k.neg_lr = (float)-c->lr;
    k.use_wd = c->weight_decay != 0, k.first = steps_done == 0, k.nesterov = c->nesterov;
    k.momentum = c->momentum != 0;
    return k;
}

void td_optim_step(td_optim_t *o, float *params, const float *grads) {
    if (o->cfg.kind == TD_OPTIM_ADAMW)
        adamw_step(o, params, grads);
    else
        sgd_step(o, params, grads);
    o->steps++;
}

const td_optim_config *td_optim_get_config(const td_optim_t *o) {
    return &o->cfg;
}
size_t td_optim_num_params(const td_optim_t *o) {
    return o->num_params;
}
uint64_t td_optim_step_count(const td_optim_t *o) {
    return o->steps;
}
void td_optim_set_step_count(td_optim_t *o, uint64_t steps) {
    o->steps = steps;
}
float *td_optim_state(td_optim_t *o) {
    return o->state;
}
size_t td_optim_state_count(const td_optim_t *o) {
    return o->state_count;
}
