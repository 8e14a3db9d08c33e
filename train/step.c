/* step.c — one optimizer step and one validation, on every rank.
 *
 * A rank reads rows rank x batch .. of each global batch (llm.c's order
 * over ranks x batch rows), so N ranks of B rows see what one process of
 * N x B rows would. The step's targets are counted over micro-batches and
 * ranks first, and each micro-batch's loss gradient is seeded with its
 * share: the gradients the program sums in place (and the update sums over
 * the ranks) are then the mean over every target of the step, and the
 * reported loss is that mean too. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

/* Profiling: the time since *t0 (work finished first) as one call of the
 * row label; *t0 moves to now. */
static int profile_since(regc_backend *be, regc_profile *pr, const char *label, double *t0)
{
    int rc = be->sync(be);
    double now = regc_time_ms();
    if (rc == REGC_OK)
        rc = regc_profile_add(pr, label, now - *t0, 0.0);
    *t0 = now;
    return rc;
}

/* Micro-batch `index` of the data (llm.c's order, or train.shuffle's) into
 * the host inputs. */
static int fill_batch(trainer *t, const regc_train_options *o, const regc_tokens *data,
                      int64_t index, int eval)
{
    /* this rank's rows of the global batch of ranks x batch rows */
    const regc_batch_spec b = {.step = index,
                               .batch = o->batch,
                               .seq = o->seq,
                               .seed = o->seed,
                               .row0 = (int64_t)t->comm->rank * o->batch,
                               .global_rows = (int64_t)t->comm->size * o->batch,
                               .eval = eval};
    return regc_model_fill_inputs(t->model, data, &b, t->n_inputs, t->inputs);
}

/* The targets of the filled batch that count toward the loss (those >= 0). */
static int64_t count_targets(trainer *t)
{
    const regc_input *x = regc_input_find(t->n_inputs, t->inputs, "targets");
    if (!x || x->tensor->dtype != REGC_I32)
        return 0;
    const int32_t *v = x->host;
    int64_t n = 0, all = regc_tensor_numel(x->tensor);
    for (int64_t i = 0; i < all; i++)
        n += v[i] >= 0;
    return n;
}

/* The filled batch to the device; constant inputs only the first time. */
static void upload_batch(trainer *t)
{
    for (int i = 0; i < t->n_inputs; i++)
        if (!t->constants_sent || !t->inputs[i].constant)
            t->be->copy_h2d(t->be, t->d_inputs[i], t->inputs[i].host,
                            (size_t)regc_tensor_bytes(t->inputs[i].tensor));
    t->constants_sent = 1;
}

/* One optimizer step over grad_accum micro-batches on every rank. Each
 * micro-batch's loss gradient is seeded with its share n / N of the step's
 * targets over all micro-batches and ranks, so that the gradients, summed
 * in place over the micro-batches and over the ranks, are those of one
 * batch of all of them; accumulating, the gradients start at zero. */
