/* test_cache.c — the compile cache's on-disk store through its public API
 * (round trips, version namespaces, every kind of damage detected as a
 * miss and repaired by the next store, LRU eviction, writers' temporary
 * files, errors). The byte encoding is test_bytes.c; `regc cache` is
 * test_cache_cli.c. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "regc_cache.h"
#include "regc_common.h"
#include "test_cache_util.h"
#include "test_util.h"

#define HEADER_BYTES REGC_TEST_CACHE_HEADER_BYTES
#define TAG_BYTES REGC_TEST_CACHE_TAG_BYTES

/* t->path is the cache directory (not made yet: regc_cache_open makes it). */
static int setup(void **state) { return regc_test_dir_setup(state, "cache", "c"); }

/* ---------------------------------------------------------------- 1. round trips */

static void test_round_trip(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = regc_test_open_cache(t->path, 0, "v1");
    assert_string_equal(regc_cache_dir(c), t->path);

    /* Nothing stored yet: the ordinary miss. */
    regc_test_expect_miss(c, "layer A");

    regc_bytes small = regc_test_text("compiled layer A"), empty = {0},
               big = regc_test_noise(1 << 20, 7);
    regc_test_cache_put(c, "layer A", "layer A", &small);
    regc_test_cache_put(c, "empty", "an empty payload", &empty);
    regc_test_cache_put(c, "big", "a 1 MiB payload", &big);
    regc_test_expect_hit(c, "layer A", &small);
    regc_test_expect_hit(c, "empty", &empty);
    regc_test_expect_hit(c, "big", &big);
    /* One byte more, one byte different, a prefix: other canonical forms. */
    regc_test_expect_miss(c, "layer A ");
    regc_test_expect_miss(c, "layer B");
    regc_test_expect_miss(c, "layer");
    regc_test_expect_miss(c, "");
    regc_test_expect_all_sound(t->path, 3);

    /* Storing again replaces the payload: a recompile's result wins. */
    regc_bytes other = regc_test_text("compiled layer A, second try");
    regc_test_cache_put(c, "layer A", "layer A", &other);
    regc_test_expect_hit(c, "layer A", &other);
    regc_test_expect_all_sound(t->path, 3);
    regc_cache_close(c);

    /* A restart: a new handle on the same directory finds everything. */
    c = regc_test_open_cache(t->path, 0, "v1");
    regc_test_expect_hit(c, "layer A", &other);
    regc_test_expect_hit(c, "empty", &empty);
    regc_test_expect_hit(c, "big", &big);
    regc_cache_close(c);

    regc_bytes_free(&small), regc_bytes_free(&big), regc_bytes_free(&other);
}

/* An empty canonical form is a key like any other. */
static void test_empty_canonical_form(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = regc_test_open_cache(t->path, 0, "v1");
    regc_bytes payload = regc_test_text("for the empty key");
    regc_test_cache_put(c, "", "empty key", &payload);
    regc_test_expect_hit(c, "", &payload);
    regc_test_expect_miss(c, "x");
    regc_cache_close(c);
    regc_bytes_free(&payload);
}

/* ---------------------------------------------------------------- 2. versions */

static void test_version_namespaces(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *v1 = regc_test_open_cache(t->path, 0, "v1"),
               *v2 = regc_test_open_cache(t->path, 0, "v2");
    regc_bytes one = regc_test_text("made by v1"), two = regc_test_text("made by v2");

    regc_test_cache_put(v1, "region", "region v1", &one);
    regc_test_expect_miss(v2, "region");
    regc_test_expect_hit(v1, "region", &one);

    /* Both live side by side in one directory, each seeing its own. */
    regc_test_cache_put(v2, "region", "region v2", &two);
    regc_test_expect_hit(v1, "region", &one);
    regc_test_expect_hit(v2, "region", &two);
    regc_test_expect_all_sound(t->path, 2);
    regc_cache_close(v1), regc_cache_close(v2);

    /* NULL is this build's version: the same keys as naming it outright. */
    const char *build = regc_cache_build_version();
    assert_non_null(build);
    assert_true(build[0] != '\0');
    assert_non_null(strstr(build, "format 2"));
    regc_cache *dflt = regc_test_open_cache(t->path, 0, NULL),
               *named = regc_test_open_cache(t->path, 0, build);
    regc_bytes three = regc_test_text("made by this build");
    regc_test_cache_put(dflt, "region", "region build", &three);
    regc_test_expect_hit(named, "region", &three);
    v1 = regc_test_open_cache(t->path, 0, "v1");
    regc_test_expect_hit(v1, "region", &one);
    regc_cache_close(v1), regc_cache_close(dflt), regc_cache_close(named);

    /* A version that extends another is a different namespace too. */
    char longer[512];
    snprintf(longer, sizeof longer, "%s+", build);
    regc_cache *ext = regc_test_open_cache(t->path, 0, longer);
    regc_test_expect_miss(ext, "region");
    regc_cache_close(ext);

    regc_bytes_free(&one), regc_bytes_free(&two), regc_bytes_free(&three);
}

