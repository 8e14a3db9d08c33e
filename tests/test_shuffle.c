/* test_shuffle.c — train.shuffle: each epoch reads the token file's rows in
 * a permutation drawn from data_seed.
 *
 * On a file whose rows name themselves (row j starts with token j), for
 * several row counts, batch sizes and seeds:
 * - every epoch reads every row at most once, and as many rows as llm.c's
 *   order reads, each row whole with its own next tokens as targets and
 *   its own loss mask;
 * - the order is a function of (seed, epoch) alone: read again it is the
 *   same, another epoch or another seed gives another;
 * - a rank's rows are its slice of the global batch's, so N ranks read what
 *   one process of N x B rows reads.
 * Through `regc train`: a shuffled run differs from llm.c's order, a run
 * resumed from its checkpoint in its second epoch goes on into the third
 * with the bits of one that never stopped, a resume that changes shuffle
 * or data_seed is refused by key, and data_seed without shuffle is refused
 * in one line; a TrainingArguments file's data_seed is unset by null,
 * applies under shuffle and is refused without it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_data.h"
#include "test_util.h"

#define SEQ 4

/* A file of n rows of SEQ (and the one token more that the last row's
 * targets need): row j's tokens are j, 1000 + j, 2000 + j, 3000 + j; its
 * mask marks the second target of each row 0. */
static regc_tokens *rows_file(int64_t n)
{
    const int64_t count = n * SEQ + 1;
    uint16_t *t = malloc((size_t)count * sizeof *t);
    uint8_t *m = malloc((size_t)count);
    assert_true(t && m);
    for (int64_t i = 0; i < count; i++) {
        t[i] = (uint16_t)(i % SEQ * 1000 + i / SEQ);
        m[i] = i % SEQ != 2; /* token 2 of a row is its second target */
    }
    char *dir = regc_test_make_temp_dir("shuffle-rows");
    char *tok = regc_test_join(dir, "t.bin"), *mask = regc_test_join(dir, "t.mask.bin");
    regc_tokens *d = NULL;
    assert_int_equal(regc_tokens_write(tok, t, count), REGC_OK);
    assert_int_equal(regc_tokens_write_mask(mask, m, count), REGC_OK);
    /* held in memory: the files go with the directory */
    char *bytes;
    size_t size;
    assert_int_equal(regc_file_read_all(tok, &bytes, &size), REGC_OK);
    assert_int_equal(regc_tokens_parse(tok, bytes, size, 65536, &d), REGC_OK);
    free(bytes);
    assert_int_equal(regc_file_read_all(mask, &bytes, &size), REGC_OK);
    assert_int_equal(regc_tokens_parse_mask(d, mask, bytes, size), REGC_OK);
    free(bytes);
    regc_test_remove_tree(dir);
    free(dir), free(tok), free(mask), free(t), free(m);
    return d;
}

/* The rows of epoch e at global batch g (cycle batches), in order, into
 * row[cycle * g]; each row checked whole: its tokens, targets and mask. */
static void read_epoch(const regc_tokens *d, int64_t n, int64_t e, int64_t g, int64_t *row)
{
    const int64_t cycle = n / g;
    int32_t *in = malloc((size_t)(g * SEQ) * sizeof *in), *next = malloc((size_t)(g * SEQ) * 4);
    assert_true(in && next);
    for (int64_t k = e * cycle; k < (e + 1) * cycle; k++) {
        assert_int_equal(regc_tokens_rows(d, k, g, 0, g, SEQ, in, next), REGC_OK);
        for (int64_t r = 0; r < g; r++) {
            const int64_t j = in[r * SEQ];
            if (j < 0 || j >= n)
                fail_msg("batch %lld row %lld starts with %lld: not a row's start", (long long)k,
                         (long long)r, (long long)j);
            for (int64_t i = 0; i < SEQ; i++) {
                const int64_t want_in = i * 1000 + j;
                const int64_t want_next = i == SEQ - 1 ? j + 1 : (i + 1) * 1000 + j;
                if (in[r * SEQ + i] != want_in)
                    fail_msg("row %lld token %lld: %d, not %lld", (long long)j, (long long)i,
                             in[r * SEQ + i], (long long)want_in);
                if (next[r * SEQ + i] != (i == 1 ? -1 : want_next))
                    fail_msg("row %lld target %lld: %d (its mask and next token: %lld)",
                             (long long)j, (long long)i, next[r * SEQ + i],
                             i == 1 ? -1LL : (long long)want_next);
            }
            row[(k - e * cycle) * g + r] = j;
        }
    }
    free(in), free(next);
}

