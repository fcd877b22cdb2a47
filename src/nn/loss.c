/* Losses over [batch, classes] rows. Sums are taken in double per row so the returned loss is
 * accurate; gradients are float. An out-of-range label makes the loss NaN (and its row's
 * gradient zero) so a bad dataset is loud, not silently skipped. */
#include <math.h>
#include <string.h>

#include "tandem/nn.h"

double td_nll_loss(const float *logp, const int32_t *labels, int batch, int classes,
                   float grad_scale, float *dlogp) {
    double loss = 0;
    if (dlogp) memset(dlogp, 0, sizeof(float) * (size_t)batch * classes);
    for (int i = 0; i < batch; i++) {
        int32_t y = labels[i];
        if (y < 0 || y >= classes) {
            loss = NAN;
            continue;
        }
        loss -= logp[(size_t)i * classes + y];
        if (dlogp) dlogp[(size_t)i * classes + y] = -grad_scale;
    }
    return loss;
}

double td_cross_entropy(const float *logits, const int32_t *labels, int batch, int classes,
                        float grad_scale, float *dlogits) {
    double loss = 0;
    for (int i = 0; i < batch; i++) {
        const float *x = logits + (size_t)i * classes;
        float *dx = dlogits ? dlogits + (size_t)i * classes : NULL;
        float mx = x[0];
        for (int j = 1; j < classes; j++) mx = x[j] > mx ? x[j] : mx;
        double se = 0;
        for (int j = 0; j < classes; j++) se += exp((double)x[j] - mx);
        double lse = mx + log(se);
        int32_t y = labels[i];
        if (y < 0 || y >= classes) {
            loss = NAN;
            if (dx) memset(dx, 0, sizeof(float) * (size_t)classes);
            continue;
        }
        loss += lse - x[y];
        if (dx) {
            for (int j = 0; j < classes; j++) dx[j] = grad_scale * (float)exp((double)x[j] - lse);
            dx[y] -= grad_scale;
        }
    }
    return loss;
}

int td_count_correct(const float *out, const int32_t *labels, int batch, int classes) {
    int correct = 0;
    for (int i = 0; i < batch; i++) {
        const float *r = out + (size_t)i * classes;
        int best = 0;
        for (int j = 1; j < classes; j++)
            if (r[j] > r[best]) best = j;
        correct += best == labels[i];
    }
    return correct;
}

double td_mse_loss(const float *out, const float *target, int batch, int dim, float grad_scale,
                   float *dout) {
    double loss = 0;
    /* d/d out of mean((out - t)^2) = 2 (out - t) / dim */
    float k = 2.0f * grad_scale / (float)dim;
    for (int i = 0; i < batch; i++) {
        const float *o = out + (size_t)i * dim, *t = target + (size_t)i * dim;
        double s = 0;
        for (int j = 0; j < dim; j++) {
            double d = (double)o[j] - t[j];
            s += d * d;
            if (dout) dout[(size_t)i * dim + j] = k * (o[j] - t[j]);
        }
        loss += s / dim;
    }
    return loss;
}

double td_bce_with_logits(const float *logits, const float *target, int batch, int dim,
                          float grad_scale, float *dlogits) {
    double loss = 0;
    /* d/dx = (sigmoid(x) - t) / dim */
    float k = grad_scale / (float)dim;
    for (int i = 0; i < batch; i++) {
        const float *x = logits + (size_t)i * dim, *t = target + (size_t)i * dim;
        double s = 0;
        for (int j = 0; j < dim; j++) {
            double xj = x[j];
            s += (xj > 0 ? xj : 0) - xj * t[j] + log1p(exp(-fabs(xj)));
            if (dlogits) {
                double sig = xj >= 0 ? 1.0 / (1.0 + exp(-xj)) : exp(xj) / (1.0 + exp(xj));
                dlogits[(size_t)i * dim + j] = k * (float)(sig - t[j]);
            }
        }
        loss += s / dim;
    }
    return loss;
}

double td_count_correct_multilabel(const float *logits, const float *target, int batch, int dim) {
    double correct = 0;
    for (int i = 0; i < batch; i++) {
        int hits = 0;
        for (int j = 0; j < dim; j++)
            hits += (logits[(size_t)i * dim + j] > 0.0f) == (target[(size_t)i * dim + j] > 0.5f);
        correct += (double)hits / dim;
    }
    return correct;
}