/* ---------------------------------------------------------------- 3. corruption */

enum damage {
    FLIP_BODY,
    FLIP_LABEL,
    FLIP_HEADER,  /* arg: the byte's offset */
    TRUNCATE,     /* arg: the new length; SIZE_MAX: half */
    APPEND,       /* arg: how many bytes */
    OTHER_HEADER, /* B's header and label, A's body */
    OTHER_FILE,   /* B's whole file under A's name */
    RESEAL,       /* arg: which header field to rewrite, header CRC recomputed */
    FLIP_SEAL,    /* the seal's last byte */
    REWRITE,      /* a payload byte changed, compressed again, both CRCs right: the seal kept */
};

enum { RESEAL_VERSION, RESEAL_KEY, RESEAL_STORED, RESEAL_PAYLOAD, RESEAL_SPLIT, RESEAL_LABEL };

typedef struct {
    enum damage kind;
    size_t arg;
    const char *what;
} damage_case;

static const damage_case damage_cases[] = {
    {FLIP_BODY, 0, "a byte of the compressed body"},
    {FLIP_LABEL, 0, "a byte of the label"},
    {FLIP_HEADER, 0, "the magic"},
    {FLIP_HEADER, 7, "the magic's last byte"},
    {FLIP_HEADER, 8, "the format version"},
    {FLIP_HEADER, 12, "the label length"},
    {FLIP_HEADER, 16, "the key's first word"},
    {FLIP_HEADER, 31, "the key's second word"},
    {FLIP_HEADER, 32, "the stored length"},
    {FLIP_HEADER, 40, "the canonical length"},
    {FLIP_HEADER, 48, "the payload length"},
    {FLIP_HEADER, 56, "the body checksum"},
    {FLIP_HEADER, 62, "the header checksum"},
    {TRUNCATE, 0, "truncated to 0 bytes"},
    {TRUNCATE, 10, "truncated to 10 bytes"},
    {TRUNCATE, 63, "truncated to 63 bytes"},
    {TRUNCATE, 64, "truncated to the header"},
    {TRUNCATE, SIZE_MAX, "truncated to half"},
    {TRUNCATE, SIZE_MAX - 1, "one byte short"},
    {APPEND, 1, "one trailing byte"},
    {APPEND, 4096, "4096 trailing bytes"},
    {OTHER_HEADER, 0, "another entry's header and label"},
    {OTHER_FILE, 0, "another entry's whole file"},
    {FLIP_SEAL, 0, "the seal's last byte"},
    {REWRITE, 0, "the payload rewritten with valid checksums (by a program without the key)"},
    {RESEAL, RESEAL_VERSION, "the next format version, header resealed"},
    {RESEAL, RESEAL_KEY, "another key, header resealed"},
    {RESEAL, RESEAL_STORED, "stored length + 1, header resealed"},
    {RESEAL, RESEAL_PAYLOAD, "payload length - 1, header resealed"},
    {RESEAL, RESEAL_SPLIT, "canonical/payload split moved, header resealed"},
    {RESEAL, RESEAL_LABEL, "label length + 1, header resealed"},
};

