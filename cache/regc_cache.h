/* regc_cache.h — the compile cache: entries on disk keyed on a canonical
 * form.
 *
 * A caller (the compile pipeline) describes what decides a compiled
 * result as canonical bytes; the key is the XXH3-128 hash of the cache's
 * version string followed by those bytes. An entry is one file,
 * <32 hex digits of the key>.regc:
 *
 *   header (64 bytes, little-endian)
 *     0  "REGCACHE"            8  format version (u32)   12  label length (u32)
 *     16 key (2 x u64)          32 stored length (u64)    40  canonical length (u64)
 *     48 payload length (u64)   56 CRC-32 of label + stored bytes (u32)
 *     60 CRC-32 of bytes 0..59 (u32)
 *   label     a line for people (`regc cache ls`)
 *   stored    zlib of (version, canonical form, payload)
 *   seal      SipHash-2-4-128 of everything before it, under the directory's
 *             key (the file `key`: 16 random bytes, readable by its owner),
 *             so an entry another program wrote, with valid checksums and a
 *             changed payload, is refused too
 *
 * Files are written atomically (a temporary file in the same directory,
 * fsync, rename), so readers and concurrent writers never see a torn
 * entry. Anything wrong with an entry — magic, format version, checksums,
 * the seal, lengths, decompression, or a stored canonical form that differs from
 * the one asked for (a key collision) — makes the lookup a miss that logs
 * one line; the caller compiles afresh and its put replaces the entry. A
 * size limit evicts the least recently used entries (a hit refreshes an
 * entry's modification time).
 *
 * The directory may be shared by many processes and users, so nothing in
 * it is trusted: a file is opened without blocking and read only when it
 * is a regular file no larger than the cache's limit, and a payload with
 * valid checksums is still input to its decoder (the caller's). */
#ifndef REGC_CACHE_H
#define REGC_CACHE_H

#include <stdint.h>
#include <time.h>

#include "regc_common.h"

#define REGC_CACHE_FORMAT 2
/* Temporary files older than this belong to a writer that died. */
#define REGC_CACHE_STALE_TEMP_S (15 * 60)

typedef struct regc_cache regc_cache;

/* $XDG_CACHE_HOME/regc, else $HOME/.cache/regc. */
int regc_cache_default_dir(char *buf, size_t cap);
/* This build's version string: release, format and a hash of the sources
 * that compile, so entries never outlive the code that made them. */
const char *regc_cache_build_version(void);

/* Open (creating) the cache directory dir. max_bytes > 0 limits the
 * entries' total size; version NULL is regc_cache_build_version(), any
 * other string keys a separate namespace in the same directory. */
int regc_cache_open(const char *dir, int64_t max_bytes, const char *version, regc_cache **out);
void regc_cache_close(regc_cache *c);
const char *regc_cache_dir(const regc_cache *c);

/* Look canon up: 1 and the payload (the caller frees it) on a hit, 0 on a
 * miss (one line on stderr when an entry was there but unusable), or a
 * negative status when out of memory. */
int regc_cache_get(regc_cache *c, const regc_bytes *canon, regc_bytes *payload);
/* Store payload under canon. A failure to write is logged and returns
 * REGC_OK: the cache only ever saves work. Returns a negative status only
 * when out of memory. */
int regc_cache_put(regc_cache *c, const regc_bytes *canon, const char *label,
                   const regc_bytes *payload);

/* The path of canon's entry in c's directory (there may be none). */
void regc_cache_entry_path(const regc_cache *c, const regc_bytes *canon, char *buf, size_t cap);

/* ---- inspecting a directory (regc cache ls | verify | clear) */
typedef struct {
    char file[64]; /* the entry's file name */
    char *label;   /* NULL when the header is unreadable */
    int64_t bytes; /* file size */
    time_t used;   /* last stored or hit */
    long used_nsec;
    int temporary;     /* a leftover temporary file of a writer */
    char problem[160]; /* verify: empty when the entry is sound */
} regc_cache_entry;

/* Every entry and temporary file in dir, oldest first; verify checks each
 * entry completely (checksums, decompression, key against the stored
 * canonical form). */
int regc_cache_scan(const char *dir, int verify, regc_cache_entry **out, int *n);
/* What verifying adds beyond checksums: the decoder of the layer that
 * wrote the entry (above this one), given the version string the entry
 * was keyed under, its canonical form and its payload. REGC_OK when the
 * payload is sound; else a status, regc_error_message() saying why. */
typedef int (*regc_cache_check_fn)(void *ctx, const char *version, const uint8_t *canon,
                                   size_t canon_len, const uint8_t *payload, size_t payload_len);
/* regc_cache_scan verifying, each entry whose checksums hold also passed
 * to check: an entry it refuses is reported with its reason. */
int regc_cache_scan_checked(const char *dir, regc_cache_check_fn check, void *ctx,
                            regc_cache_entry **out, int *n);
void regc_cache_entries_free(regc_cache_entry *e, int n);
/* Remove every entry and temporary file in dir; *removed counts them. */
int regc_cache_clear(const char *dir, int *removed);

#endif
