/* cmd_plan.c — `regc plan`: a run's device memory and communication per
 * rank for N ranks, from shapes alone (a dry run: no weights, no devices,
 * no MPI). The step is compiled for N ranks exactly as `mpirun -np N regc
 * train` compiles it, and the memory is the program's own account of what
 * the trainer allocates for it. */
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
          "\n"
          "Compile a training step for N ranks from shapes alone and print, per rank, the\n"
          "device memory the run would hold (parameter, gradient and AdamW shards, the\n"
          "activation plan's peak with the gathered parameters in it, inputs) and the\n"
          "communication of one step. No weights are read, no devices or MPI are needed.\n"
          "\n"
          "options:\n"
          "  --model <dir|file|preset>  Hugging Face directory (only config.json is read), a\n"
          "                             regc graph JSON file, or a built-in preset\n"
          "  --ranks <N>                processes, >= 1 (required)\n"
          "  --batch <B>                sequences per rank, >= 1 (default 4)\n"
          "  --seq <T>                  tokens per sequence, >= 1 (default 64)\n"
          "  --zero-stage <0|3>         ZeRO stage (default 3)\n"
          "  --level <O0|O1|O2>         compile level (default O1)\n"
          "  --precision <fp32|bf16>    compile.precision (default fp32); bf16 holds the\n"
          "                             saved activations autocast keeps in bf16 and what\n"
          "                             only bf16 GEMMs read in bf16, and gathers those\n"
          "                             parameters in bf16 at stage 3\n"
          "  --fp32-storage <on|off>    under bf16, hold and gather every tensor in fp32\n"
          "                             (default off)\n"
          "  --prefetch-bucket-size <E> stage 3: parameters gathered ahead (default one unit)\n"
          "  --param-persistence-threshold <E>\n"
          "                             stage 3: units of at most E parameters stay gathered\n"
          "                             from forward to backward (default 0: none)\n"
          "  --max-live-parameters <E>  stage 3: at most E parameters gathered at once by\n"
          "                             the gathers ahead (default 0: no limit)\n"
          "  --reduce-bucket-size <E>   gradient elements reduced at a time (stage 0: the\n"
          "                             all-reduce buckets, default 25 MiB; stage 3: the\n"
          "                             reduce-scatters in flight)\n"
          "  --passes <PASS[@MB],...>   the schedule passes, in order (default\n"
          "                             prefetch,overlap_reduce,selective_gather; none)\n"
          "  --offload-optimizer <cpu|none>\n"
          "                             AdamW's state and update on the host (default none)\n"
          "  --budget-mb <MiB>          device memory per rank in MiB; the compiler makes\n"
          "                             the step fit (compile.memory_budget_mb): the least\n"
          "                             recomputation that does, and at stage 3 the prefetch\n"
          "                             and the resident units\n"
          "  --recompute <none|selective|full|auto>\n"
          "                             saved activations computed again in the backward\n"
          "                             (default auto: as little as the budget needs)\n"
          "  --logits-chunk-rows <ROWS> the head and its loss in chunks of this many rows\n"
          "                             (default 0: whole, unless a budget chunks them)\n"
          "  --offload-activation <on|off>\n"
          "                             saved activations to the host and back (default off)\n"
          "  --backend <cpu|cuda>       the device the plan is for: on cuda the copies of\n"
          "                             offloaded activations are placed where compute hides\n"
          "                             them (default cpu; no device is needed)\n"
          "  --fit <seq|batch>          find the longest sequence (largest batch) whose step\n"
          "                             fits --device-memory-mb per rank, and print its plan\n"
          "  --device-memory-mb <MiB>   the device memory --fit fills (its budget)\n"
          "  --host-memory-mb <MiB>     host memory per rank the offloaded optimizer state\n"
          "                             and activations may take (default: no limit)\n"
          "  --gradient-accumulation-steps <K>\n"
          "                             micro-batches per step (default 1)\n"
          "  --lora-r <R>               LoRA adapters of rank R, the rest frozen (as regc\n"
          "                             train --lora-r): no gradients or moments for the base\n"
          "  --lora-target-modules <NAME,...|all-linear>\n"
          "                             the layers adapted (default: the architecture's)\n"
          "  --base-dtype <fp32|bf16>   the frozen base's linear weights held in bf16\n"
          "  --load-in-4bit <on|off>    QLoRA: the linear layers in NF4 (as regc train)\n"
          "  --json                     one JSON object instead of text\n"
          "  -h, --help                 print this text\n",
          f);
}

