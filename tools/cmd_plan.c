/* cmd_plan.c — `regc plan`: a run's device memory and communication per
 * rank for N ranks, from shapes alone (a dry run: no weights, no devices,
 * no MPI). It reads regc train's options, flags and config files, through
 * the same table (cli_settings.c), and compiles the step for N ranks
 * exactly as `mpirun -np N regc train` would compile it with them; the
 * memory is the program's own account of what the trainer allocates for
 * it. Its own flags (--ranks, --fit, --device-memory-mb) are taken out of
 * argv before the rest goes to the table. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "regc_models.h"
#include "regc_region.h"
#include "regc_train.h"

void print_plan_usage(FILE *f)
{
    fputs("usage: regc plan --model <hf-dir|graph.json|preset> --ranks <N> [options]\n"
          "       regc plan --config <FILE> [--deepspeed <ds_config.json>] --ranks <N> [options]\n"
          "\n"
          "Compile a training step for N ranks from shapes alone and print, per rank, the\n"
          "device memory the run would hold (parameter, gradient and AdamW shards, the\n"
          "activation plan's peak with the gathered parameters in it, inputs), what is\n"
          "recomputed, offloaded and chunked, and the communication of one step. No\n"
          "weights are read, no devices or MPI are needed.\n"
          "\n"
          "It reads every option of regc train, flags and config files alike (see regc\n"
          "train --help), and compiles the step `mpirun -np N regc train` with them would\n"
          "compile: --batch, --seq, --zero-stage (here 3 unless given), --level,\n"
          "--precision, --recompute, --memory-budget-mb, --offload-optimizer,\n"
          "--offload-activation, --passes, --lora-r, --load-in-4bit, --backend (cuda\n"
          "places the copies of offloaded activations where compute hides them; no device\n"
          "is needed), ... The options that only a run reads (the learning rate, the\n"
          "steps, the data) change nothing here.\n"
          "\n"
          "options of its own:\n"
          "  --ranks <N>                processes, >= 1 (required)\n"
          "  --fit <seq|batch>          find the longest sequence (largest batch) whose step\n"
          "                             fits --device-memory-mb per rank, and print its plan\n"
          "  --device-memory-mb <MiB>   the device memory --fit fills (its budget)\n"
          "  --json                     one JSON object instead of text (as regc train's)\n"
          "  -h, --help                 print this text\n",
          f);
}

/* The plan's own flags beside regc train's options. */
typedef struct {
    long long ranks;
    const char *fit; /* "seq", "batch" or NULL */
    long long device_mb;
} plan_flags;

/* What a plan is of: the settings as regc train reads them and the
 * plan's own flags. */
typedef struct {
    const regc_train_settings *s;
    plan_flags f;
    long long batch, seq; /* the settings', or what --fit found */
} plan_args;

/* Is flag (--name) among argv's, as "--name value" or "--name=value"? */
static int given(int argc, char **argv, const char *flag)
{
    const size_t n = strlen(flag);
    for (int i = 0; i < argc; i++)
        if (!strncmp(argv[i], flag, n) && (argv[i][n] == '\0' || argv[i][n] == '='))
            return 1;
    return 0;
}

/* argv's plan flags into f, the rest (regc train's) into rest[*n_rest]:
 * 0, or the usage exit code. */
static int split_plan_flags(int argc, char **argv, plan_flags *f, char **rest, int *n_rest,
                            int *help)
{
    *n_rest = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        char flag[64];
        const char *value = split_flag(argc, argv, i, flag, sizeof flag);
        const int own = !strcmp(flag, "--ranks") || !strcmp(flag, "--fit") ||
                        !strcmp(flag, "--device-memory-mb");
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            *help = 1;
            return 0;
        }
        if (!own || strncmp(arg, "--", 2) != 0) {
            rest[(*n_rest)++] = argv[i];
            continue;
        }
        if (!value)
            return usage_error("%s needs a value (see regc plan --help)", flag);
        if (!strchr(arg, '='))
            i++;
        int rc = 0;
        if (!strcmp(flag, "--ranks"))
            rc = parse_int(flag, value, 1, 1 << 20, "a positive integer", &f->ranks);
        else if (!strcmp(flag, "--device-memory-mb"))
            rc = parse_int(flag, value, 1, INT64_C(1) << 30, "a positive integer", &f->device_mb);
        else if (!strcmp(value, "seq") || !strcmp(value, "batch"))
            f->fit = !strcmp(value, "seq") ? "seq" : "batch";
        else
            return usage_error("--fit: expected seq or batch, got \"%s\"", value);
        if (rc)
            return rc;
    }
    return 0;
}

