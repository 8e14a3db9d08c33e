/* regc.c — the `regc` command: argument parsing and output formatting over
 * the library in region/regc.h. Everything that does work lives in the
 * library; this file only turns flags into options and reports into lines.
 *
 * Exit codes: 0 success, 1 the library reported an error, 2 a usage error. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "regc.h"
#include "regc_detect.h"

#ifndef REGC_VERSION
#define REGC_VERSION "0.1.0"
#endif

enum { EXIT_ERROR = 1, EXIT_USAGE = 2 };

static void print_usage(FILE *f)
{
    fputs("usage: regc <command> [options]\n"
          "\n"
          "commands:\n"
          "  train       train a model on token data and report each step\n"
          "  dump-graph  write a model's flat forward graph as regc graph JSON (or text)\n"
          "  detect      find the repeated layers of a model's flat graph\n"
          "  coldstart   time compiling (full, regional, regional from the compile cache) and the\n"
          "              first steps at several depths\n"
          "  cache       list, verify or clear the compile cache\n"
          "  version     print the version\n"
          "  help        print this text, or `regc help <command>` for a command's flags\n"
          "\n"
          "Run `regc <command> --help` for the options of a command.\n",
          f);
}

static void print_train_usage(FILE *f)
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

/* ---- strict number parsing: the whole argument must be the number ------ */

/* The command usage errors are reported for ("regc train", ...). */
static const char *usage_cmd = "regc train";

/* One line on stderr, prefixed with the command, and the usage exit code. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", usage_cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return EXIT_USAGE;
}

/* Integers in [min, max]; the text must be plain decimal digits (an
 * optional leading '-' only when min < 0), so " 5", "+5", "5x" and "0x10"
 * are all refused rather than half-read. */
static int parse_int(const char *flag, const char *text, long long min, long long max,
                     const char *what, long long *out)
{
    const char *p = text;
    if (*p == '-' && min < 0)
        p++;
    int ok = *p != '\0';
    for (; *p; p++)
        if (*p < '0' || *p > '9')
            ok = 0;
    if (ok) {
        errno = 0;
        char *end;
        long long v = strtoll(text, &end, 10);
        if (errno == 0 && *end == '\0' && v >= min && v <= max) {
            *out = v;
            return 0;
        }
    }
    usage_error("%s: expected %s, got \"%s\"", flag, what, text);
    return -1;
}

/* Seeds span all of uint64 (the library's streams are keyed by 64 bits). */
static int parse_u64(const char *flag, const char *text, uint64_t *out)
{
    int ok = *text != '\0';
    for (const char *p = text; *p; p++)
        if (*p < '0' || *p > '9')
            ok = 0;
    if (ok) {
        errno = 0;
        char *end;
        unsigned long long v = strtoull(text, &end, 10);
        if (errno == 0 && *end == '\0') {
            *out = (uint64_t)v;
            return 0;
        }
    }
    usage_error("%s: expected a non-negative integer below 2^64, got \"%s\"", flag, text);
    return -1;
}

/* Finite floats, > 0 when `positive`, else >= 0. */
static int parse_float(const char *flag, const char *text, int positive, float *out)
{
    const char *what = positive ? "a positive number" : "a non-negative number";
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    /* strtod skips leading blanks and reads "inf"/"nan"; neither is a
     * learning rate someone meant to type. */
    int ok = text[0] != '\0' && !isspace((unsigned char)text[0]) && end != text &&
             *end == '\0' && errno == 0 && isfinite(v) && v <= 3.0e38 &&
             (positive ? v > 0.0 : v >= 0.0);
    if (!ok) {
        usage_error("%s: expected %s, got \"%s\"", flag, what, text);
        return -1;
    }
    *out = (float)v;
    if (positive && *out == 0.0f) { /* below float's range: would silently become 0 */
        usage_error("%s: %s is too small for a float", flag, text);
        return -1;
    }
    return 0;
}

/* ---- per-step output ---------------------------------------------------- */

typedef struct {
    int json;
    int step_width; /* digits of the last step, so the columns line up */
    int write_failed;
    const char *cache_dir;
} step_printer;

/* JSON has no NaN or Infinity; a diverged step must still be a valid line. */
static void json_number(char *buf, size_t cap, const char *fmt, double v)
{
    if (isfinite(v))
        snprintf(buf, cap, fmt, v);
    else
        snprintf(buf, cap, "null");
}

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

/* The flag name of argv[i] into flag, and its value: the text after "=",
 * else the next argument unless that is itself a flag ("--model --json"
 * means the value was forgotten, not that the model is called "--json");
 * NULL when there is none. */
static const char *split_flag(int argc, char **argv, int i, char *flag, size_t cap)
{
    const char *arg = argv[i], *eq = strchr(arg, '=');
    if (eq) {
        size_t len = (size_t)(eq - arg);
        if (len >= cap)
            len = cap - 1;
        memcpy(flag, arg, len);
        flag[len] = '\0';
        return eq + 1;
    }
    snprintf(flag, cap, "%s", arg);
    return i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0 ? argv[i + 1] : NULL;
}

/* ---- regc train --------------------------------------------------------- */

/* What the command line of `regc train` says, beyond the options. */
typedef struct {
    const char *model_spec, *weights_path, *config_path;
    int json, help, no_cache;
} train_args;

/* "on" / "off" for the compile switches. */
static int parse_switch(const char *flag, const char *text, int *out)
{
    if (!strcmp(text, "on") || !strcmp(text, "off")) {
        *out = !strcmp(text, "on");
        return 0;
    }
    usage_error("%s: expected on or off, got \"%s\"", flag, text);
    return -1;
}

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
            if (!strcmp(flag, "--json") || !strcmp(flag, "--help") || !strcmp(flag, "--no-cache"))
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

    int rc = regc_train(model, &o, on_step, &p);
    regc_model_free(model);
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

static int cmd_train(int argc, char **argv)
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

/* ---- regc dump-graph ---------------------------------------------------- */