/* A damaged copy of entry A (`a`, label length la) in a new buffer. */
static uint8_t *damaged(const damage_case *d, const uint8_t *a, size_t alen, size_t la,
                        const uint8_t *b, size_t blen, size_t lb, size_t *out_len)
{
    uint8_t *x = malloc(alen + blen + 4096);
    assert_non_null(x);
    memcpy(x, a, alen);
    size_t n = alen;
    switch (d->kind) {
    case FLIP_BODY: /* the middle of the zlib stream */
        x[HEADER_BYTES + la + (alen - HEADER_BYTES - la) / 2] ^= 0x10;
        break;
    case FLIP_LABEL: x[HEADER_BYTES + 1] ^= 0x01; break;
    case FLIP_HEADER: x[d->arg] ^= 0x01; break;
    case FLIP_SEAL: x[alen - 1] ^= 0x01; break;
    case REWRITE: {
        size_t stored = (size_t)regc_test_get_le(a + 32, 8);
        uLongf plain_len = (uLongf)(regc_test_get_le(a + 40, 8) + regc_test_get_le(a + 48, 8));
        uint8_t *plain = malloc(plain_len);
        assert_non_null(plain);
        uLongf got = plain_len;
        assert_int_equal(uncompress(plain, &got, a + HEADER_BYTES + la, (uLong)stored), Z_OK);
        plain[plain_len - 1] ^= 0x01;
        uLongf now = compressBound(plain_len);
        assert_true(HEADER_BYTES + la + now + TAG_BYTES <= alen + blen + 4096);
        assert_int_equal(compress2(x + HEADER_BYTES + la, &now, plain, plain_len, 1), Z_OK);
        memcpy(x + HEADER_BYTES + la + now, a + alen - TAG_BYTES, TAG_BYTES); /* the old seal */
        regc_test_put_le(x + 32, now, 8);
        regc_test_put_le(x + 56, crc32(crc32(0L, Z_NULL, 0), x + HEADER_BYTES, (uInt)(la + now)),
                         4);
        regc_test_reseal_header(x);
        n = HEADER_BYTES + la + now + TAG_BYTES;
        free(plain);
        break;
    }
    case TRUNCATE:
        n = d->arg == SIZE_MAX ? alen / 2 : d->arg == SIZE_MAX - 1 ? alen - 1 : d->arg;
        break;
    case APPEND:
        memset(x + alen, 0, d->arg);
        n = alen + d->arg;
        break;
    case OTHER_HEADER: /* B's header + label, then A's body */
        memcpy(x, b, HEADER_BYTES + lb);
        memcpy(x + HEADER_BYTES + lb, a + HEADER_BYTES + la, alen - HEADER_BYTES - la);
        n = HEADER_BYTES + lb + alen - HEADER_BYTES - la;
        break;
    case OTHER_FILE:
        memcpy(x, b, blen);
        n = blen;
        break;
    case RESEAL:
        switch (d->arg) {
        case RESEAL_VERSION: regc_test_put_le(x + 8, REGC_CACHE_FORMAT + 1, 4); break;
        case RESEAL_KEY: regc_test_put_le(x + 16, regc_test_get_le(x + 16, 8) + 1, 8); break;
        case RESEAL_STORED: regc_test_put_le(x + 32, regc_test_get_le(x + 32, 8) + 1, 8); break;
        case RESEAL_PAYLOAD: regc_test_put_le(x + 48, regc_test_get_le(x + 48, 8) - 1, 8); break;
        case RESEAL_SPLIT: /* the same total: decompression succeeds, the key cannot */
            regc_test_put_le(x + 40, regc_test_get_le(x + 40, 8) + 1, 8);
            regc_test_put_le(x + 48, regc_test_get_le(x + 48, 8) - 1, 8);
            break;
        case RESEAL_LABEL: regc_test_put_le(x + 12, regc_test_get_le(x + 12, 4) + 1, 4); break;
        }
        regc_test_reseal_header(x);
        break;
    }
    *out_len = n;
    return x;
}

/* Each kind of damage to one entry: a miss that hands back nothing, a
 * problem named by verify while the other entry stays sound, and a put
 * that makes it whole again. Which check catches it does not matter. */
