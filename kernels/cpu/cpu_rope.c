/* cpu_rope.c — rotary position embedding in Hugging Face Llama's
 * rotate_half convention: the first rot_dim values of each head (all of
 * them, or the part Phi and GPT-NeoX rotate) are two halves, and pair i
 * is (x[i], x[i + rot_dim/2]) rotated by the angle of (position, i); the
 * rest of the head passes through. The backward is the same kernel with
 * the angle negated (a rotation's transpose). A y held in bf16 gets each
 * value rounded as it is stored. */
#include "cpu_kernels.h"
#include "kernel_checks.h"
#include "regc_common.h"

void regc_cpu_rope(regc_backend *be, float *y, const float *x, const float *cos, const float *sin,
                   int64_t batch, int64_t t, int n_head, int head_dim, int rot_dim, int inverse,
                   int y_bf16)
{
    const int status = regc_rope_check(batch, t, n_head, head_dim, rot_dim);
    if (status != REGC_OK) {
        regc_cpu_set_failure(be, status);
        return;
    }
    const int half = rot_dim / 2;
    const int64_t rows = batch * t, ld = (int64_t)n_head * head_dim;
    const float sign = inverse ? -1.0f : 1.0f;
    /* every (batch, position) row is independent: no reduction, no order */
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (rows * ld >= regc_cpu_par_min(be))  \
    schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + (r % t) * half; /* [half] */
        const float *s = sin + (r % t) * half; /* [half] */
        for (int h = 0; h < n_head; h++) {
            const int64_t at = r * ld + (int64_t)h * head_dim; /* the head's [head_dim] */
            const float *xh = x + at;
            if (!y_bf16) {
                float *yh = y + at;
                for (int i = 0; i < half; i++)
                    regc_rope_pair(&yh[i], &yh[i + half], xh[i], xh[i + half], c[i], sign * s[i]);
                for (int i = rot_dim; i < head_dim; i++) /* the part not rotated */
                    yh[i] = xh[i];
                continue;
            }
            uint16_t *yh = (uint16_t *)y + at; /* y held in bf16 (never x: no bf16 in place) */
            for (int i = 0; i < half; i++) {
                float y1, y2;
                regc_rope_pair(&y1, &y2, xh[i], xh[i + half], c[i], sign * s[i]);
                yh[i] = regc_bf16_bits(y1), yh[i + half] = regc_bf16_bits(y2);
            }
            for (int i = rot_dim; i < head_dim; i++)
                yh[i] = regc_bf16_bits(xh[i]);
        }
    }
}
