/* checkpoint.c — checkpoints a run resumes from, exactly.
 *
 * output_dir/checkpoint-N/ (N optimizer steps done) holds the model as a
 * Hugging Face directory (config.json or a graph model's graph.json, and
 * model.safetensors), AdamW's moments by parameter name
 * (optimizer.safetensors: exp_avg.<name>, exp_avg_sq.<name>, fp32), and
 * trainer_state.json: where the run stands (steps done, the next batch of
 * the data) and the settings that decide what the rest computes. Nothing
 * else is needed to continue: the schedule and AdamW's bias corrections
 * follow from the step count, the data's batches from the batch index.
 *
 * Under ZeRO-3 no rank holds the whole model: the trainer streams each
 * gather unit's weights and moments into the files, rank 0 writing.
 *
 * A checkpoint appears whole or not at all: it is a staged directory
 * (common/stagedir.c): written into a hidden sibling
 * (.checkpoint-N.tmp-<host>-<pid>), every file written atomically and
 * fsynced, then swapped into place in one rename and the parent fsynced. A
 * kill at any moment leaves the earlier checkpoints and at most a hidden
 * directory, which the next save removes. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint.h"

#define STATE_FILE "trainer_state.json"
#define OPTIMIZER_FILE "optimizer.safetensors"
#define MOMENT1 "exp_avg."
#define MOMENT2 "exp_avg_sq."

int regc_run_state_of(const regc_train_options *o, const regc_model *m, const regc_tokens *data,
                      int64_t step, regc_run_state *st)
{
    memset(st, 0, sizeof *st);
    regc_bytes b = {0};
    int rc = regc_model_write_structure(m, &b);
    st->structure = rc == REGC_OK ? regc_hash64(b.data, b.len) : 0;
    regc_bytes_free(&b);
    st->global_step = step;
    st->next_batch = step * o->grad_accum;
    /* the global batch: a checkpoint moves between rank counts that keep it */
    st->steps = o->steps, st->batch = o->batch * (o->comm ? o->comm->size : 1), st->seq = o->seq;
    st->grad_accum = o->grad_accum;
    st->warmup = regc_train_warmup_steps(o);
    st->data_tokens = regc_tokens_count(data);
    st->data_hash = regc_tokens_hash(data);
    st->seed = o->seed;
    st->shuffle = o->shuffle != 0, st->data_seed = o->shuffle ? o->data_seed : 0;
    regc_documents docs;
    regc_model_documents(m, &docs);
    st->eod = docs.eod_token_id;
    st->reset_positions = docs.reset_position_ids, st->mask_eod = docs.eod_mask_loss;
    st->lr = (double)o->lr, st->weight_decay = (double)o->weight_decay;
    st->decay_params = o->weight_decay != 0.0f ? o->weight_decay_params : REGC_DECAY_ALL;
    st->max_grad_norm = o->max_grad_norm;
    st->min_lr_rate = o->min_lr >= 0.0 ? o->min_lr / (double)o->lr : o->min_lr_rate;
    st->beta1 = (double)o->beta1, st->beta2 = (double)o->beta2, st->eps = (double)o->eps;
    st->schedule = (int)o->lr_scheduler;
    if (regc_train_schedule_is_deepspeed(o->lr_scheduler)) {
        const int cosine = o->lr_scheduler == REGC_SCHEDULE_WARMUP_COSINE_LR;
        st->warmup_min_lr = cosine ? 0.0 : o->warmup_min_lr;
        st->warmup_type = o->warmup_type;
        st->total_num_steps = o->lr_scheduler == REGC_SCHEDULE_WARMUP_LR ? 0
                              : o->total_num_steps > 0                   ? o->total_num_steps
                                                                         : o->steps;
        st->warmup_min_ratio = !cosine                      ? 0.0
                               : o->warmup_min_ratio >= 0.0 ? o->warmup_min_ratio
                                                            : 0.0;
        st->cos_min_ratio = !cosine ? 0.0 : o->cos_min_ratio >= 0.0 ? o->cos_min_ratio : 0.0001;
    }
    return rc;
}