static void test_corruption_is_a_miss_then_repaired(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = regc_test_open_cache(t->path, 0, "v1");
    /* Labels and payloads of different sizes, so B's header over A's body
     * disagrees with it in length as well as in checksum. */
    regc_bytes pa = regc_test_noise(3000, 1), pb = regc_test_noise(2000, 2);
    regc_test_cache_put(c, "entry A", "label A", &pa);
    regc_test_cache_put(c, "entry B", "label of B", &pb);
    char path_a[1200], path_b[1200], problem[200];
    regc_test_entry_path(t->path, "label A", path_a, sizeof path_a);
    regc_test_entry_path(t->path, "label of B", path_b, sizeof path_b);
    size_t alen, blen;
    uint8_t *a = regc_test_read_bytes(path_a, &alen), *b = regc_test_read_bytes(path_b, &blen);
    size_t la = strlen("label A"), lb = strlen("label of B");
    assert_int_equal(regc_test_get_le(a + 12, 4), la);
    assert_int_equal(regc_test_get_le(b + 12, 4), lb);
    assert_int_equal(alen, HEADER_BYTES + la + regc_test_get_le(a + 32, 8) + TAG_BYTES);

    for (size_t i = 0; i < sizeof damage_cases / sizeof damage_cases[0]; i++) {
        const damage_case *d = &damage_cases[i];
        size_t n;
        uint8_t *x = damaged(d, a, alen, la, b, blen, lb, &n);
        assert_true(n != alen || memcmp(x, a, n) != 0);
        regc_test_write_bytes(path_a, x, n);
        free(x);

        regc_bytes k = regc_test_text("entry A"), got;
        int rc = regc_cache_get(c, &k, &got);
        regc_bytes_free(&k);
        if (rc != 0)
            fail_msg("%s: expected a miss, got %d", d->what, rc);
        assert_null(got.data);
        assert_int_equal(got.len, 0);
        /* B is untouched and still served. */
        regc_test_expect_hit(c, "entry B", &pb);

        regc_test_problem_of(t->path, regc_test_base_name(path_a), problem, sizeof problem);
        if (!problem[0])
            fail_msg("%s: verify found nothing wrong", d->what);
        regc_test_problem_of(t->path, regc_test_base_name(path_b), problem, sizeof problem);
        if (problem[0])
            fail_msg("%s: the sound entry B reported \"%s\"", d->what, problem);

        /* The compile that follows a miss stores afresh: whole again. */
        regc_test_cache_put(c, "entry A", "label A", &pa);
        regc_test_expect_hit(c, "entry A", &pa);
        regc_test_expect_all_sound(t->path, 2);
        size_t now_len;
        uint8_t *now = regc_test_read_bytes(path_a, &now_len);
        assert_int_equal(now_len, alen);
        assert_memory_equal(now, a, alen);
        free(now);
    }
    free(a), free(b);
    regc_cache_close(c);
    regc_bytes_free(&pa), regc_bytes_free(&pb);
}

/* A file with an entry's name that holds no entry at all. */
static void test_foreign_file_is_a_miss(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = regc_test_open_cache(t->path, 0, "v1");
    regc_bytes p = regc_test_text("payload");
    regc_test_cache_put(c, "k", "k", &p);
    char path[1200];
    regc_test_entry_path(t->path, "k", path, sizeof path);
    static const char junk[] =
        "REGCACHE and then nothing that makes sense at all .......................";
    regc_test_write_bytes(path, junk, sizeof junk);
    regc_test_expect_miss(c, "k");
    char problem[200];
    regc_test_problem_of(t->path, regc_test_base_name(path), problem, sizeof problem);
    assert_true(problem[0] != '\0');
    regc_test_cache_put(c, "k", "k", &p);
    regc_test_expect_hit(c, "k", &p);
    regc_cache_close(c);
    regc_bytes_free(&p);
}

/* ---------------------------------------------------------------- 4. eviction */

