/* test_cache_hostile.c — compile-cache entries written by someone else:
 * payloads changed behind valid checksums, and files that are no entries
 * at all. Each changed payload is decoded, validated and refused (a miss
 * that recompiles, trains bit for bit like a clean cache and replaces the
 * entry, and that `regc cache verify` names), or, where no check can tell
 * it from a program regc could make, run without a stray access (the
 * sanitizers watch). A FIFO or a huge sparse file in an entry's place is
 * refused at once, never waited on or read. That the programs regc
 * compiles pass the same checks is tests/test_validate.c's. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "regc_train.h"
#include "serial.h"
#include "test_cache_util.h"
#include "test_model.h"
#include "test_util.h"
#include "validate.h"

#define STEPS 2
#define HEADER REGC_TEST_CACHE_HEADER_BYTES
#define TAG REGC_TEST_CACHE_TAG_BYTES

static int setup(void **state) { return regc_test_dir_setup(state, "cache_hostile", "cache"); }

/* ---------------------------------------------------------------- entries as bytes */

/* An entry file taken apart: header, label, keyed bytes and payload. */
typedef struct {
    uint8_t header[HEADER];
    uint8_t tag[TAG];
    char *label;
    uint8_t *plain; /* keyed bytes, then the payload */
    size_t keyed_len, payload_len;
} entry;

static void entry_load(const char *path, entry *e)
{
    size_t n;
    uint8_t *f = regc_test_read_bytes(path, &n);
    assert_true(n >= HEADER);
    memcpy(e->header, f, HEADER);
    size_t label_len = (size_t)regc_test_get_le(f + 12, 4);
    size_t stored = (size_t)regc_test_get_le(f + 32, 8);
    e->keyed_len = (size_t)regc_test_get_le(f + 40, 8);
    e->payload_len = (size_t)regc_test_get_le(f + 48, 8);
    assert_int_equal(n, HEADER + label_len + stored + TAG);
    memcpy(e->tag, f + n - TAG, TAG);
    e->label = calloc(label_len + 1, 1);
    e->plain = malloc(e->keyed_len + e->payload_len + 1);
    assert_non_null(e->label);
    assert_non_null(e->plain);
    memcpy(e->label, f + HEADER, label_len);
    uLongf got = (uLongf)(e->keyed_len + e->payload_len);
    assert_int_equal(uncompress(e->plain, &got, f + HEADER + label_len, (uLong)stored), Z_OK);
    assert_int_equal(got, e->keyed_len + e->payload_len);
    free(f);
}

static void entry_free(entry *e) { free(e->label), free(e->plain); }

static uint32_t crc(const void *p, size_t n) { return (uint32_t)crc32(0L, p, (uInt)n); }

/* Write e's keyed bytes with `payload` as an entry file: compressed, both
 * checksums right, as another program could; sealed with the cache's key
 * (what reaches the decoder's checks: a program holding the key), or, with
 * sealed 0, with e's old seal (a program without it). */
static void entry_store(const char *path, const entry *e, const uint8_t *payload, size_t len,
                        int sealed)
{
    size_t label_len = strlen(e->label), plain_len = e->keyed_len + len;
    uint8_t *plain = malloc(plain_len + 1);
    uLongf stored = compressBound((uLong)plain_len);
    uint8_t *file = malloc(HEADER + label_len + stored + TAG);
    assert_non_null(plain);
    assert_non_null(file);
    memcpy(plain, e->plain, e->keyed_len);
    memcpy(plain + e->keyed_len, payload, len);
    assert_int_equal(compress2(file + HEADER + label_len, &stored, plain, (uLong)plain_len, 1),
                     Z_OK);
    memcpy(file, e->header, HEADER);
    memcpy(file + HEADER, e->label, label_len);
    regc_test_put_le(file + 32, stored, 8);
    regc_test_put_le(file + 48, len, 8);
    regc_test_put_le(file + 56, crc(file + HEADER, label_len + stored), 4);
    regc_test_reseal_header(file);
    size_t n = HEADER + label_len + stored;
    if (sealed) {
        char dir[2048];
        snprintf(dir, sizeof dir, "%.*s", (int)(regc_test_base_name(path) - path - 1), path);
        regc_test_seal_entry(dir, file, n, file + n);
    } else {
        memcpy(file + n, e->tag, TAG);
    }
    regc_test_write_bytes(path, file, n + TAG);
    free(plain), free(file);
}