static void test_every_row_once_an_epoch(void **state)
{
    (void)state;
    static const int64_t rows[] = {1, 3, 16, 17, 100, 257};
    static const int64_t batches[] = {1, 2, 5};
    for (size_t a = 0; a < sizeof rows / sizeof *rows; a++)
        for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
            const int64_t n = rows[a], g = batches[b], read = n / g * g;
            if (read == 0)
                continue;
            regc_tokens *d = rows_file(n);
            regc_tokens_set_shuffle(d, 1, 42);
            int64_t *order[3];
            char *seen = calloc((size_t)n, 1);
            for (int e = 0; e < 3; e++) {
                order[e] = malloc((size_t)read * sizeof **order);
                read_epoch(d, n, e, g, order[e]);
                memset(seen, 0, (size_t)n);
                for (int64_t i = 0; i < read; i++) {
                    if (seen[order[e][i]])
                        fail_msg("n %lld, batch %lld, epoch %d: row %lld read twice", (long long)n,
                                 (long long)g, e, (long long)order[e][i]);
                    seen[order[e][i]] = 1;
                }
            }
            /* read again: the same; the epochs (of enough rows to differ) differ */
            int64_t *again = malloc((size_t)read * sizeof *again);
            read_epoch(d, n, 1, g, again);
            assert_memory_equal(again, order[1], (size_t)read * sizeof *again);
            if (n >= 16) {
                assert_memory_not_equal(order[0], order[1], (size_t)read * sizeof *again);
                assert_memory_not_equal(order[1], order[2], (size_t)read * sizeof *again);
                regc_tokens_set_shuffle(d, 1, 43);
                read_epoch(d, n, 1, g, again);
                assert_memory_not_equal(again, order[1], (size_t)read * sizeof *again);
            }
            for (int e = 0; e < 3; e++)
                free(order[e]);
            free(again), free(seen);
            regc_tokens_free(d);
        }
}

/* Shuffle off: llm.c's order, consecutive rows; a rank's rows are its
 * slice of the global batch either way. */
static void test_ranks_read_their_slice(void **state)
{
    (void)state;
    const int64_t n = 50, g = 6, b = 2;
    regc_tokens *d = rows_file(n);
    int32_t whole[6 * SEQ], whole_next[6 * SEQ], part[2 * SEQ], part_next[2 * SEQ];
    for (int on = 0; on < 2; on++) {
        regc_tokens_set_shuffle(d, on, 7);
        for (int64_t k = 0; k < 20; k++) {
            assert_int_equal(regc_tokens_rows(d, k, g, 0, g, SEQ, whole, whole_next), REGC_OK);
            if (!on)
                for (int64_t r = 0; r < g; r++)
                    assert_int_equal(whole[r * SEQ], (k % (n / g)) * g + r);
            for (int64_t r0 = 0; r0 < g; r0 += b) {
                assert_int_equal(regc_tokens_rows(d, k, g, r0, b, SEQ, part, part_next), REGC_OK);
                assert_memory_equal(part, whole + r0 * SEQ, sizeof part);
                assert_memory_equal(part_next, whole_next + r0 * SEQ, sizeof part_next);
            }
        }
    }
    regc_tokens_free(d);
}

/* regc train on gpt2-tiny over `data` at B=4, T=32 for `steps` steps, with
 * more flags: its n step losses. */
static void train(const char *data, const char *steps, double *loss, int n, ...)
{
    const char *const args[] = {"--model", "gpt2-tiny", "--data", data,    "--steps",
                                steps,     "--batch",   "4",      "--seq", "32",
                                "--lr",    "1e-3",      NULL};
    va_list ap;
    va_start(ap, n);
    assert_int_equal(regc_test_train_losses_v(loss, n, args, ap), n);
    va_end(ap);
}

/* Three batches of 4 rows of 32 an epoch: 8 steps read three epochs, and a
 * checkpoint at step 4 stands in the second. */
static char *write_three_batches(const char *dir)
{
    enum { N = 3 * 4 * 32 + 1 };
    uint16_t t[N];
    for (int i = 0; i < N; i++)
        t[i] = (uint16_t)((i * 37 + 11) % 500);
    char *path = regc_test_join(dir, "three.bin");
    assert_int_equal(regc_tokens_write(path, t, N), REGC_OK);
    return path;
}