typedef struct {
    const char *model;
    long long ranks, batch, seq, stage, prefetch, accum, budget_mb, persistence, max_live;
    long long reduce_bucket, chunk_rows;
    int level, json, offload, precision, fp32_storage, recompute, offload_activation, cuda;
    const char *fit; /* "seq", "batch" or NULL */
    long long lora_r;
    const char *lora_targets;
    int base_dtype;   /* regc_base_dtype */
    int load_in_4bit; /* the linear layers in NF4 */
    long long device_mb, host_mb;
    regc_pass_list passes;
    int passes_given;
} plan_args;

static int parse_plan_args(int argc, char **argv, plan_args *a, int *help)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            *help = 1;
            return 0;
        }
        if (!strcmp(arg, "--json")) {
            a->json = 1;
            continue;
        }
        char flag[64];
        const char *value = split_flag(argc, argv, i, flag, sizeof flag);
        if (strncmp(arg, "--", 2) != 0)
            return usage_error("unexpected argument \"%s\" (see regc plan --help)", arg);
        if (!value)
            return usage_error("%s needs a value (see regc plan --help)", flag);
        if (!strchr(arg, '='))
            i++;
        int rc = 0;
        if (!strcmp(flag, "--model"))
            a->model = value;
        else if (!strcmp(flag, "--ranks"))
            rc = parse_int(flag, value, 1, 1 << 20, "a positive integer", &a->ranks);
        else if (!strcmp(flag, "--batch"))
            rc = parse_int(flag, value, 1, INT32_MAX, "a positive integer", &a->batch);
        else if (!strcmp(flag, "--seq"))
            rc = parse_int(flag, value, 1, INT32_MAX, "a positive integer", &a->seq);
        else if (!strcmp(flag, "--zero-stage")) {
            rc = parse_int(flag, value, 0, 3, "0 or 3", &a->stage);
            if (!rc && a->stage != 0 && a->stage != 3)
                return usage_error("--zero-stage: %lld is not built (0 or 3)", a->stage);
        } else if (!strcmp(flag, "--prefetch-bucket-size"))
            rc = parse_int(flag, value, 0, INT64_MAX, "a non-negative integer", &a->prefetch);
        else if (!strcmp(flag, "--param-persistence-threshold"))
            rc = parse_int(flag, value, 0, INT64_MAX, "a non-negative integer", &a->persistence);
        else if (!strcmp(flag, "--max-live-parameters"))
            rc = parse_int(flag, value, 0, INT64_MAX, "a non-negative integer", &a->max_live);
        else if (!strcmp(flag, "--passes")) {
            char why[160];
            if (regc_passes_from_text(value, &a->passes, why, sizeof why))
                return usage_error("--passes: %s, got \"%s\"", why, value);
            a->passes_given = 1;
        } else if (!strcmp(flag, "--reduce-bucket-size"))
            rc = parse_int(flag, value, 1, INT64_MAX, "a positive integer", &a->reduce_bucket);
        else if (!strcmp(flag, "--offload-optimizer")) {
            if (strcmp(value, "cpu") && strcmp(value, "none"))
                return usage_error("--offload-optimizer: expected cpu or none, got \"%s\"", value);
            a->offload = !strcmp(value, "cpu");
        } else if (!strcmp(flag, "--recompute")) {
            if ((a->recompute = regc_recompute_from_name(value)) < 0)
                return usage_error("--recompute: expected none, selective, full or auto, got "
                                   "\"%s\"",
                                   value);
        } else if (!strcmp(flag, "--offload-activation")) {
            if (strcmp(value, "on") && strcmp(value, "off"))
                return usage_error("--offload-activation: expected on or off, got \"%s\"", value);
            a->offload_activation = !strcmp(value, "on");
        } else if (!strcmp(flag, "--logits-chunk-rows")) {
            rc = parse_int(flag, value, 0, INT64_C(1) << 40, "an integer >= 0", &a->chunk_rows);
        } else if (!strcmp(flag, "--backend")) {
            if (strcmp(value, "cpu") && strcmp(value, "cuda"))
                return usage_error("--backend: expected cpu or cuda, got \"%s\"", value);
            a->cuda = !strcmp(value, "cuda");
        } else if (!strcmp(flag, "--fit")) {
            if (strcmp(value, "seq") && strcmp(value, "batch"))
                return usage_error("--fit: expected seq or batch, got \"%s\"", value);
            a->fit = !strcmp(value, "seq") ? "seq" : "batch";
        } else if (!strcmp(flag, "--lora-r"))
            rc = parse_int(flag, value, 1, 65536, "an integer from 1 to 65536", &a->lora_r);
        else if (!strcmp(flag, "--lora-target-modules"))
            a->lora_targets = value;
        else if (!strcmp(flag, "--base-dtype")) {
            if (strcmp(value, "fp32") && strcmp(value, "bf16"))
                return usage_error("--base-dtype: expected fp32 or bf16, got \"%s\"", value);
            a->base_dtype = !strcmp(value, "bf16") ? REGC_BASE_BF16 : REGC_BASE_FP32;
        } else if (!strcmp(flag, "--load-in-4bit")) {
            if (strcmp(value, "on") && strcmp(value, "off"))
                return usage_error("--load-in-4bit: expected on or off, got \"%s\"", value);
            a->load_in_4bit = !strcmp(value, "on");
        } else if (!strcmp(flag, "--device-memory-mb"))
            rc = parse_int(flag, value, 1, INT64_C(1) << 30, "a positive integer", &a->device_mb);
        else if (!strcmp(flag, "--host-memory-mb"))
            rc = parse_int(flag, value, 1, INT64_C(1) << 30, "a positive integer", &a->host_mb);
        else if (!strcmp(flag, "--budget-mb"))
            rc = parse_int(flag, value, 1, INT64_C(1) << 30, "a positive integer", &a->budget_mb);
        else if (!strcmp(flag, "--gradient-accumulation-steps"))
            rc = parse_int(flag, value, 1, INT32_MAX, "a positive integer", &a->accum);
        else if (!strcmp(flag, "--level")) {
            if ((a->level = regc_level_from_name(value)) < 0)
                return usage_error("--level: expected O0, O1 or O2, got \"%s\"", value);
        } else if (!strcmp(flag, "--fp32-storage")) {
            if (strcmp(value, "on") && strcmp(value, "off"))
                return usage_error("--fp32-storage: expected on or off, got \"%s\"", value);
            a->fp32_storage = !strcmp(value, "on");
        } else if (!strcmp(flag, "--precision")) {
            if ((a->precision = regc_precision_from_name(value)) < 0)
                return usage_error("--precision: expected fp32 or bf16, got \"%s\"", value);
        } else
            return usage_error("unknown option %s (see regc plan --help)", flag);
        if (rc)
            return rc;
    }
    if (!a->model)
        return usage_error("--model is required (see regc plan --help)");
    if (!a->ranks)
        return usage_error("--ranks is required (see regc plan --help)");
    if ((a->fit != NULL) != (a->device_mb > 0))
        return usage_error("--fit and --device-memory-mb go together (see regc plan --help)");
    if (a->fit && a->budget_mb)
        return usage_error("--fit fills --device-memory-mb; --budget-mb is for one plan");
    if ((a->lora_targets || a->base_dtype || a->load_in_4bit) && !a->lora_r)
        return usage_error("%s needs --lora-r", a->lora_targets ? "--lora-target-modules"
                                                : a->base_dtype ? "--base-dtype bf16"
                                                                : "--load-in-4bit on");
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
               regc_recompute_name((regc_recompute)a->recompute));
        return;
    }
    printf("recompute: %s, %d instructions run again in the backward (%s): %.3g GFLOP a step, "
           "%.1f%% of its FLOPs\n",
           regc_recompute_name((regc_recompute)a->recompute), r->replays, r->kernels,
           r->replay_flop / 1e9, 100.0 * r->replay_flop / (r->step_flop > 0 ? r->step_flop : 1));
}

