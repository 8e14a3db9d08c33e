/* cmd_coldstart.c — `regc coldstart`: compile time (full, regional, and
 * regional from a warm compile cache) and first steps against depth. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "regc_train.h"

void print_coldstart_usage(FILE *f)
{
    fputs(
        "usage: regc coldstart --model <hf-dir|graph.json|preset> [options]\n"
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
        "  --precision <fp32|bf16>    compile.precision of every compile and of the training\n"
        "                             (default fp32)\n"
        "  --level <O1|O2>            the training's compile level; O2 captures the step as\n"
        "                             CUDA graphs on a GPU, capture_ms its time (default O1)\n"
        "  --backend <name>           the training's backend: cpu, or cuda (cuda:N) where\n"
        "                             built (default cpu); setup_ms is its set-up before the\n"
        "                             first step (on cuda, cuBLASLt's for every GEMM)\n"
        "  --json                     print one JSON object per depth and mode:\n"
        "                             {\"model\", \"layers\", \"mode\" (full|regional|\n"
        "                             regional+cache), \"cache_hits\", \"cache_misses\",\n"
        "                             \"build_ms\", \"detect_ms\", \"compile_ms\", \"inline_ms\",\n"
        "                             \"total_ms\", \"total_min_ms\", \"total_max_ms\",\n"
        "                             \"setup_ms\", \"capture_ms\", \"first_step_ms\",\n"
        "                             \"step_ms\",\n"
        "                             \"peak_bytes\",\n"
        "                             \"lower_bound_bytes\", \"region_kinds\", "
        "\"region_compiles\"}\n"
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
    int mode;                     /* COLD_* */
    int cache_hits, cache_misses; /* of the last timed compile */
    double build_ms, detect_ms, compile_ms, inline_ms, total_ms, total_min, total_max;
    double setup_ms, capture_ms, first_step_ms, step_ms; /* NAN: not measured */
    int64_t peak_bytes, lower_bound_bytes;
    int region_kinds, region_compiles;
} cold_row;