/* ---------------------------------------------------------------- the state file */

/* A double that reads back as itself: cJSON writes 15 digits wherever they
 * come within a rounding of the value, and a float widened (a learning
 * rate of 2e-5) needs 17 to be named exactly. */
static int add_exact(cJSON *o, const char *key, double v)
{
    char text[32];
    snprintf(text, sizeof text, "%.17g", v);
    return cJSON_AddRawToObject(o, key, text) != NULL;
}

static char *state_json(const regc_run_state *st)
{
    char structure[24], seed[24], data[24], data_seed[24];
    snprintf(structure, sizeof structure, "%016" PRIx64, st->structure);
    snprintf(data, sizeof data, "%016" PRIx64, st->data_hash);
    snprintf(seed, sizeof seed, "%" PRIu64, st->seed);
    snprintf(data_seed, sizeof data_seed, "%" PRIu64, st->data_seed);
    cJSON *root = cJSON_CreateObject(), *train = cJSON_CreateObject();
    int ok = root && train && cJSON_AddItemToObject(root, "train", train);
    if (!ok)
        cJSON_Delete(train);
    ok = ok && cJSON_AddNumberToObject(root, "global_step", (double)st->global_step);
    ok = ok && cJSON_AddNumberToObject(root, "skipped_steps", (double)st->skipped_steps);
    ok = ok && cJSON_AddNumberToObject(root, "next_batch", (double)st->next_batch);
    ok = ok && cJSON_AddStringToObject(root, "model_structure", structure);
    ok = ok && cJSON_AddNumberToObject(train, "steps", (double)st->steps);
    ok = ok && cJSON_AddNumberToObject(train, "batch", (double)st->batch);
    ok = ok && cJSON_AddNumberToObject(train, "seq", (double)st->seq);
    ok =
        ok && cJSON_AddNumberToObject(train, "gradient_accumulation_steps", (double)st->grad_accum);
    ok = ok && cJSON_AddStringToObject(train, "lr_scheduler_type",
                                       regc_train_schedule_name(st->schedule));
    ok = ok && cJSON_AddNumberToObject(train, "warmup_steps", (double)st->warmup);
    ok = ok && add_exact(train, "lr", st->lr);
    ok = ok && add_exact(train, "weight_decay", st->weight_decay);
    ok = ok && cJSON_AddStringToObject(train, "weight_decay_params",
                                       regc_decay_params_names[st->decay_params]);
    ok = ok && add_exact(train, "max_grad_norm", st->max_grad_norm);
    ok = ok && add_exact(train, "min_lr_rate", st->min_lr_rate);
    ok = ok && add_exact(train, "adam_beta1", st->beta1);
    ok = ok && add_exact(train, "adam_beta2", st->beta2);
    ok = ok && add_exact(train, "adam_epsilon", st->eps);
    ok = ok && add_exact(train, "warmup_min_lr", st->warmup_min_lr);
    ok = ok && cJSON_AddNumberToObject(train, "warmup_type", (double)st->warmup_type);
    ok = ok && cJSON_AddNumberToObject(train, "total_num_steps", (double)st->total_num_steps);
    ok = ok && add_exact(train, "warmup_min_ratio", st->warmup_min_ratio);
    ok = ok && add_exact(train, "cos_min_ratio", st->cos_min_ratio);
    ok = ok && cJSON_AddStringToObject(train, "seed", seed);
    ok = ok && cJSON_AddNumberToObject(train, "data_tokens", (double)st->data_tokens);
    ok = ok && cJSON_AddStringToObject(train, "data_hash", data);
    if (st->eod >= 0) /* absent: one document a row, as before the option */
        ok = ok && cJSON_AddNumberToObject(train, "eod_token_id", (double)st->eod);
    if (st->reset_positions)
        ok = ok && cJSON_AddBoolToObject(train, "reset_position_ids", 1);
    if (st->mask_eod)
        ok = ok && cJSON_AddBoolToObject(train, "eod_mask_loss", 1);
    if (st->shuffle) /* absent: llm.c's order, as before the option */
        ok = ok && cJSON_AddBoolToObject(train, "shuffle", 1) &&
             cJSON_AddStringToObject(train, "data_seed", data_seed);
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    return text;
}