/* The entry whose label starts with `prefix`: the first, by listing. */
static void find_entry(const char *dir, const char *prefix, char *path, size_t cap)
{
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(dir, 0, &e, &n), REGC_OK);
    path[0] = 0;
    for (int i = 0; i < n && !path[0]; i++)
        if (e[i].label && !strncmp(e[i].label, prefix, strlen(prefix)))
            snprintf(path, cap, "%s/%s", dir, e[i].file);
    regc_cache_entries_free(e, n);
    if (!path[0])
        fail_msg("no entry labelled %s... in %s", prefix, dir);
}

/* ---------------------------------------------------------------- training */

typedef struct {
    int inline_back;
    regc_level level;
} form;

static void collect_loss(const regc_step_report *r, void *user)
{
    regc_test_losses *l = user;
    if (l->n < REGC_TEST_MAX_STEPS)
        l->loss[l->n++] = r->loss;
}

static void collect_stats(const regc_compile_stats *st, void *user)
{
    regc_test_losses *l = user;
    l->hits = st->cache_hits, l->misses = st->cache_misses;
}

/* gpt2-tiny for STEPS steps through cache_dir (NULL: none); its status
 * (a run of an accepted but altered program may fail, never crash). */
static int train(const char *cache_dir, form f, regc_test_losses *l)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = 2, o.seq = 16, o.steps = STEPS, o.threads = 1;
    o.compile.level = f.level;
    o.compile.inline_back = f.inline_back;
    o.cache_dir = cache_dir;
    o.on_compiled = collect_stats;
    memset(l, 0, sizeof *l);
    int rc = regc_train(m, &o, collect_loss, l, NULL);
    regc_model_free(m);
    return rc;
}

static void expect_same_losses(const regc_test_losses *want, const regc_test_losses *got,
                               const char *what)
{
    assert_int_equal(got->n, STEPS);
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&want->loss[s], &got->loss[s], sizeof(float)))
            fail_msg("%s: step %d loss %.9g, a clean cache gives %.9g", what, s,
                     (double)got->loss[s], (double)want->loss[s]);
}

/* `regc cache verify` on dir: exit status 1 and a DAMAGED line naming
 * file, or (file NULL) exit status 0, every entry sound. */
static void expect_verify(const char *dir, const char *file)
{
    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "cache", "verify", "--dir", dir, NULL);
    if (!file && (rc != 0 || !strstr(p.out, "every entry is sound")))
        fail_msg("verify %s (%d):\n%s%s", dir, rc, p.out, p.err);
    if (file) {
        const char *at = strstr(p.out, file), *end = at ? strchr(at, '\n') : NULL;
        const char *damaged = at ? strstr(at, "DAMAGED") : NULL;
        if (rc != 1 || !damaged || (end && damaged > end))
            fail_msg("verify does not name %s as damaged (%d):\n%s%s", file, rc, p.out, p.err);
    }
    regc_test_proc_free(&p);
}

/* ---------------------------------------------------------------- changed step programs */

static int find_kernel(const regc_program *p, int kernel)
{
    for (int i = 0; i < p->n_instr; i++)
        if (p->instr[i].kernel == kernel)
            return i;
    return -1;
}

static int norm_at(const regc_program *p)
{
    int i = find_kernel(p, K_LN_FWD);
    return i >= 0 ? i : find_kernel(p, K_ADD_LN_FWD);
}