int regc_trainer_step(trainer *t, const regc_train_options *o, int step, regc_profile *pr,
                      regc_step_report *r)
{
    regc_backend *be = t->be;
    const int k = o->grad_accum, shared = k > 1 || t->comm->size > 1;
    int64_t total = 0;
    int rc = REGC_OK;
    double t0 = regc_time_ms(), comm0, wait0;
    regc_program_comm_times(t->program, &comm0, &wait0);
    /* DeepSpeed's schedules: this step's rate from the steps applied so far
     * (the last read-back), the update's constant schedule applying it */
    if (regc_train_schedule_is_deepspeed(o->lr_scheduler)) {
        const double lr = regc_train_ds_lr(o, (int64_t)t->host.step);
        be->copy_h2d(be, (char *)t->scalars + offsetof(regc_step_scalars, base_lr), &lr, sizeof lr);
    }
    if (shared) {
        for (int j = 0; j < k && rc == REGC_OK; j++)
            if ((rc = fill_batch(t, o, t->tokens, (int64_t)step * k + j, 0)) == REGC_OK)
                total += t->counts[j] = count_targets(t);
        if (rc || (rc = t->comm->allreduce(t->comm, &total, 1, REGC_COMM_I64)))
            return rc;
        if (total == 0)
            return regc_error(REGC_ERR_ARG,
                              "step %d: no target of its %d micro-batches counts toward the loss",
                              step, k);
    }
    if (k > 1)
        be->fill(be, t->grads, (size_t)t->block, 0.0f);
    for (int j = 0; j < k && rc == REGC_OK; j++) {
        if ((rc = fill_batch(t, o, t->tokens, (int64_t)step * k + j, 0)))
            return rc;
        upload_batch(t);
        if (shared) {
            float share = (float)((double)t->counts[j] / (double)total);
            be->copy_h2d(be, (char *)t->scalars + offsetof(regc_step_scalars, loss_scale), &share,
                         sizeof share);
        }
        if (pr && (rc = profile_since(be, pr, "inputs (batch to the device)", &t0)))
            return rc;
        regc_program_set_profile(t->program, pr);
        rc = regc_program_run(t->program);
        regc_program_set_profile(t->program, NULL);
        t0 = regc_time_ms();
        if (rc == REGC_OK)
            be->copy_d2h(be, &t->losses[j], regc_program_loss(t->program), sizeof(float));
    }
    if (rc || (rc = be->sync(be)))
        return rc;
    /* The step's loss, before the update: the mean over every target of the
     * step, on every rank. A loss that is not finite on any rank makes it so,
     * and then no rank updates (the update's own collectives are entered by
     * all or none). A non-finite gradient norm is caught inside the update,
     * where every rank sees the same global norm, and makes AdamW a no-op. */
    double loss = t->losses[0];
    if (shared) {
        loss = 0.0;
        for (int j = 0; j < k; j++)
            loss += (double)t->losses[j] * (double)t->counts[j] / (double)total;
        if ((rc = t->comm->allreduce(t->comm, &loss, 1, REGC_COMM_F64)))
            return rc;
    }
    const int bad_loss = !isfinite(loss);
    r->nonfinite = bad_loss ? "loss" : NULL;
    regc_program_set_profile(t->program, pr);
    if (!bad_loss)
        rc = regc_program_update(t->program);
    regc_program_set_profile(t->program, NULL);
    if (rc)
        return rc;
    t0 = regc_time_ms();
    be->copy_d2h(be, &t->host, t->scalars, sizeof t->host);
    if ((rc = be->sync(be)))
        return rc;
    if (!bad_loss && t->host.skipped)
        r->nonfinite = "gradient norm";
    if (pr && (rc = profile_since(be, pr, "loss and scalars to the host", &t0)))
        return rc;
    if (pr)
        regc_profile_count_run(pr);
    double comm1, wait1;
    regc_program_comm_times(t->program, &comm1, &wait1);
    r->comm_ms = comm1 - comm0, r->comm_wait_ms = wait1 - wait0;
    r->loss = (float)loss;
    r->lr = t->host.lr;
    r->grad_norm = o->max_grad_norm > 0.0 && !bad_loss ? t->host.grad_norm : NAN;
    return REGC_OK;
}

/* The mean loss over the first val_batches global batches of the
 * validation data, each weighted by the targets that count in it. */
int regc_trainer_evaluate(trainer *t, const regc_train_options *o, float *val_loss)
{
    double sums[2] = {0.0, 0.0}; /* loss x targets, targets */
    for (int b = 0; b < o->val_batches; b++) {
        float loss = 0.0f;
        int rc = fill_batch(t, o, t->val_tokens, b, 1);
        if (rc)
            return rc;
        int64_t n = count_targets(t);
        upload_batch(t);
        if ((rc = regc_program_run(t->val_program)))
            return rc;
        t->be->copy_d2h(t->be, &loss, regc_program_loss(t->val_program), sizeof loss);
        if ((rc = t->be->sync(t->be)))
            return rc;
        sums[0] += (double)loss * (double)n;
        sums[1] += (double)n;
    }
    int rc = t->comm->allreduce(t->comm, sums, 2, REGC_COMM_F64);
    *val_loss = sums[1] > 0 ? (float)(sums[0] / sums[1]) : NAN;
    return rc;
}
