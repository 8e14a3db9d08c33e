/* fuzz_graph_json.c — the graph JSON reader (graph/graph_json.c with the
 * shape rules of graph/graph.c) and the graph model loader on top of it
 * (models/graph_model.c), on arbitrary bytes.
 *
 * Besides memory and undefined-behaviour errors it checks the reader's
 * round-trip promise: a graph it accepts writes JSON that reads back to
 * the same text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "model_internal.h"
#include "regc_graph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    regc_graph *g = NULL;
    int rc = regc_graph_from_json(text, "graph.json", &g);
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
    } else {
        char *once = regc_graph_to_json(g);
        regc_graph *back = NULL;
        if (!once || regc_graph_from_json(once, "round trip", &back) != REGC_OK)
            abort();
        char *twice = regc_graph_to_json(back);
        if (!twice || strcmp(once, twice) != 0)
            abort();
        free(once), free(twice);
        regc_graph_free(back);
        regc_graph_free(g);
    }

    regc_model *m = NULL;
    if (regc_model_new(&regc_arch_graph, "graph.json", &m) != REGC_OK)
        abort();
    rc = regc_graph_model_parse(m, text, "graph.json");
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
    } else {
        char line[1024];
        regc_model_describe(m, line, sizeof line);
        regc_graph *built = NULL;
        if (regc_model_build_graph(m, 1, 1, &built) == REGC_OK)
            regc_graph_free(built);
        regc_error_clear();
    }
    regc_model_free(m);
    free(text);
    return 0;
}