static void print_recompute(const plan_args *a, const regc_fit_plan *r)
{
    if (r->logits_chunks > 0)
        printf("loss: the logits in %lld chunks of at most %lld rows, never whole\n",
               (long long)r->logits_chunks, (long long)r->logits_chunk_rows);
    if (r->offloaded > 0) {
        char bytes[32];
        size_text(bytes, sizeof bytes, r->offload_bytes);
        printf("offload: %d activations, %s, to the host after their forward and back before "
               "their backward\n",
               r->offloaded, bytes);
    }
    if (r->replays == 0) {
        printf("recompute: %s, nothing recomputed\n",
               regc_recompute_name(a->s->train.compile.recompute));
        return;
    }
    printf("recompute: %s, %d instructions run again in the backward (%s): %.3g GFLOP a step, "
           "%.1f%% of its FLOPs\n",
           regc_recompute_name(a->s->train.compile.recompute), r->replays, r->kernels,
           r->replay_flop / 1e9, 100.0 * r->replay_flop / (r->step_flop > 0 ? r->step_flop : 1));
}

static void print_text(const plan_args *a, const regc_device_memory *mem, const regc_comm_plan *c,
                       const regc_compile_stats *st, const regc_fit_plan *r)
{
    const regc_train_options *o = &a->s->train;
    printf("%s, %lld ranks x batch %lld x seq %lld, ZeRO stage %d, %s, %s: compiled in %.1f ms\n",
           a->s->model, a->f.ranks, a->batch, a->seq, o->zero_stage,
           regc_level_name(o->compile.level), regc_precision_name(o->compile.precision),
           st->detect_ms + st->compile_ms + st->inline_ms + st->build_ms);
    if (st->fit_probes)
        printf("memory budget: %d compiles tried to choose what fits, in %.1f ms\n", st->fit_probes,
               st->fit_ms);
    if (st->zero3_units)
        print_zero3_schedule(stdout, st);
    print_device_memory(stdout, mem, (int)a->f.ranks);
    print_recompute(a, r);
    char gather[32], window[32], scatter[32], allreduce[32];
    size_text(gather, sizeof gather, c->gather_bytes);
    size_text(window, sizeof window, c->window_bytes);
    size_text(scatter, sizeof scatter, c->scatter_bytes);
    size_text(allreduce, sizeof allreduce, c->allreduce_bytes);
    char frozen[48] = "";
    if (c->frozen_units)
        snprintf(frozen, sizeof frozen, " and %d of the frozen block", c->frozen_units);
    if (c->units)
        printf("communication per rank and step: all-gather %s received (%d gathers of %d "
               "units%s; at most %s gathered at once), reduce-scatter %s sent (%d)%s%s%s\n",
               gather, c->gathers, c->units, frozen, window, scatter, c->scatters,
               c->allreduce_bytes ? ", all-reduce " : "", c->allreduce_bytes ? allreduce : "",
               c->allreduce_bytes ? " sent" : "");
    else
        printf("communication per rank and step: all-reduce %s sent\n", allreduce);
}

