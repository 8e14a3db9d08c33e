/* cmd_train.c — `regc train`: flags and the config file into training
 * options, one line per step out. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "regc_train.h"

void print_train_usage(FILE *f)
{
    regc_train_options d;
    regc_train_options_default(&d);
    fprintf(f,
            "usage: regc train --model <hf-dir|graph.json|preset> [options]\n"
            "       regc train --config <FILE> [options]\n"
            "\n"
            "Train a model for a number of steps with AdamW, printing one line per step.\n"
            "\n"
            "options:\n"
            "  --config <FILE>        JSON config file {\"compile\": {...}, \"train\": {...}} whose\n"
            "                         keys mirror these flags (train.model, train.steps, ...,\n"
            "                         compile.level, ...); unknown keys are errors. Every flag\n"
            "                         given on the command line overrides the file, wherever\n"
            "                         it appears; --model is not needed when the file sets it\n"
            "  --model <dir|file|preset>\n"
            "                         Hugging Face model directory (config.json + safetensors),\n"
            "                         a regc graph JSON file (see regc dump-graph; it trains only\n"
            "                         at the batch and sequence it was built for, initialised at\n"
            "                         random from --seed unless --weights is given), or a\n"
            "                         built-in preset, initialised at random from --seed:\n"
            "                        ");
    for (const char *const *p = regc_model_preset_names(); p && *p; p++)
        fprintf(f, " %s", *p);
    fprintf(f,
            "\n"
            "  --weights <FILE>       safetensors file with the weights of a graph JSON model,\n"
            "                         matched by the graph's parameter names (graph models only)\n"
            "  --data <tokens.bin>    token file in the llm.c format (default: the built-in corpus)\n"
            "  --steps <N>            optimizer steps, >= 1 (default %d)\n"
            "  --batch <B>            sequences per step, >= 1 (default %lld)\n"
            "  --seq <T>              tokens per sequence, >= 1 (default %lld)\n"
            "  --lr <LR>              AdamW learning rate, > 0 (default %g)\n"
            "  --weight-decay <WD>    AdamW decoupled weight decay, >= 0 (default %g)\n"
            "  --seed <S>             seed of the random init of presets and of the masked\n"
            "                         positions of masked-LM (BERT) training (default %llu)\n"
            "  --threads <N>          CPU threads; 0 uses OMP_NUM_THREADS or all cores (default 0)\n"
            "  --backend <name>       compute backend: cpu, or cuda where built (default %s)\n"
            "  --json                 print one JSON object per step instead of a table:\n"
            "                         {\"step\": k, \"loss\": L, \"ms\": t, \"tokens_per_s\": r}\n"
            "  --save <DIR>           after training, write config.json and model.safetensors to DIR\n"
            "                         (graph models: graph.json and model.safetensors)\n"
            "  --profile              time every instruction of the steps after the first and,\n"
            "                         after training, print on stderr where a step's time goes:\n"
            "                         per kernel and GEMM shape, ms per step and GFLOP/s\n"
            "\n"
            "compile options (the config file's \"compile\" keys):\n"
            "  --level <O0|O1|O2>     O0 op by op; O1 fused with a static memory plan; O2 adds\n"
            "                         whole-step capture (on the CPU the same as O1) (default %s)\n"
            "  --regional <on|off>    compile each distinct layer once and reuse it for every\n"
            "                         repeat (use_regional_compilation) (default %s)\n"
            "  --inline-back <on|off> stamp the compiled regions into one flat step program;\n"
            "                         off runs them as calls, the reference (default %s)\n"
            "  --dump-graphs <DIR>    write the compiler's intermediate graphs to DIR (compiles\n"
            "                         afresh: the cache is not read)\n"
            "  --cache-dir <DIR>      compile cache directory (compile.cache_dir; default\n"
            "                         $XDG_CACHE_HOME/regc, else ~/.cache/regc); a step compiled\n"
            "                         before loads in milliseconds, and layers compiled before\n"
            "                         load instead of compiling; compile.cache_max_mb limits its\n"
            "                         size (default 1024), least recently used entries going first\n"
            "  --no-cache             neither read nor write the compile cache\n"
            "\n"
            "  -h, --help             print this text\n",
            d.steps, (long long)d.batch, (long long)d.seq, (double)d.lr, (double)d.weight_decay,
            (unsigned long long)d.seed, d.backend ? d.backend : "cpu",
            regc_level_name(d.compile.level), d.compile.regional ? "on" : "off",
            d.compile.inline_back ? "on" : "off");
}

/* ---- per-step output */

typedef struct {
    int json;
    int step_width; /* digits of the last step, so the columns line up */
    int write_failed;
    const char *cache_dir;
} step_printer;

/* With a cache: what it gave, on stderr before the first step. */
static void on_compiled(const regc_compile_stats *st, void *user)
{
    const step_printer *p = user;
    if (p->cache_dir)
        fprintf(stderr, "compile cache %s: %d hit%s, %d miss%s (%.1f ms)\n", p->cache_dir,
                st->cache_hits, st->cache_hits == 1 ? "" : "s", st->cache_misses,
                st->cache_misses == 1 ? "" : "es", st->cache_ms);
}

