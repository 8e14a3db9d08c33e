/* test_documents.c — documents packed in a token file (train.eod_token_id)
 * train as if each were alone, through `regc train`.
 *
 * The token file holds documents of half a row, each ending with the
 * end-of-document token. Rows of T with the documents' mask then see what
 * rows of T / 2, one document each, see: the same token pairs, summed in
 * the same flattened order by every GEMM, and attention over the same keys,
 * only at positions T / 2 further on, which RoPE's relative rotation
 * cancels up to rounding. So llama-tiny's losses agree within 2e-6 over
 * five steps, where without the mask they differ by far more. GPT-2's
 * learned positions see the offset unless train.reset_position_ids counts
 * them from each document's start; with it, gpt2-tiny's losses agree as
 * closely. train.eod_mask_loss gives the bits of a loss mask file that
 * leaves out the targets read at the end-of-document token. Regional ==
 * full, O0 == O1 and 1 == 2 threads hold bit for bit with each; a resume
 * keeps the bits and refuses a change of any of the three by its key; a
 * graph model (llama-tiny saved as one) packs with its family's bits; and
 * what they cannot apply to is refused by name. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_data.h"
#include "regc_graph.h"
#include "test_model.h"
#include "test_util.h"

#define STEPS 5
#define SEQ 32 /* a row: two documents of SEQ / 2 */
#define EOD 7

static int setup(void **state) { return regc_test_dir_setup(state, "documents", "tokens.bin"); }

/* STEPS batches of 2 rows of SEQ, and one token more, in documents of
 * SEQ / 2 that each end with EOD; no other token is EOD. */
static void write_documents(const regc_test_dir *f)
{
    const int n = STEPS * 2 * SEQ + 1;
    uint16_t *t = malloc((size_t)n * sizeof *t);
    assert_non_null(t);
    for (int i = 0; i < n; i++)
        t[i] = (uint16_t)(i % (SEQ / 2) == SEQ / 2 - 1 ? EOD : 8 + (i * 37 + 11) % 240);
    assert_int_equal(regc_tokens_write(f->path, t, n), 0);
    free(t);
}

/* Beside write_documents' file: a loss mask that leaves out each target
 * read at EOD, as train.eod_mask_loss does. */
static char *write_eod_mask(const regc_test_dir *f)
{
    const int n = STEPS * 2 * SEQ + 1;
    uint8_t *m = malloc((size_t)n);
    assert_non_null(m);
    for (int i = 0; i < n; i++) /* token i is read at i - 1 */
        m[i] = i > 0 && (i - 1) % (SEQ / 2) == SEQ / 2 - 1 ? 0 : 1;
    char *path = regc_test_join(f->dir, "eod.mask.bin");
    assert_int_equal(regc_tokens_write_mask(path, m, n), 0);
    free(m);
    return path;
}

/* regc train on model over the file at [batch, seq] with more flags
 * (NULL-terminated): its STEPS losses. */
static void train(const regc_test_dir *f, const char *model, const char *batch, const char *seq,
                  double *loss, ...)
{
    const char *const args[] = {"--model", model,   "--data", f->path, "--steps", "5", "--batch",
                                batch,     "--seq", seq,      "--lr",  "1e-3",    NULL};
    va_list ap;
    va_start(ap, loss);
    assert_int_equal(regc_test_train_losses_v(loss, STEPS, args, ap), STEPS);
    va_end(ap);
}

static double largest_gap(const double *a, const double *b)
{
    double gap = 0.0;
    for (int s = 0; s < STEPS; s++) {
        const double g = fabs(a[s] - b[s]) / fabs(b[s]);
        gap = g > gap ? g : gap;
    }
    return gap;
}

/* Packed rows trained with a setting (packed) against rows of one document
 * (separate) and packed rows without it (without): within 2e-6 with it,
 * and far enough without that the check could fail. */
