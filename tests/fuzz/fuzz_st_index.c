/* fuzz_st_index.c — a sharded checkpoint's model.safetensors.index.json
 * (models/weights.c) on arbitrary bytes, checked against the parameters of
 * a small GPT-2 (the gpt2-tiny preset): the weight_map's shape, the file
 * each parameter names (it must stay inside the directory) and entries no
 * parameter reads. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "model_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static regc_model *model;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the model is input-independent: loaded once, kept for the run */
    if (!model && regc_model_load_shapes("gpt2-tiny", &model) != REGC_OK)
        abort();
    int n = regc_model_n_params(model);
    char **files = calloc((size_t)n + 1, sizeof *files);
    if (!files)
        abort();
    /* an index naming the first moments is read under their prefix, as a
     * checkpoint's optimizer file holds each moment under its own */
    char *text = fuzz_text(data, size);
    const char *prefix = strstr(text, "\"exp_avg.") ? "exp_avg." : "";
    free(text);
    int rc = regc_weights_parse_index(model, (const char *)data, size, "index.json", prefix, files);
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
        for (int i = 0; i < n; i++)
            if (files[i])
                abort(); /* a failure leaves no names behind */
    } else {
        for (int i = 0; i < n; i++) {
            if (!files[i] || !files[i][0] || files[i][0] == '/')
                abort(); /* every parameter has a file inside the directory */
            free(files[i]);
        }
    }
    free(files);
    return 0;
}
