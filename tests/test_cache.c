/* test_cache.c — the compile cache's on-disk store through its public API
 * (round trips, version namespaces, every kind of damage detected as a
 * miss and repaired by the next store, LRU eviction, writers' temporary
 * files, errors), the byte encoding its keys and payloads use, and the
 * `regc cache ls|verify|clear` command. */
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
#include "test_util.h"

#define HEADER_BYTES 64

/* t->path is the cache directory (not made yet: regc_cache_open makes it). */
static int setup(void **state)
{
    return regc_test_dir_setup(state, "cache", "c");
}

/* ---------------------------------------------------------------- helpers */

static regc_bytes bytes_of(const void *p, size_t n)
{
    regc_bytes b = {0};
    regc_bytes_put(&b, p, n);
    assert_false(b.failed);
    return b;
}

static regc_bytes text(const char *s) { return bytes_of(s, strlen(s)); }

/* Deterministic bytes that zlib cannot shrink: the entry's size is then
 * predictable from the payload's. */
static regc_bytes noise(size_t n, uint64_t seed)
{
    regc_bytes b = {0};
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint8_t c = (uint8_t)(x >> 24);
        regc_bytes_put(&b, &c, 1);
    }
    assert_false(b.failed);
    return b;
}

static regc_cache *open_cache(const char *dir, int64_t max_bytes, const char *version)
{
    regc_cache *c = NULL;
    int rc = regc_cache_open(dir, max_bytes, version, &c);
    if (rc != REGC_OK)
        fail_msg("regc_cache_open(%s): %s", dir, regc_error_message());
    assert_non_null(c);
    return c;
}

static void put(regc_cache *c, const char *canon, const char *label, const regc_bytes *payload)
{
    regc_bytes k = text(canon);
    assert_int_equal(regc_cache_put(c, &k, label, payload), REGC_OK);
    regc_bytes_free(&k);
}

/* A hit returning exactly `want`. */
static void expect_hit(regc_cache *c, const char *canon, const regc_bytes *want)
{
    regc_bytes k = text(canon), got;
    int rc = regc_cache_get(c, &k, &got);
    regc_bytes_free(&k);
    if (rc != 1)
        fail_msg("expected a hit for \"%s\", got %d", canon, rc);
    assert_int_equal(got.len, want->len);
    if (want->len)
        assert_memory_equal(got.data, want->data, want->len);
    regc_bytes_free(&got);
}

/* A miss that hands back nothing. */
static void expect_miss(regc_cache *c, const char *canon)
{
    regc_bytes k = text(canon), got;
    memset(&got, 0xAB, sizeof got); /* get must clear what it was given */
    int rc = regc_cache_get(c, &k, &got);
    regc_bytes_free(&k);
    if (rc != 0)
        fail_msg("expected a miss for \"%s\", got %d", canon, rc);
    assert_null(got.data);
    assert_int_equal(got.len, 0);
}

/* The full path of the entry whose label is `label`, found by listing. */
static void entry_path(const char *dir, const char *label, char *buf, size_t cap)
{
    regc_cache_entry *e;
    int n, found = 0;
    assert_int_equal(regc_cache_scan(dir, 0, &e, &n), REGC_OK);
    for (int i = 0; i < n; i++)
        if (!e[i].temporary && e[i].label && !strcmp(e[i].label, label)) {
            snprintf(buf, cap, "%s/%s", dir, e[i].file);
            found++;
        }
    regc_cache_entries_free(e, n);
    if (found != 1)
        fail_msg("%d entries labelled \"%s\" in %s", found, label, dir);
}

/* verify: the problem reported for file (a base name); fails if absent. */
static void problem_of(const char *dir, const char *file, char *buf, size_t cap)
{
    regc_cache_entry *e;
    int n, found = 0;
    assert_int_equal(regc_cache_scan(dir, 1, &e, &n), REGC_OK);
    for (int i = 0; i < n; i++)
        if (!strcmp(e[i].file, file)) {
            snprintf(buf, cap, "%s", e[i].problem);
            found = 1;
        }
    regc_cache_entries_free(e, n);
    if (!found)
        fail_msg("%s not listed in %s", file, dir);
}