static void print_dump_graph_usage(FILE *f)
{
    fputs("usage: regc dump-graph --model <hf-dir|graph.json|preset> --out <FILE> [options]\n"
          "\n"
          "Write a model's flat forward graph (inputs input_ids, position_ids, targets; one\n"
          "parameter tensor per model parameter; ending in the mean cross-entropy loss) as\n"
          "regc graph JSON, which `regc train --model FILE` accepts. Shapes only: no weights\n"
          "are read or allocated, so any model size dumps instantly.\n"
          "\n"
          "options:\n"
          "  --model <dir|file|preset>  Hugging Face directory (only config.json is read), a\n"
          "                             regc graph JSON file, or a built-in preset\n"
          "  --batch <B>                sequences in the graph's batch, >= 1 (default 4)\n"
          "  --seq <T>                  tokens per sequence, >= 1 (default 64)\n"
          "  --out <FILE>               where to write; replaced atomically (required)\n"
          "  --text                     write the readable text listing instead of JSON\n"
          "  -h, --help                 print this text\n",
          f);
}

/* The graph as text: JSON, or regc_graph_dump's listing. */
static int graph_text(const regc_graph *g, int text, char **out, size_t *len)
{
    if (!text) {
        char *json = regc_graph_to_json(g);
        if (!json)
            return regc_error(REGC_ERR_MEMORY, "out of memory writing the graph");
        size_t n = strlen(json);
        char *s = (n && json[n - 1] == '\n') ? json : realloc(json, n + 2);
        if (!s) {
            free(json);
            return regc_error(REGC_ERR_MEMORY, "out of memory writing the graph");
        }
        if (!n || s[n - 1] != '\n') {
            s[n++] = '\n';
            s[n] = '\0';
        }
        *out = s;
        *len = n;
        return REGC_OK;
    }
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return regc_error(REGC_ERR_MEMORY, "out of memory writing the graph");
    regc_graph_dump(g, f);
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return regc_error(REGC_ERR_MEMORY, "out of memory writing the graph");
    }
    *out = buf;
    *len = n;
    return REGC_OK;
}

/* The flags of the commands that take a model and build its graph:
 * --model, --batch, --seq, --out (when `out` is wanted), and one switch
 * without a value (`switch_name`: --text, --json). */
typedef struct {
    const char *model, *out;
    long long batch, seq;
    int on; /* the switch was given */
} graph_flags;

/* Returns -1 when the command should go on, else its exit code (0 after
 * --help). */
static int parse_graph_flags(int argc, char **argv, const char *switch_name, int want_out,
                             void (*usage)(FILE *), graph_flags *f)
{
    const char *cmd = usage_cmd + strlen("regc ");
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(arg, switch_name)) {
            f->on = 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0)
            return usage_error("unexpected argument \"%s\" (options start with --; see "
                               "regc %s --help)",
                               arg, cmd);
        /* Every other flag takes a value, given as "--flag value" or
         * "--flag=value". */
        char flag[64];
        const char *value = split_flag(argc, argv, i, flag, sizeof flag);
        int is_model = !strcmp(flag, "--model"), is_out = want_out && !strcmp(flag, "--out");
        int is_batch = !strcmp(flag, "--batch"), is_seq = !strcmp(flag, "--seq");
        if (!is_model && !is_out && !is_batch && !is_seq) {
            if (!strcmp(flag, switch_name) || !strcmp(flag, "--help"))
                return usage_error("%s takes no value", flag);
            return usage_error("unknown option %s (see regc %s --help)", flag, cmd);
        }
        if (!value)
            return usage_error("%s: missing value", flag);
        if (!strchr(arg, '=')) /* the value was the next argument */
            i++;
        if ((is_model || is_out) && value[0] == '\0')
            return usage_error("%s: expected a non-empty value", flag);
        if (is_model)
            f->model = value;
        else if (is_out)
            f->out = value;
        else if (parse_int(flag, value, 1, INT32_MAX, "a positive integer",
                           is_batch ? &f->batch : &f->seq))
            return EXIT_USAGE;
    }
    if (!f->model)
        return usage_error("--model is required (see regc %s --help)", cmd);
    if (want_out && !f->out)
        return usage_error("--out is required (see regc %s --help)", cmd);
    return -1;
}

static int cmd_dump_graph(int argc, char **argv)
{
    usage_cmd = "regc dump-graph";
    graph_flags f = {.batch = 4, .seq = 64};
    int code = parse_graph_flags(argc, argv, "--text", 1, print_dump_graph_usage, &f);
    if (code >= 0)
        return code;
    const char *model_spec = f.model, *out_path = f.out;
    long long batch = f.batch, seq = f.seq;
    int text = f.on;

    regc_model *model = NULL;
    regc_graph *g = NULL;
    char *buf = NULL;
    size_t len = 0;
    int rc = regc_model_load_shapes(model_spec, &model);
    if (rc == REGC_OK)
        rc = regc_model_build_graph(model, batch, seq, &g);
    if (rc == REGC_OK)
        rc = graph_text(g, text, &buf, &len);
    if (rc == REGC_OK)
        rc = regc_file_write_atomic(out_path, buf, len);
    free(buf);
    regc_graph_free(g);
    regc_model_free(model);
    if (rc != REGC_OK) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        return EXIT_ERROR;
    }
    return 0;
}

/* ---- regc detect -------------------------------------------------------- */