static int scalars_buf(const regc_program *p)
{
    for (int b = 0; b < p->n_bufs; b++)
        if (p->bufs[b].kind == BUF_SCALARS)
            return b;
    return -1;
}

/* Each changes one thing a hostile writer could; 0 when it finds nothing
 * to change in p. */
static int wider_norm(regc_program *p) /* a dimension: what overflows layernorm_fwd_row */
{
    int i = norm_at(p);
    return i >= 0 && (p->instr[i].d[1] *= 2, 1);
}

static int gemm_reads_scalars(regc_program *p) /* a buffer index */
{
    int i = find_kernel(p, K_GEMM);
    return i >= 0 && (p->instr[i].refs[1].buf = scalars_buf(p), 1);
}

static int gemm_becomes_norm(regc_program *p) /* a kernel id */
{
    int i = find_kernel(p, K_GEMM);
    return i >= 0 && (p->instr[i].kernel = K_LN_FWD, 1);
}

static int operand_past_its_end(regc_program *p) /* an offset */
{
    int i = norm_at(p);
    if (i < 0)
        return 0;
    regc_ref *x = &p->instr[i].refs[p->instr[i].n_refs - 2]; /* the weight */
    x->off += p->bufs[x->buf].bytes / 2;
    return 1;
}

static int buffer_past_the_arena(regc_program *p) /* a plan offset */
{
    int b = p->instr[norm_at(p)].refs[0].buf;
    return p->bufs[b].kind == BUF_ARENA && (p->bufs[b].offset = p->arena_bytes, 1);
}

static int ids_from_floats(regc_program *p) /* token ids read from an activation */
{
    int i = find_kernel(p, K_EMBED_FWD);
    return i >= 0 && (p->instr[i].refs[1] = p->instr[i].refs[0], 1);
}

static int loss_in_the_scalars(regc_program *p)
{
    p->loss.buf = scalars_buf(p);
    return 1;
}

static int call_binds_past_its_buffer(regc_program *p) /* a lazy call's binding */
{
    for (int i = 0; i < p->n_steps; i++) {
        lazy_step *s = &p->steps[i];
        if (s->piece < 0)
            continue;
        const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
        for (int k = 0; k < r->n_slots; k++)
            if (r->slots[k].kind == SLOT_TEMP && s->bind[k].buf >= 0 && r->n_fwd > 0) {
                s->bind[k].off += p->bufs[s->bind[k].buf].bytes;
                return 1;
            }
    }
    return 0;
}

static int freed_before_use(regc_program *p) /* O0: a buffer's lifetime */
{
    for (int b = 0; b < p->n_bufs; b++)
        if (p->bufs[b].kind == BUF_ARENA && p->bufs[b].first >= 0 &&
            p->bufs[b].last > p->bufs[b].first && b != p->loss.buf) {
            p->bufs[b].last = p->bufs[b].first;
            return 1;
        }
    return 0;
}

static const struct {
    const char *name;
    int (*change)(regc_program *p);
    form f;
} step_changes[] = {
    {"wider norm", wider_norm, {1, REGC_LEVEL_O1}},
    {"gemm reads the scalars", gemm_reads_scalars, {1, REGC_LEVEL_O1}},
    {"gemm becomes a norm", gemm_becomes_norm, {1, REGC_LEVEL_O1}},
    {"operand past its end", operand_past_its_end, {1, REGC_LEVEL_O1}},
    {"buffer past the arena", buffer_past_the_arena, {1, REGC_LEVEL_O1}},
    {"ids from floats", ids_from_floats, {1, REGC_LEVEL_O1}},
    {"loss in the scalars", loss_in_the_scalars, {1, REGC_LEVEL_O1}},
    {"call binds past its buffer", call_binds_past_its_buffer, {0, REGC_LEVEL_O1}},
    {"freed before use", freed_before_use, {1, REGC_LEVEL_O0}},
};