/* verify: every entry sound, `want` of them, no temporaries. */
static void expect_all_sound(const char *dir, int want)
{
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(dir, 1, &e, &n), REGC_OK);
    for (int i = 0; i < n; i++) {
        if (e[i].problem[0])
            fail_msg("%s: %s", e[i].file, e[i].problem);
        assert_false(e[i].temporary);
        assert_non_null(e[i].label);
    }
    regc_cache_entries_free(e, n);
    assert_int_equal(n, want);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static uint8_t *read_bytes(const char *path, size_t *len)
{
    uint8_t *b = (uint8_t *)regc_test_read_file(path, len);
    if (!b)
        fail_msg("cannot read %s", path);
    return b;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    assert_int_equal(regc_test_write_file(path, p, n), 0);
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A header that passes its own checksum: bytes 60..63 are the CRC-32 of 0..59. */
static void reseal_header(uint8_t *h)
{
    put_le(h + 60, crc32(crc32(0L, Z_NULL, 0), h, 60), 4);
}

static void set_mtime(const char *path, time_t when)
{
    struct timespec ts[2] = {{when, 0}, {when, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static time_t mtime_of(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_mtim.tv_sec;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Names in dir containing `part`. */
static int count_names(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += strstr(de->d_name, part) != NULL;
    closedir(d);
    return n;
}

/* ---------------------------------------------------------------- 1. round trips */

static void test_round_trip(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = open_cache(t->path, 0, "v1");
    assert_string_equal(regc_cache_dir(c), t->path);

    /* Nothing stored yet: the ordinary miss. */
    expect_miss(c, "layer A");

    regc_bytes small = text("compiled layer A"), empty = {0}, big = noise(1 << 20, 7);
    put(c, "layer A", "layer A", &small);
    put(c, "empty", "an empty payload", &empty);
    put(c, "big", "a 1 MiB payload", &big);
    expect_hit(c, "layer A", &small);
    expect_hit(c, "empty", &empty);
    expect_hit(c, "big", &big);
    /* One byte more, one byte different, a prefix: other canonical forms. */
    expect_miss(c, "layer A ");
    expect_miss(c, "layer B");
    expect_miss(c, "layer");
    expect_miss(c, "");
    expect_all_sound(t->path, 3);

    /* Storing again replaces the payload: a recompile's result wins. */
    regc_bytes other = text("compiled layer A, second try");
    put(c, "layer A", "layer A", &other);
    expect_hit(c, "layer A", &other);
    expect_all_sound(t->path, 3);
    regc_cache_close(c);

    /* A restart: a new handle on the same directory finds everything. */
    c = open_cache(t->path, 0, "v1");
    expect_hit(c, "layer A", &other);
    expect_hit(c, "empty", &empty);
    expect_hit(c, "big", &big);
    regc_cache_close(c);

    regc_bytes_free(&small), regc_bytes_free(&big), regc_bytes_free(&other);
}

/* An empty canonical form is a key like any other. */
static void test_empty_canonical_form(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = open_cache(t->path, 0, "v1");
    regc_bytes payload = text("for the empty key");
    put(c, "", "empty key", &payload);
    expect_hit(c, "", &payload);
    expect_miss(c, "x");
    regc_cache_close(c);
    regc_bytes_free(&payload);
}

/* ---------------------------------------------------------------- 2. versions */

static void test_version_namespaces(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *v1 = open_cache(t->path, 0, "v1"), *v2 = open_cache(t->path, 0, "v2");
    regc_bytes one = text("made by v1"), two = text("made by v2");

    put(v1, "region", "region v1", &one);
    expect_miss(v2, "region");
    expect_hit(v1, "region", &one);

    /* Both live side by side in one directory, each seeing its own. */
    put(v2, "region", "region v2", &two);
    expect_hit(v1, "region", &one);
    expect_hit(v2, "region", &two);
    expect_all_sound(t->path, 2);
    regc_cache_close(v1), regc_cache_close(v2);

    /* NULL is this build's version: the same keys as naming it outright. */
    const char *build = regc_cache_build_version();
    assert_non_null(build);
    assert_true(build[0] != '\0');
    assert_non_null(strstr(build, "format 1"));
    regc_cache *dflt = open_cache(t->path, 0, NULL), *named = open_cache(t->path, 0, build);
    regc_bytes three = text("made by this build");
    put(dflt, "region", "region build", &three);
    expect_hit(named, "region", &three);
    v1 = open_cache(t->path, 0, "v1");
    expect_hit(v1, "region", &one);
    regc_cache_close(v1), regc_cache_close(dflt), regc_cache_close(named);

    /* A version that extends another is a different namespace too. */
    char longer[512];
    snprintf(longer, sizeof longer, "%s+", build);
    regc_cache *ext = open_cache(t->path, 0, longer);
    expect_miss(ext, "region");
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
    {RESEAL, RESEAL_VERSION, "format version 2, header resealed"},
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
    case FLIP_LABEL:
        x[HEADER_BYTES + 1] ^= 0x01;
        break;
    case FLIP_HEADER:
        x[d->arg] ^= 0x01;
        break;
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
        case RESEAL_VERSION:
            put_le(x + 8, 2, 4);
            break;
        case RESEAL_KEY:
            put_le(x + 16, get_le(x + 16, 8) + 1, 8);
            break;
        case RESEAL_STORED:
            put_le(x + 32, get_le(x + 32, 8) + 1, 8);
            break;
        case RESEAL_PAYLOAD:
            put_le(x + 48, get_le(x + 48, 8) - 1, 8);
            break;
        case RESEAL_SPLIT: /* the same total: decompression succeeds, the key cannot */
            put_le(x + 40, get_le(x + 40, 8) + 1, 8);
            put_le(x + 48, get_le(x + 48, 8) - 1, 8);
            break;
        case RESEAL_LABEL:
            put_le(x + 12, get_le(x + 12, 4) + 1, 4);
            break;
        }
        reseal_header(x);
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
    regc_cache *c = open_cache(t->path, 0, "v1");
    /* Labels and payloads of different sizes, so B's header over A's body
     * disagrees with it in length as well as in checksum. */
    regc_bytes pa = noise(3000, 1), pb = noise(2000, 2);
    put(c, "entry A", "label A", &pa);
    put(c, "entry B", "label of B", &pb);
    char path_a[1200], path_b[1200], problem[200];
    entry_path(t->path, "label A", path_a, sizeof path_a);
    entry_path(t->path, "label of B", path_b, sizeof path_b);
    size_t alen, blen;
    uint8_t *a = read_bytes(path_a, &alen), *b = read_bytes(path_b, &blen);
    size_t la = strlen("label A"), lb = strlen("label of B");
    assert_int_equal(get_le(a + 12, 4), la);
    assert_int_equal(get_le(b + 12, 4), lb);
    assert_int_equal(alen, HEADER_BYTES + la + get_le(a + 32, 8));

    for (size_t i = 0; i < sizeof damage_cases / sizeof damage_cases[0]; i++) {
        const damage_case *d = &damage_cases[i];
        size_t n;
        uint8_t *x = damaged(d, a, alen, la, b, blen, lb, &n);
        assert_true(n != alen || memcmp(x, a, n) != 0);
        write_bytes(path_a, x, n);
        free(x);

        regc_bytes k = text("entry A"), got;
        int rc = regc_cache_get(c, &k, &got);
        regc_bytes_free(&k);
        if (rc != 0)
            fail_msg("%s: expected a miss, got %d", d->what, rc);
        assert_null(got.data);
        assert_int_equal(got.len, 0);
        /* B is untouched and still served. */
        expect_hit(c, "entry B", &pb);

        problem_of(t->path, base_name(path_a), problem, sizeof problem);
        if (!problem[0])
            fail_msg("%s: verify found nothing wrong", d->what);
        problem_of(t->path, base_name(path_b), problem, sizeof problem);
        if (problem[0])
            fail_msg("%s: the sound entry B reported \"%s\"", d->what, problem);

        /* The compile that follows a miss stores afresh: whole again. */
        put(c, "entry A", "label A", &pa);
        expect_hit(c, "entry A", &pa);
        expect_all_sound(t->path, 2);
        size_t now_len;
        uint8_t *now = read_bytes(path_a, &now_len);
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
    regc_cache *c = open_cache(t->path, 0, "v1");
    regc_bytes p = text("payload");
    put(c, "k", "k", &p);
    char path[1200];
    entry_path(t->path, "k", path, sizeof path);
    static const char junk[] = "REGCACHE and then nothing that makes sense at all .......................";
    write_bytes(path, junk, sizeof junk);
    expect_miss(c, "k");
    char problem[200];
    problem_of(t->path, base_name(path), problem, sizeof problem);
    assert_true(problem[0] != '\0');
    put(c, "k", "k", &p);
    expect_hit(c, "k", &p);
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
        p[i] = noise(4000, 10 + (uint64_t)i);

    /* Three entries stored without a limit, to learn an entry's size. */
    regc_cache *c = open_cache(t->path, 0, "v1");
    for (int i = 0; i < 3; i++)
        put(c, names[i], names[i], &p[i]);
    regc_cache_close(c);
    char path[5][1200];
    int64_t size = 0;
    for (int i = 0; i < 3; i++) {
        entry_path(t->path, names[i], path[i], sizeof path[i]);
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
        set_mtime(path[i], now - 1000 + 100 * i);

    c = open_cache(t->path, max, "v1");
    put(c, names[3], names[3], &p[3]);
    entry_path(t->path, names[3], path[3], sizeof path[3]);
    assert_false(exists(path[0]));
    assert_true(exists(path[1]) && exists(path[2]) && exists(path[3]));
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(t->path, 0, &e, &n), REGC_OK);
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += e[i].bytes;
    /* Listed oldest first. */
    assert_int_equal(n, 3);
    assert_string_equal(e[0].file, base_name(path[1]));
    assert_string_equal(e[1].file, base_name(path[2]));
    assert_string_equal(e[2].file, base_name(path[3]));
    regc_cache_entries_free(e, n);
    assert_true(total <= max);
    expect_miss(c, names[0]);

    /* A hit is a use: entry 1, the oldest, outlives entry 2 now. */
    expect_hit(c, names[1], &p[1]);
    assert_true(mtime_of(path[1]) >= now);
    put(c, names[4], names[4], &p[4]);
    entry_path(t->path, names[4], path[4], sizeof path[4]);
    assert_true(exists(path[1]));
    assert_false(exists(path[2]));
    assert_true(exists(path[3]) && exists(path[4]));
    expect_hit(c, names[1], &p[1]);
    expect_hit(c, names[3], &p[3]);
    expect_hit(c, names[4], &p[4]);
    expect_all_sound(t->path, 3);
    regc_cache_close(c);
    for (int i = 0; i < 5; i++)
        regc_bytes_free(&p[i]);
}

/* Only the entries count against the limit, and only entries are evicted:
 * another file in the directory is left alone. */
static void test_eviction_spares_other_files(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = open_cache(t->path, 1, "v1"); /* smaller than any entry */
    char notes[1200];
    snprintf(notes, sizeof notes, "%s/notes.txt", t->path);
    write_bytes(notes, "keep me", 7);
    regc_bytes p = text("payload");
    put(c, "k", "k", &p);
    /* The entry exceeds the limit alone, so it goes at once: a miss. */
    expect_miss(c, "k");
    assert_true(exists(notes));
    regc_cache_close(c);
    regc_bytes_free(&p);
}

/* Listing and verifying read entries without using them: the LRU order
 * stays the one the lookups made. */
static void test_scan_leaves_use_times(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = open_cache(t->path, 0, "v1");
    regc_bytes p = text("payload");
    put(c, "a", "a", &p);
    put(c, "b", "b", &p);
    regc_cache_close(c);
    char pa[1200], pb[1200];
    entry_path(t->path, "a", pa, sizeof pa);
    entry_path(t->path, "b", pb, sizeof pb);
    time_t then = time(NULL) - 5000;
    set_mtime(pa, then + 10);
    set_mtime(pb, then);
    expect_all_sound(t->path, 2);
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(t->path, 0, &e, &n), REGC_OK);
    regc_cache_entries_free(e, n);
    assert_int_equal(mtime_of(pa), then + 10);
    assert_int_equal(mtime_of(pb), then);

    regc_test_proc r;
    assert_int_equal(regc_test_run_regc(&r, "cache", "verify", "--dir", t->path, NULL), 0);
    regc_test_proc_free(&r);
    assert_int_equal(mtime_of(pa), then + 10);
    assert_int_equal(mtime_of(pb), then);
    regc_bytes_free(&p);
}

/* ---------------------------------------------------------------- 5. temporary files */

static void test_temporary_files(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = open_cache(t->path, 0, "v1");
    char stale[1200], fresh[1200], notes[1200];
    snprintf(stale, sizeof stale, "%s/0123456789abcdef0123456789abcdef.regc.tmp.AbC123", t->path);
    snprintf(fresh, sizeof fresh, "%s/fedcba9876543210fedcba9876543210.regc.tmp.XyZ789", t->path);
    snprintf(notes, sizeof notes, "%s/notes.txt", t->path);
    write_bytes(stale, "half an entry", 13);
    write_bytes(fresh, "a writer at work", 16);
    write_bytes(notes, "not the cache's", 15);
    time_t now = time(NULL);
    set_mtime(stale, now - REGC_CACHE_STALE_TEMP_S - 60);

    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(t->path, 1, &e, &n), REGC_OK);
    assert_int_equal(n, 2); /* notes.txt is not listed */
    for (int i = 0; i < n; i++) {
        assert_true(e[i].temporary);
        assert_null(e[i].label);
        assert_int_equal(e[i].problem[0], '\0');
    }
    assert_string_equal(e[0].file, base_name(stale)); /* oldest first */
    assert_int_equal(e[0].bytes, 13);
    assert_int_equal(e[0].used, now - REGC_CACHE_STALE_TEMP_S - 60);
    regc_cache_entries_free(e, n);

    /* The next store sweeps the dead writer's file, not the live one's. */
    regc_bytes p = text("payload");
    put(c, "k", "k", &p);
    assert_false(exists(stale));
    assert_true(exists(fresh));
    expect_hit(c, "k", &p);

    /* Younger than the limit: its writer may still be alive. */
    set_mtime(fresh, time(NULL) - REGC_CACHE_STALE_TEMP_S + 60);
    put(c, "k2", "k2", &p);
    assert_true(exists(fresh));

    /* A name longer than any writer makes is not the cache's: neither
     * listed nor removed (cut short, it would name another file). */
    char longname[1400];
    snprintf(longname, sizeof longname, "%s/%0100d.regc.tmp.AbC123", t->path, 0);
    write_bytes(longname, "x", 1);
    set_mtime(longname, now - REGC_CACHE_STALE_TEMP_S - 60);
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
    assert_true(exists(notes));
    assert_true(exists(longname));
    expect_miss(c, "k");
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
    write_bytes(file, "x", 1);
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
    c = open_cache(below, 0, NULL);
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
    regc_bytes p = text("payload");

    /* The entry's name is taken by a directory: the rename fails, for
     * root too. The name comes from storing the same key elsewhere. */
    char other[1200], name[1200], taken[2400];
    snprintf(other, sizeof other, "%s/other", t->dir);
    regc_cache *o = open_cache(other, 0, "v1");
    put(o, "k", "k", &p);
    regc_cache_close(o);
    entry_path(other, "k", name, sizeof name);
    regc_cache *c = open_cache(t->path, 0, "v1");
    snprintf(taken, sizeof taken, "%s/%s", t->path, base_name(name));
    assert_int_equal(mkdir(taken, 0755), 0);
    regc_bytes k = text("k");
    assert_int_equal(regc_cache_put(c, &k, "k", &p), REGC_OK);
    regc_bytes_free(&k);
    expect_miss(c, "k");
    assert_int_equal(count_names(t->path, ".tmp."), 0);
    assert_int_equal(rmdir(taken), 0);

    /* A read-only directory; root writes there regardless. */
    if (geteuid() != 0) {
        assert_int_equal(chmod(t->path, 0500), 0);
        k = text("k");
        int rc = regc_cache_put(c, &k, "k", &p);
        regc_bytes_free(&k);
        int left = count_names(t->path, ".regc");
        assert_int_equal(chmod(t->path, 0700), 0);
        assert_int_equal(rc, REGC_OK);
        assert_int_equal(left, 0);
        expect_miss(c, "k");
    }
    /* Writable again: stored as usual. */
    put(c, "k", "k", &p);
    expect_hit(c, "k", &p);
    regc_cache_close(c);
    regc_bytes_free(&p);
}

/* ---------------------------------------------------------------- 7. bytes */

static void test_varints(void **state)
{
    (void)state;
    static const int64_t ints[] = {0, 1, -1, 63, -64, 64, 127, 128, -128, 300, -300, 1 << 20,
                                   INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, INT64_MAX - 1,
                                   INT64_MIN + 1};
    static const uint64_t uints[] = {0, 1, 127, 128, 255, 16383, 16384, UINT32_MAX, UINT64_MAX,
                                     (uint64_t)1 << 63};
    const size_t ni = sizeof ints / sizeof ints[0], nu = sizeof uints / sizeof uints[0];
    regc_bytes b = {0};
    for (size_t i = 0; i < ni; i++)
        regc_bytes_put_i64(&b, ints[i]);
    for (size_t i = 0; i < nu; i++)
        regc_bytes_put_u64(&b, uints[i]);
    assert_false(b.failed);
    regc_reader r = regc_reader_of(b.data, b.len);
    for (size_t i = 0; i < ni; i++) {
        int64_t v = regc_reader_i64(&r);
        if (v != ints[i])
            fail_msg("i64 %lld read back as %lld", (long long)ints[i], (long long)v);
    }
    for (size_t i = 0; i < nu; i++)
        assert_true(regc_reader_u64(&r) == uints[i]);
    assert_false(r.failed);
    assert_ptr_equal(r.p, r.end);
    regc_bytes_free(&b);

    /* The widths LEB128 and zigzag promise: small magnitudes are short. */
    struct {
        int64_t v;
        size_t len;
    } widths[] = {{0, 1}, {-1, 1}, {63, 1}, {-64, 1}, {64, 2}, {INT64_MAX, 10}, {INT64_MIN, 10}};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        regc_bytes w = {0};
        regc_bytes_put_i64(&w, widths[i].v);
        assert_int_equal(w.len, widths[i].len);
        regc_bytes_free(&w);
    }
    regc_bytes u = {0};
    regc_bytes_put_u64(&u, 127);
    assert_int_equal(u.len, 1);
    assert_int_equal(u.data[0], 0x7f);
    regc_bytes_put_u64(&u, 128);
    assert_int_equal(u.len, 3);
    assert_int_equal(u.data[1], 0x80);
    assert_int_equal(u.data[2], 0x01);
    regc_bytes_free(&u);
}

static void test_floats_and_strings(void **state)
{
    (void)state;
    static const uint32_t bits[] = {0x00000000u, 0x80000000u /* -0.0 */, 0x3f800000u,
                                    0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7fc12345u,
                                    0xffc00001u, 0x00000001u /* subnormal */, 0x7f7fffffu};
    const size_t nb = sizeof bits / sizeof bits[0];
    regc_bytes b = {0};
    for (size_t i = 0; i < nb; i++) {
        float f;
        memcpy(&f, &bits[i], 4);
        regc_bytes_put_f32(&b, f);
    }
    regc_bytes_put_str(&b, "");
    regc_bytes_put_str(&b, NULL);
    regc_bytes_put_str(&b, "hello, cache");
    assert_false(b.failed);
    /* Four little-endian IEEE bytes: 1.0f is 00 00 80 3f. */
    assert_int_equal(b.data[8], 0x00);
    assert_int_equal(b.data[10], 0x80);
    assert_int_equal(b.data[11], 0x3f);

    regc_reader r = regc_reader_of(b.data, b.len);
    for (size_t i = 0; i < nb; i++) {
        float f = regc_reader_f32(&r);
        uint32_t u;
        memcpy(&u, &f, 4);
        if (u != bits[i])
            fail_msg("float bits %08x read back as %08x", bits[i], u);
    }
    char *s1 = regc_reader_str(&r), *s2 = regc_reader_str(&r), *s3 = regc_reader_str(&r);
    assert_false(r.failed);
    assert_ptr_equal(r.p, r.end);
    assert_string_equal(s1, "");
    assert_string_equal(s2, "");
    assert_string_equal(s3, "hello, cache");
    free(s1), free(s2), free(s3);

    /* A string whose length runs past the end. */
    regc_bytes_free(&b);
    regc_bytes_put_u64(&b, 10);
    regc_bytes_put(&b, "abc", 3);
    r = regc_reader_of(b.data, b.len);
    assert_null(regc_reader_str(&r));
    assert_true(r.failed);
    regc_bytes_free(&b);
}

static void test_reader_failures(void **state)
{
    (void)state;
    regc_bytes b = {0};
    regc_bytes_put_i64(&b, 5);
    regc_bytes_put_i64(&b, -3);
    regc_bytes_put_i64(&b, 7);

    /* In range, then out of it: lo comes back and the failure sticks. */
    regc_reader r = regc_reader_of(b.data, b.len);
    assert_int_equal(regc_reader_int(&r, 0, 5), 5);
    assert_false(r.failed);
    assert_int_equal(regc_reader_int(&r, 0, 10), 0);
    assert_true(r.failed);
    assert_int_equal(regc_reader_i64(&r), 0); /* 7 is there, but the reader has failed */
    r = regc_reader_of(b.data, b.len);
    assert_int_equal(regc_reader_int(&r, 6, 9), 6);
    assert_true(r.failed);
    r = regc_reader_of(b.data, b.len);
    assert_int_equal(regc_reader_int(&r, 5, 5), 5);
    assert_int_equal(regc_reader_int(&r, -3, -3), -3);
    assert_int_equal(regc_reader_int(&r, INT64_MIN, INT64_MAX), 7);
    assert_false(r.failed);
    regc_bytes_free(&b);

    /* Past the end: 0, zeroed bytes, and failed. */
    r = regc_reader_of("", 0);
    assert_true(regc_reader_u64(&r) == 0);
    assert_true(r.failed);
    r = regc_reader_of("ab", 2);
    uint8_t dst[4] = {9, 9, 9, 9};
    regc_reader_get(&r, dst, 4);
    assert_true(r.failed);
    assert_true(dst[0] == 0 && dst[1] == 0 && dst[2] == 0 && dst[3] == 0);
    r = regc_reader_of("abc", 3);
    assert_true(regc_reader_f32(&r) == 0.0f);
    assert_true(r.failed);
    r = regc_reader_of("ab", 2);
    regc_reader_get(&r, dst, 2);
    assert_false(r.failed);
    assert_true(regc_reader_i64(&r) == 0);
    assert_true(r.failed);

    /* A varint cut off after a continuation byte. */
    static const uint8_t cut[] = {0x80};
    r = regc_reader_of(cut, sizeof cut);
    assert_true(regc_reader_u64(&r) == 0);
    assert_true(r.failed);
    static const uint8_t cut2[] = {0xff, 0xff, 0xff};
    r = regc_reader_of(cut2, sizeof cut2);
    assert_true(regc_reader_i64(&r) == 0);
    assert_true(r.failed);
    /* Longer than any 64-bit value: eleven bytes. */
    static const uint8_t overlong[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
                                       0x80, 0x80, 0x80, 0x80, 0x00};
    r = regc_reader_of(overlong, sizeof overlong);
    assert_true(regc_reader_u64(&r) == 0);
    assert_true(r.failed);
}

/* ---------------------------------------------------------------- 8. regc cache */

/* A usage error: exit 2, one stderr line naming `a`, nothing on stdout. */
static void expect_usage(const regc_test_proc *p, const char *a)
{
    if (p->status != 2)
        fail_msg("expected exit 2, got %d; stderr:\n%s", p->status, p->err);
    if (regc_test_count_lines(p->err) != 1 || !strstr(p->err, a))
        fail_msg("expected one stderr line naming \"%s\", got:\n%s", a, p->err);
    assert_int_equal(p->out_len, 0);
}

/* The line of `out` containing `s`, copied into buf; fails if none. */
static void line_with(const char *out, const char *s, char *buf, size_t cap)
{
    const char *hit = strstr(out, s);
    if (!hit)
        fail_msg("no line with \"%s\" in:\n%s", s, out);
    const char *start = hit;
    while (start > out && start[-1] != '\n')
        start--;
    const char *end = strchr(hit, '\n');
    size_t n = end ? (size_t)(end - start) : strlen(start);
    snprintf(buf, cap, "%.*s", (int)n, start);
}

static void test_cli_ls_verify_clear(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = open_cache(t->path, 0, NULL);
    regc_bytes pa = noise(3000, 3), pb = text("a step program");
    put(c, "A", "layer kind 1 (O1, cpu)", &pa);
    put(c, "B", "whole step (O1, cpu)", &pb);
    regc_cache_close(c);
    char path_a[1200], path_b[1200], line[1400];
    entry_path(t->path, "layer kind 1 (O1, cpu)", path_a, sizeof path_a);
    entry_path(t->path, "whole step (O1, cpu)", path_b, sizeof path_b);

    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "cache", "ls", "--dir", t->path, NULL), 0);
    assert_int_equal(regc_test_count_lines(p.out), 3);
    line_with(p.out, base_name(path_a), line, sizeof line);
    assert_non_null(strstr(line, "layer kind 1 (O1, cpu)"));
    line_with(p.out, base_name(path_b), line, sizeof line);
    assert_non_null(strstr(line, "whole step (O1, cpu)"));
    line_with(p.out, "2 entries", line, sizeof line);
    assert_non_null(strstr(line, t->path));
    assert_int_equal(p.err_len, 0);
    regc_test_proc_free(&p);

    /* --dir=D is the same option. */
    char opt[1300];
    snprintf(opt, sizeof opt, "--dir=%s", t->path);
    assert_int_equal(regc_test_run_regc(&p, "cache", "ls", opt, NULL), 0);
    assert_int_equal(regc_test_count_lines(p.out), 3);
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "cache", "verify", "--dir", t->path, NULL), 0);
    assert_non_null(strstr(p.out, "every entry is sound"));
    assert_null(strstr(p.out, "DAMAGED"));
    regc_test_proc_free(&p);

    /* One flipped byte in A's body: verify names A, and only A. */
    size_t n;
    uint8_t *a = read_bytes(path_a, &n);
    a[n - 100] ^= 0x04;
    write_bytes(path_a, a, n);
    free(a);
    assert_int_equal(regc_test_run_regc(&p, "cache", "verify", "--dir", t->path, NULL), 1);
    line_with(p.out, base_name(path_a), line, sizeof line);
    assert_non_null(strstr(line, "DAMAGED"));
    assert_null(strstr(p.out, base_name(path_b)));
    assert_null(strstr(p.out, "every entry is sound"));
    assert_non_null(strstr(p.out, "damaged entries found"));
    regc_test_proc_free(&p);

    /* A writer's temporary file is listed as such and counted apart. */
    char temp[1300];
    snprintf(temp, sizeof temp, "%s.tmp.Q1w2E3", path_b);
    write_bytes(temp, "partial", 7);
    assert_int_equal(regc_test_run_regc(&p, "cache", "ls", "--dir", t->path, NULL), 0);
    assert_int_equal(regc_test_count_lines(p.out), 4);
    line_with(p.out, base_name(temp), line, sizeof line);
    assert_non_null(strstr(line, "temporary"));
    line_with(p.out, "2 entries", line, sizeof line);
    assert_non_null(strstr(line, "1 temporary file"));
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "cache", "clear", "--dir", t->path, NULL), 0);
    assert_non_null(strstr(p.out, "removed 3 files"));
    regc_test_proc_free(&p);
    assert_false(exists(path_a) || exists(path_b) || exists(temp));
    assert_true(exists(t->path)); /* the directory itself stays */
    assert_int_equal(regc_test_run_regc(&p, "cache", "ls", "--dir", t->path, NULL), 0);
    assert_int_equal(regc_test_count_lines(p.out), 1);
    assert_non_null(strstr(p.out, "0 entries"));
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "cache", "verify", "--dir", t->path, NULL), 0);
    assert_non_null(strstr(p.out, "every entry is sound"));
    regc_test_proc_free(&p);
    regc_bytes_free(&pa), regc_bytes_free(&pb);
}