static void print_detect_usage(FILE *f)
{
    fputs("usage: regc detect --model <hf-dir|graph.json|preset> [options]\n"
          "\n"
          "Build the model's flat forward graph (shapes only) and find its repeated layers\n"
          "from the graph's structure alone: region kinds, instances, nodes and parameters\n"
          "per instance, coverage (the fraction of nodes inside instances), near misses (a\n"
          "layer whose wiring matches a kind but whose shapes or attributes do not) and the\n"
          "time detection took.\n"
          "\n"
          "options:\n"
          "  --model <dir|file|preset>  Hugging Face directory (only config.json is read), a\n"
          "                             regc graph JSON file (read as it is), or a preset\n"
          "  --batch <B>                sequences in the graph's batch, >= 1 (default 1)\n"
          "  --seq <T>                  tokens per sequence, >= 1 (default 64, or the\n"
          "                             model's maximum when smaller)\n"
          "  --json                     print one JSON object:\n"
          "                             {\"regions\": [{\"kind\", \"instances\", \"nodes\",\n"
          "                             \"params_per_instance\"}], \"coverage\", \"ms\",\n"
          "                             \"near_misses\": [{\"kind\", \"node\", \"reason\"}]}\n"
          "  -h, --help                 print this text\n",
          f);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The graph to detect on: a graph JSON file as it is, else the model's. */
static int detect_load_graph(const char *spec, long long batch, long long seq, regc_graph **g)
{
    struct stat st;
    if (ends_with(spec, ".json") && stat(spec, &st) == 0 && S_ISREG(st.st_mode)) {
        char *text = NULL;
        size_t len = 0;
        int rc = regc_file_read_all(spec, &text, &len);
        if (rc == REGC_OK)
            rc = regc_graph_from_json(text, spec, g);
        free(text);
        return rc;
    }
    regc_model *m = NULL;
    int rc = regc_model_load_shapes(spec, &m);
    if (rc == REGC_OK) {
        if (seq <= 0)
            seq = regc_model_max_seq(m) < 64 ? regc_model_max_seq(m) : 64;
        rc = regc_model_build_graph(m, batch, seq, g);
    }
    regc_model_free(m);
    return rc;
}

static const char *formal_counts(const regc_region_kind *k, char *buf, size_t cap)
{
    int n[3] = {0, 0, 0};
    for (int f = 0; f < k->n_inputs; f++)
        n[k->inputs[f].cls]++;
    snprintf(buf, cap, "%d/%d/%d", n[REGC_FORMAL_CARRIED], n[REGC_FORMAL_SHARED],
             n[REGC_FORMAL_PER_INSTANCE]);
    return buf;
}

static void print_detect_table(const regc_blocks *b, const regc_graph *g, double ms)
{
    printf("%d nodes, %d region kind%s\n", regc_graph_n_nodes(g), regc_blocks_n_kinds(b),
           regc_blocks_n_kinds(b) == 1 ? "" : "s");
    if (regc_blocks_n_kinds(b) > 0)
        printf("%-5s %10s %6s %17s  %s\n", "kind", "instances", "nodes", "params/instance",
               "inputs carried/shared/per-instance");
    for (int k = 0; k < regc_blocks_n_kinds(b); k++) {
        const regc_region_kind *r = regc_blocks_kind(b, k);
        char counts[64];
        printf("%-5d %10d %6d %17lld  %s\n", k, r->n_instances, r->n_nodes,
               (long long)r->params_per_instance, formal_counts(r, counts, sizeof counts));
    }
    printf("program:");
    for (int i = 0; i < regc_blocks_n_segments(b); i++) {
        const regc_segment *s = regc_blocks_segment(b, i);
        if (s->type == REGC_SEGMENT_GLUE)
            printf("%s glue %d node%s", i ? " ·" : "", s->n_nodes, s->n_nodes == 1 ? "" : "s");
        else
            printf(" · kind %d x %d", s->kind, s->count);
    }
    printf("\n");
    for (int i = 0; i < regc_blocks_n_near_misses(b); i++) {
        const regc_near_miss *nm = regc_blocks_near_miss(b, i);
        printf("near miss: node %d almost an instance of kind %d (template node %d): %s\n",
               nm->node, nm->kind, nm->template_node, nm->reason);
    }
    printf("coverage %.1f%%, detected in %.3f ms\n", 100.0 * regc_blocks_coverage(b), ms);
}

static int print_detect_json(const regc_blocks *b, double ms)
{
    cJSON *o = cJSON_CreateObject(), *regions = cJSON_AddArrayToObject(o, "regions");
    int ok = o && regions;
    for (int k = 0; ok && k < regc_blocks_n_kinds(b); k++) {
        const regc_region_kind *r = regc_blocks_kind(b, k);
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToArray(regions, e);
        ok = ok && cJSON_AddNumberToObject(e, "kind", k);
        ok = ok && cJSON_AddNumberToObject(e, "instances", r->n_instances);
        ok = ok && cJSON_AddNumberToObject(e, "nodes", r->n_nodes);
        ok = ok && cJSON_AddNumberToObject(e, "params_per_instance",
                                           (double)r->params_per_instance);
    }
    ok = ok && cJSON_AddNumberToObject(o, "coverage", regc_blocks_coverage(b));
    ok = ok && cJSON_AddNumberToObject(o, "ms", ms);
    cJSON *near = ok ? cJSON_AddArrayToObject(o, "near_misses") : NULL;
    ok = ok && near;
    for (int i = 0; ok && i < regc_blocks_n_near_misses(b); i++) {
        const regc_near_miss *nm = regc_blocks_near_miss(b, i);
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToArray(near, e);
        ok = ok && cJSON_AddNumberToObject(e, "kind", nm->kind);
        ok = ok && cJSON_AddNumberToObject(e, "node", nm->node);
        ok = ok && cJSON_AddStringToObject(e, "reason", nm->reason);
    }
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text)
        return regc_error(REGC_ERR_MEMORY, "out of memory writing JSON");
    puts(text);
    free(text);
    return REGC_OK;
}

static int cmd_detect(int argc, char **argv)
{
    usage_cmd = "regc detect";
    graph_flags f = {.batch = 1, .seq = 0}; /* seq 0: 64, or the model's maximum */
    int code = parse_graph_flags(argc, argv, "--json", 0, print_detect_usage, &f);
    if (code >= 0)
        return code;
    const char *model_spec = f.model;
    long long batch = f.batch, seq = f.seq;
    int json = f.on;

    regc_graph *g = NULL;
    regc_blocks *b = NULL;
    int rc = detect_load_graph(model_spec, batch, seq, &g);
    double ms = 0.0;
    if (rc == REGC_OK) {
        double t0 = regc_time_ms();
        rc = regc_detect_blocks(g, &b);
        ms = regc_time_ms() - t0;
    }
    if (rc == REGC_OK) {
        if (json)
            rc = print_detect_json(b, ms);
        else
            print_detect_table(b, g, ms);
    }
    regc_blocks_free(b);
    regc_graph_free(g);
    if (rc != REGC_OK) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        return EXIT_ERROR;
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "regc: writing to standard output failed\n");
        return EXIT_ERROR;
    }
    return 0;
}