/* The step entry of a cold run in dir, taken apart; the clean payload. */
static void cold_entry(const char *dir, form f, char *path, size_t cap, entry *e)
{
    regc_test_losses l;
    assert_int_equal(train(dir, f, &l), REGC_OK);
    find_entry(dir, "step:", path, cap);
    entry_load(path, e);
}

/* After a refused entry: the run recompiled and trained like a clean
 * cache, and the entry on disk is the clean one again. */
static void expect_repaired(const char *path, const entry *clean, const char *what)
{
    entry now;
    entry_load(path, &now);
    if (now.payload_len != clean->payload_len ||
        memcmp(now.plain + now.keyed_len, clean->plain + clean->keyed_len, now.payload_len))
        fail_msg("%s: the entry was not replaced by a sound one (%zu bytes, %zu clean)", what,
                 now.payload_len, clean->payload_len);
    entry_free(&now);
}

static void test_changed_step_programs_recompile(void **state)
{
    regc_test_dir *t = *state;
    for (size_t c = 0; c < sizeof step_changes / sizeof step_changes[0]; c++) {
        form f = step_changes[c].f;
        regc_test_losses ref, got;
        assert_int_equal(train(NULL, f, &ref), REGC_OK);
        char name[32], path[2048];
        snprintf(name, sizeof name, "step%zu", c);
        char *dir = regc_test_join(t->dir, name);
        entry clean;
        cold_entry(dir, f, path, sizeof path, &clean);

        regc_program *p = NULL;
        regc_compile_stats st;
        memset(&st, 0, sizeof st);
        assert_int_equal(
            regc_program_read(clean.plain + clean.keyed_len, clean.payload_len, &p, &st), REGC_OK);
        if (!step_changes[c].change(p))
            fail_msg("%s: nothing to change", step_changes[c].name);
        regc_bytes changed = {0};
        regc_program_write(p, &st, &changed);
        regc_program_free(p);
        entry_store(path, &clean, changed.data, changed.len, 1);
        regc_bytes_free(&changed);

        expect_verify(dir, regc_test_base_name(path));
        if (train(dir, f, &got) != REGC_OK)
            fail_msg("%s: %s", step_changes[c].name, regc_error_message());
        assert_true(got.misses >= 1); /* the step, compiled again */
        expect_same_losses(&ref, &got, step_changes[c].name);
        expect_repaired(path, &clean, step_changes[c].name);
        expect_verify(dir, NULL);
        entry_free(&clean);
        free(dir);
    }
}

/* A rewrite no check of the decoder can tell from a compile: a norm's
 * epsilon, every table still consistent. It would train to other losses;
 * written by a program without the cache's key, its seal is wrong, so it
 * is refused, recompiled and replaced like any damage, and verify names it. */
static int other_epsilon(regc_program *p)
{
    int i = norm_at(p);
    return i >= 0 && (p->instr[i].f = p->instr[i].f * 4.0f + 1e-3f, 1);
}

static void test_unsealed_rewrite_refused(void **state)
{
    regc_test_dir *t = *state;
    form f = {1, REGC_LEVEL_O1};
    regc_test_losses ref, got;
    assert_int_equal(train(NULL, f, &ref), REGC_OK);
    char path[2048];
    char *dir = regc_test_join(t->dir, "unsealed");
    entry clean;
    cold_entry(dir, f, path, sizeof path, &clean);
    regc_program *p = NULL;
    regc_compile_stats st;
    memset(&st, 0, sizeof st);
    assert_int_equal(regc_program_read(clean.plain + clean.keyed_len, clean.payload_len, &p, &st),
                     REGC_OK);
    assert_true(other_epsilon(p));
    regc_bytes changed = {0};
    regc_program_write(p, &st, &changed);
    regc_program_free(p);
    /* the decoder's own checks accept it: only the seal can refuse it */
    regc_program *q = NULL;
    assert_int_equal(regc_program_read(changed.data, changed.len, &q, &st), REGC_OK);
    regc_program_free(q);
    entry_store(path, &clean, changed.data, changed.len, 0);
    regc_bytes_free(&changed);

    expect_verify(dir, regc_test_base_name(path));
    if (train(dir, f, &got) != REGC_OK)
        fail_msg("unsealed rewrite: %s", regc_error_message());
    assert_true(got.misses >= 1);
    expect_same_losses(&ref, &got, "unsealed rewrite");
    expect_repaired(path, &clean, "unsealed rewrite");
    expect_verify(dir, NULL);
    entry_free(&clean);
    free(dir);
}