static void expect_as_separate(const char *model, const char *setting, const double *packed,
                               const double *separate, const double *without)
{
    const double gap = largest_gap(packed, separate), off = largest_gap(without, separate);
    printf("%s, packed vs separate: %.3g relative; without %s %.3g\n", model, gap, setting, off);
    if (!(gap <= 2e-6))
        fail_msg("%s: packed rows with %s are %.3g away from separate documents", model, setting,
                 gap);
    if (!(off > 100 * 2e-6))
        fail_msg("%s: without %s packed rows are only %.3g away: the check could not fail", model,
                 setting, off);
}

static void test_packed_rows_train_as_separate_documents(void **state)
{
    regc_test_dir *f = *state;
    write_documents(f);
    double packed[STEPS], separate[STEPS], unmasked[STEPS];
    train(f, "llama-tiny", "2", "32", packed, "--eod-token-id", "7", NULL);
    train(f, "llama-tiny", "4", "16", separate, NULL);
    train(f, "llama-tiny", "2", "32", unmasked, NULL);
    expect_as_separate("llama-tiny", "the documents' mask", packed, separate, unmasked);
}

/* GPT-2's positions are learned: packed rows see their documents at the
 * row's positions unless they count from each document's start. */
static void test_reset_positions_train_gpt2_as_separate_documents(void **state)
{
    regc_test_dir *f = *state;
    write_documents(f);
    double packed[STEPS], separate[STEPS], offset[STEPS];
    train(f, "gpt2-tiny", "2", "32", packed, "--eod-token-id", "7", "--reset-position-ids", "on",
          NULL);
    train(f, "gpt2-tiny", "4", "16", separate, NULL);
    train(f, "gpt2-tiny", "2", "32", offset, "--eod-token-id", "7", NULL);
    expect_as_separate("gpt2-tiny", "positions reset", packed, separate, offset);
}

/* train.eod_mask_loss is the loss mask that leaves out the targets read at
 * EOD, bit for bit; without either, the loss differs. */
static void test_eod_mask_loss_is_a_loss_mask(void **state)
{
    regc_test_dir *f = *state;
    write_documents(f);
    char *mask = write_eod_mask(f);
    double switched[STEPS], masked[STEPS], all[STEPS];
    train(f, "llama-tiny", "2", "32", switched, "--eod-token-id", "7", "--eod-mask-loss", "on",
          NULL);
    train(f, "llama-tiny", "2", "32", masked, "--eod-token-id", "7", "--loss-mask", mask, NULL);
    train(f, "llama-tiny", "2", "32", all, "--eod-token-id", "7", NULL);
    if (memcmp(switched, masked, sizeof masked))
        fail_msg("eod_mask_loss: first loss %.9g, the loss mask's %.9g", switched[0], masked[0]);
    if (!memcmp(switched, all, sizeof all))
        fail_msg("eod_mask_loss changed nothing: the check could not fail");
    free(mask);
}

static void test_documents_keep_the_invariants(void **state)
{
    regc_test_dir *f = *state;
    write_documents(f);
    static const char *const runs[][3] = {{"llama-tiny", "--eod-mask-loss", "on"},
                                          {"gpt2-tiny", "--reset-position-ids", "on"}};
    static const char *const variants[][2] = {
        {"--regional", "off"}, {"--level", "O0"}, {"--threads", "1"}};
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        double want[STEPS], got[STEPS];
        train(f, runs[r][0], "2", "32", want, "--eod-token-id", "7", runs[r][1], runs[r][2],
              "--threads", "2", NULL);
        for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
            train(f, runs[r][0], "2", "32", got, "--eod-token-id", "7", runs[r][1], runs[r][2],
                  variants[v][0], variants[v][1], NULL);
            if (memcmp(want, got, sizeof want))
                fail_msg("%s %s %s, %s %s: step losses differ from the default run's", runs[r][0],
                         runs[r][1], runs[r][2], variants[v][0], variants[v][1]);
        }
    }
}