typedef struct {
    const char *model, *svg, *cache_dir, *backend;
    regc_precision precision;
    regc_level level; /* the training's */
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
        return usage_error("%s: expected a comma-separated list of layer counts, got \"\"", flag);
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
                return usage_error("%s: layer count %lld appears twice in \"%s\"", flag, v, text);
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
        static const char *const valued[] = {
            "--model", "--layers",    "--repeat",  "--batch",     "--seq",   "--steps", "--threads",
            "--svg",   "--cache-dir", "--backend", "--precision", "--level", NULL};
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
        if (!strcmp(flag, "--model") || !strcmp(flag, "--svg") || !strcmp(flag, "--cache-dir") ||
            !strcmp(flag, "--backend")) {
            if (value[0] == '\0')
                return usage_error("%s: expected a non-empty value", flag);
            if (!strcmp(flag, "--model"))
                a->model = value;
            else if (!strcmp(flag, "--backend"))
                a->backend = value;
            else if (!strcmp(flag, "--cache-dir"))
                a->cache_dir = value;
            else
                a->svg = value;
        } else if (!strcmp(flag, "--level")) {
            const int l = regc_level_from_name(value);
            if (l != REGC_LEVEL_O1 && l != REGC_LEVEL_O2)
                return usage_error("%s: expected O1 or O2, got \"%s\"", flag, value);
            a->level = (regc_level)l;
        } else if (!strcmp(flag, "--precision")) {
            const int p = regc_precision_from_name(value);
            if (p < 0)
                return usage_error("%s: expected fp32 or bf16, got \"%s\"", flag, value);
            a->precision = (regc_precision)p;
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
    double setup_ms;   /* before the first step */
    double capture_ms; /* O2: capturing the step, over the steps */
} cold_steps;

static void cold_on_step(const regc_step_report *r, void *user)
{
    cold_steps *s = user;
    if (s->n == 0)
        s->setup_ms = r->setup_ms;
    s->capture_ms += r->capture_ms;
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
    o.precision = a->precision;
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
        o.backend = a->backend;
        o.compile.level = a->level;
        o.compile.precision = a->precision;
        o.compile.regional = row->mode != COLD_FULL;
        o.cache_dir = row->mode == COLD_CACHED ? cache_dir : NULL;
        rc = regc_train(m, &o, cold_on_step, &s, NULL);
    }
    if (rc == REGC_OK && s.n == s.cap) {
        row->setup_ms = s.setup_ms;
        row->capture_ms = s.capture_ms > 0.0 ? s.capture_ms : NAN;
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
    char su[48], fs[48], sm[48], cm[48];
    cold_num(su, sizeof su, r->setup_ms, "%.6g");
    cold_num(cm, sizeof cm, r->capture_ms, "%.6g");
    cold_num(fs, sizeof fs, r->first_step_ms, "%.6g");
    cold_num(sm, sizeof sm, r->step_ms, "%.6g");
    /* The model name through cJSON: a path may hold quotes or backslashes. */
    cJSON *name = cJSON_CreateString(model);
    char *quoted = name ? cJSON_PrintUnformatted(name) : NULL;
    cJSON_Delete(name);
    if (!quoted)
        return regc_error(REGC_ERR_MEMORY, "out of memory writing JSON");
    int n = printf(
        "{\"model\": %s, \"layers\": %lld, \"mode\": \"%s\", \"build_ms\": %s, "
        "\"detect_ms\": %s, \"compile_ms\": %s, \"inline_ms\": %s, \"total_ms\": %s, "
        "\"total_min_ms\": %s, \"total_max_ms\": %s, \"setup_ms\": %s, \"capture_ms\": %s, "
        "\"first_step_ms\": %s, "
        "\"step_ms\": %s, \"peak_bytes\": %lld, \"lower_bound_bytes\": %lld, "
        "\"region_kinds\": %d, \"region_compiles\": %d, \"cache_hits\": %d, "
        "\"cache_misses\": %d}\n",
        quoted, (long long)r->layers, cold_mode_name[r->mode], b[0], b[1], b[2], b[3], b[4], b[5],
        b[6], su, cm, fs, sm, (long long)r->peak_bytes, (long long)r->lower_bound_bytes,
        r->region_kinds, r->region_compiles, r->cache_hits, r->cache_misses);
    free(quoted);
    if (n < 0 || fflush(stdout) != 0)
        return regc_error(REGC_ERR_IO, "writing to standard output failed");
    return REGC_OK;
}

static void cold_print_header(void)
{
    printf("%-12s %6s %-14s %9s %10s %9s %10s %21s %8s %9s %10s %9s %9s %9s\n", "model", "layers",
           "mode", "detect_ms", "compile_ms", "inline_ms", "total_ms", "total min..max", "compiles",
           "setup_ms", "first_step", "step_ms", "peak_MiB", "bound_MiB");
}

static int cold_print_row(const char *model, const cold_row *r)
{
    char spread[48], su[32], fs[32], sm[32];
    snprintf(spread, sizeof spread, "%.1f..%.1f", r->total_min, r->total_max);
    cold_num(su, sizeof su, r->setup_ms, "%.1f");
    cold_num(fs, sizeof fs, r->first_step_ms, "%.1f");
    cold_num(sm, sizeof sm, r->step_ms, "%.1f");
    int n =
        printf("%-12s %6lld %-14s %9.1f %10.1f %9.1f %10.1f %21s %8d %9s %10s %9s %9.1f %9.1f\n",
               model, (long long)r->layers, cold_mode_name[r->mode], r->detect_ms, r->compile_ms,
               r->inline_ms, r->total_ms, spread, r->region_compiles, su, fs, sm,
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
static int cold_svg(const char *model, const cold_row *rows, int n_rows, char **out, size_t *len)
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

int cmd_coldstart(int argc, char **argv)
{
    usage_cmd = "regc coldstart";
    cold_args a = {.layers = {12, 24, 48, 96},
                   .n_layers = 4,
                   .repeat = 5,
                   .batch = 4,
                   .seq = 64,
                   .steps = 3,
                   .level = REGC_LEVEL_O1,
                   .backend = "cpu"};
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
        snprintf(temp_dir, sizeof temp_dir, "%s/regc-coldstart-XXXXXX",
                 tmp && tmp[0] ? tmp : "/tmp");
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
            row->setup_ms = row->capture_ms = row->first_step_ms = row->step_ms = NAN;
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
    return exit_code(rc);
}