static void on_step(const regc_step_report *r, void *user)
{
    step_printer *p = user;
    int n;
    if (p->json) {
        char loss[48], ms[48], tps[48];
        /* %.9g round-trips any float, so a reader recovers the exact loss. */
        json_number(loss, sizeof loss, "%.9g", (double)r->loss);
        json_number(ms, sizeof ms, "%.6g", r->ms);
        json_number(tps, sizeof tps, "%.6g", r->tokens_per_s);
        n = printf("{\"step\": %d, \"loss\": %s, \"ms\": %s, \"tokens_per_s\": %s}\n", r->step,
                   loss, ms, tps);
    } else {
        n = printf("step %*d | loss %7.4f | %8.1f ms | %8.0f tok/s\n", p->step_width, r->step,
                   (double)r->loss, r->ms, r->tokens_per_s);
    }
    /* Flushed per step: the lines are progress, and a reader on a pipe
     * (a log collector, a test) should see each one as it happens. */
    if (n < 0 || fflush(stdout) != 0)
        p->write_failed = 1;
}

/* What the command line of `regc train` says, beyond the options. */
typedef struct {
    const char *model_spec, *weights_path, *config_path;
    int json, help, no_cache, profile;
} train_args;

/* Parse argv into o and a. It runs twice: once to find --config and catch
 * usage errors before anything is loaded, then over the options the config
 * file set, so every flag given overrides the file whatever its position.
 * Returns 0, or the usage exit code (the message already printed). */
static int parse_train_args(int argc, char **argv, regc_train_options *o, train_args *a)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            a->help = 1;
            return 0;
        }
        if (!strcmp(arg, "--json")) {
            a->json = 1;
            continue;
        }
        if (!strcmp(arg, "--no-cache")) {
            a->no_cache = 1;
            continue;
        }
        if (!strcmp(arg, "--profile")) {
            a->profile = 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0)
            return usage_error("unexpected argument \"%s\" (options start with --; see "
                               "regc train --help)",
                               arg);

        /* Every other flag takes a value, given as "--flag value" or
         * "--flag=value". */
        char flag[64];
        const char *value = split_flag(argc, argv, i, flag, sizeof flag);

        static const char *const valued[] = {
            "--model", "--data", "--steps", "--batch", "--seq", "--lr", "--weight-decay",
            "--seed", "--threads", "--backend", "--save", "--weights", "--config", "--level",
            "--regional", "--inline-back", "--dump-graphs", "--cache-dir", NULL};
        int known = 0;
        for (const char *const *k = valued; *k; k++)
            if (!strcmp(flag, *k))
                known = 1;
        if (!known) {
            if (!strcmp(flag, "--json") || !strcmp(flag, "--help") || !strcmp(flag, "--no-cache") ||
                !strcmp(flag, "--profile"))
                return usage_error("%s takes no value", flag);
            return usage_error("unknown option %s (see regc train --help)", flag);
        }
        if (!value)
            return usage_error("%s: missing value", flag);
        if (!strchr(arg, '=')) /* the value was the next argument */
            i++;

        long long v;
        if (!strcmp(flag, "--model") || !strcmp(flag, "--data") || !strcmp(flag, "--save") ||
            !strcmp(flag, "--backend") || !strcmp(flag, "--weights") ||
            !strcmp(flag, "--config") || !strcmp(flag, "--dump-graphs") ||
            !strcmp(flag, "--cache-dir")) {
            if (value[0] == '\0')
                return usage_error("%s: expected a non-empty value", flag);
            if (!strcmp(flag, "--model"))
                a->model_spec = value;
            else if (!strcmp(flag, "--weights"))
                a->weights_path = value;
            else if (!strcmp(flag, "--config"))
                a->config_path = value;
            else if (!strcmp(flag, "--data"))
                o->data_path = value;
            else if (!strcmp(flag, "--save"))
                o->save_dir = value;
            else if (!strcmp(flag, "--dump-graphs"))
                o->compile.dump_dir = value;
            else if (!strcmp(flag, "--cache-dir"))
                o->cache_dir = value;
            else
                o->backend = value;
        } else if (!strcmp(flag, "--level")) {
            int l = regc_level_from_name(value);
            if (l < 0)
                return usage_error("%s: expected O0, O1 or O2, got \"%s\"", flag, value);
            o->compile.level = (regc_level)l;
        } else if (!strcmp(flag, "--regional")) {
            if (parse_switch(flag, value, &o->compile.regional))
                return EXIT_USAGE;
        } else if (!strcmp(flag, "--inline-back")) {
            if (parse_switch(flag, value, &o->compile.inline_back))
                return EXIT_USAGE;
        } else if (!strcmp(flag, "--steps")) {
            if (parse_int(flag, value, 1, INT_MAX, "a positive integer", &v))
                return EXIT_USAGE;
            o->steps = (int)v;
        } else if (!strcmp(flag, "--batch")) {
            if (parse_int(flag, value, 1, INT32_MAX, "a positive integer", &v))
                return EXIT_USAGE;
            o->batch = v;
        } else if (!strcmp(flag, "--seq")) {
            if (parse_int(flag, value, 1, INT32_MAX, "a positive integer", &v))
                return EXIT_USAGE;
            o->seq = v;
        } else if (!strcmp(flag, "--threads")) {
            if (parse_int(flag, value, 0, 4096, "an integer from 0 to 4096", &v))
                return EXIT_USAGE;
            o->threads = (int)v;
        } else if (!strcmp(flag, "--lr")) {
            if (parse_float(flag, value, 1, &o->lr))
                return EXIT_USAGE;
        } else if (!strcmp(flag, "--weight-decay")) {
            if (parse_float(flag, value, 0, &o->weight_decay))
                return EXIT_USAGE;
        } else if (!strcmp(flag, "--seed")) {
            if (parse_u64(flag, value, &o->seed))
                return EXIT_USAGE;
        }
    }
    return 0;
}