/* A run resumed from its checkpoint goes on with the bits of one that never
 * stopped; a resume that would change the documents is refused by key. */
static void test_documents_resume(void **state)
{
    regc_test_dir *f = *state;
    write_documents(f);
    char *out = regc_test_join(f->dir, "out"), *ck = regc_test_join(out, "checkpoint-2");
    double whole[STEPS], resumed[STEPS];
    train(f, "gpt2-tiny", "2", "32", whole, "--eod-token-id", "7", "--reset-position-ids", "on",
          "--eod-mask-loss", "on", "--output-dir", out, "--save-steps", "2", NULL);
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--data", f->path,
                                        "--steps", "5", "--batch", "2", "--seq", "32", "--json",
                                        "--lr", "1e-3", "--no-cache", "--eod-token-id", "7",
                                        "--reset-position-ids", "on", "--eod-mask-loss", "on",
                                        "--resume-from-checkpoint", ck, NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, resumed, STEPS), STEPS - 2);
    regc_test_proc_free(&p);
    if (memcmp(resumed, whole + 2, (STEPS - 2) * sizeof(double)))
        fail_msg("the resumed run's losses differ from the whole run's");
    /* each setting changed alone, the others as the checkpoint has them */
    static const char *const changed[][5] = {
        {"--eod-token-id", "-1", "off", "off",
         "train.eod_token_id is 7 in the checkpoint, -1 (none) now"},
        {"--eod-token-id", "7", "off", "on",
         "train.reset_position_ids is true in the checkpoint, false now"},
        {"--eod-token-id", "7", "on", "off",
         "train.eod_mask_loss is true in the checkpoint, false now"}};
    for (size_t i = 0; i < sizeof changed / sizeof *changed; i++) {
        regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--data", f->path, "--steps", "5",
                           "--batch", "2", "--seq", "32", changed[i][0], changed[i][1],
                           "--reset-position-ids", changed[i][2], "--eod-mask-loss", changed[i][3],
                           "--resume-from-checkpoint", ck, NULL);
        if (p.status != 1 || !strstr(p.err, changed[i][4]) || !strstr(p.err, "trainer_state.json"))
            fail_msg("a resume with %s %s --reset-position-ids %s --eod-mask-loss %s: exit %d, "
                     "not the refusal \"%s\":\n%s",
                     changed[i][0], changed[i][1], changed[i][2], changed[i][3], p.status,
                     changed[i][4], p.err);
        regc_test_proc_free(&p);
    }
    free(out), free(ck);
}

/* The doc_start of tiny_attention_graph's attention. */
enum { NO_DOCS, DOCS_INPUT, DOCS_CONSTANT };

/* A graph JSON model of one attention, causal or not, reading a doc_start
 * that is a data input, a constant or none, with an unread
 * decoder_input_ids or not (a graph of vocabulary 64), saved as dir/name;
 * beside it small.bin, tokens it can read. */
