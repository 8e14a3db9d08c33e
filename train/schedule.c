/* schedule.c — DeepSpeed's learning-rate schedulers, and epochs as steps.
 *
 * DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR
 * (deepspeed/runtime/lr_schedules.py) are computed here on the host, in
 * doubles in the order Python computes them, and handed to the step's
 * update as its base rate under the constant schedule; the update then
 * uses exactly that rate. The engine steps a scheduler after every applied
 * optimizer step, starting from last_batch_iteration -1, so optimizer step
 * s (from 0) runs at get_lr() with last_batch_iteration s - 1: the first at
 * the rate the constructor set (warmup_min_lr, or 0 for WarmupCosineLR).
 * A step skipped for a non-finite gradient does not count, as DeepSpeed
 * does not step its scheduler on an overflow. */
#include <math.h>
#include <string.h>

#include "regc_train.h"

const char *regc_train_schedule_name(int s)
{
    static const char *const names[REGC_TRAIN_SCHEDULE_COUNT] = {
        "constant", "constant_with_warmup", "linear",        "cosine", "cosine_with_min_lr",
        "WarmupLR", "WarmupDecayLR",        "WarmupCosineLR"};
    return s >= 0 && s < REGC_TRAIN_SCHEDULE_COUNT ? names[s] : NULL;
}

int regc_train_schedule_is_deepspeed(int s)
{
    return s >= REGC_SCHEDULE_WARMUP_LR && s < REGC_TRAIN_SCHEDULE_COUNT;
}

/* The warmup's fraction done at iteration it < W: log(it + 1) / log(W), as
 * DeepSpeed multiplies by the inverse it keeps, or it / W. */
static double warmup_gamma(const regc_train_options *o, double it, double w)
{
    if (o->warmup_type == 1)
        return it / w;
    const double inverse_log_warm_up = 1.0 / log(w);
    return inverse_log_warm_up * log(it + 1.0);
}

double regc_train_ds_lr(const regc_train_options *o, int64_t s)
{
    const double it = (double)s - 1.0; /* last_batch_iteration */
    /* DeepSpeed takes at least 2 warmup steps (and log(1) would divide by 0) */
    const double w = fmax(2.0, (double)regc_train_warmup_steps(o));
    const double total = (double)(o->total_num_steps > 0 ? o->total_num_steps : o->steps);
    const double lr = (double)o->lr;
    if (o->lr_scheduler == REGC_SCHEDULE_WARMUP_COSINE_LR) {
        const double wmr = o->warmup_min_ratio >= 0.0 ? o->warmup_min_ratio : 0.0;
        const double cmr = o->cos_min_ratio >= 0.0 ? o->cos_min_ratio : 0.0001;
        if (it < 0.0)
            return 0.0;
        double ratio;
        if (it < w) {
            ratio = warmup_gamma(o, it, w);
            const double ratio_delta = 1.0 - wmr;
            ratio = wmr + ratio * ratio_delta;
        } else {
            const double real_last_step = it - w + 1.0;
            const double real_total_steps = fmax(1.0, total - w);
            const double progress = fmin(1.0, real_last_step / real_total_steps);
            const double ratio_delta = 1.0 - cmr;
            ratio = (1.0 + cos(3.141592653589793 * progress)) / 2.0;
            ratio = fmax(0.0, cmr + ratio_delta * ratio);
        }
        return lr * ratio;
    }
    const double min_lr = o->warmup_min_lr, delta = lr - min_lr;
    if (it < 0.0)
        return min_lr;
    double gamma;
    if (it < w)
        gamma = warmup_gamma(o, it, w);
    else if (o->lr_scheduler == REGC_SCHEDULE_WARMUP_DECAY_LR)
        gamma = fmax(0.0, (total - it) / fmax(1.0, total - w));
    else
        gamma = 1.0;
    return min_lr + delta * gamma;
}

int regc_train_resolve_epochs(regc_train_options *o, const regc_model *m, int ranks)
{
    if (!(o->num_train_epochs > 0.0))
        return REGC_OK;
    int64_t count = 0;
    int rc;
    if (o->data_path) {
        rc = regc_tokens_count_files(o->data_path, &count);
    } else {
        regc_tokens *t = NULL;
        if ((rc = regc_tokens_builtin(&t)) == REGC_OK)
            count = regc_tokens_count(t);
        regc_tokens_free(t);
    }
    if (rc)
        return rc;
    /* a rank's row is seq tokens (2 x seq for T5's pairs), llm.c's order
     * taking ranks x batch rows at a time until fewer remain */
    const int64_t row = (m && !strcmp(regc_model_arch(m), "t5") ? 2 : 1) * o->seq;
    const int64_t rows = (int64_t)(ranks > 0 ? ranks : 1) * o->batch;
    const int64_t batches =
        rows > 0 && row > 0 && rows <= (count - 1) / row ? (count - 1) / (rows * row) : 0;
    if (batches < 1)
        return regc_error(REGC_ERR_ARG,
                          "%s: %lld tokens hold no batch of %lld x %lld (train.num_train_epochs "
                          "counts batches)",
                          o->data_path ? o->data_path : "the built-in corpus", (long long)count,
                          (long long)rows, (long long)row);
    /* the micro-batches that read the file E times, in whole steps; a
     * product such as 0.1 x 30 carries a rounding error above 3 that must
     * not make a fourth step */
    const double micro = o->num_train_epochs * (double)batches;
    const double steps = ceil(micro / (double)o->grad_accum * (1.0 - 1e-12));
    if (!(steps >= 1.0 && steps <= 2147483647.0))
        return regc_error(REGC_ERR_ARG,
                          "train.num_train_epochs: %g epochs of %lld batches are %.0f steps (1 to "
                          "2^31 - 1)",
                          o->num_train_epochs, (long long)batches, steps);
    o->steps = (int)steps;
    return REGC_OK;
}