static void print_text(const plan_args *a, const regc_device_memory *mem, const regc_comm_plan *c,
                       const regc_compile_stats *st, const regc_fit_plan *r)
{
    printf("%s, %lld ranks x batch %lld x seq %lld, ZeRO stage %lld, %s, %s: compiled in %.1f ms\n",
           a->model, a->ranks, a->batch, a->seq, a->stage, regc_level_name((regc_level)a->level),
           regc_precision_name((regc_precision)a->precision),
           st->detect_ms + st->compile_ms + st->inline_ms + st->build_ms);
    if (st->fit_probes)
        printf("memory budget: %d compiles tried to choose what fits, in %.1f ms\n", st->fit_probes,
               st->fit_ms);
    if (st->zero3_units)
        print_zero3_schedule(stdout, st);
    print_device_memory(stdout, mem, (int)a->ranks);
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
    char *model = json_quote(a->model);
    printf("{\"model\": %s, \"ranks\": %lld, \"batch\": %lld, \"seq\": %lld, \"zero_stage\": "
           "%lld, \"level\": \"%s\", \"precision\": \"%s\", \"compile_ms\": %.3f, "
           "\"fit_probes\": %d, \"fit_ms\": %.3f,\n",
           model ? model : "null", a->ranks, a->batch, a->seq, a->stage,
           regc_level_name((regc_level)a->level), regc_precision_name((regc_precision)a->precision),
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
           regc_recompute_name((regc_recompute)a->recompute), r->replays, r->replay_flop,
           r->step_flop, (long long)r->logits_chunks, (long long)r->logits_chunk_rows, r->offloaded,
           (long long)r->offload_bytes);
}