static void print_json(const plan_args *a, const regc_device_memory *mem, const regc_comm_plan *c,
                       const regc_compile_stats *st, const regc_fit_plan *r)
{
    const regc_train_options *o = &a->s->train;
    char *model = json_quote(a->s->model);
    printf("{\"model\": %s, \"ranks\": %lld, \"batch\": %lld, \"seq\": %lld, \"zero_stage\": "
           "%d, \"level\": \"%s\", \"precision\": \"%s\", \"compile_ms\": %.3f, "
           "\"fit_probes\": %d, \"fit_ms\": %.3f,\n",
           model ? model : "null", a->f.ranks, a->batch, a->seq, o->zero_stage,
           regc_level_name(o->compile.level), regc_precision_name(o->compile.precision),
           st->detect_ms + st->compile_ms + st->inline_ms + st->build_ms, st->fit_probes,
           st->fit_ms);
    free(model);
    printf(" \"memory\": {\"params\": %lld, \"grads\": %lld, \"m\": %lld, \"v\": %lld, "
           "\"frozen\": %lld, \"model_floats\": %lld, \"block_floats\": %lld, \"activations\": "
           "%lld, \"inputs\": "
           "%lld, \"scalars\": %lld, \"total\": %lld, \"host\": %lld, \"host_activations\": "
           "%lld},\n",
           (long long)mem->params, (long long)mem->grads, (long long)mem->m, (long long)mem->v,
           (long long)mem->frozen, (long long)mem->model_floats, (long long)mem->block_floats,
           (long long)mem->activations, (long long)mem->inputs, (long long)mem->scalars,
           (long long)mem->total, (long long)mem->host, (long long)mem->host_activations);
    printf(" \"communication\": {\"units\": %d, \"frozen_units\": %d, \"gathers\": %d, "
           "\"scatters\": %d, \"gather_bytes\": %lld, \"scatter_bytes\": %lld, "
           "\"allreduce_bytes\": %lld, \"window_bytes\": %lld},\n \"schedule\": {\"prefetch\": "
           "%lld, \"resident\": %d},\n",
           c->units, c->frozen_units, c->gathers, c->scatters, (long long)c->gather_bytes,
           (long long)c->scatter_bytes, (long long)c->allreduce_bytes, (long long)c->window_bytes,
           (long long)st->zero3_prefetch, st->zero3_resident);
    printf(" \"recompute\": {\"level\": \"%s\", \"replays\": %d, \"flop\": %.6g, \"step_flop\": "
           "%.6g, \"logits_chunks\": %lld, \"logits_chunk_rows\": %lld, \"offloaded\": %d, "
           "\"offload_bytes\": %lld}}\n",
           regc_recompute_name(o->compile.recompute), r->replays, r->replay_flop, r->step_flop,
           (long long)r->logits_chunks, (long long)r->logits_chunk_rows, r->offloaded,
           (long long)r->offload_bytes);
}

/* The step at a's batch and sequence compiled as regc train would compile
 * it at this rank count (train.c's compile options), with budget (bytes,
 * 0: none) in place of the settings' own. */
static int compile_plan(const plan_args *a, const regc_model *m, int64_t budget, int fit_check,
                        regc_program **p, regc_compile_stats *st)
{
    const regc_train_options *o = &a->s->train;
    regc_compile_options co = o->compile;
    co.ranks = (int)a->f.ranks, co.zero_stage = o->zero_stage;
    co.accumulate_grads = o->grad_accum > 1;
    co.budget_bytes = budget;
    co.device = o->backend && !strncmp(o->backend, "cuda", 4) ? "cuda" : NULL;
    co.cache = NULL, co.dump_dir = NULL;
    co.fit_check = fit_check;
    *p = NULL;
    return regc_program_compile(m, a->batch, a->seq, &co, p, st);
}

/* Does the step at size (a's seq or batch) fit the budget? 1 yes, 0 no
 * (a budget error), or another error; *least what the step holds at its
 * least (-1: not known). The compile only answers whether (fit_check):
 * the plan of the size found is compiled in full. */
static int fits_at(plan_args *a, const regc_model *m, long long size, int64_t budget,
                   int64_t *least)
{
    *(strcmp(a->f.fit, "seq") ? &a->batch : &a->seq) = size;
    regc_program *p = NULL;
    regc_compile_stats st;
    int rc = compile_plan(a, m, budget, 1, &p, &st);
    int fit = rc == REGC_OK;
    *least = rc == REGC_OK || rc == REGC_ERR_BUDGET ? st.fit_least : -1;
    if (fit && p) { /* no search (recompute not auto): the program itself, against the
                       least budget (a pass may have its own) */
        regc_compile_options co = a->s->train.compile;
        co.budget_bytes = budget;
        regc_device_memory mem;
        regc_program_device_memory(p, &mem);
        fit = mem.total <= regc_compile_least_budget(&co), *least = mem.total;
    }
    regc_program_free(p);
    return rc == REGC_OK || rc == REGC_ERR_BUDGET ? fit : rc;
}

/* The largest size at which the line through (x0, y0) and (x1, y1) stays
 * within budget; -1 when a point is unknown or the line does not rise. */