static void test_lru_eviction(void **state)
{
    regc_test_dir *t = *state;
    static const char *const names[] = {"lru 0", "lru 1", "lru 2", "lru 3", "lru 4"};
    regc_bytes p[5];
    for (int i = 0; i < 5; i++)
        p[i] = regc_test_noise(4000, 10 + (uint64_t)i);

    /* Three entries stored without a limit, to learn an entry's size. */
    regc_cache *c = regc_test_open_cache(t->path, 0, "v1");
    for (int i = 0; i < 3; i++)
        regc_test_cache_put(c, names[i], names[i], &p[i]);
    regc_cache_close(c);
    char path[5][1200];
    int64_t size = 0;
    for (int i = 0; i < 3; i++) {
        regc_test_entry_path(t->path, names[i], path[i], sizeof path[i]);
        struct stat st;
        assert_int_equal(stat(path[i], &st), 0);
        if (st.st_size > size)
            size = st.st_size;
    }
    assert_true(size > 4000);
    /* Room for three entries and a half, never four. */
    int64_t max = 3 * size + size / 2;

    /* Oldest first, set outright: the order cannot depend on the clock's
     * resolution or on how fast the puts ran. */
    time_t now = time(NULL);
    for (int i = 0; i < 3; i++)
        regc_test_set_mtime(path[i], now - 1000 + 100 * i);

    c = regc_test_open_cache(t->path, max, "v1");
    regc_test_cache_put(c, names[3], names[3], &p[3]);
    regc_test_entry_path(t->path, names[3], path[3], sizeof path[3]);
    assert_false(regc_test_exists(path[0]));
    assert_true(regc_test_exists(path[1]) && regc_test_exists(path[2]) &&
                regc_test_exists(path[3]));
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(t->path, 0, &e, &n), REGC_OK);
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += e[i].bytes;
    /* Listed oldest first. */
    assert_int_equal(n, 3);
    assert_string_equal(e[0].file, regc_test_base_name(path[1]));
    assert_string_equal(e[1].file, regc_test_base_name(path[2]));
    assert_string_equal(e[2].file, regc_test_base_name(path[3]));
    regc_cache_entries_free(e, n);
    assert_true(total <= max);
    regc_test_expect_miss(c, names[0]);

    /* A hit is a use: entry 1, the oldest, outlives entry 2 now. */
    regc_test_expect_hit(c, names[1], &p[1]);
    assert_true(regc_test_mtime_of(path[1]) >= now);
    regc_test_cache_put(c, names[4], names[4], &p[4]);
    regc_test_entry_path(t->path, names[4], path[4], sizeof path[4]);
    assert_true(regc_test_exists(path[1]));
    assert_false(regc_test_exists(path[2]));
    assert_true(regc_test_exists(path[3]) && regc_test_exists(path[4]));
    regc_test_expect_hit(c, names[1], &p[1]);
    regc_test_expect_hit(c, names[3], &p[3]);
    regc_test_expect_hit(c, names[4], &p[4]);
    regc_test_expect_all_sound(t->path, 3);
    regc_cache_close(c);
    for (int i = 0; i < 5; i++)
        regc_bytes_free(&p[i]);
}

/* Only the entries count against the limit, and only entries are evicted:
 * another file in the directory is left alone. */
static void test_eviction_spares_other_files(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = regc_test_open_cache(t->path, 1, "v1"); /* smaller than any entry */
    char notes[1200];
    snprintf(notes, sizeof notes, "%s/notes.txt", t->path);
    regc_test_write_bytes(notes, "keep me", 7);
    regc_bytes p = regc_test_text("payload");
    regc_test_cache_put(c, "k", "k", &p);
    /* The entry exceeds the limit alone, so it goes at once: a miss. */
    regc_test_expect_miss(c, "k");
    assert_true(regc_test_exists(notes));
    regc_cache_close(c);
    regc_bytes_free(&p);
}

/* Listing and verifying read entries without using them: the LRU order
 * stays the one the lookups made. */
static void test_scan_leaves_use_times(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = regc_test_open_cache(t->path, 0, "v1");
    regc_bytes p = regc_test_text("payload");
    regc_test_cache_put(c, "a", "a", &p);
    regc_test_cache_put(c, "b", "b", &p);
    regc_cache_close(c);
    char pa[1200], pb[1200];
    regc_test_entry_path(t->path, "a", pa, sizeof pa);
    regc_test_entry_path(t->path, "b", pb, sizeof pb);
    time_t then = time(NULL) - 5000;
    regc_test_set_mtime(pa, then + 10);
    regc_test_set_mtime(pb, then);
    regc_test_expect_all_sound(t->path, 2);
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(t->path, 0, &e, &n), REGC_OK);
    regc_cache_entries_free(e, n);
    assert_int_equal(regc_test_mtime_of(pa), then + 10);
    assert_int_equal(regc_test_mtime_of(pb), then);

    regc_test_proc r;
    assert_int_equal(regc_test_run_regc(&r, "cache", "verify", "--dir", t->path, NULL), 0);
    regc_test_proc_free(&r);
    assert_int_equal(regc_test_mtime_of(pa), then + 10);
    assert_int_equal(regc_test_mtime_of(pb), then);
    regc_bytes_free(&p);
}