/* Nothing cached yet is not an error, and looking does not create it. */
static void test_cli_missing_dir(void **state)
{
    regc_test_dir *t = *state;
    static const char *const subs[] = {"ls", "verify", "clear"};
    for (int i = 0; i < 3; i++) {
        regc_test_proc p;
        assert_int_equal(regc_test_run_regc(&p, "cache", subs[i], "--dir", t->path, NULL), 0);
        assert_non_null(strstr(p.out, "no cache directory"));
        assert_non_null(strstr(p.out, t->path));
        assert_int_equal(regc_test_count_lines(p.out), 1);
        regc_test_proc_free(&p);
        assert_false(exists(t->path));
    }
}

static void test_cli_usage(void **state)
{
    regc_test_dir *t = *state;
    regc_test_proc p;
    regc_test_run_regc(&p, "cache", NULL);
    expect_usage(&p, "expected ls, verify or clear");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "lss", "--dir", t->path, NULL);
    expect_usage(&p, "\"lss\"");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "ls", "--bogus", NULL);
    expect_usage(&p, "--bogus");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "ls", "--dir", NULL);
    expect_usage(&p, "--dir");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "ls", "--dir=", NULL);
    expect_usage(&p, "--dir");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "ls", "--dir", "--bogus", NULL);
    expect_usage(&p, "--dir");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "ls", "verify", NULL);
    expect_usage(&p, "\"verify\"");
    regc_test_proc_free(&p);
    assert_false(exists(t->path));

    const char *help[][3] = {{"cache", "--help", NULL}, {"cache", "-h", NULL}, {"help", "cache", NULL}};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(regc_test_run_regc(&p, help[i][0], help[i][1], NULL), 0);
        assert_non_null(strstr(p.out, "usage: regc cache"));
        assert_non_null(strstr(p.out, "  ls "));
        assert_non_null(strstr(p.out, "  verify "));
        assert_non_null(strstr(p.out, "  clear "));
        assert_non_null(strstr(p.out, "--dir"));
        assert_int_equal(p.err_len, 0);
        regc_test_proc_free(&p);
    }
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
        cmocka_unit_test(test_default_dir),
        regc_test_in_dir(test_unwritable_put, setup),
        cmocka_unit_test(test_varints),
        cmocka_unit_test(test_floats_and_strings),
        cmocka_unit_test(test_reader_failures),
        regc_test_in_dir(test_cli_ls_verify_clear, setup),
        regc_test_in_dir(test_cli_missing_dir, setup),
        regc_test_in_dir(test_cli_usage, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
