/* cmd_graph.c — `regc dump-graph` and `regc detect`: the commands that
 * build a model's flat graph from shapes and show it or its layers. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "regc_detect.h"
#include "regc_models.h"

/* ---- regc dump-graph ---------------------------------------------------- */

void print_dump_graph_usage(FILE *f)
{
    fputs("usage: regc dump-graph --model <hf-dir|graph.json|preset> --out <FILE> [options]\n"
          "       regc dump-graph --model <hf-dir|preset> --save <DIR> [options]\n"
          "\n"
          "Write a model's flat forward graph (data inputs input_ids and targets; constant\n"
          "inputs such as position_ids, rotary tables and position buckets; one parameter\n"
          "tensor per model parameter; ending in the mean cross-entropy loss) as regc graph\n"
          "JSON. Shapes only: no weights are read or allocated, so any model size dumps\n"
          "instantly. `regc train --model FILE` trains it given --weights that hold its\n"
          "parameters and constants, which --save writes.\n"
          "\n"
          "--save writes the model as a graph model instead: DIR/graph.json and\n"
          "DIR/model.safetensors, which holds the parameters (the directory's weights, or\n"
          "the random init from --seed) and the constants' values, so that\n"
          "`regc train --model DIR/graph.json --weights DIR/model.safetensors` trains it\n"
          "with no architecture code.\n"
          "\n"
          "options:\n"
          "  --model <dir|file|preset>  Hugging Face directory (only config.json is read,\n"
          "                             and its weights with --save), a regc graph JSON\n"
          "                             file (not with --save: it is a graph model\n"
          "                             already), or a built-in preset\n"
          "  --batch <B>                sequences in the graph's batch, >= 1 (default 4)\n"
          "  --seq <T>                  tokens per sequence, >= 1 (default 64)\n"
          "  --out <FILE>               where to write the graph; replaced atomically\n"
          "  --save <DIR>               write the graph model (graph and weights) into DIR\n"
          "  --seed <S>                 with --save, the random init of a model without\n"
          "                             weights (default 1337, as regc train)\n"
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
    const char *save; /* dump-graph --save */
    long long batch, seq, seed;
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
        int is_save = want_out && !strcmp(flag, "--save");
        int is_seed = want_out && !strcmp(flag, "--seed");
        if (!is_model && !is_out && !is_batch && !is_seq && !is_save && !is_seed) {
            if (!strcmp(flag, switch_name) || !strcmp(flag, "--help"))
                return usage_error("%s takes no value", flag);
            return usage_error("unknown option %s (see regc %s --help)", flag, cmd);
        }
        if (!value)
            return usage_error("%s: missing value", flag);
        if (!strchr(arg, '=')) /* the value was the next argument */
            i++;
        if ((is_model || is_out || is_save) && value[0] == '\0')
            return usage_error("%s: expected a non-empty value", flag);
        if (is_model)
            f->model = value;
        else if (is_out)
            f->out = value;
        else if (is_save)
            f->save = value;
        else if (is_seed) {
            if (parse_int(flag, value, 0, INT64_MAX, "a non-negative integer", &f->seed))
                return EXIT_USAGE;
        } else if (parse_int(flag, value, 1, INT32_MAX, "a positive integer",
                             is_batch ? &f->batch : &f->seq))
            return EXIT_USAGE;
    }
    if (!f->model)
        return usage_error("--model is required (see regc %s --help)", cmd);
    if (want_out && !f->out && !f->save)
        return usage_error("--out or --save is required (see regc %s --help)", cmd);
    return -1;
}

/* The model as a graph model in dir: its weights (or the init from seed)
 * and its constants beside graph.json. */
static int save_graph_model(const char *spec, long long batch, long long seq, long long seed,
                            const char *dir)
{
    regc_model *model = NULL, *gm = NULL;
    int rc = regc_model_load(spec, &model);
    if (rc == REGC_OK && !regc_model_has_weights(model))
        rc = regc_model_init_random(model, (uint64_t)seed);
    if (rc == REGC_OK)
        rc = regc_model_as_graph(model, batch, seq, &gm);
    if (rc == REGC_OK)
        rc = regc_model_save(gm, dir);
    regc_model_free(gm);
    regc_model_free(model);
    return rc;
}

int cmd_dump_graph(int argc, char **argv)
{
    usage_cmd = "regc dump-graph";
    graph_flags f = {.batch = 4, .seq = 64, .seed = 1337};
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
    int rc = REGC_OK;
    if (out_path) {
        rc = regc_model_load_shapes(model_spec, &model);
        if (rc == REGC_OK)
            rc = regc_model_build_graph(model, batch, seq, &g);
        if (rc == REGC_OK)
            rc = graph_text(g, text, &buf, &len);
        if (rc == REGC_OK)
            rc = regc_file_write_atomic(out_path, buf, len);
    }
    if (rc == REGC_OK && f.save)
        rc = save_graph_model(model_spec, batch, seq, f.seed, f.save);
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

void print_detect_usage(FILE *f)
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
        ok =
            ok && cJSON_AddNumberToObject(e, "params_per_instance", (double)r->params_per_instance);
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

int cmd_detect(int argc, char **argv)
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
    return exit_code(rc);
}
