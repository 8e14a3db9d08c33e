/* fuzz_hf_config.c — a Hugging Face config.json (models/model_load.c and the
 * config readers of every architecture), on arbitrary bytes: parsed into a
 * shape-only model, described, written back, and its forward graph built
 * at a small batch and sequence. */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_util.h"
#include "model_internal.h"
#include "regc_graph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    regc_model *m = NULL;
    int rc = regc_model_config_parse((const char *)data, size, "config.json", "model", &m);
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
        if (m)
            abort(); /* a failure leaves no model behind */
        return 0;
    }
    char line[2048];
    regc_model_describe(m, line, sizeof line);
    cJSON *cfg = m->arch->write_config(m);
    cJSON_Delete(cfg);
    /* a graph costs time in proportion to the layers: build the small ones */
    if (regc_model_n_params(m) <= 400) {
        int64_t seq = regc_model_max_seq(m) < 4 ? regc_model_max_seq(m) : 4;
        regc_graph *g = NULL;
        if (regc_model_build_graph(m, 2, seq, &g) == REGC_OK)
            regc_graph_free(g);
        else
            regc_error_clear();
    }
    regc_model_free(m);
    return 0;
}