/* ---------------------------------------------------------------- changed regions */

static int wider_input_slot(regc_compiled_region *r) /* memory the compiler binds is smaller */
{
    return r->n_in > 0 && r->in_slot[0] >= 0 && (r->slots[r->in_slot[0]].bytes *= 2, 1);
}

static int temp_past_the_scratch(regc_compiled_region *r)
{
    for (int i = 0; i < r->n_fwd; i++)
        for (int k = 0; k < r->fwd[i].n_refs; k++) {
            int s = r->fwd[i].refs[k].buf;
            if (s >= 0 && r->slots[s].kind == SLOT_TEMP) {
                r->slots[s].offset = r->scratch_bytes;
                return 1;
            }
        }
    return 0;
}

/* a bf16 mark where the kernel reads fp32: the operand would be read as
 * half its bytes' worth of other values */
static int bf16_mark_on_an_fp32_operand(regc_compiled_region *r)
{
    for (int i = 0; i < r->n_fwd; i++)
        for (int k = 0; k < r->fwd[i].n_refs; k++)
            if (r->fwd[i].refs[k].buf >= 0 && !regc_instr_bf16_allowed(&r->fwd[i], k)) {
                r->fwd[i].bf16_refs |= (uint16_t)(1u << k);
                return 1;
            }
    return 0;
}

static int forward_reads_a_gradient(regc_compiled_region *r) /* unbound in a forward call */
{
    for (int k = 0; k < r->n_out; k++)
        if (r->dout_slot[k] >= 0 && r->n_fwd > 0 && r->fwd[0].n_refs > 1) {
            r->fwd[0].refs[1] = (regc_ref){r->dout_slot[k], 0};
            return 1;
        }
    return 0;
}

static const struct {
    const char *name;
    int (*change)(regc_compiled_region *r);
} region_changes[] = {
    {"wider input slot", wider_input_slot},
    {"temporary past the scratch", temp_past_the_scratch},
    {"forward reads a gradient", forward_reads_a_gradient},
    {"bf16 mark on an fp32 operand", bf16_mark_on_an_fp32_operand},
};

/* A region entry changed while the step entry is gone: the step compiles
 * from the cached regions, refuses the changed one, recompiles it. */
static void test_changed_regions_recompile(void **state)
{
    regc_test_dir *t = *state;
    form f = {1, REGC_LEVEL_O1};
    regc_test_losses ref, got;
    assert_int_equal(train(NULL, f, &ref), REGC_OK);
    for (size_t c = 0; c < sizeof region_changes / sizeof region_changes[0]; c++) {
        char name[32], step[2048], path[2048];
        snprintf(name, sizeof name, "region%zu", c);
        char *dir = regc_test_join(t->dir, name);
        entry clean;
        cold_entry(dir, f, step, sizeof step, &clean);
        entry_free(&clean);
        assert_int_equal(unlink(step), 0);
        /* the first region entry the change applies to */
        regc_cache_entry *list;
        int n, changed = 0;
        assert_int_equal(regc_cache_scan(dir, 0, &list, &n), REGC_OK);
        for (int i = 0; i < n && !changed; i++) {
            if (!list[i].label || strncmp(list[i].label, "region:", 7))
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, list[i].file);
            entry_load(path, &clean);
            regc_reader rd = regc_reader_of(clean.plain + clean.keyed_len, clean.payload_len);
            regc_compiled_region *r = NULL;
            assert_int_equal(regc_region_read(&rd, &r), REGC_OK);
            if ((changed = region_changes[c].change(r))) {
                regc_bytes b = {0};
                regc_region_write(r, &b);
                entry_store(path, &clean, b.data, b.len, 1);
                regc_bytes_free(&b);
            } else {
                entry_free(&clean);
            }
            regc_compiled_region_free(r);
        }
        regc_cache_entries_free(list, n);
        if (!changed)
            fail_msg("%s: no region to change", region_changes[c].name);

        /* structural changes are named by verify; one that only the
         * formals it is compiled for show is refused by the compile */
        if (c > 0)
            expect_verify(dir, regc_test_base_name(path));
        if (train(dir, f, &got) != REGC_OK)
            fail_msg("%s: %s", region_changes[c].name, regc_error_message());
        assert_true(got.misses >= 2); /* the region and the step */
        expect_same_losses(&ref, &got, region_changes[c].name);
        expect_repaired(path, &clean, region_changes[c].name);
        expect_verify(dir, NULL);
        entry_free(&clean);
        free(dir);
    }
}