/* ---------------------------------------------------------------- 5. temporary files */

static void test_temporary_files(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = regc_test_open_cache(t->path, 0, "v1");
    char stale[1200], fresh[1200], notes[1200];
    snprintf(stale, sizeof stale, "%s/0123456789abcdef0123456789abcdef.regc.tmp.AbC123", t->path);
    snprintf(fresh, sizeof fresh, "%s/fedcba9876543210fedcba9876543210.regc.tmp.XyZ789", t->path);
    snprintf(notes, sizeof notes, "%s/notes.txt", t->path);
    regc_test_write_bytes(stale, "half an entry", 13);
    regc_test_write_bytes(fresh, "a writer at work", 16);
    regc_test_write_bytes(notes, "not the cache's", 15);
    time_t now = time(NULL);
    regc_test_set_mtime(stale, now - REGC_CACHE_STALE_TEMP_S - 60);

    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(t->path, 1, &e, &n), REGC_OK);
    assert_int_equal(n, 2); /* notes.txt is not listed */
    for (int i = 0; i < n; i++) {
        assert_true(e[i].temporary);
        assert_null(e[i].label);
        assert_int_equal(e[i].problem[0], '\0');
    }
    assert_string_equal(e[0].file, regc_test_base_name(stale)); /* oldest first */
    assert_int_equal(e[0].bytes, 13);
    assert_int_equal(e[0].used, now - REGC_CACHE_STALE_TEMP_S - 60);
    regc_cache_entries_free(e, n);

    /* The next store sweeps the dead writer's file, not the live one's. */
    regc_bytes p = regc_test_text("payload");
    regc_test_cache_put(c, "k", "k", &p);
    assert_false(regc_test_exists(stale));
    assert_true(regc_test_exists(fresh));
    regc_test_expect_hit(c, "k", &p);

    /* Younger than the limit: its writer may still be alive. */
    regc_test_set_mtime(fresh, time(NULL) - REGC_CACHE_STALE_TEMP_S + 60);
    regc_test_cache_put(c, "k2", "k2", &p);
    assert_true(regc_test_exists(fresh));

    /* A name longer than any writer makes is not the cache's: neither
     * listed nor removed (cut short, it would name another file). */
    char longname[1400];
    snprintf(longname, sizeof longname, "%s/%0100d.regc.tmp.AbC123", t->path, 0);
    regc_test_write_bytes(longname, "x", 1);
    regc_test_set_mtime(longname, now - REGC_CACHE_STALE_TEMP_S - 60);
    assert_int_equal(regc_cache_scan(t->path, 0, &e, &n), REGC_OK);
    assert_int_equal(n, 3);
    for (int i = 0; i < n; i++)
        assert_true(strlen(e[i].file) < 64 && strstr(longname, e[i].file) == NULL);
    regc_cache_entries_free(e, n);

    /* clear: entries and temporaries, counted; other files stay. */
    int removed = -1;
    assert_int_equal(regc_cache_clear(t->path, &removed), REGC_OK);
    assert_int_equal(removed, 3);
    assert_int_equal(regc_cache_scan(t->path, 0, &e, &n), REGC_OK);
    assert_int_equal(n, 0);
    regc_cache_entries_free(e, n);
    assert_true(regc_test_exists(notes));
    assert_true(regc_test_exists(longname));
    regc_test_expect_miss(c, "k");
    assert_int_equal(regc_cache_clear(t->path, &removed), REGC_OK);
    assert_int_equal(removed, 0);
    regc_cache_close(c);
    regc_bytes_free(&p);
}

/* ---------------------------------------------------------------- 6. errors */