/* The step at a's batch and sequence compiled as regc train would compile
 * it at this rank count, with budget (bytes, 0: none). */
static int compile_plan(const plan_args *a, const regc_model *m, int64_t budget, regc_program **p,
                        regc_compile_stats *st)
{
    regc_compile_options co;
    regc_compile_options_default(&co);
    co.level = (regc_level)a->level;
    co.precision = (regc_precision)a->precision;
    co.fp32_storage = a->fp32_storage;
    co.recompute = (regc_recompute)a->recompute;
    co.ranks = (int)a->ranks, co.zero_stage = (int)a->stage, co.prefetch_floats = a->prefetch;
    co.accumulate_grads = a->accum > 1;
    co.budget_bytes = budget;
    co.host_budget_bytes = (int64_t)a->host_mb << 20;
    co.persistence_floats = a->persistence, co.max_live_floats = a->max_live;
    co.reduce_bucket_floats = a->reduce_bucket;
    co.offload_optimizer = a->offload;
    co.offload_activation = a->offload_activation;
    co.logits_chunk_rows = a->chunk_rows;
    co.device = a->cuda ? "cuda" : NULL;
    if (a->passes_given)
        co.passes = a->passes;
    *p = NULL;
    return regc_program_compile(m, a->batch, a->seq, &co, p, st);
}

/* Does the step at *size (a's seq or batch) fit the budget? 1 yes, 0 no
 * (a budget error), or another error. */
static int fits_at(plan_args *a, const regc_model *m, long long size, int64_t budget)
{
    *(strcmp(a->fit, "seq") ? &a->batch : &a->seq) = size;
    regc_program *p = NULL;
    regc_compile_stats st;
    int rc = compile_plan(a, m, budget, &p, &st);
    int fit = rc == REGC_OK;
    if (fit) {
        regc_device_memory mem;
        regc_program_device_memory(p, &mem);
        fit = mem.total <= budget;
    }
    regc_program_free(p);
    return rc == REGC_OK || rc == REGC_ERR_BUDGET ? fit : rc;
}

/* --fit: the largest size that fits, by doubling then bisecting; a size
 * the model cannot take (its positions) ends the doubling. a's size is
 * left at the answer. */