static void test_shuffled_run_resumes(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("shuffle-resume"),
         *ck = regc_test_join(dir, "checkpoint-4");
    char *data = write_three_batches(dir);
    double ordered[8], whole[8], resumed[4];
    train(data, "8", ordered, 8, NULL);
    train(data, "8", whole, 8, "--shuffle", "on", "--data-seed", "5", "--output-dir", dir,
          "--save-steps", "4", NULL);
    if (!memcmp(ordered, whole, sizeof whole))
        fail_msg("a shuffled run gave the losses of llm.c's order");
    train(data, "8", resumed, 4, "--shuffle", "on", "--data-seed", "5", "--resume-from-checkpoint",
          ck, NULL);
    if (memcmp(resumed, whole + 4, sizeof resumed))
        fail_msg("the resumed run's losses differ from the whole run's: %.9g against %.9g",
                 resumed[0], whole[4]);
    static const char *const changed[][3] = {
        {"off", "5", "train.shuffle is true in the checkpoint, false now"},
        {"on", "6", "train.data_seed is 5 in the checkpoint, 6 now"}};
    for (size_t i = 0; i < sizeof changed / sizeof *changed; i++) {
        regc_test_proc p;
        const int on = !strcmp(changed[i][0], "on");
        regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--data", data, "--steps", "8",
                           "--batch", "4", "--seq", "32", "--shuffle", changed[i][0],
                           "--resume-from-checkpoint", ck, on ? "--data-seed" : NULL, changed[i][1],
                           NULL);
        if (p.status != 1 || !strstr(p.err, changed[i][2]) || !strstr(p.err, "trainer_state.json"))
            fail_msg("a resume with --shuffle %s, data_seed %s: exit %d, not the refusal "
                     "\"%s\":\n%s",
                     changed[i][0], changed[i][1], p.status, changed[i][2], p.err);
        regc_test_proc_free(&p);
    }
    regc_test_remove_tree(dir);
    free(dir), free(ck), free(data);
}

/* train.data_seed's value and where it came from, as --print-config says
 * for a TrainingArguments file holding `data_seed` and more flags. */
static int data_seed_of(const char *dir, const char *data_seed, const char *shuffle, double *value,
                        char *from, size_t cap, regc_test_proc *p)
{
    char text[128];
    snprintf(text, sizeof text, "{\"data_seed\": %s, \"seed\": 3}\n", data_seed);
    assert_int_equal(regc_test_write_text(dir, "args.json", text), 0);
    char *file = regc_test_join(dir, "args.json");
    const int rc = regc_test_run_regc(p, "train", "--model", "gpt2-tiny", "--config", file,
                                      "--shuffle", shuffle, "--print-config", NULL);
    free(file);
    if (rc != 0)
        return rc;
    cJSON *cfg = cJSON_Parse(p->out);
    const cJSON *row = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cfg, "train"), "data_seed");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, "value"),
                *f = cJSON_GetObjectItemCaseSensitive(row, "from");
    assert_true(cJSON_IsNumber(v) && cJSON_IsString(f));
    *value = v->valuedouble;
    snprintf(from, cap, "%s", f->valuestring);
    cJSON_Delete(cfg);
    return rc;
}

static void test_training_arguments_data_seed(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("shuffle-args"), from[256];
    double v;
    regc_test_proc p;
    /* null: unset, so train.seed under shuffle; off, nothing to refuse */
    assert_int_equal(data_seed_of(dir, "null", "on", &v, from, sizeof from, &p), 0);
    if (v != 3.0 || !strstr(from, "train.seed, as --shuffle is on"))
        fail_msg("data_seed null under shuffle: %g from \"%s\"", v, from);
    regc_test_proc_free(&p);
    assert_int_equal(data_seed_of(dir, "null", "off", &v, from, sizeof from, &p), 0);
    regc_test_proc_free(&p);
    /* a number: the order's seed under shuffle, refused naming the key without */
    assert_int_equal(data_seed_of(dir, "11", "on", &v, from, sizeof from, &p), 0);
    if (v != 11.0 || !strstr(from, "args.json: data_seed"))
        fail_msg("data_seed 11 under shuffle: %g from \"%s\"", v, from);
    regc_test_proc_free(&p);
    assert_int_equal(data_seed_of(dir, "11", "off", &v, from, sizeof from, &p), 1);
    regc_test_expect_one_line_error(&p, 1, "args.json: data_seed", "train.shuffle, which is off");
    regc_test_proc_free(&p);
    regc_test_remove_tree(dir);
    free(dir);
}

static void test_data_seed_without_shuffle_refused(void **state)
{
    (void)state;
    regc_test_proc p;
    regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "1", "--data-seed", "3",
                       NULL);
    regc_test_expect_one_line_error(&p, 1, "--data-seed", "train.shuffle, which is off");
    regc_test_proc_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_row_once_an_epoch),
        cmocka_unit_test(test_ranks_read_their_slice),
        cmocka_unit_test(test_shuffled_run_resumes),
        cmocka_unit_test(test_data_seed_without_shuffle_refused),
        cmocka_unit_test(test_training_arguments_data_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