static int get_int(const cJSON *o, const char *key, const char *path, int64_t *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 9007199254740992.0 ||
        it->valuedouble != (double)(int64_t)it->valuedouble)
        return regc_error(REGC_ERR_FORMAT, "%s: \"%s\" is missing or not a whole number", path,
                          key);
    *out = (int64_t)it->valuedouble;
    return REGC_OK;
}

static int get_bool(const cJSON *o, const char *key, const char *path, int64_t *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsBool(it))
        return regc_error(REGC_ERR_FORMAT, "%s: \"%s\" is missing or not true or false", path, key);
    *out = cJSON_IsTrue(it);
    return REGC_OK;
}

static int get_double(const cJSON *o, const char *key, const char *path, double *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(it))
        return regc_error(REGC_ERR_FORMAT, "%s: \"%s\" is missing or not a number", path, key);
    *out = it->valuedouble;
    return REGC_OK;
}

static int get_hex_or_dec(const cJSON *o, const char *key, const char *path, int base,
                          uint64_t *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    char *end = NULL;
    if (!cJSON_IsString(it) || !it->valuestring[0])
        return regc_error(REGC_ERR_FORMAT, "%s: \"%s\" is missing or not a string", path, key);
    errno = 0;
    *out = strtoull(it->valuestring, &end, base);
    if (errno || *end)
        return regc_error(REGC_ERR_FORMAT, "%s: \"%s\" is not a number", path, key);
    return REGC_OK;
}