static long long line_size(long long x0, int64_t y0, long long x1, int64_t y1, int64_t budget)
{
    if (x0 < 1 || y0 < 0 || y1 < 0 || x1 <= x0 || y1 <= y0)
        return -1;
    const double x = (double)x0 + (double)(budget - y0) * (double)(x1 - x0) / (double)(y1 - y0);
    return x < 1.0 ? 1 : x > 1e15 ? (long long)1e15 : (long long)x;
}

/* --fit: the largest size that fits, a's size left at it. The least a
 * step holds grows with its size nearly along a line (the activations
 * with the tokens, the logits' chunks fixed), so each size tried is where
 * the line through two sizes already tried meets the budget: beyond the
 * largest known to fit (each step at least twice the one before, at most
 * to 64 times it), then within the bracket, one above the line's answer
 * after a size that fit and at it after one that did not, so that a
 * straight line is settled by two compiles. Two sizes that do not halve
 * the bracket are followed by a bisection, so it halves at least every
 * three sizes. Only whether each size fits decides; the line only chooses
 * the next size. A size the model refuses (its positions) counts as one
 * that does not fit, and the line printed says why. */
static int fit_size(plan_args *a, const regc_model *m, int64_t budget)
{
    const char *what = a->f.fit;
    const double t0 = regc_time_ms();
    regc_compile_options co = a->s->train.compile;
    co.budget_bytes = budget;
    const int64_t target = regc_compile_least_budget(&co); /* a pass may ask for less */
    int64_t l_lo = -1, l_hi = -1, l_prev = -1, l;
    int rc = fits_at(a, m, 1, budget, &l_lo);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        char least[64] = "";
        regc_program *p = NULL;
        regc_compile_stats st;
        if (compile_plan(a, m, 0, 0, &p, &st) == REGC_OK) { /* nothing to fit: its most */
            regc_device_memory mem;
            regc_program_device_memory(p, &mem);
            snprintf(least, sizeof least, " (without a budget it holds %.1f MiB)",
                     (double)mem.total / (1 << 20));
        }
        regc_program_free(p);
        fits_at(a, m, 1, budget, &l); /* the budget's own message, naming the least */
        return regc_error(REGC_ERR_BUDGET,
                          "regc plan --fit %s: even %s 1 does not fit %lld MiB per rank: %s%s",
                          what, what, a->f.device_mb, regc_error_message(), least);
    }
    /* lo fits, prev is the size that fit before it (-1: none); hi does not
     * (-1: none known yet); width the bracket's width when last checked,
     * since the sizes tried in it since; last the side the last size fell on */
    long long lo = 1, hi = -1, prev = -1, width = 0;
    int since = 0, last = 0, tried = 1;
    char stop[300] = "";
    while (hi < 0 || hi - lo > 1) {
        long long t;
        if (hi < 0) { /* each step at least twice the last, at most to 64 times lo */
            const long long p = line_size(prev, l_prev, lo, l_lo, target);
            const long long step = prev > 0 ? 2 * (lo - prev) : lo;
            t = p > lo ? p + 1 : lo + step;
            t = t < lo + step ? lo + step : t > 64 * lo ? 64 * lo : t;
        } else {
            int halve = 0; /* two sizes that did not halve the bracket: bisect */
            if (since == 2)
                halve = hi - lo > width / 2, width = hi - lo, since = 0;
            const long long p = halve ? -1 : line_size(lo, l_lo, hi, l_hi, target);
            t = p < 0 ? lo + (hi - lo) / 2 : last > 0 ? p + 1 : p;
            t = t <= lo ? lo + 1 : t >= hi ? hi - 1 : t;
            since++;
        }
        rc = fits_at(a, m, t, budget, &l);
        tried++;
        last = rc > 0 ? 1 : -1;
        if (rc > 0) {
            prev = lo, l_prev = l_lo, lo = t, l_lo = l;
        } else {
            if (hi < 0) /* the bracket found */
                width = t - lo, since = 0;
            hi = t, l_hi = rc < 0 ? -1 : l;
            if (rc < 0) /* beyond what the model takes, or another refusal: said */
                snprintf(stop, sizeof stop, "; %s %lld: %s", what, t, regc_error_message());
            else
                stop[0] = 0;
        }
    }
    *(strcmp(what, "seq") ? &a->batch : &a->seq) = lo;
    char host[64] = "";
    if (a->s->train.compile.host_budget_bytes > 0)
        snprintf(host, sizeof host, " and %lld MiB of host memory",
                 (long long)(a->s->train.compile.host_budget_bytes >> 20));
    printf("regc plan --fit %s: %s %lld is the most that fits %lld MiB per rank%s (%lld does "
           "not%s); %d sizes tried in %.0f ms\n",
           what, what, lo, a->f.device_mb, host, hi, stop, tried, regc_time_ms() - t0);
    regc_error_clear();
    return REGC_OK;
}

