/* cmd_merge.c — `regc merge`: a PEFT LoRA adapter merged into its base, as
 * PEFT's merge_and_unload does (W += alpha / r * B A on every adapted layer,
 * in fp32), written as a plain model directory that trains or loads without
 * PEFT, each tensor in the dtype the base stored it in. A graph JSON model
 * (an export) takes its weights from --weights, as regc train does, and is
 * written as regc train --save writes one: graph.json, and model.safetensors
 * with the merged parameters under their own names and the constants. */
#include <stdlib.h>
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "regc_models.h"

void print_merge_usage(FILE *f)
{
    fputs("usage: regc merge --model <hf-dir|graph.json> [--weights <file|dir>] --adapter <dir>\n"
          "                  --save <dir>\n"
          "\n"
          "Merge a LoRA adapter (PEFT's adapter_config.json and adapter_model.safetensors, as\n"
          "`regc train --save` writes them under LoRA) into its base model and write the\n"
          "merged model: config.json (graph.json for a graph model) and model.safetensors,\n"
          "each tensor in the base's dtype.\n"
          "\n"
          "options:\n"
          "  --model <dir>     the base: a Hugging Face directory, or a graph JSON model\n"
          "  --weights <path>  a graph model's weights (a safetensors file, or the directory of\n"
          "                    the checkpoint it was exported from), as regc train takes them\n"
          "  --adapter <dir>   the adapter\n"
          "  --save <dir>      where the merged model goes (appears whole or not at all)\n",
          f);
}

int cmd_merge(int argc, char **argv)
{
    const char *model = NULL, *weights = NULL, *adapter = NULL, *save = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            print_merge_usage(stdout);
            return 0;
        }
        char flag[64];
        const char *value = split_flag(argc, argv, i, flag, sizeof flag);
        if (strncmp(argv[i], "--", 2) != 0)
            return usage_error("unexpected argument \"%s\" (see regc merge --help)", argv[i]);
        if (!value)
            return usage_error("%s needs a value (see regc merge --help)", flag);
        if (!strchr(argv[i], '='))
            i++;
        if (!strcmp(flag, "--model"))
            model = value;
        else if (!strcmp(flag, "--weights"))
            weights = value;
        else if (!strcmp(flag, "--adapter"))
            adapter = value;
        else if (!strcmp(flag, "--save"))
            save = value;
        else
            return usage_error("unknown option %s (see regc merge --help)", flag);
    }
    if (!model || !adapter || !save)
        return usage_error("--model, --adapter and --save are all required (see regc merge "
                           "--help)");
    regc_model *m = NULL;
    regc_weights *w = NULL;
    regc_dtype *dtype = NULL; /* the base's, per parameter */
    regc_lora_config c;
    char targets[1024], what[600];
    int rc = regc_model_load_shapes(model, &m);
    const int graph = rc == REGC_OK && !strcmp(regc_model_arch(m), "graph");
    if (rc == REGC_OK && graph && !weights)
        rc = regc_error(REGC_ERR_ARG,
                        "%s: a graph JSON model's weights are a file of their own: give --weights",
                        model);
    else if (rc == REGC_OK && !graph && weights) {
        const char *arch = regc_model_arch(m); /* the architecture table's, not m's */
        regc_model_free(m);
        return usage_error("--weights applies to graph JSON models only (%s is a %s model)", model,
                           arch);
    }
    if (rc == REGC_OK &&
        (rc = regc_lora_read_config(adapter, &c, targets, sizeof targets)) == REGC_OK)
        rc = regc_model_add_lora(m, &c);
    if (rc == REGC_OK)
        regc_lora_describe(m, what, sizeof what);
    if (rc == REGC_OK && (rc = regc_weights_open(m, graph ? weights : model, "", &w)) == REGC_OK &&
        (rc = regc_model_read_weights(m, w)) == REGC_OK && regc_model_n_constants(m) > 0)
        rc = regc_model_read_constants(m, w); /* written back beside the parameters */
    const int n = rc == REGC_OK ? regc_model_n_params(m) : 0;
    if (rc == REGC_OK && !(dtype = malloc((size_t)n * sizeof *dtype + 1)))
        rc = regc_error(REGC_ERR_MEMORY, "out of memory");
    for (int i = 0; i < n && dtype; i++)
        dtype[i] = regc_weights_dtype(w, i);
    regc_weights_close(w);
    if (rc == REGC_OK)
        rc = regc_model_merge_lora(m); /* the base's parameters, first, in order */
    if (rc == REGC_OK)
        rc = regc_model_save_as(m, save, dtype);
    free(dtype);
    regc_model_free(m);
    if (rc) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        return EXIT_ERROR;
    }
    printf("merged %s into %s: %s\n", what, model, save);
    return 0;
}