static int read_state(const char *dir, regc_run_state *st)
{
    char path[4096];
    int rc = regc_path_join(path, sizeof path, dir, STATE_FILE);
    char *text = NULL;
    if (rc || (rc = regc_file_read_all(path, &text, NULL)))
        return rc;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *train = cJSON_GetObjectItemCaseSensitive(root, "train");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(train)) {
        cJSON_Delete(root);
        return regc_error(REGC_ERR_FORMAT, "%s: not a trainer state (malformed JSON)", path);
    }
    memset(st, 0, sizeof *st);
    const cJSON *sched = cJSON_GetObjectItemCaseSensitive(train, "lr_scheduler_type");
    st->schedule = -1;
    for (int k = 0; cJSON_IsString(sched) && k < REGC_TRAIN_SCHEDULE_COUNT; k++)
        if (!strcmp(sched->valuestring, regc_train_schedule_name(k)))
            st->schedule = k;
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(train, "weight_decay_params");
    st->decay_params = groups ? -1 : REGC_DECAY_ALL; /* written since it became an option */
    for (int k = 0; cJSON_IsString(groups) && regc_decay_params_names[k]; k++)
        if (!strcmp(groups->valuestring, regc_decay_params_names[k]))
            st->decay_params = k;
    /* written since AdamW's constants and DeepSpeed's schedules became
     * options; a checkpoint from before ran with torch's constants. AdamW's
     * are floats in regc, read back rounded to one. */
    st->beta1 = (double)0.9f, st->beta2 = (double)0.999f, st->eps = (double)1e-8f;
    st->eod = -1;
    enum { DOUBLE, FLOAT, INT, BOOL }; /* how each key is read */
    const struct {
        const char *key;
        double *d;
        int64_t *i;
        int kind;
    } later[] = {{"adam_beta1", &st->beta1, NULL, FLOAT},
                 {"adam_beta2", &st->beta2, NULL, FLOAT},
                 {"adam_epsilon", &st->eps, NULL, FLOAT},
                 {"warmup_min_lr", &st->warmup_min_lr, NULL, DOUBLE},
                 {"warmup_type", NULL, &st->warmup_type, INT},
                 {"total_num_steps", NULL, &st->total_num_steps, INT},
                 {"warmup_min_ratio", &st->warmup_min_ratio, NULL, DOUBLE},
                 {"cos_min_ratio", &st->cos_min_ratio, NULL, DOUBLE},
                 {"eod_token_id", NULL, &st->eod, INT},
                 {"reset_position_ids", NULL, &st->reset_positions, BOOL},
                 {"eod_mask_loss", NULL, &st->mask_eod, BOOL},
                 {"shuffle", NULL, &st->shuffle, BOOL}};
    for (size_t k = 0; k < sizeof later / sizeof later[0] && rc == REGC_OK; k++) {
        double v = 0.0;
        if (!cJSON_GetObjectItemCaseSensitive(train, later[k].key))
            continue;
        if (later[k].kind == BOOL)
            rc = get_bool(train, later[k].key, path, later[k].i);
        else if (later[k].kind == INT)
            rc = get_int(train, later[k].key, path, later[k].i);
        else if ((rc = get_double(train, later[k].key, path, &v)) == REGC_OK)
            *later[k].d = later[k].kind == FLOAT ? (double)(float)v : v;
    }
    if (rc) {
        cJSON_Delete(root);
        return rc;
    }
    if ((rc = get_int(root, "global_step", path, &st->global_step)) ||
        (rc = get_int(root, "skipped_steps", path, &st->skipped_steps)) ||
        (rc = get_int(root, "next_batch", path, &st->next_batch)) ||
        (rc = get_hex_or_dec(root, "model_structure", path, 16, &st->structure)) ||
        (rc = get_int(train, "steps", path, &st->steps)) ||
        (rc = get_int(train, "batch", path, &st->batch)) ||
        (rc = get_int(train, "seq", path, &st->seq)) ||
        (rc = get_int(train, "gradient_accumulation_steps", path, &st->grad_accum)) ||
        (rc = get_int(train, "warmup_steps", path, &st->warmup)) ||
        (rc = get_int(train, "data_tokens", path, &st->data_tokens)) ||
        (rc = get_double(train, "lr", path, &st->lr)) ||
        (rc = get_double(train, "weight_decay", path, &st->weight_decay)) ||
        (rc = get_double(train, "max_grad_norm", path, &st->max_grad_norm)) ||
        (rc = get_double(train, "min_lr_rate", path, &st->min_lr_rate)) ||
        (rc = get_hex_or_dec(train, "seed", path, 10, &st->seed)) ||
        (rc = get_hex_or_dec(train, "data_hash", path, 16, &st->data_hash)) ||
        (st->shuffle && (rc = get_hex_or_dec(train, "data_seed", path, 10, &st->data_seed)))) {
        cJSON_Delete(root);
        return rc;
    }
    cJSON_Delete(root);
    if (st->schedule < 0)
        return regc_error(REGC_ERR_FORMAT, "%s: \"lr_scheduler_type\" is not a schedule", path);
    if (st->decay_params < 0)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: \"weight_decay_params\" is not \"all\" or \"not_bias_norm\"", path);
    if (st->skipped_steps > st->global_step)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: skipped_steps %" PRId64 " is more than global_step %" PRId64, path,
                          st->skipped_steps, st->global_step);
    if (st->next_batch != st->global_step * st->grad_accum)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: next_batch %" PRId64 " does not follow from global_step %" PRId64
                          " and gradient_accumulation_steps %" PRId64,
                          path, st->next_batch, st->global_step, st->grad_accum);
    return REGC_OK;
}

/* ---------------------------------------------------------------- writing */

int regc_checkpoint_begin(const char *output_dir, int64_t step, regc_checkpoint_writer *ck)
{
    char name[64], dir[4096];
    snprintf(name, sizeof name, "checkpoint-%" PRId64, step);
    int rc = regc_path_join(dir, sizeof dir, output_dir, name);
    if (rc || (rc = regc_staged_dir_open(dir, &ck->staged)))
        return rc;
    snprintf(ck->output_dir, sizeof ck->output_dir, "%s", output_dir); /* shorter than dir */
    ck->tmp = regc_staged_dir_path(ck->staged);
    return REGC_OK;
}

