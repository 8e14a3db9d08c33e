/* test_config_keys.c — every architecture's table of config.json keys
 * (models/model_load.c checks a file against it), key by key: an applied
 * key's bad value refused by name, an inert key accepted with any value, a
 * refused key refused (and accepted at its neutral value), a key no table
 * names refused, and a model_type that is no string refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "regc_models.h"
#include "test_model.h"
#include "test_util.h"

static int setup(void **state) { return regc_test_dir_setup(state, "config-keys", "model"); }

/* A small config.json of any architecture, extra keys replacing its own. */
static void write_any_config(regc_test_dir *f, const char *type, const char *extra)
{
    static const char *const gpt2[][2] = {{"vocab_size", "64"},
                                          {"n_positions", "16"},
                                          {"n_embd", "24"},
                                          {"n_layer", "2"},
                                          {"n_head", "4"}};
    static const char *const bert[][2] = {
        {"vocab_size", "64"},        {"hidden_size", "24"},
        {"num_hidden_layers", "2"},  {"num_attention_heads", "4"},
        {"intermediate_size", "40"}, {"max_position_embeddings", "16"},
        {"type_vocab_size", "2"}};
    static const char *const t5[][2] = {{"vocab_size", "64"}, {"d_model", "24"},
                                        {"d_kv", "6"},        {"d_ff", "40"},
                                        {"num_layers", "2"},  {"num_heads", "4"}};
    /* StableLM's: half of each head of 4 rotated (its default quarter is 1) */
    static const char *const stablelm[][2] = {{"vocab_size", "64"},
                                              {"hidden_size", "24"},
                                              {"intermediate_size", "40"},
                                              {"num_hidden_layers", "3"},
                                              {"num_attention_heads", "6"},
                                              {"num_key_value_heads", "2"},
                                              {"max_position_embeddings", "16"},
                                              {"partial_rotary_factor", "0.5"}};
    /* no num_key_value_heads: GPT-NeoX's heads are all alike */
    static const char *const gpt_neox[][2] = {
        {"vocab_size", "64"},         {"hidden_size", "24"},
        {"intermediate_size", "40"},  {"num_hidden_layers", "2"},
        {"num_attention_heads", "3"}, {"max_position_embeddings", "16"}};
    char head[96];
    snprintf(head, sizeof head, "\"model_type\": \"%s\"", type);
    if (!strcmp(type, "gpt2"))
        regc_test_write_config(f->path, head, gpt2, sizeof gpt2 / sizeof *gpt2, extra, NULL);
    else if (!strcmp(type, "bert"))
        regc_test_write_config(f->path, head, bert, sizeof bert / sizeof *bert, extra, NULL);
    else if (!strcmp(type, "t5"))
        regc_test_write_config(f->path, head, t5, sizeof t5 / sizeof *t5, extra, NULL);
    else if (!strcmp(type, "stablelm"))
        regc_test_write_config(f->path, head, stablelm, sizeof stablelm / sizeof *stablelm, extra,
                               NULL);
    else if (!strcmp(type, "gpt_neox"))
        regc_test_write_config(f->path, head, gpt_neox, sizeof gpt_neox / sizeof *gpt_neox, extra,
                               NULL);
    else /* Llama and its relatives */
        regc_test_write_decoder_config(f->path, type, extra, NULL);
}

/* An earlier table names key too (an architecture's own entry comes
 * before the shared one's and wins). */
static int shadowed(const regc_config_key *const *tables, int t, const char *key)
{
    for (int u = 0; u < t; u++)
        for (const regc_config_key *k = tables[u]; k->key; k++)
            if (!strcmp(k->key, key))
                return 1;
    return 0;
}

/* Every key of every architecture's table, as the table says; and a key no
 * table names. A value no key accepts ([[]]) must be refused naming an
 * applied key, and accepted for an inert one. */
static void test_key_tables(void **state)
{
    regc_test_dir *f = *state;
    int checked = 0;
    for (int a = 0; regc_model_type_name(a); a++) {
        const char *type = regc_model_type_name(a);
        const regc_config_key *tables[8];
        if (regc_model_config_keys(type, tables, 8) == 0)
            continue;
        for (int t = 0; tables[t]; t++) {
            for (const regc_config_key *k = tables[t]; k->key; k++) {
                if (shadowed(tables, t, k->key))
                    continue;
                char extra[256];
                snprintf(extra, sizeof extra, "\"%s\": [[]]", k->key);
                write_any_config(f, type, extra);
                if (!strcmp(k->key, "model_type"))
                    continue; /* the file's dispatch key: tested below */
                regc_model *m = NULL;
                const int rc = regc_model_load_config(f->path, &m);
                char quoted[128];
                snprintf(quoted, sizeof quoted, "\"%s", k->key);
                if (k->use == REGC_KEY_INERT) {
                    if (rc != REGC_OK)
                        fail_msg("%s: inert key %s refused: %s", type, k->key,
                                 regc_error_message());
                    regc_model_free(m);
                } else if (rc == REGC_OK || !strstr(regc_error_message(), quoted)) {
                    fail_msg("%s: key %s with [[]]: %s", type, k->key,
                             rc == REGC_OK ? "accepted" : regc_error_message());
                }
                if (k->use == REGC_KEY_REFUSED && k->neutral) {
                    snprintf(extra, sizeof extra, "\"%s\": %s", k->key, k->neutral);
                    write_any_config(f, type, extra);
                    assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
                    regc_model_free(m);
                }
                checked++;
            }
        }
        write_any_config(f, type, "\"rope_interleaved\": true");
        char want[128];
        snprintf(want, sizeof want,
                 "key \"rope_interleaved\" is not one regc knows for "
                 "model_type \"%s\"",
                 type);
        regc_test_expect_config_error(f->path, REGC_ERR_UNSUPPORTED, want);
    }
    assert_true(checked > 9 * 20);
    assert_int_equal(regc_test_write_text(f->path, "config.json", "{\"model_type\": [[]]}"), 0);
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT, "key \"model_type\" must be a string");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_key_tables, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