/* ---- regc coldstart ----------------------------------------------------- */

static void print_coldstart_usage(FILE *f)
{
    fputs("usage: regc coldstart --model <hf-dir|graph.json|preset> [options]\n"
          "\n"
          "Measure the cold-start cost of a model at several depths: for each depth and for\n"
          "full and regional compilation (level O1), compile the training step from scratch\n"
          "(build the graph, detect layers, compile, inline back) --repeat times and report\n"
          "the median of each phase. The third mode, regional+cache, fills a compile cache\n"
          "once, then times --repeat warm starts, each from a freshly opened cache handle\n"
          "with no state kept in the process: from the loaded model to the step program\n"
          "ready (key, read, check, decode). Then, when the model fits in half the machine's memory\n"
          "(16 bytes per parameter plus the activation plan plus the inputs), train --steps\n"
          "steps on the built-in corpus and report the first step and the median of the rest.\n"
          "Depths re-shape the model with the same widths (presets and Hugging Face configs;\n"
          "a graph JSON file has a fixed depth and is refused).\n"
          "\n"
          "options:\n"
          "  --model <dir|file|preset>  Hugging Face directory (only config.json is read) or a\n"
          "                             built-in preset\n"
          "  --layers <N,N,...>         depths to measure: distinct positive integers, comma\n"
          "                             separated (default 12,24,48,96)\n"
          "  --repeat <N>               compilations per depth and mode, >= 1 (default 5)\n"
          "  --batch <B>                sequences per step, >= 1 (default 4)\n"
          "  --seq <T>                  tokens per sequence, >= 1 (default 64)\n"
          "  --steps <S>                training steps per depth and mode, >= 2 (default 3);\n"
          "                             skipped (null) when the vocabulary is below 256 or the\n"
          "                             model does not fit\n"
          "  --threads <N>              CPU threads for training; 0 uses OMP_NUM_THREADS or all\n"
          "                             cores (default 0)\n"
          "  --json                     print one JSON object per depth and mode:\n"
          "                             {\"model\", \"layers\", \"mode\" (full|regional|\n"
          "                             regional+cache), \"cache_hits\", \"cache_misses\",\n"
          "                             \"build_ms\", \"detect_ms\", \"compile_ms\", \"inline_ms\",\n"
          "                             \"total_ms\", \"total_min_ms\", \"total_max_ms\",\n"
          "                             \"first_step_ms\", \"step_ms\", \"peak_bytes\",\n"
          "                             \"lower_bound_bytes\", \"region_kinds\", \"region_compiles\"}\n"
          "                             (null where not measured)\n"
          "  --cache-dir <DIR>          the regional+cache mode's cache directory (default: a\n"
          "                             new temporary directory, removed afterwards)\n"
          "  --svg <FILE>               also write an SVG chart of total compile time against\n"
          "                             depth for every mode; replaced atomically\n"
          "  -h, --help                 print this text\n",
          f);
}

#define COLD_MAX_LAYERS 64

/* One depth in one mode. Times are medians over the repeats. */
enum { COLD_FULL, COLD_REGIONAL, COLD_CACHED, COLD_MODES };
static const char *const cold_mode_name[COLD_MODES] = {"full", "regional", "regional+cache"};

typedef struct {
    int64_t layers;
    int mode;                 /* COLD_* */
    int cache_hits, cache_misses; /* of the last timed compile */
    double build_ms, detect_ms, compile_ms, inline_ms, total_ms, total_min, total_max;
    double first_step_ms, step_ms; /* NAN: not measured */
    int64_t peak_bytes, lower_bound_bytes;
    int region_kinds, region_compiles;
} cold_row;

typedef struct {
    const char *model, *svg, *cache_dir;
    int64_t layers[COLD_MAX_LAYERS];
    int n_layers;
    long long repeat, batch, seq, steps, threads;
    int json;
} cold_args;

/* "12,24,48": distinct positive integers. Duplicates are refused: they
 * would only repeat a row and draw a chart point twice. */
static int parse_layer_list(const char *flag, const char *text, cold_args *a)
{
    a->n_layers = 0;
    const char *p = text;
    if (*p == '\0')
        return usage_error("%s: expected a comma-separated list of layer counts, got \"\"",
                           flag);
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof item)
            return usage_error("%s: expected a comma-separated list of positive integers, got "
                               "\"%s\"",
                               flag, text);
        memcpy(item, p, len);
        item[len] = '\0';
        long long v;
        if (parse_int(flag, item, 1, 100000, "positive layer counts up to 100000", &v))
            return EXIT_USAGE;
        for (int i = 0; i < a->n_layers; i++)
            if (a->layers[i] == v)
                return usage_error("%s: layer count %lld appears twice in \"%s\"", flag, v,
                                   text);
        if (a->n_layers == COLD_MAX_LAYERS)
            return usage_error("%s: at most %d layer counts, got more in \"%s\"", flag,
                               COLD_MAX_LAYERS, text);
        a->layers[a->n_layers++] = v;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