int regc_checkpoint_moments_open(const regc_checkpoint_writer *ck, const regc_model *m,
                                 regc_st_writer **out)
{
    int n = regc_model_n_params(m), rc;
    regc_st_entry *e = calloc(2 * (size_t)n + 1, sizeof *e);
    char *names = malloc(2 * (size_t)n * 512 + 1), path[4096];
    *out = NULL;
    if (!e || !names) {
        free(e), free(names);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", ck->tmp);
    }
    int j = 0; /* the trained parameters alone have moments */
    for (int i = 0; i < n; j += !regc_model_param_frozen(m, i), i++)
        for (int k = 0; k < 2 && !regc_model_param_frozen(m, i); k++) {
            regc_st_entry *x = &e[2 * j + k];
            x->name = names + (2 * (size_t)j + (size_t)k) * 512;
            snprintf(x->name, 512, "%s%s", k ? MOMENT2 : MOMENT1, regc_model_param_name(m, i));
            x->dtype = REGC_F32;
            x->ndim = regc_model_param_shape(m, i, x->shape);
        }
    n = j;
    if ((rc = regc_path_join(path, sizeof path, ck->tmp, OPTIMIZER_FILE)) == REGC_OK)
        rc = regc_st_writer_open(path, e, 2 * n, 0, out);
    free(e), free(names);
    return rc;
}

void regc_checkpoint_abandon(regc_checkpoint_writer *ck)
{
    regc_staged_dir_abandon(ck->staged);
    ck->staged = NULL, ck->tmp = NULL;
}

int regc_checkpoint_commit(regc_checkpoint_writer *ck, const regc_run_state *st)
{
    char path[4096];
    char *state = state_json(st);
    int rc = state ? REGC_OK : regc_error(REGC_ERR_MEMORY, "%s: out of memory", ck->tmp);
    if (rc == REGC_OK && (rc = regc_path_join(path, sizeof path, ck->tmp, STATE_FILE)) == REGC_OK)
        rc = regc_file_write_atomic(path, state, strlen(state));
    free(state);
    if (rc) {
        regc_checkpoint_abandon(ck);
        return rc;
    }
    rc = regc_staged_dir_commit(ck->staged);
    ck->staged = NULL, ck->tmp = NULL;
    return rc;
}

/* ---------------------------------------------------------------- finding */

/* N of "checkpoint-N", or -1 for any other name. */
static int64_t checkpoint_number(const char *name)
{
    int64_t n;
    if (strncmp(name, "checkpoint-", 11) != 0 || regc_text_to_i64(name + 11, 0, INT64_MAX, &n))
        return -1;
    return n;
}

/* The steps of every checkpoint in output_dir, ascending, into *out. */
static int list_checkpoints(const char *output_dir, int64_t **out, int *n)
{
    *out = NULL, *n = 0;
    DIR *d = opendir(output_dir);
    if (!d)
        return regc_error(REGC_ERR_IO, "%s: cannot list: %s", output_dir, strerror(errno));
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t k = checkpoint_number(e->d_name);
        if (k < 0)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *x = realloc(*out, (size_t)cap * sizeof *x);
            if (!x) {
                closedir(d);
                return regc_error(REGC_ERR_MEMORY, "%s: out of memory", output_dir);
            }
            *out = x;
        }
        (*out)[(*n)++] = k;
    }
    closedir(d);
    for (int i = 1; i < *n; i++) /* insertion sort: a handful of entries */
        for (int j = i; j > 0 && (*out)[j - 1] > (*out)[j]; j--) {
            int64_t t = (*out)[j];
            (*out)[j] = (*out)[j - 1], (*out)[j - 1] = t;
        }
    return REGC_OK;
}

int regc_checkpoint_latest(const char *output_dir, char *buf, size_t cap)
{
    int64_t *steps;
    int n, rc = list_checkpoints(output_dir, &steps, &n);
    if (rc)
        return rc;
    if (n == 0) {
        free(steps);
        return regc_error(REGC_ERR_IO, "%s: no checkpoint-N directory to resume from", output_dir);
    }
    char name[64];
    snprintf(name, sizeof name, "checkpoint-%" PRId64, steps[n - 1]);
    free(steps);
    return regc_path_join(buf, cap, output_dir, name);
}