static char *tiny_attention_graph(const regc_test_dir *f, const char *name, int causal, int doc,
                                  int decoder)
{
    regc_graph *g = regc_graph_new();
    const int64_t bt[2] = {2, 16}, table[2] = {64, 8}, cols[2] = {64, 8};
    int ids = regc_graph_add_tensor(g, "input_ids", REGC_I32, REGC_ROLE_INPUT, 2, bt);
    int targets = regc_graph_add_tensor(g, "targets", REGC_I32, REGC_ROLE_INPUT, 2, bt);
    if (decoder)
        regc_graph_add_tensor(g, "decoder_input_ids", REGC_I32, REGC_ROLE_INPUT, 2, bt);
    int docs = doc == DOCS_INPUT
                   ? regc_graph_add_tensor(g, "doc_start", REGC_I32, REGC_ROLE_INPUT, 2, bt)
               : doc == DOCS_CONSTANT ? regc_graph_add_constant(g, "doc_start", REGC_I32, 2, bt)
                                      : -1;
    int wte = regc_graph_add_tensor(g, "wte", REGC_F32, REGC_ROLE_PARAM, 2, table);
    int head = regc_graph_add_tensor(g, "head", REGC_F32, REGC_ROLE_PARAM, 2, cols);
    int x = regc_graph_embedding(g, ids, wte); /* [2, 16, 8] */
    const regc_attrs a = {.n_head = 2, .n_kv_head = 2, .causal = causal, .scale = 0.5f};
    int h = regc_graph_attention_full(g, x, x, x, -1, -1, -1, docs, &a); /* [2, 16, 8] */
    int logits = regc_graph_matmul(g, h, head, 0, 1);                    /* [2, 16, 64] */
    assert_int_equal(regc_graph_mark_output(g, regc_graph_cross_entropy(g, logits, targets)),
                     REGC_OK);
    char *json = regc_graph_to_json(g);
    assert_non_null(json);
    assert_int_equal(regc_test_write_text(f->dir, name, json), 0);
    free(json);
    regc_graph_free(g);
    uint16_t t[2 * 16 * 3 + 1];
    for (int i = 0; i < (int)(sizeof t / sizeof *t); i++)
        t[i] = (uint16_t)(i % 60);
    char *small = regc_test_join(f->dir, "small.bin");
    assert_int_equal(regc_tokens_write(small, t, sizeof t / sizeof *t), REGC_OK);
    free(small);
    return regc_test_join(f->dir, name);
}

/* A graph model given train.eod_token_id: its causal attention reads the
 * documents' starts, so llama-tiny saved as a graph model trains packed
 * rows with the bits of llama-tiny itself, under eod_mask_loss too; without
 * the setting it gives other losses. */
static void test_graph_model_packs_as_its_family(void **state)
{
    regc_test_dir *f = *state;
    write_documents(f);
    char *dir = regc_test_join(f->dir, "graph");
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "dump-graph", "--model", "llama-tiny", "--batch", "2",
                                        "--seq", "32", "--save", dir, NULL),
                     0);
    regc_test_proc_free(&p);
    char *graph = regc_test_join(dir, "graph.json"),
         *weights = regc_test_join(dir, "model.safetensors");
    double family[STEPS], packed[STEPS], plain[STEPS];
    for (int mask = 0; mask < 2; mask++) {
        const char *on = mask ? "on" : "off";
        train(f, "llama-tiny", "2", "32", family, "--eod-token-id", "7", "--eod-mask-loss", on,
              NULL);
        train(f, graph, "2", "32", packed, "--weights", weights, "--eod-token-id", "7",
              "--eod-mask-loss", on, NULL);
        if (memcmp(family, packed, sizeof family))
            fail_msg("eod_mask_loss %s: the graph model's step 0 loss %.9g, llama-tiny's %.9g", on,
                     packed[0], family[0]);
    }
    train(f, graph, "2", "32", plain, "--weights", weights, NULL);
    if (!memcmp(plain, packed, sizeof plain))
        fail_msg("without train.eod_token_id the graph model gave the packed rows' losses");
    free(dir), free(graph), free(weights);
}

/* BERT and T5 attend their own way, a graph model's positions are its
 * graph's, and an id past the vocabulary is no token: one line each. */