/* Returns -1 when the command should go on, else its exit code. */
static int parse_coldstart_args(int argc, char **argv, cold_args *a)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            print_coldstart_usage(stdout);
            return 0;
        }
        if (!strcmp(arg, "--json")) {
            a->json = 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0)
            return usage_error("unexpected argument \"%s\" (options start with --; see "
                               "regc coldstart --help)",
                               arg);
        char flag[64];
        const char *value = split_flag(argc, argv, i, flag, sizeof flag);
        static const char *const valued[] = {"--model", "--layers", "--repeat", "--batch",
                                             "--seq",   "--steps",  "--threads", "--svg", "--cache-dir",
                                             NULL};
        int known = 0;
        for (const char *const *k = valued; *k; k++)
            if (!strcmp(flag, *k))
                known = 1;
        if (!known) {
            if (!strcmp(flag, "--json") || !strcmp(flag, "--help"))
                return usage_error("%s takes no value", flag);
            return usage_error("unknown option %s (see regc coldstart --help)", flag);
        }
        if (!value)
            return usage_error("%s: missing value", flag);
        if (!strchr(arg, '=')) /* the value was the next argument */
            i++;
        if (!strcmp(flag, "--model") || !strcmp(flag, "--svg") || !strcmp(flag, "--cache-dir")) {
            if (value[0] == '\0')
                return usage_error("%s: expected a non-empty value", flag);
            if (!strcmp(flag, "--model"))
                a->model = value;
            else if (!strcmp(flag, "--cache-dir"))
                a->cache_dir = value;
            else
                a->svg = value;
        } else if (!strcmp(flag, "--layers")) {
            if (parse_layer_list(flag, value, a))
                return EXIT_USAGE;
        } else if (!strcmp(flag, "--repeat")) {
            if (parse_int(flag, value, 1, 100000, "a positive integer", &a->repeat))
                return EXIT_USAGE;
        } else if (!strcmp(flag, "--batch") || !strcmp(flag, "--seq")) {
            if (parse_int(flag, value, 1, INT32_MAX, "a positive integer",
                          !strcmp(flag, "--batch") ? &a->batch : &a->seq))
                return EXIT_USAGE;
        } else if (!strcmp(flag, "--steps")) {
            if (parse_int(flag, value, 2, INT_MAX, "an integer >= 2", &a->steps))
                return EXIT_USAGE;
        } else if (parse_int(flag, value, 0, 4096, "an integer from 0 to 4096", &a->threads)) {
            return EXIT_USAGE;
        }
    }
    if (!a->model)
        return usage_error("--model is required (see regc coldstart --help)");
    return -1;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Sorts v in place. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    double *ms;
    int n, cap;
} cold_steps;

static void cold_on_step(const regc_step_report *r, void *user)
{
    cold_steps *s = user;
    if (s->n < s->cap)
        s->ms[s->n++] = r->ms;
}

/* One compilation at O1; with cache_dir, through a cache opened for it
 * alone (a restart: nothing of an earlier one is kept in the process).
 * *wall_ms: from opening the cache to the program ready. */
static int cold_compile_once(const regc_model *m, const cold_args *a, int regional,
                             const char *cache_dir, regc_program **p, regc_compile_stats *st,
                             double *wall_ms)
{
    double t0 = regc_time_ms();
    regc_compile_options o;
    regc_compile_options_default(&o);
    o.level = REGC_LEVEL_O1;
    o.regional = regional;
    regc_cache *cache = NULL;
    int rc = cache_dir ? regc_cache_open(cache_dir, 0, NULL, &cache) : REGC_OK;
    o.cache = cache;
    if (rc == REGC_OK)
        rc = regc_program_compile(m, a->batch, a->seq, &o, p, st);
    regc_cache_close(cache);
    *wall_ms = regc_time_ms() - t0;
    return rc;
}

/* Compile m --repeat times in one mode and fill the row's medians. */
static int cold_compile(const regc_model *m, const cold_args *a, const char *cache_dir,
                        cold_row *row, int64_t *input_bytes)
{
    int n = (int)a->repeat;
    double *t = calloc((size_t)n * 5, sizeof *t);
    if (!t)
        return regc_error(REGC_ERR_MEMORY, "out of memory timing %d compilations", n);
    double *build = t, *detect = t + n, *comp = t + 2 * n, *inl = t + 3 * n, *total = t + 4 * n;
    int rc = REGC_OK, regional = row->mode != COLD_FULL;
    const char *dir = row->mode == COLD_CACHED ? cache_dir : NULL;
    if (dir) { /* fill the cache first */
        regc_program *p = NULL;
        regc_compile_stats st;
        double ms;
        rc = cold_compile_once(m, a, regional, dir, &p, &st, &ms);
        regc_program_free(p);
    }
    for (int r = 0; r < n && rc == REGC_OK; r++) {
        regc_program *p = NULL;
        regc_compile_stats st;
        memset(&st, 0, sizeof st);
        double wall;
        rc = cold_compile_once(m, a, regional, dir, &p, &st, &wall);
        if (rc == REGC_OK) {
            build[r] = st.build_ms;
            detect[r] = st.detect_ms;
            comp[r] = st.compile_ms;
            inl[r] = st.inline_ms;
            total[r] = dir ? wall : st.build_ms + st.detect_ms + st.compile_ms + st.inline_ms;
            row->cache_hits = st.cache_hits;
            row->cache_misses = st.cache_misses;
            /* Shapes and plans do not depend on the repeat. */
            row->peak_bytes = st.peak_bytes;
            row->lower_bound_bytes = st.lower_bound_bytes;
            row->region_kinds = st.region_kinds;
            row->region_compiles = st.region_compiles;
            *input_bytes = 0;
            for (int i = 0; i < regc_program_n_inputs(p); i++) {
                const regc_tensor *in = regc_program_input(p, i);
                *input_bytes += regc_tensor_bytes(in);
            }
        }
        regc_program_free(p);
    }
    if (rc == REGC_OK) {
        row->build_ms = median(build, n);
        row->detect_ms = median(detect, n);
        row->compile_ms = median(comp, n);
        row->inline_ms = median(inl, n);
        row->total_ms = median(total, n);
        row->total_min = total[0];
        row->total_max = total[n - 1];
    }
    free(t);
    return rc;
}

/* Train a fresh copy of the depth's model; its weights are the only
 * memory that grows with the parameter count. */