int regc_checkpoint_prune(const char *output_dir, int keep)
{
    /* what dead writers left: the hidden siblings of any checkpoint */
    regc_staged_dir_remove_dead(output_dir, "checkpoint-");
    if (keep <= 0)
        return REGC_OK;
    int64_t *steps;
    int n, rc = list_checkpoints(output_dir, &steps, &n);
    for (int i = 0; rc == REGC_OK && i + keep < n; i++) {
        char name[64], path[4096];
        snprintf(name, sizeof name, "checkpoint-%" PRId64, steps[i]);
        if ((rc = regc_path_join(path, sizeof path, output_dir, name)) == REGC_OK)
            rc = regc_remove_tree(path);
    }
    free(steps);
    return rc;
}

/* ---------------------------------------------------------------- resuming */

/* One setting in two states: equal, or within a few roundings. A state
 * file written before add_exact names a double in the 15 digits cJSON
 * chose wherever they read back within one rounding (a rate of 2e-5, a
 * float widened, or min_lr_rate, a ratio, read back as a neighbouring
 * double); any setting given differently is further apart. */
static int same_setting(double a, double b)
{
    return a == b || fabs(a - b) <= 4.0 * DBL_EPSILON * fmax(fabs(a), fabs(b));
}

/* The documents' settings, each named by its key before the structure
 * they are part of. */
static int documents_differ(const regc_run_state *a, const char *a_is, const regc_run_state *b,
                            const char *b_is, char *buf, size_t cap)
{
    if (a->eod != b->eod) {
        char x[24] = "-1 (none)", y[24] = "-1 (none)";
        if (a->eod >= 0)
            snprintf(x, sizeof x, "%" PRId64, a->eod);
        if (b->eod >= 0)
            snprintf(y, sizeof y, "%" PRId64, b->eod);
        snprintf(buf, cap, "train.eod_token_id is %s %s, %s %s", x, a_is, y, b_is);
        return 1;
    }
    const struct {
        const char *key;
        int64_t x, y;
    } flags[] = {{"reset_position_ids", a->reset_positions, b->reset_positions},
                 {"eod_mask_loss", a->mask_eod, b->mask_eod}};
    for (size_t k = 0; k < sizeof flags / sizeof *flags; k++)
        if (flags[k].x != flags[k].y) {
            snprintf(buf, cap, "train.%s is %s %s, %s %s", flags[k].key,
                     flags[k].x ? "true" : "false", a_is, flags[k].y ? "true" : "false", b_is);
            return 1;
        }
    return 0;
}

