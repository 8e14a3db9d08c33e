/* test_cache_util.c — helpers of the compile-cache tests (test_cache_util.h). */
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

#include "test_cache_util.h"
#include "test_util.h"

regc_bytes regc_test_bytes_of(const void *p, size_t n)
{
    regc_bytes b = {0};
    regc_bytes_put(&b, p, n);
    assert_false(b.failed);
    return b;
}

regc_bytes regc_test_text(const char *s) { return regc_test_bytes_of(s, strlen(s)); }

/* Deterministic bytes that zlib cannot shrink: the entry's size is then
 * predictable from the payload's. */
regc_bytes regc_test_noise(size_t n, uint64_t seed)
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

regc_cache *regc_test_open_cache(const char *dir, int64_t max_bytes, const char *version)
{
    regc_cache *c = NULL;
    int rc = regc_cache_open(dir, max_bytes, version, &c);
    if (rc != REGC_OK)
        fail_msg("regc_cache_open(%s): %s", dir, regc_error_message());
    assert_non_null(c);
    return c;
}

void regc_test_cache_put(regc_cache *c, const char *canon, const char *label,
                         const regc_bytes *payload)
{
    regc_bytes k = regc_test_text(canon);
    assert_int_equal(regc_cache_put(c, &k, label, payload), REGC_OK);
    regc_bytes_free(&k);
}

/* A hit returning exactly `want`. */
void regc_test_expect_hit(regc_cache *c, const char *canon, const regc_bytes *want)
{
    regc_bytes k = regc_test_text(canon), got;
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
void regc_test_expect_miss(regc_cache *c, const char *canon)
{
    regc_bytes k = regc_test_text(canon), got;
    memset(&got, 0xAB, sizeof got); /* get must clear what it was given */
    int rc = regc_cache_get(c, &k, &got);
    regc_bytes_free(&k);
    if (rc != 0)
        fail_msg("expected a miss for \"%s\", got %d", canon, rc);
    assert_null(got.data);
    assert_int_equal(got.len, 0);
}

/* The full path of the entry whose label is `label`, found by listing. */
void regc_test_entry_path(const char *dir, const char *label, char *buf, size_t cap)
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
void regc_test_problem_of(const char *dir, const char *file, char *buf, size_t cap)
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
void regc_test_expect_all_sound(const char *dir, int want)
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

const char *regc_test_base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

uint8_t *regc_test_read_bytes(const char *path, size_t *len)
{
    uint8_t *b = (uint8_t *)regc_test_read_file(path, len);
    if (!b)
        fail_msg("cannot read %s", path);
    return b;
}

void regc_test_write_bytes(const char *path, const void *p, size_t n)
{
    assert_int_equal(regc_test_write_file(path, p, n), 0);
}

uint64_t regc_test_get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void regc_test_put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A header that passes its own checksum: bytes 60..63 are the CRC-32 of 0..59. */
void regc_test_reseal_header(uint8_t *h)
{
    regc_test_put_le(h + 60, crc32(crc32(0L, Z_NULL, 0), h, 60), 4);
}

void regc_test_seal_entry(const char *cache_dir, const uint8_t *file, size_t len,
                          uint8_t tag[REGC_TEST_CACHE_TAG_BYTES])
{
    char path[4200];
    snprintf(path, sizeof path, "%s/key", cache_dir);
    size_t n;
    uint8_t *key = regc_test_read_bytes(path, &n);
    assert_int_equal(n, 16);
    regc_siphash128(key, file, len, tag);
    free(key);
}

void regc_test_set_mtime(const char *path, time_t when)
{
    struct timespec ts[2] = {{when, 0}, {when, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

time_t regc_test_mtime_of(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_mtim.tv_sec;
}

int regc_test_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Names in dir containing `part`. */
int regc_test_count_names(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += strstr(de->d_name, part) != NULL;
    closedir(d);
    return n;
}