static int fit_size(plan_args *a, const regc_model *m, int64_t budget)
{
    const char *what = a->fit;
    int rc = fits_at(a, m, 1, budget);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        char least[64] = "";
        regc_program *p = NULL;
        regc_compile_stats st;
        if (compile_plan(a, m, 0, &p, &st) == REGC_OK) { /* nothing to fit: its most */
            regc_device_memory mem;
            regc_program_device_memory(p, &mem);
            snprintf(least, sizeof least, " (without a budget it holds %.1f MiB)",
                     (double)mem.total / (1 << 20));
        }
        regc_program_free(p);
        fits_at(a, m, 1, budget); /* the budget's own message, naming the least */
        return regc_error(REGC_ERR_BUDGET,
                          "regc plan --fit %s: even %s 1 does not fit %lld MiB per rank: %s%s",
                          what, what, a->device_mb, regc_error_message(), least);
    }
    long long lo = 1, hi = -1; /* lo fits; hi does not, or -1: unknown */
    char stop[300] = "";
    while (hi < 0) {
        const long long next = lo * 2;
        rc = fits_at(a, m, next, budget);
        if (rc < 0) { /* beyond what the model takes */
            snprintf(stop, sizeof stop, "; %s %lld: %s", what, next, regc_error_message());
            hi = next;
        } else if (rc) {
            lo = next;
        } else {
            hi = next;
        }
    }
    while (hi - lo > 1) {
        const long long mid = lo + (hi - lo) / 2;
        rc = fits_at(a, m, mid, budget);
        if (rc > 0)
            lo = mid;
        else
            hi = mid;
    }
    *(strcmp(what, "seq") ? &a->batch : &a->seq) = lo;
    char host[64] = "";
    if (a->host_mb)
        snprintf(host, sizeof host, " and %lld MiB of host memory", a->host_mb);
    printf("regc plan --fit %s: %s %lld is the most that fits %lld MiB per rank%s (%lld does "
           "not%s)\n",
           what, what, lo, a->device_mb, host, hi, stop);
    regc_error_clear();
    return REGC_OK;
}

int cmd_plan(int argc, char **argv)
{
    usage_cmd = "regc plan";
    plan_args a = {.batch = 4,
                   .seq = 64,
                   .stage = 3,
                   .prefetch = -1,
                   .accum = 1,
                   .level = REGC_LEVEL_O1,
                   .recompute = REGC_RECOMPUTE_AUTO};
    int help = 0, rc = parse_plan_args(argc, argv, &a, &help);
    if (help) {
        print_plan_usage(stdout);
        return 0;
    }
    if (rc)
        return rc;
    regc_model *m = NULL;
    if ((rc = regc_model_load_shapes(a.model, &m)) != REGC_OK)
        return exit_code(rc);
    if ((rc = regc_model_check_nf4_trainable(m, a.lora_r > 0)) != REGC_OK) {
        regc_model_free(m);
        return exit_code(rc);
    }
    if (a.lora_r) {
        regc_lora_config c = {.r = a.lora_r,
                              .target_modules = a.lora_targets,
                              .base_dtype = a.base_dtype,
                              .load_in_4bit = a.load_in_4bit};
        if ((rc = regc_model_add_lora(m, &c)) != REGC_OK) {
            regc_model_free(m);
            return exit_code(rc);
        }
    }
    const int64_t budget = (int64_t)(a.fit ? a.device_mb : a.budget_mb) << 20;
    regc_program *p = NULL;
    regc_compile_stats st;
    if (a.fit)
        rc = fit_size(&a, m, budget);
    if (rc == REGC_OK)
        rc = compile_plan(&a, m, budget, &p, &st);
    if (rc == REGC_OK) {
        regc_device_memory mem;
        regc_comm_plan c;
        regc_fit_plan r;
        regc_program_device_memory(p, &mem);
        regc_program_comm_plan(p, &c);
        regc_program_fit_plan(p, &r);
        if (a.json)
            print_json(&a, &mem, &c, &st, &r);
        else
            print_text(&a, &mem, &c, &st, &r);
    }
    regc_program_free(p);
    regc_model_free(m);
    return exit_code(rc);
}