static void test_documents_refused(void **state)
{
    regc_test_dir *f = *state;
    char *json = regc_test_tiny_graph_json(), *graph = regc_test_join(f->dir, "graph.json");
    assert_int_equal(regc_test_write_text(f->dir, "graph.json", json), 0);
    const char *const refused[][3] = {
        {"bert-tiny", "7", "bert-tiny is a bert model"},
        {"t5-tiny", "7", "t5-tiny is a t5 model"},
        {"llama-tiny", "100000", "100000 is past the vocabulary"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        regc_test_proc p;
        regc_test_run_regc(&p, "train", "--model", refused[i][0], "--eod-token-id", refused[i][1],
                           "--steps", "1", NULL);
        regc_test_expect_one_line_error(&p, 1, "train.eod_token_id", refused[i][2]);
        regc_test_proc_free(&p);
    }
    /* the switches: without the token, and a reset of rotary positions */
    static const char *const switches[][5] = {
        {"gpt2-tiny", "-1", "--reset-position-ids", "train.reset_position_ids",
         "needs train.eod_token_id"},
        {"gpt2-tiny", "-1", "--eod-mask-loss", "train.eod_mask_loss", "needs train.eod_token_id"},
        {"llama-tiny", "7", "--reset-position-ids", "train.reset_position_ids",
         "llama-tiny's rotary positions are relative"}};
    for (size_t i = 0; i < sizeof switches / sizeof *switches; i++) {
        regc_test_proc p;
        regc_test_run_regc(&p, "train", "--model", switches[i][0], "--eod-token-id", switches[i][1],
                           switches[i][2], "on", "--steps", "1", NULL);
        regc_test_expect_one_line_error(&p, 1, switches[i][3], switches[i][4]);
        regc_test_proc_free(&p);
    }
    regc_test_proc p;
    regc_test_run_regc(&p, "train", "--model", graph, "--eod-token-id", "7", "--reset-position-ids",
                       "on", "--steps", "1", NULL);
    regc_test_expect_one_line_error(&p, 1, "train.reset_position_ids",
                                    "graph.json's positions are its graph's");
    regc_test_proc_free(&p);
    free(json), free(graph);
    /* a graph's own doc_start needs the setting; attention that is not
     * causal has no documents to keep */
    char *documents = tiny_attention_graph(f, "documents.json", 1, DOCS_INPUT, 0),
         *open = tiny_attention_graph(f, "open.json", 0, NO_DOCS, 0),
         *constant = tiny_attention_graph(f, "constant.json", 1, DOCS_CONSTANT, 0),
         *decoder = tiny_attention_graph(f, "decoder.json", 1, NO_DOCS, 1),
         *small = regc_test_join(f->dir, "small.bin");
    regc_test_run_regc(&p, "train", "--model", documents, "--data", small, "--steps", "1", NULL);
    regc_test_expect_one_line_error(&p, 1, "node 1 attends over documents",
                                    "train.eod_token_id says where they end");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "train", "--model", documents, "--data", small, "--steps", "1",
                       "--batch", "2", "--seq", "16", "--eod-token-id", "7", NULL);
    if (p.status != 0)
        fail_msg("a graph reading doc_start with train.eod_token_id: exit %d: %s", p.status, p.err);
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "train", "--model", open, "--data", small, "--steps", "1",
                       "--eod-token-id", "7", NULL);
    regc_test_expect_one_line_error(&p, 1, "train.eod_token_id",
                                    "has no causal attention to keep within documents");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "train", "--model", constant, "--data", small, "--steps", "1",
                       "--eod-token-id", "7", NULL);
    regc_test_expect_one_line_error(&p, 1, "constant.json", "doc_start must be an i32 data input");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "train", "--model", decoder, "--data", small, "--steps", "1",
                       "--eod-token-id", "7", NULL);
    regc_test_expect_one_line_error(&p, 1, "train.eod_token_id", "is an encoder-decoder graph");
    regc_test_proc_free(&p);
    free(documents), free(open), free(constant), free(decoder), free(small);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_packed_rows_train_as_separate_documents, setup),
        regc_test_in_dir(test_reset_positions_train_gpt2_as_separate_documents, setup),
        regc_test_in_dir(test_eod_mask_loss_is_a_loss_mask, setup),
        regc_test_in_dir(test_documents_keep_the_invariants, setup),
        regc_test_in_dir(test_documents_resume, setup),
        regc_test_in_dir(test_graph_model_packs_as_its_family, setup),
        regc_test_in_dir(test_documents_refused, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