/* ---------------------------------------------------------------- random bytes */

#define RANDOM_CHANGES 120

/* Single bytes of a step payload changed at random: a payload the
 * decoder refuses is a miss that trains like a clean cache and is
 * replaced; one it accepts (a different but consistent program, such as
 * another epsilon) runs without a stray access. */
static void test_random_payload_bytes(void **state)
{
    regc_test_dir *t = *state;
    form f = {1, REGC_LEVEL_O1};
    regc_test_losses ref, got;
    assert_int_equal(train(NULL, f, &ref), REGC_OK);
    char path[2048];
    entry clean;
    cold_entry(t->path, f, path, sizeof path, &clean);
    const uint8_t *payload = clean.plain + clean.keyed_len;
    const uint8_t *canon = memchr(clean.plain, 0, clean.keyed_len);
    assert_non_null(canon);
    canon++;
    size_t canon_len = clean.keyed_len - (size_t)(canon - clean.plain);
    uint8_t *bytes = malloc(clean.payload_len);
    assert_non_null(bytes);
    uint64_t x = 0x2545F4914F6CDD1Dull;
    int refused = 0, accepted = 0, same = 0;
    for (int i = 0; i < RANDOM_CHANGES; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t at = (size_t)(x % clean.payload_len);
        memcpy(bytes, payload, clean.payload_len);
        bytes[at] ^= (uint8_t)(1 + (x >> 32) % 255);
        entry_store(path, &clean, bytes, clean.payload_len, 1);
        int ok = regc_compile_check_entry(canon, canon_len, bytes, clean.payload_len) == REGC_OK;
        int rc = train(t->path, f, &got);
        if (ok) { /* it ran; whatever it computed, nothing strayed */
            accepted++;
            same += rc == REGC_OK && !memcmp(ref.loss, got.loss, sizeof(float) * STEPS);
            continue;
        }
        refused++;
        if (rc != REGC_OK)
            fail_msg("byte %zu: %s", at, regc_error_message());
        assert_true(got.misses >= 1);
        char what[64];
        snprintf(what, sizeof what, "byte %zu changed", at);
        expect_same_losses(&ref, &got, what);
        expect_repaired(path, &clean, what);
    }
    print_message("%d changed payloads: %d refused, %d accepted (%d of them train like a clean "
                  "cache)\n",
                  RANDOM_CHANGES, refused, accepted, same);
    assert_true(refused > RANDOM_CHANGES / 2);
    free(bytes);
    entry_free(&clean);
}

/* ---------------------------------------------------------------- files that are no entries */

static void make_sparse(const char *path, off_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, size), 0);
    close(fd);
}

/* A FIFO and a 3 GB sparse file under entry names: lookups miss at once
 * (nothing waits on the FIFO, nothing reads the sparse file), ls and
 * verify finish and name both, and a store replaces the FIFO. */