int regc_run_state_differ(const regc_run_state *a, const char *a_is, const regc_run_state *b,
                          const char *b_is, int any_length, char *buf, size_t cap)
{
    if (documents_differ(a, a_is, b, b_is, buf, cap))
        return 1;
    if (a->structure != b->structure) {
        snprintf(buf, cap, "the model's structure differs (%s and %s)", a_is, b_is);
        return 1;
    }
    if (a->data_hash != b->data_hash || a->data_tokens != b->data_tokens) {
        snprintf(buf, cap,
                 "train.data: the tokens (or their loss mask) differ (%" PRId64
                 " tokens %s, %" PRId64 " %s)",
                 a->data_tokens, a_is, b->data_tokens, b_is);
        return 1;
    }
    if (a->schedule != b->schedule) {
        snprintf(buf, cap, "train.lr_scheduler_type is %s %s, %s %s",
                 regc_train_schedule_name(a->schedule), a_is, regc_train_schedule_name(b->schedule),
                 b_is);
        return 1;
    }
    if (a->decay_params != b->decay_params) {
        snprintf(buf, cap, "train.weight_decay_params is %s %s, %s %s",
                 regc_decay_params_names[a->decay_params], a_is,
                 regc_decay_params_names[b->decay_params], b_is);
        return 1;
    }
    if (a->seed != b->seed) {
        snprintf(buf, cap, "train.seed is %" PRIu64 " %s, %" PRIu64 " %s", a->seed, a_is, b->seed,
                 b_is);
        return 1;
    }
    if (a->shuffle != b->shuffle) {
        snprintf(buf, cap, "train.shuffle is %s %s, %s %s", a->shuffle ? "true" : "false", a_is,
                 b->shuffle ? "true" : "false", b_is);
        return 1;
    }
    if (a->data_seed != b->data_seed) {
        snprintf(buf, cap, "train.data_seed is %" PRIu64 " %s, %" PRIu64 " %s", a->data_seed, a_is,
                 b->data_seed, b_is);
        return 1;
    }
    const struct {
        const char *key;
        double a, b;
    } fields[] = {
        /* a constant schedule does not depend on the run's length, nor do
         * DeepSpeed's, whose length is total_num_steps (compared below) */
        {"steps", (double)a->steps,
         any_length && (a->schedule == REGC_SCHEDULE_CONSTANT ||
                        regc_train_schedule_is_deepspeed(a->schedule))
             ? (double)a->steps
             : (double)b->steps},
        {"batch", (double)a->batch, (double)b->batch},
        {"seq", (double)a->seq, (double)b->seq},
        {"gradient_accumulation_steps", (double)a->grad_accum, (double)b->grad_accum},
        {"warmup_steps", (double)a->warmup, (double)b->warmup},
        {"lr", a->lr, b->lr},
        {"weight_decay", a->weight_decay, b->weight_decay},
        {"max_grad_norm", a->max_grad_norm, b->max_grad_norm},
        {"min_lr_rate", a->min_lr_rate, b->min_lr_rate},
        {"adam_beta1", a->beta1, b->beta1},
        {"adam_beta2", a->beta2, b->beta2},
        {"adam_epsilon", a->eps, b->eps},
        {"warmup_min_lr", a->warmup_min_lr, b->warmup_min_lr},
        {"warmup_type", (double)a->warmup_type, (double)b->warmup_type},
        {"total_num_steps", (double)a->total_num_steps, (double)b->total_num_steps},
        {"warmup_min_ratio", a->warmup_min_ratio, b->warmup_min_ratio},
        {"cos_min_ratio", a->cos_min_ratio, b->cos_min_ratio},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!same_setting(fields[i].a, fields[i].b)) {
            snprintf(buf, cap, "train.%s is %.17g %s, %.17g %s", fields[i].key, fields[i].a, a_is,
                     fields[i].b, b_is);
            return 1;
        }
    return 0;
}

int regc_checkpoint_check(const char *dir, const regc_run_state *now, regc_run_state *saved)
{
    int rc = read_state(dir, saved);
    if (rc)
        return rc;
    char path[4096], what[512];
    regc_path_join(path, sizeof path, dir, STATE_FILE);
    if (documents_differ(saved, "in the checkpoint", now, "now", what, sizeof what))
        return regc_error(REGC_ERR_ARG, "%s: %s", path, what);
    if (saved->structure != now->structure)
        return regc_error(REGC_ERR_ARG,
                          "%s: the checkpoint is of another model (its structure differs from "
                          "the model being trained)",
                          path);
    if (regc_run_state_differ(saved, "in the checkpoint", now, "now", 1, what, sizeof what))
        return regc_error(REGC_ERR_ARG, "%s: %s", path, what);
    if (saved->global_step > now->steps)
        return regc_error(REGC_ERR_ARG,
                          "%s: the checkpoint is past the run's end (step %" PRId64 " of %" PRId64
                          ")",
                          path, saved->global_step, now->steps);
    return REGC_OK;
}

int regc_checkpoint_open(const char *dir, const regc_model *m, regc_weights *src[3])
{
    static const char *const prefix[3] = {"", MOMENT1, MOMENT2};
    char path[4096];
    int rc = REGC_OK;
    src[0] = src[1] = src[2] = NULL;
    for (int k = regc_model_has_lora(m); k < 3 && rc == REGC_OK; k++) /* LoRA: the caller's base */
        if ((rc = regc_path_join(path, sizeof path, dir,
                                 k ? OPTIMIZER_FILE : "model.safetensors")) == REGC_OK)
            rc = regc_weights_open(m, path, prefix[k], &src[k]);
    for (int k = 0; rc && k < 3; k++)
        regc_weights_close(src[k]), src[k] = NULL;
    return rc;
}
