/* fuzz_nf4_checkpoint.c — a checkpoint Transformers saved in 4 bits
 * (bitsandbytes NF4; models/nf4_checkpoint.c, models/weights.c,
 * models/safetensors.c): the input is its model.safetensors, read against
 * the fixed config.json of tests/data/qlora_checkpoint (a tiny Llama whose
 * linear layers but the head are NF4 with double quantisation). As
 * `regc train` does, the model is loaded from its directory, LoRA is applied
 * (which holds the linear layers in NF4) and the base's weights source is
 * opened: binding checks each quantised weight's packed bytes, .absmax,
 * .nested_absmax, .quant_map, .nested_quant_map and the
 * .quant_state.bitsandbytes__nf4 JSON. A source that opens then has every
 * parameter read: the NF4 ones as their blob and dequantised, the others as
 * fp32. A refusal must be a one-line error.
 *
 * The seed is tests/data/qlora_checkpoint/model.safetensors, which
 * tools/fuzz.sh copies into the corpus; it is larger than the other
 * harnesses' inputs, so this harness gets a larger -max_len. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "regc_graph.h"
#include "regc_models.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* tests/data/qlora_checkpoint/config.json */
static const char config_json[] = "{\n"
                                  "  \"architectures\": [\n"
                                  "    \"LlamaForCausalLM\"\n"
                                  "  ],\n"
                                  "  \"attention_bias\": false,\n"
                                  "  \"attention_dropout\": 0.0,\n"
                                  "  \"bos_token_id\": 1,\n"
                                  "  \"dtype\": \"float32\",\n"
                                  "  \"eos_token_id\": 2,\n"
                                  "  \"head_dim\": 8,\n"
                                  "  \"hidden_act\": \"silu\",\n"
                                  "  \"hidden_size\": 48,\n"
                                  "  \"initializer_range\": 0.02,\n"
                                  "  \"intermediate_size\": 100,\n"
                                  "  \"max_position_embeddings\": 16,\n"
                                  "  \"mlp_bias\": false,\n"
                                  "  \"model_type\": \"llama\",\n"
                                  "  \"num_attention_heads\": 6,\n"
                                  "  \"num_hidden_layers\": 2,\n"
                                  "  \"num_key_value_heads\": 2,\n"
                                  "  \"pad_token_id\": null,\n"
                                  "  \"pretraining_tp\": 1,\n"
                                  "  \"quantization_config\": {\n"
                                  "    \"_load_in_4bit\": true,\n"
                                  "    \"_load_in_8bit\": false,\n"
                                  "    \"bnb_4bit_compute_dtype\": \"float32\",\n"
                                  "    \"bnb_4bit_quant_storage\": \"uint8\",\n"
                                  "    \"bnb_4bit_quant_type\": \"nf4\",\n"
                                  "    \"bnb_4bit_use_double_quant\": true,\n"
                                  "    \"llm_int8_enable_fp32_cpu_offload\": false,\n"
                                  "    \"llm_int8_has_fp16_weight\": false,\n"
                                  "    \"llm_int8_skip_modules\": null,\n"
                                  "    \"llm_int8_threshold\": 6.0,\n"
                                  "    \"load_in_4bit\": true,\n"
                                  "    \"load_in_8bit\": false,\n"
                                  "    \"quant_method\": \"bitsandbytes\"\n"
                                  "  },\n"
                                  "  \"rms_norm_eps\": 1e-06,\n"
                                  "  \"rope_parameters\": {\n"
                                  "    \"rope_theta\": 10000.0,\n"
                                  "    \"rope_type\": \"default\"\n"
                                  "  },\n"
                                  "  \"tie_word_embeddings\": false,\n"
                                  "  \"transformers_version\": \"5.24.0\",\n"
                                  "  \"use_cache\": true,\n"
                                  "  \"vocab_size\": 300\n"
                                  "}\n";

static char dir[64], config_path[96], st_path[96];
static regc_model *model;

static void remove_dir(void)
{
    unlink(st_path);
    unlink(config_path);
    rmdir(dir);
}

static void write_file(const char *path, const void *bytes, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(bytes, 1, size, f) != size) || fclose(f) != 0)
        abort();
}

/* The model, once: its directory with config.json, loaded as `regc train
 * --model DIR --lora-r 4` loads it (the checkpoint's quantization_config
 * implies load_in_4bit). */
static void setup(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/regc-fuzz-nf4-XXXXXX", tmp && strlen(tmp) < 32 ? tmp : "/tmp");
    if (!mkdtemp(dir))
        abort();
    snprintf(config_path, sizeof config_path, "%s/config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    atexit(remove_dir);
    write_file(config_path, config_json, sizeof config_json - 1);
    regc_lora_config c = {.r = 4, .target_modules = "q_proj", .load_in_4bit = 1};
    if (regc_model_load_shapes(dir, &model) != REGC_OK || !regc_model_checkpoint_nf4(model) ||
        regc_model_add_lora(model, &c) != REGC_OK) {
        fprintf(stderr, "fuzz: %s\n", regc_error_message());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!model)
        setup();
    write_file(st_path, data, size);
    regc_weights *w = NULL;
    int rc = regc_weights_open(model, dir, "", &w);
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
        if (w)
            abort(); /* a failure leaves no source behind */
        return 0;
    }
    for (int i = 0; i < regc_model_n_params(model); i++) {
        const int64_t n = regc_model_param_numel(model, i);
        float *x = malloc((size_t)n * sizeof *x + 1);
        if (!x)
            abort();
        if (regc_weights_is_nf4(w, i)) {
            uint8_t *blob = malloc((size_t)regc_frozen_kind_bytes(REGC_FROZEN_NF4, n));
            if (!blob)
                abort();
            if ((rc = regc_weights_read_nf4(w, i, blob)) != REGC_OK)
                fuzz_check_failure(rc);
            free(blob);
        }
        /* whole, then a range from the middle (an NF4 one is dequantised) */
        if ((rc = regc_weights_read(w, i, 0, n, x)) != REGC_OK)
            fuzz_check_failure(rc);
        if ((rc = regc_weights_read(w, i, n / 2, n - n / 2, x)) != REGC_OK)
            fuzz_check_failure(rc);
        free(x);
    }
    regc_weights_close(w);
    return 0;
}