/* Every payload in the fuzz harness's corpus (real entries, and inputs the
 * fuzzer once found crashing: field_out_of_range, a stored node index of
 * INT32_MIN that the decoder took one from) decodes, as a step and as a
 * region, to a program or a one-line refusal; the sanitizers watch. */
static void test_fuzz_corpus_decodes_safely(void **state)
{
    (void)state;
    const char *dir = REGC_SOURCE_DIR "/tests/fuzz/corpus/cache_entry";
    DIR *d = opendir(dir);
    assert_non_null(d);
    int files = 0, refused = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t size = 0;
        uint8_t *data = (uint8_t *)regc_test_read_file(path, &size);
        assert_non_null(data);
        regc_program *p = NULL;
        regc_compile_stats st = {0};
        if (regc_program_read(data, size, &p, &st) == REGC_OK)
            regc_program_free(p);
        else
            refused++, assert_null(p), assert_null(strchr(regc_error_message(), '\n'));
        regc_reader rd = regc_reader_of(data, size);
        regc_compiled_region *r = NULL;
        if (regc_region_read(&rd, &r) == REGC_OK)
            regc_compiled_region_free(r);
        free(data);
        files++;
    }
    closedir(d);
    assert_true(files >= 8);
    assert_true(refused >= 1); /* the finding is refused, not decoded */
}

static void test_fifo_and_sparse_files_refused(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = regc_test_open_cache(t->path, 0, NULL);
    regc_bytes kf = regc_test_text("fifo"), ks = regc_test_text("sparse"), got;
    char fifo[4200], sparse[4200];
    regc_cache_entry_path(c, &kf, fifo, sizeof fifo);
    regc_cache_entry_path(c, &ks, sparse, sizeof sparse);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    make_sparse(sparse, (off_t)3 << 30);
    alarm(60); /* a lookup that waits on the FIFO fails the test, not the suite */
    double t0 = regc_time_ms();
    assert_int_equal(regc_cache_get(c, &kf, &got), 0);
    assert_int_equal(regc_cache_get(c, &ks, &got), 0);
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(t->path, 1, &e, &n), REGC_OK);
    assert_int_equal(n, 2);
    for (int i = 0; i < n; i++) {
        int is_fifo = !strcmp(e[i].file, regc_test_base_name(fifo));
        assert_non_null(strstr(e[i].problem, is_fifo ? "not a regular file" : "beyond"));
    }
    regc_cache_entries_free(e, n);
    double ms = regc_time_ms() - t0;
    if (ms > 2000)
        fail_msg("refusing a FIFO and a sparse file took %.0f ms", ms);
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "cache", "ls", "--dir", t->path, NULL), 0);
    regc_test_proc_free(&p);
    expect_verify(t->path, regc_test_base_name(fifo));
    expect_verify(t->path, regc_test_base_name(sparse));
    alarm(0);

    /* a store replaces the FIFO with an entry */
    regc_bytes payload = regc_test_text("payload");
    assert_int_equal(regc_cache_put(c, &kf, "fifo", &payload), REGC_OK);
    regc_test_expect_hit(c, "fifo", &payload);
    regc_cache_close(c);

    /* a cache limit lowers the size read: 2 MiB is refused under 1 MiB */
    c = regc_test_open_cache(t->path, 1 << 20, NULL);
    make_sparse(sparse, (off_t)2 << 20);
    assert_int_equal(regc_cache_get(c, &ks, &got), 0);
    regc_cache_close(c);
    regc_bytes_free(&kf), regc_bytes_free(&ks), regc_bytes_free(&payload);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_changed_step_programs_recompile, setup),
        regc_test_in_dir(test_unsealed_rewrite_refused, setup),
        regc_test_in_dir(test_changed_regions_recompile, setup),
        regc_test_in_dir(test_random_payload_bytes, setup),
        regc_test_in_dir(test_fifo_and_sparse_files_refused, setup),
        cmocka_unit_test(test_fuzz_corpus_decodes_safely),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