static int cold_train(const regc_model *base, const cold_args *a, const char *cache_dir,
                      cold_row *row)
{
    regc_model *m = NULL;
    int rc = regc_model_with_layers(base, row->layers, &m);
    cold_steps s = {.cap = (int)a->steps};
    s.ms = calloc((size_t)s.cap, sizeof *s.ms);
    if (rc == REGC_OK && !s.ms)
        rc = regc_error(REGC_ERR_MEMORY, "out of memory for %d step times", s.cap);
    if (rc == REGC_OK) {
        regc_train_options o;
        regc_train_options_default(&o);
        o.batch = a->batch;
        o.seq = a->seq;
        o.steps = (int)a->steps;
        o.threads = (int)a->threads;
        o.compile.level = REGC_LEVEL_O1;
        o.compile.regional = row->mode != COLD_FULL;
        o.cache_dir = row->mode == COLD_CACHED ? cache_dir : NULL;
        rc = regc_train(m, &o, cold_on_step, &s);
    }
    if (rc == REGC_OK && s.n == s.cap) {
        row->first_step_ms = s.ms[0];
        row->step_ms = median(s.ms + 1, s.n - 1);
    } else if (rc == REGC_OK) {
        rc = regc_error(REGC_ERR_SHAPE, "training reported %d of %d steps", s.n, s.cap);
    }
    free(s.ms);
    regc_model_free(m);
    return rc;
}

static void cold_num(char *buf, size_t cap, double v, const char *fmt)
{
    if (isfinite(v))
        snprintf(buf, cap, fmt, v);
    else
        snprintf(buf, cap, "null");
}

static int cold_print_json(const char *model, const cold_row *r)
{
    char b[8][48];
    cold_num(b[0], sizeof b[0], r->build_ms, "%.6g");
    cold_num(b[1], sizeof b[1], r->detect_ms, "%.6g");
    cold_num(b[2], sizeof b[2], r->compile_ms, "%.6g");
    cold_num(b[3], sizeof b[3], r->inline_ms, "%.6g");
    cold_num(b[4], sizeof b[4], r->total_ms, "%.6g");
    cold_num(b[5], sizeof b[5], r->total_min, "%.6g");
    cold_num(b[6], sizeof b[6], r->total_max, "%.6g");
    char fs[48], sm[48];
    cold_num(fs, sizeof fs, r->first_step_ms, "%.6g");
    cold_num(sm, sizeof sm, r->step_ms, "%.6g");
    /* The model name through cJSON: a path may hold quotes or backslashes. */
    cJSON *name = cJSON_CreateString(model);
    char *quoted = name ? cJSON_PrintUnformatted(name) : NULL;
    cJSON_Delete(name);
    if (!quoted)
        return regc_error(REGC_ERR_MEMORY, "out of memory writing JSON");
    int n = printf("{\"model\": %s, \"layers\": %lld, \"mode\": \"%s\", \"build_ms\": %s, "
                   "\"detect_ms\": %s, \"compile_ms\": %s, \"inline_ms\": %s, \"total_ms\": %s, "
                   "\"total_min_ms\": %s, \"total_max_ms\": %s, \"first_step_ms\": %s, "
                   "\"step_ms\": %s, \"peak_bytes\": %lld, \"lower_bound_bytes\": %lld, "
                   "\"region_kinds\": %d, \"region_compiles\": %d, \"cache_hits\": %d, "
                   "\"cache_misses\": %d}\n",
                   quoted, (long long)r->layers, cold_mode_name[r->mode], b[0], b[1], b[2], b[3],
                   b[4], b[5], b[6], fs, sm, (long long)r->peak_bytes,
                   (long long)r->lower_bound_bytes, r->region_kinds, r->region_compiles,
                   r->cache_hits, r->cache_misses);
    free(quoted);
    if (n < 0 || fflush(stdout) != 0)
        return regc_error(REGC_ERR_IO, "writing to standard output failed");
    return REGC_OK;
}

static void cold_print_header(void)
{
    printf("%-12s %6s %-14s %9s %10s %9s %10s %21s %8s %10s %9s %9s %9s\n", "model", "layers",
           "mode", "detect_ms", "compile_ms", "inline_ms", "total_ms", "total min..max",
           "compiles", "first_step", "step_ms", "peak_MiB", "bound_MiB");
}

static int cold_print_row(const char *model, const cold_row *r)
{
    char spread[48], fs[32], sm[32];
    snprintf(spread, sizeof spread, "%.1f..%.1f", r->total_min, r->total_max);
    cold_num(fs, sizeof fs, r->first_step_ms, "%.1f");
    cold_num(sm, sizeof sm, r->step_ms, "%.1f");
    int n = printf("%-12s %6lld %-14s %9.1f %10.1f %9.1f %10.1f %21s %8d %10s %9s %9.1f %9.1f\n",
                   model, (long long)r->layers, cold_mode_name[r->mode], r->detect_ms,
                   r->compile_ms, r->inline_ms, r->total_ms, spread, r->region_compiles, fs, sm,
                   (double)r->peak_bytes / 1048576.0, (double)r->lower_bound_bytes / 1048576.0);
    if (n < 0 || fflush(stdout) != 0)
        return regc_error(REGC_ERR_IO, "writing to standard output failed");
    return REGC_OK;
}

