/* Winograd F(4x4, 3x3) convolution for 3x3 stride-1 Conv2d (forward and backward). */
#ifndef TANDEM_NN_CONV_WINOGRAD_H
#define TANDEM_NN_CONV_WINOGRAD_H

#include <stdbool.h>
#include <stddef.h>

#include "tandem/core.h"

/* Filter slots of the transformed filter: 6x6 tile positions. */
#define TD_WINO_POS 36

/* Whether a conv layer uses Winograd: TANDEM_CONV_ALGO (auto|im2col|winograd) and the layer
 * shape. Only 3x3 stride-1 convs are eligible; `winograd` forces it where eligible, `auto`
 * also needs in_c >= 8 (below that the transforms cost more than the saved multiplies).
 * TD_ERR_INVALID for an unknown TANDEM_CONV_ALGO value. */
td_status td__conv_use_winograd(int in_c, int kernel, int stride, bool *out);

/* Floats of scratch td__wino_conv and td__wino_backward need for ns samples of a conv with c
 * input and k output channels, input h x w, output oh x ow. */
size_t td__wino_scratch_floats(int ns, int c, int k, int h, int w, int oh, int ow);

/* Floats of a transformed filter U for oc x ic channels: 36 slots of oc x ic floats, each padded
 * to an odd number of cache lines (so U [36, oc, ic] below is slot-strided, not dense). */
size_t td__wino_filter_floats(int oc, int ic);

/* Transforms W [oc, ic, 3, 3] into U [36, oc, ic] (G g G^T per filter). */
void td__wino_filter(const float *w, int oc, int ic, float *u);

/* y = conv(x, filter U [36, k, c]) (+ bias[k] when bias != NULL) for ns samples, 3x3 kernel,
 * stride 1, padding pad (may be negative: the input is then cropped). Sample s's input is
 * x + s * ldx ([c, h, w]); its output y + s * ldy ([k, oh, ow]) is overwritten. */
void td__wino_conv(const float *x, size_t ldx, int ns, int c, int h, int w, int pad, const float *u,
                   int k, int oh, int ow, const float *bias, float *y, size_t ldy, float *scratch);

/* The backward of that conv for ns samples, given its inputs x (as above) and the output
 * gradients dy (sample s at dy + s * ldy, [k, oh, ow]), its filter U (as above) and pad >= 0:
 *   dW [k, c, 3, 3] = the weight gradient summed over the samples (overwritten): 36 gemms over
 *   all tiles in the Winograd domain, dU = Z V^T with Z = A dy A^T per tile, then G^T dU G;
 *   dx (when not NULL; sample s at dx + s * lddx, [c, h, w], overwritten) = the input gradient,
 *   the forward's transforms run backwards: U^T Z per tile position, then B . B^T, the
 *   overlapping tiles added.
 * Both share the forward's tiles and Z: the input gradient needs no transform of dy of its own
 * and no tiles beyond the forward's (a convolution of dy padded by 2 - pad needed both). */
void td__wino_backward(const float *x, size_t ldx, int ns, int c, int h, int w, int pad,
                       const float *dy, size_t ldy, int k, int oh, int ow, const float *u,
                       float *dw, float *dx, size_t lddx, float *scratch);

#endif