static void test_open_errors(void **state)
{
    regc_test_dir *t = *state;
    char file[1200], below[1300];
    snprintf(file, sizeof file, "%s/plain", t->dir);
    snprintf(below, sizeof below, "%s/sub", file);
    regc_test_write_bytes(file, "x", 1);
    regc_cache *c = (regc_cache *)&c; /* must be cleared */
    int rc = regc_cache_open(below, 0, NULL, &c);
    assert_true(rc < 0);
    assert_null(c);
    regc_test_expect_error(below, NULL);

    /* The directory is a regular file itself. */
    rc = regc_cache_open(file, 0, NULL, &c);
    assert_true(rc < 0);
    assert_null(c);
    regc_test_expect_error(file, NULL);

    rc = regc_cache_open("", 0, NULL, &c);
    assert_true(rc < 0);
    assert_null(c);

    /* scan and clear name the directory they cannot open. */
    regc_cache_entry *e = (regc_cache_entry *)&e;
    int n = -1;
    assert_true(regc_cache_scan(below, 0, &e, &n) < 0);
    assert_null(e);
    assert_int_equal(n, 0);
    regc_test_expect_error(below, NULL);
    int removed = -1;
    assert_true(regc_cache_clear(below, &removed) < 0);
    assert_int_equal(removed, 0);

    /* Opening makes every missing parent. */
    snprintf(below, sizeof below, "%s/x/y/z", t->dir);
    c = regc_test_open_cache(below, 0, NULL);
    struct stat st;
    assert_int_equal(stat(below, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    regc_cache_close(c);
}

static char *saved_env(const char *name)
{
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void restore_env(const char *name, char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    free(value);
}

/* The sealing key: made on first open, private to its owner, kept by every
 * later open (entries written before stay hits), and a key file that is
 * not one refuses the cache by name. Another directory's key does not
 * verify this one's entries. */
static void test_sealing_key(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = regc_test_open_cache(t->path, 0, "v1");
    char key[1200];
    snprintf(key, sizeof key, "%s/key", t->path);
    struct stat st;
    assert_int_equal(stat(key, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, 16);
    regc_bytes p = regc_test_noise(500, 3);
    regc_test_cache_put(c, "sealed", "sealed", &p);
    regc_cache_close(c);
    c = regc_test_open_cache(t->path, 0, "v1");
    regc_test_expect_hit(c, "sealed", &p);
    regc_cache_close(c);

    /* the same entry file under another directory (another key) */
    char other[1200], from[1400], to[1400];
    snprintf(other, sizeof other, "%s/other", t->dir);
    regc_cache *o = regc_test_open_cache(other, 0, "v1");
    regc_test_entry_path(t->path, "sealed", from, sizeof from);
    snprintf(to, sizeof to, "%s/%s", other, regc_test_base_name(from));
    size_t n;
    uint8_t *bytes = regc_test_read_bytes(from, &n);
    regc_test_write_bytes(to, bytes, n);
    free(bytes);
    regc_test_expect_miss(o, "sealed");
    regc_cache_close(o);

    regc_test_write_bytes(key, "short", 5);
    regc_cache *bad = NULL;
    assert_int_not_equal(regc_cache_open(t->path, 0, "v1", &bad), REGC_OK);
    assert_null(bad);
    assert_non_null(strstr(regc_error_message(), key));
    regc_bytes_free(&p);
}

static void test_default_dir(void **state)
{
    (void)state;
    char *xdg = saved_env("XDG_CACHE_HOME"), *home = saved_env("HOME");
    /* Results first, assertions after the environment is back: a failed
     * assertion leaves the test at once. */
    char abs_dir[256], rel_dir[256], no_xdg[256], none[256] = "", tiny[8];
    int rc_abs, rc_rel, rc_no_xdg, rc_none, rc_empty, rc_tiny;
    char msg_none[512];

    setenv("XDG_CACHE_HOME", "/xdg/cache", 1);
    setenv("HOME", "/home/someone", 1);
    rc_abs = regc_cache_default_dir(abs_dir, sizeof abs_dir);
    setenv("XDG_CACHE_HOME", "relative/cache", 1);
    rc_rel = regc_cache_default_dir(rel_dir, sizeof rel_dir);
    unsetenv("XDG_CACHE_HOME");
    rc_no_xdg = regc_cache_default_dir(no_xdg, sizeof no_xdg);
    unsetenv("HOME");
    rc_none = regc_cache_default_dir(none, sizeof none);
    snprintf(msg_none, sizeof msg_none, "%s", regc_error_message());
    setenv("XDG_CACHE_HOME", "", 1);
    setenv("HOME", "", 1);
    rc_empty = regc_cache_default_dir(none, sizeof none);
    setenv("XDG_CACHE_HOME", "/a/long/enough/path", 1);
    rc_tiny = regc_cache_default_dir(tiny, sizeof tiny);

    restore_env("XDG_CACHE_HOME", xdg);
    restore_env("HOME", home);

    assert_int_equal(rc_abs, REGC_OK);
    assert_string_equal(abs_dir, "/xdg/cache/regc");
    assert_int_equal(rc_rel, REGC_OK);
    assert_string_equal(rel_dir, "/home/someone/.cache/regc");
    assert_int_equal(rc_no_xdg, REGC_OK);
    assert_string_equal(no_xdg, "/home/someone/.cache/regc");
    assert_true(rc_none < 0);
    assert_non_null(strstr(msg_none, "XDG_CACHE_HOME"));
    assert_non_null(strstr(msg_none, "HOME is not set") || strstr(msg_none, "nor HOME"));
    assert_null(strchr(msg_none, '\n'));
    assert_true(rc_empty < 0);
    assert_true(rc_tiny < 0);
}

/* A store that cannot be written is not an error: the cache only saves
 * work. It leaves nothing behind, and the lookup stays a miss. */
static void test_unwritable_put(void **state)
{
    regc_test_dir *t = *state;
    regc_bytes p = regc_test_text("payload");

    /* The entry's name is taken by a directory: the rename fails, for
     * root too. The name comes from storing the same key elsewhere. */
    char other[1200], name[1200], taken[2400];
    snprintf(other, sizeof other, "%s/other", t->dir);
    regc_cache *o = regc_test_open_cache(other, 0, "v1");
    regc_test_cache_put(o, "k", "k", &p);
    regc_cache_close(o);
    regc_test_entry_path(other, "k", name, sizeof name);
    regc_cache *c = regc_test_open_cache(t->path, 0, "v1");
    snprintf(taken, sizeof taken, "%s/%s", t->path, regc_test_base_name(name));
    assert_int_equal(mkdir(taken, 0755), 0);
    regc_bytes k = regc_test_text("k");
    assert_int_equal(regc_cache_put(c, &k, "k", &p), REGC_OK);
    regc_bytes_free(&k);
    regc_test_expect_miss(c, "k");
    assert_int_equal(regc_test_count_names(t->path, ".tmp."), 0);
    assert_int_equal(rmdir(taken), 0);

    /* A read-only directory; root writes there regardless. */
    if (geteuid() != 0) {
        assert_int_equal(chmod(t->path, 0500), 0);
        k = regc_test_text("k");
        int rc = regc_cache_put(c, &k, "k", &p);
        regc_bytes_free(&k);
        int left = regc_test_count_names(t->path, ".regc");
        assert_int_equal(chmod(t->path, 0700), 0);
        assert_int_equal(rc, REGC_OK);
        assert_int_equal(left, 0);
        regc_test_expect_miss(c, "k");
    }
    /* Writable again: stored as usual. */
    regc_test_cache_put(c, "k", "k", &p);
    regc_test_expect_hit(c, "k", &p);
    regc_cache_close(c);
    regc_bytes_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_round_trip, setup),
        regc_test_in_dir(test_empty_canonical_form, setup),
        regc_test_in_dir(test_version_namespaces, setup),
        regc_test_in_dir(test_corruption_is_a_miss_then_repaired, setup),
        regc_test_in_dir(test_foreign_file_is_a_miss, setup),
        regc_test_in_dir(test_lru_eviction, setup),
        regc_test_in_dir(test_eviction_spares_other_files, setup),
        regc_test_in_dir(test_scan_leaves_use_times, setup),
        regc_test_in_dir(test_temporary_files, setup),
        regc_test_in_dir(test_open_errors, setup),
        regc_test_in_dir(test_sealing_key, setup),
        cmocka_unit_test(test_default_dir),
        regc_test_in_dir(test_unwritable_put, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