/* A tick step of 1, 2 or 5 times a power of ten giving about 5 ticks. */
static double nice_step(double span)
{
    double raw = span / 5.0, p = pow(10.0, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * p;
}

/* The chart as one self-contained SVG document (malloc'd). Rows alternate
 * full, regional, regional+cache per depth. */
static int cold_svg(const char *model, const cold_row *rows, int n_rows, char **out,
                    size_t *len)
{
    const double W = 640, H = 400, L = 70, R = 150, T = 40, B = 50;
    double xmax = 0, ymax = 0;
    for (int i = 0; i < n_rows; i++) {
        if ((double)rows[i].layers > xmax)
            xmax = (double)rows[i].layers;
        if (rows[i].total_ms > ymax)
            ymax = rows[i].total_ms;
    }
    if (ymax <= 0)
        ymax = 1;
    double ystep = nice_step(ymax), xstep = nice_step(xmax > 0 ? xmax : 1);
    if (xstep < 1)
        xstep = 1;
    ymax = ceil(ymax / ystep) * ystep;
    double xtop = ceil(xmax / xstep) * xstep;
    if (xtop <= 0)
        xtop = 1;
#define SX(v) (L + (v) / xtop * (W - L - R))
#define SY(v) (H - B - (v) / ymax * (H - T - B))
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return regc_error(REGC_ERR_MEMORY, "out of memory writing the SVG chart");
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
            "viewBox=\"0 0 %g %g\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H, W, H);
    /* The model name is user text: escape what XML reserves. */
    fputs("<text x=\"320\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">"
          "Cold start compile time: ",
          f);
    for (const char *c = model; *c; c++) {
        if (*c == '<')
            fputs("&lt;", f);
        else if (*c == '>')
            fputs("&gt;", f);
        else if (*c == '&')
            fputs("&amp;", f);
        else if ((unsigned char)*c >= 0x20)
            fputc(*c, f);
    }
    fputs("</text>\n", f);
    fprintf(f,
            "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n"
            "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n",
            L, H - B, W - R, H - B, L, T, L, H - B);
    for (double v = 0; v <= xtop + 1e-9; v += xstep)
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"black\"/>"
                "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%g</text>\n",
                SX(v), H - B, SX(v), H - B + 5, SX(v), H - B + 18, v);
    for (double v = 0; v <= ymax + 1e-9 * ymax; v += ystep)
        fprintf(f,
                "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                L, SY(v), W - R, SY(v), L - 6, SY(v) + 4, v);
    fprintf(f,
            "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">layers</text>\n"
            "<text x=\"16\" y=\"%g\" text-anchor=\"middle\" transform=\"rotate(-90 16 %g)\">"
            "total compile time (ms, median)</text>\n",
            (L + W - R) / 2, H - 12, (T + H - B) / 2, (T + H - B) / 2);
    static const char *const color[COLD_MODES] = {"#d62728", "#1f77b4", "#2ca02c"};
    for (int mode = 0; mode < COLD_MODES; mode++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                color[mode]);
        for (int i = 0, first = 1; i < n_rows; i++)
            if (rows[i].mode == mode) {
                fprintf(f, "%s%.1f,%.1f", first ? "" : " ", SX((double)rows[i].layers),
                        SY(rows[i].total_ms));
                first = 0;
            }
        fputs("\"/>\n", f);
        for (int i = 0; i < n_rows; i++)
            if (rows[i].mode == mode)
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                        SX((double)rows[i].layers), SY(rows[i].total_ms), color[mode]);
        double ly = T + 10 + 20 * mode;
        fprintf(f,
                "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"2\"/>"
                "<text x=\"%g\" y=\"%g\">%s</text>\n",
                W - R + 15, ly, W - R + 40, ly, color[mode], W - R + 46, ly + 4,
                cold_mode_name[mode]);
    }
    fputs("</svg>\n", f);
#undef SX
#undef SY
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return regc_error(REGC_ERR_MEMORY, "out of memory writing the SVG chart");
    }
    *out = buf;
    *len = n;
    return REGC_OK;
}

static int cmd_coldstart(int argc, char **argv)
{
    usage_cmd = "regc coldstart";
    cold_args a = {.layers = {12, 24, 48, 96}, .n_layers = 4, .repeat = 5, .batch = 4,
                   .seq = 64, .steps = 3};
    int code = parse_coldstart_args(argc, argv, &a);
    if (code >= 0)
        return code;

    regc_model *base = NULL;
    cold_row *rows = calloc((size_t)a.n_layers * COLD_MODES, sizeof *rows);
    int n_rows = 0;
    int rc = rows ? REGC_OK : regc_error(REGC_ERR_MEMORY, "out of memory");
    /* The warm mode's cache: given, or a temporary one of its own. */
    char temp_dir[4096] = "";
    const char *cache_dir = a.cache_dir;
    if (rc == REGC_OK && !cache_dir) {
        const char *tmp = getenv("TMPDIR");
        snprintf(temp_dir, sizeof temp_dir, "%s/regc-coldstart-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(temp_dir)) {
            rc = regc_error(REGC_ERR_IO, "%s: cannot create a temporary directory: %s", temp_dir,
                            strerror(errno));
            temp_dir[0] = 0;
        }
        cache_dir = temp_dir;
    }
    if (rc == REGC_OK)
        rc = regc_model_load_shapes(a.model, &base);
    /* The built-in corpus is GPT-2 byte-level text: ids up to 255. */
    int can_train = rc == REGC_OK && regc_model_vocab(base) >= 256;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double half_mem = pages > 0 && page > 0 ? 0.5 * (double)pages * (double)page : 0.0;
    for (int d = 0; rc == REGC_OK && d < a.n_layers; d++) {
        regc_model *m = NULL;
        rc = regc_model_with_layers(base, a.layers[d], &m);
        for (int mode = 0; rc == REGC_OK && mode < COLD_MODES; mode++) {
            cold_row *row = &rows[n_rows];
            row->layers = a.layers[d];
            row->mode = mode;
            row->first_step_ms = row->step_ms = NAN;
            int64_t input_bytes = 0;
            rc = cold_compile(m, &a, cache_dir, row, &input_bytes);
            /* Weights, gradients and AdamW's two moments, all fp32. */
            double need = 16.0 * (double)regc_model_total_numel(m) + (double)row->peak_bytes +
                          (double)input_bytes;
            if (rc == REGC_OK && can_train && need < half_mem)
                rc = cold_train(base, &a, cache_dir, row);
            if (rc == REGC_OK) {
                /* The header only above a row: a failed load prints nothing. */
                if (!a.json && n_rows == 0)
                    cold_print_header();
                n_rows++;
                rc = a.json ? cold_print_json(a.model, row) : cold_print_row(a.model, row);
            }
        }
        regc_model_free(m);
    }
    char *svg = NULL;
    size_t svg_len = 0;
    /* Nothing is written unless every row was measured. */
    if (rc == REGC_OK && a.svg)
        rc = cold_svg(a.model, rows, n_rows, &svg, &svg_len);
    if (rc == REGC_OK && a.svg)
        rc = regc_file_write_atomic(a.svg, svg, svg_len);
    free(svg);
    free(rows);
    regc_model_free(base);
    int removed;
    if (temp_dir[0] && regc_cache_clear(temp_dir, &removed) == REGC_OK)
        rmdir(temp_dir);
    if (rc != REGC_OK) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        return EXIT_ERROR;
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "regc: writing to standard output failed\n");
        return EXIT_ERROR;
    }
    return 0;
}

