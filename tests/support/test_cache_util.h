/* test_cache_util.h — what the compile-cache tests share: payloads and
 * keys as bytes, opening, storing and checking entries, and reaching into
 * entry files (their headers, modification times) to damage them. */
#ifndef REGC_TEST_CACHE_UTIL_H
#define REGC_TEST_CACHE_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "regc_cache.h"
#include "regc_common.h"

#define REGC_TEST_CACHE_HEADER_BYTES 64 /* an entry's header, as regc_cache.h lays it out */
#define REGC_TEST_CACHE_TAG_BYTES 16    /* and the seal after its body */

regc_bytes regc_test_bytes_of(const void *p, size_t n);
regc_bytes regc_test_text(const char *s); /* its characters, without the NUL */
/* Deterministic bytes that zlib cannot shrink: the entry's size is then
 * predictable from the payload's. */
regc_bytes regc_test_noise(size_t n, uint64_t seed);
regc_cache *regc_test_open_cache(const char *dir, int64_t max_bytes, const char *version);
void regc_test_cache_put(regc_cache *c, const char *canon, const char *label,
                         const regc_bytes *payload);
/* A hit returning exactly `want`. */
void regc_test_expect_hit(regc_cache *c, const char *canon, const regc_bytes *want);
/* A miss that hands back nothing. */
void regc_test_expect_miss(regc_cache *c, const char *canon);
/* The full path of the entry whose label is `label`, found by listing. */
void regc_test_entry_path(const char *dir, const char *label, char *buf, size_t cap);
/* verify: the problem reported for file (a base name); fails if absent. */
void regc_test_problem_of(const char *dir, const char *file, char *buf, size_t cap);
/* verify: every entry sound, `want` of them, no temporaries. */
void regc_test_expect_all_sound(const char *dir, int want);
const char *regc_test_base_name(const char *path);
uint8_t *regc_test_read_bytes(const char *path, size_t *len);
void regc_test_write_bytes(const char *path, const void *p, size_t n);
uint64_t regc_test_get_le(const uint8_t *p, int n);
void regc_test_put_le(uint8_t *p, uint64_t v, int n);
/* A header that passes its own checksum: bytes 60..63 are the CRC-32 of 0..59. */
void regc_test_reseal_header(uint8_t *h);
/* The seal of an entry file's first len bytes under cache_dir's key file,
 * as a program that holds the key makes it. */
void regc_test_seal_entry(const char *cache_dir, const uint8_t *file, size_t len,
                          uint8_t tag[REGC_TEST_CACHE_TAG_BYTES]);
void regc_test_set_mtime(const char *path, time_t when);
time_t regc_test_mtime_of(const char *path);
int regc_test_exists(const char *path);
/* Names in dir containing `part`. */
int regc_test_count_names(const char *dir, const char *part);

#endif
