/* step_math.h — private to kernels/: the optimizer step's scalar math, as
 * static inline functions that both the CPU backend and CUDA device code
 * compile, so every backend forms the same learning rate and AdamW
 * coefficients from the same doubles.
 *
 * The formulas are Hugging Face's (get_scheduler) and torch.optim.AdamW's:
 * torch forms lr, the bias corrections and the step size as Python floats
 * (doubles) and its CPU kernel rounds each coefficient to float once. */
#ifndef REGC_STEP_MATH_H
#define REGC_STEP_MATH_H

#include <math.h>

#include "kernel_math.h"
#include "regc_backend.h"

/* The schedule's factor on base_lr at optimizer step s (from 0). */
static inline REGC_HD double regc_schedule_factor(const regc_step_scalars *c, double s)
{
    const double w = c->warmup_steps, n = c->total_steps;
    if (c->schedule == REGC_SCHEDULE_CONSTANT)
        return 1.0;
    if (s < w)
        return s / (w > 1.0 ? w : 1.0);
    if (c->schedule == REGC_SCHEDULE_CONSTANT_WITH_WARMUP)
        return 1.0;
    const double rest = n - w > 1.0 ? n - w : 1.0;
    if (c->schedule == REGC_SCHEDULE_LINEAR) {
        const double f = (n - s) / rest;
        return f > 0.0 ? f : 0.0;
    }
    const double progress = (s - w) / rest;
    double f = 0.5 * (1.0 + cos(3.141592653589793 * c->num_cycles * 2.0 * progress));
    if (c->schedule == REGC_SCHEDULE_COSINE_WITH_MIN_LR)
        f = f * (1.0 - c->min_lr_rate) + c->min_lr_rate;
    return f > 0.0 ? f : 0.0;
}

/* Is s's configuration one a step can run with? */
static inline REGC_HD int regc_step_scalars_ok(const regc_step_scalars *s)
{
    return s->schedule >= 0 && s->schedule < REGC_SCHEDULE_COUNT && s->base_lr >= 0.0 &&
           s->step >= 0.0 && s->beta1 >= 0.0 && s->beta1 < 1.0 && s->beta2 >= 0.0 && s->beta2 < 1.0;
}

/* The start of an optimizer step (regc_backend's step_schedule). */
static inline REGC_HD void regc_step_begin(regc_step_scalars *s)
{
    s->lr = s->base_lr * regc_schedule_factor(s, s->step);
    s->step += 1.0; /* AdamW's t counts from 1 */
    const double bc1 = 1.0 - pow(s->beta1, s->step), bc2 = 1.0 - pow(s->beta2, s->step);
    s->decay = (float)(1.0 - s->lr * s->weight_decay);
    s->neg_step_size = (float)(-(s->lr / bc1));
    s->bc2_sqrt = (float)sqrt(bc2);
    s->beta1_f = (float)s->beta1;
    s->beta2_f = (float)s->beta2;
    s->one_minus_beta1 = (float)(1.0 - s->beta1);
    s->one_minus_beta2 = (float)(1.0 - s->beta2);
    s->eps_f = (float)s->eps;
    s->grad_sumsq = 0.0;
    s->grad_norm = 0.0f;
    s->clip_scale = 1.0f;
    s->skipped = 0;
}

/* grad_norm, clip_scale and skipped from grad_sumsq (regc_backend's grad_clip).
 * torch 1.13's clip_grad_norm_ computes max_norm / (norm + 1e-6) on float
 * tensors as a reciprocal times max_norm, then clamps it to 1. */
static inline REGC_HD void regc_step_clip(regc_step_scalars *s)
{
    s->grad_norm = (float)sqrt(s->grad_sumsq);
    /* One NaN or infinity anywhere in the gradients makes the sum of
     * squares so: the update would spread it into every parameter and
     * moment. The step is skipped instead, and not counted. */
    if (!isfinite(s->grad_norm)) {
        s->skipped = 1;
        s->step -= 1.0;
        return;
    }
    if (s->max_grad_norm > 0.0) {
        const float coef = (1.0f / (s->grad_norm + 1e-6f)) * (float)s->max_grad_norm;
        s->clip_scale = coef < 1.0f ? coef : 1.0f;
    }
}

#endif