/* Load the model and train it; the strings in o and a may belong to cfg. */
static int train_run(const regc_train_options *op, const train_args *a, const regc_config *cfg)
{
    regc_train_options o = *op;
    const char *model_spec = a->model_spec, *weights_path = a->weights_path;
    int json = a->json;
    if (!model_spec)
        return usage_error("--model is required (a Hugging Face directory or a preset; see "
                           "regc train --help), unless the --config file sets train.model");

    regc_model *model = NULL;
    if (regc_model_load(model_spec, &model) != REGC_OK) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        return EXIT_ERROR;
    }
    if (weights_path) {
        const char *arch = regc_model_arch(model); /* static, outlives the model */
        if (strcmp(arch, "graph") != 0) {
            regc_model_free(model);
            /* From the file it is the file that is wrong, not the usage. */
            if (cfg && weights_path == regc_config_weights(cfg)) {
                fprintf(stderr,
                        "regc: %s: train.weights: applies to graph JSON models only (%s is a %s "
                        "model)\n",
                        a->config_path, model_spec, arch);
                return EXIT_ERROR;
            }
            return usage_error("--weights applies to graph JSON models only (%s is a %s model)",
                               model_spec, arch);
        }
        if (regc_model_read_safetensors(model, weights_path) != REGC_OK) {
            fprintf(stderr, "regc: %s\n", regc_error_message());
            regc_model_free(model);
            return EXIT_ERROR;
        }
    }
    char desc[1024];
    regc_model_describe(model, desc, sizeof desc);
    fprintf(stderr, "%s\n", desc);

    step_printer p = {.json = json, .step_width = 4, .cache_dir = o.cache_dir};
    o.on_compiled = on_compiled;
    for (int last = o.steps - 1, w = 1; last >= 10; last /= 10)
        if (++w > p.step_width)
            p.step_width = w;

    if (a->profile && !(o.profile = regc_profile_new())) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        regc_model_free(model);
        return EXIT_ERROR;
    }
    int rc = regc_train(model, &o, on_step, &p);
    regc_model_free(model);
    if (rc == REGC_OK && o.profile)
        rc = regc_profile_write(o.profile, stderr);
    regc_profile_free(o.profile);
    if (rc != REGC_OK) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        return EXIT_ERROR;
    }
    if (p.write_failed || fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "regc: writing to standard output failed\n");
        return EXIT_ERROR;
    }
    if (o.save_dir && !json)
        fprintf(stderr, "saved %s\n", o.save_dir);
    return 0;
}

int cmd_train(int argc, char **argv)
{
    usage_cmd = "regc train";
    regc_train_options o;
    /* The compile cache is on by default, in the user's cache directory
     * (none when neither XDG_CACHE_HOME nor HOME is set). */
    char default_cache[4096];
    const char *cache = regc_cache_default_dir(default_cache, sizeof default_cache) == REGC_OK
                            ? default_cache
                            : NULL;
    regc_train_options_default(&o);
    o.cache_dir = cache;
    train_args a = {0};
    int urc = parse_train_args(argc, argv, &o, &a);
    if (urc || a.help) {
        if (a.help)
            print_train_usage(stdout);
        return urc;
    }

    /* The file first, then the command line over it. */
    regc_config *cfg = NULL;
    if (a.config_path) {
        if (regc_config_load(a.config_path, &cfg) != REGC_OK) {
            fprintf(stderr, "regc: %s\n", regc_error_message());
            return EXIT_ERROR;
        }
        regc_train_options_default(&o);
        o.cache_dir = cache;
        regc_config_apply(cfg, &o);
        train_args from_file = {.model_spec = regc_config_model(cfg),
                                .weights_path = regc_config_weights(cfg),
                                .json = regc_config_json(cfg) > 0};
        a = from_file;
        parse_train_args(argc, argv, &o, &a); /* already checked: cannot fail */
    }
    if (a.no_cache)
        o.cache_dir = NULL;
    int rc = train_run(&o, &a, cfg);
    regc_config_free(cfg);
    return rc;
}