/* The model the settings name, as the run would train it (dropout, LoRA). */
static int plan_model(const regc_train_settings *s, regc_model **out)
{
    *out = NULL;
    regc_model *m = NULL;
    int rc = regc_model_load_shapes(s->model, &m);
    if (rc == REGC_OK)
        rc = cli_apply_model_settings(s, m);
    if (rc)
        regc_model_free(m);
    else
        *out = m;
    return rc;
}

/* The plan of the settings' step (with --fit, first the size that fits). */
static int plan_command(plan_args *a)
{
    regc_model *m = NULL;
    int rc = plan_model(a->s, &m);
    const int64_t budget =
        a->f.fit ? (int64_t)a->f.device_mb << 20 : a->s->train.compile.budget_bytes;
    regc_program *p = NULL;
    regc_compile_stats st;
    if (rc == REGC_OK && a->f.fit)
        rc = fit_size(a, m, budget);
    if (rc == REGC_OK)
        rc = compile_plan(a, m, budget, 0, &p, &st);
    if (rc == REGC_OK) {
        regc_device_memory mem;
        regc_comm_plan c;
        regc_fit_plan r;
        regc_program_device_memory(p, &mem);
        regc_program_comm_plan(p, &c);
        regc_program_fit_plan(p, &r);
        if (a->s->json)
            print_json(a, &mem, &c, &st, &r);
        else
            print_text(a, &mem, &c, &st, &r);
    }
    regc_program_free(p);
    regc_model_free(m);
    return rc;
}

int cmd_plan(int argc, char **argv)
{
    usage_cmd = "regc plan";
    plan_flags f = {0};
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int n_rest = 0, help = 0, usage = 0;
    if (!rest)
        return exit_code(regc_error(REGC_ERR_MEMORY, "out of memory"));
    usage = split_plan_flags(argc, argv, &f, rest, &n_rest, &help);
    cli_settings c;
    regc_train_settings_default(&c.s);
    /* from flags alone, the plan of a sharded run unless told; a config
     * file's plan is its run's, whose stage is 0 unless the file says */
    if (!given(n_rest, rest, "--config") && !given(n_rest, rest, "--deepspeed"))
        c.s.train.zero_stage = 3;
    c.s.train.cache_dir = NULL;
    c.from = NULL, c.cfg = c.ds = NULL;
    int rc = REGC_OK;
    if (!usage && !help)
        rc = cli_read_settings(n_rest, rest, &c, &help, &usage);
    free(rest);
    if (!usage && !help && rc == REGC_OK) {
        if (!c.s.model)
            usage = usage_error("--model is required (see regc plan --help), unless the "
                                "--config file sets train.model");
        else if (!f.ranks)
            usage = usage_error("--ranks is required (see regc plan --help)");
        else if ((f.fit != NULL) != (f.device_mb > 0))
            usage = usage_error("--fit and --device-memory-mb go together (see regc plan --help)");
        else if (f.fit && c.s.train.compile.budget_bytes > 0)
            usage = usage_error("--fit fills --device-memory-mb; --memory-budget-mb is for one "
                                "plan");
    }
    if (help)
        print_plan_usage(stdout);
    if (usage || help) {
        cli_settings_free(&c);
        return usage;
    }
    /* the step count is the run's business: epochs would read the data */
    if (c.s.train.num_train_epochs > 0.0)
        c.s.train.num_train_epochs = 0.0, c.s.train.steps = INT32_MAX;
    if (rc == REGC_OK)
        rc = regc_settings_resolve(&c.s, c.from, (int)f.ranks, NULL);
    if (rc == REGC_OK)
        rc = regc_train_check_options(&c.s.train);
    plan_args a = {.s = &c.s, .f = f, .batch = c.s.train.batch, .seq = c.s.train.seq};
    if (rc == REGC_OK)
        rc = plan_command(&a);
    cli_settings_free(&c);
    return exit_code(rc);
}