/* ---- regc cache ----------------------------------------------------------- */

static void print_cache_usage(FILE *f)
{
    fputs("usage: regc cache <ls|verify|clear> [--dir DIR]\n"
          "\n"
          "The compile cache holds compiled layers and whole step programs, one file each,\n"
          "keyed on the structure they were compiled from (never on weights or parameter\n"
          "names), the level, the device and this build of regc.\n"
          "\n"
          "  ls      one line per entry: file, size, last use, what it holds; oldest first\n"
          "  verify  check every entry whole (header, checksums, decompression, key);\n"
          "          exit status 1 when any is damaged (regc recompiles those by itself)\n"
          "  clear   remove every entry and leftover temporary file\n"
          "\n"
          "options:\n"
          "  --dir <DIR>   the cache directory (default $XDG_CACHE_HOME/regc, else\n"
          "                ~/.cache/regc)\n"
          "  -h, --help    print this text\n",
          f);
}

static int cache_list(const char *dir, int verify)
{
    regc_cache_entry *e;
    int n, bad = 0, temps = 0;
    int64_t total = 0;
    if (regc_cache_scan(dir, verify, &e, &n) != REGC_OK) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        return EXIT_ERROR;
    }
    for (int i = 0; i < n; i++) {
        char when[32] = "?";
        struct tm tm;
        if (localtime_r(&e[i].used, &tm))
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        total += e[i].bytes;
        if (e[i].temporary) {
            temps++;
            printf("%s  %9lld  %s  (temporary file of a writer)\n", e[i].file, (long long)e[i].bytes,
                   when);
        } else if (e[i].problem[0]) {
            bad++;
            printf("%s  %9lld  %s  DAMAGED: %s\n", e[i].file, (long long)e[i].bytes, when,
                   e[i].problem);
        } else if (!verify) {
            printf("%s  %9lld  %s  %s\n", e[i].file, (long long)e[i].bytes, when,
                   e[i].label ? e[i].label : "(unreadable header)");
        }
    }
    printf("%s: %d entr%s, %.1f MiB%s", dir, n - temps, n - temps == 1 ? "y" : "ies",
           (double)total / 1048576.0, temps ? "" : "\n");
    if (temps)
        printf(", %d temporary file%s\n", temps, temps == 1 ? "" : "s");
    if (verify)
        printf("%s\n", bad ? "damaged entries found" : "every entry is sound");
    regc_cache_entries_free(e, n);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "regc: writing to standard output failed\n");
        return EXIT_ERROR;
    }
    return bad ? EXIT_ERROR : 0;
}

static int cmd_cache(int argc, char **argv)
{
    usage_cmd = "regc cache";
    const char *sub = NULL, *dir = NULL;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            print_cache_usage(stdout);
            return 0;
        }
        if (strncmp(arg, "--", 2) != 0) {
            if (sub)
                return usage_error("unexpected argument \"%s\" (see regc cache --help)", arg);
            sub = arg;
            continue;
        }
        char flag[64];
        const char *value = split_flag(argc, argv, i, flag, sizeof flag);
        if (strcmp(flag, "--dir") != 0)
            return usage_error("unknown option %s (see regc cache --help)", flag);
        if (!value || !value[0])
            return usage_error("--dir: missing value");
        if (!strchr(arg, '='))
            i++;
        dir = value;
    }
    if (!sub || (strcmp(sub, "ls") && strcmp(sub, "verify") && strcmp(sub, "clear")))
        return usage_error("expected ls, verify or clear%s%s%s (see regc cache --help)",
                           sub ? ", got \"" : "", sub ? sub : "", sub ? "\"" : "");
    char def[4096];
    if (!dir) {
        if (regc_cache_default_dir(def, sizeof def) != REGC_OK) {
            fprintf(stderr, "regc: %s\n", regc_error_message());
            return EXIT_ERROR;
        }
        dir = def;
    }
    struct stat st;
    if (stat(dir, &st) != 0 && errno == ENOENT) { /* nothing cached yet */
        printf("%s: no cache directory\n", dir);
        return 0;
    }
    if (!strcmp(sub, "clear")) {
        int removed;
        if (regc_cache_clear(dir, &removed) != REGC_OK) {
            fprintf(stderr, "regc: %s\n", regc_error_message());
            return EXIT_ERROR;
        }
        printf("%s: removed %d file%s\n", dir, removed, removed == 1 ? "" : "s");
        return 0;
    }
    return cache_list(dir, !strcmp(sub, "verify"));
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "help")) {
        if (argc == 2) {
            print_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "train")) {
            print_train_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "dump-graph")) {
            print_dump_graph_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "detect")) {
            print_detect_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "coldstart")) {
            print_coldstart_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "cache")) {
            print_cache_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "version") || !strcmp(argv[2], "help")) {
            print_usage(stdout);
            return 0;
        }
        fprintf(stderr,
                "regc help: unknown command \"%s\" (commands: train, dump-graph, detect, coldstart, cache, version)\n",
                argv[2]);
        return EXIT_USAGE;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("regc %s\n", REGC_VERSION);
        return fflush(stdout) == 0 ? 0 : EXIT_ERROR;
    }
    if (!strcmp(cmd, "train"))
        return cmd_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "dump-graph"))
        return cmd_dump_graph(argc - 2, argv + 2);
    if (!strcmp(cmd, "detect"))
        return cmd_detect(argc - 2, argv + 2);
    if (!strcmp(cmd, "coldstart"))
        return cmd_coldstart(argc - 2, argv + 2);
    if (!strcmp(cmd, "cache"))
        return cmd_cache(argc - 2, argv + 2);
    fprintf(stderr,
            "regc: unknown command \"%s\" (commands: train, dump-graph, detect, coldstart, cache, version; see regc "
            "--help)\n",
            cmd);
    return EXIT_USAGE;
}
