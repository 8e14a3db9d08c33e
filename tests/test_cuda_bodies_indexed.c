/* test_cuda_bodies_indexed.c — the per-thread bodies of the CUDA
 * backend's kernels that find their elements by index arithmetic
 * (kernels/cuda/cuda_elementwise.h) run on the host over their kernels'
 * whole grids, against the CPU backend's kernels, bit for bit: the rotary
 * embedding (a pair of a head's columns, by position; inverse, in place,
 * its output held in bf16), the embedding lookup (a row by id, the table
 * in fp32 or bf16) and its gradient (each id's rows summed in order after a
 * sort, a padding row, ids out of range), the column sums, and transpose
 * under permutations of one to six dimensions.
 *
 * A GPU kernel of cuda_elementwise.cu is a loop over its grid that calls
 * one of these bodies; running the same body here over every index proves,
 * without a GPU, that it picks the right elements and the CPU's formula.
 * Inputs are regc's random stream with edge values spread through them
 * (zeros of both signs, subnormals, huge values, infinities, NaN). Each
 * comparison is shown able to fail: a re-derived variant (an fma, the
 * other direction, another summation order, another index, another
 * permutation) is run over the same inputs and must differ somewhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_elementwise.h"
#include "regc_backend.h"
#include "regc_common.h"
#include "test_cuda_body.h"
#include "test_device.h"

static regc_backend *cpu;

static int group_setup(void **state)
{
    (void)state;
    cpu = regc_test_cpu_backend(2); /* two threads: the CPU's parallel split too */
    return cpu ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    regc_backend_free(cpu);
    return 0;
}

static float *cpu_download(const float *dev, size_t n) { return regc_test_download(cpu, dev, n); }

/* ---- rotary embedding ------------------------------------------------------------------- */

/* The body over every item (rotated pairs and values passed through) of
 * [batch, t, n_head, head_dim] against the CPU's kernel, rotating the first
 * rot_dim values of each head: the same bits, in fp32 and y in bf16; an fma
 * in the rotation and the other direction are both caught. */
static void check_rope(int64_t batch, int64_t t, int n_head, int head_dim, int rot_dim, int inverse,
                       int in_place)
{
    const int half = rot_dim / 2;
    const size_t n = (size_t)(batch * t * n_head * head_dim), nt = (size_t)(t * half);
    float *hx = regc_test_spread_edges(n, 60 + (uint64_t)head_dim, 0.0f, 3.0f);
    float *hc = regc_test_spread_edges(nt, 61, 0.0f, 1.0f),
          *hs = regc_test_spread_edges(nt, 62, 0.0f, 1.0f);
    float *x = regc_test_upload(cpu, hx, n);
    float *y = in_place ? x : regc_test_dev_nan(cpu, n);
    const float *cs = regc_test_upload(cpu, hc, nt), *sn = regc_test_upload(cpu, hs, nt);
    cpu->rope(cpu, y, x, cs, sn, batch, t, n_head, head_dim, rot_dim, inverse, 0);
    const float *want = cpu_download(y, n);
    const float sign = inverse ? -1.0f : 1.0f;
    float *got = regc_test_host_floats(n);
    if (in_place)
        memcpy(got, hx, n * sizeof(float));
    const int64_t items = batch * t * n_head * (head_dim - half);
    for (int64_t i = 0; i < items; i++)
        cuda_body_rope(i, got, in_place ? got : hx, hc, hs, t, n_head, head_dim, rot_dim, sign, 0);
    char what[160];
    snprintf(what, sizeof what, "rope%s%s batch=%lld t=%lld n_head=%d head_dim=%d rot_dim=%d",
             inverse ? " inverse" : "", in_place ? " in place" : "", (long long)batch, (long long)t,
             n_head, head_dim, rot_dim);
    regc_test_expect_bits(what, got, want, n);
    if (!in_place) { /* y held in bf16: the fp32 values rounded, by the CPU and the body */
        float *y16 = regc_test_dev_nan(cpu, (n + 1) / 2);
        cpu->rope(cpu, y16, x, cs, sn, batch, t, n_head, head_dim, rot_dim, inverse, 1);
        const uint16_t *cpu16 = (const uint16_t *)cpu_download(y16, (n + 1) / 2);
        uint16_t *body16 = (uint16_t *)regc_test_host_floats((n + 1) / 2);
        for (int64_t i = 0; i < items; i++)
            cuda_body_rope(i, (float *)body16, hx, hc, hs, t, n_head, head_dim, rot_dim, sign, 1);
        for (size_t i = 0; i < n; i++)
            if (cpu16[i] != regc_bf16_bits(want[i]) || body16[i] != cpu16[i])
                fail_msg("%s, y in bf16: [%zu] is 0x%04x on the CPU, 0x%04x in the body; %.9g "
                         "rounds to 0x%04x",
                         what, i, cpu16[i], body16[i], (double)want[i], regc_bf16_bits(want[i]));
    }
    /* the part past rot_dim passes through unchanged */
    const int64_t ld = (int64_t)n_head * head_dim;
    for (int64_t r = 0; r < batch * t; r++)
        for (int h = 0; h < n_head; h++)
            for (int j = rot_dim; j < head_dim; j++) {
                const int64_t a = r * ld + (int64_t)h * head_dim + j;
                if (memcmp(&want[a], &hx[a], sizeof(float)) != 0)
                    fail_msg("%s: [%lld] past the rotated part is %.9g, not x's %.9g", what,
                             (long long)a, (double)want[a], (double)hx[a]);
            }

    /* an fma in the rotation, and the other direction, are both caught */
    float *var = regc_test_host_floats(n), *other = regc_test_host_floats(n);
    memcpy(var, hx, n * sizeof(float));
    for (int64_t r = 0; r < batch * t; r++)
        for (int h = 0; h < n_head; h++)
            for (int j = 0; j < half; j++) {
                const int64_t a = r * ld + (int64_t)h * head_dim + j, b = a + half;
                const float c = hc[(r % t) * half + j], s = sign * hs[(r % t) * half + j];
                var[a] = fmaf(hx[a], c, -(hx[b] * s));
                var[b] = fmaf(hx[b], c, hx[a] * s);
            }
    for (int64_t i = 0; i < items; i++)
        cuda_body_rope(i, other, hx, hc, hs, t, n_head, head_dim, rot_dim, -sign, 0);
    regc_test_expect_caught(what, var, want, n);
    regc_test_expect_caught(what, other, want, n);
}

/* Whole heads, and the first part of each (Phi's, GPT-NeoX's: a quarter,
 * 0.4, 0.75). */
static void test_rope_body(void **state)
{
    (void)state;
    for (int inverse = 0; inverse < 2; inverse++)
        for (int in_place = 0; in_place < 2; in_place++) {
            check_rope(2, 5, 3, 8, 8, inverse, in_place);
            check_rope(3, 7, 4, 64, 64, inverse, in_place);
            check_rope(1, 33, 2, 6, 6, inverse, in_place);
            check_rope(2, 5, 3, 16, 4, inverse, in_place);
            check_rope(1, 9, 2, 80, 32, inverse, in_place);
            check_rope(2, 3, 4, 128, 96, inverse, in_place);
        }
}

/* ---- embedding lookup and its gradient --------------------------------------------------- */

static void test_embedding_fwd_body(void **state)
{
    (void)state;
    const int64_t vocab = 53, cols = 70, rows = 301;
    float *htable = regc_test_spread_edges((size_t)(vocab * cols), 70, 0.0f, 1.0f);
    int32_t *ids = malloc((size_t)rows * sizeof *ids);
    assert_non_null(ids);
    for (int64_t r = 0; r < rows; r++) /* skewed: many repeats, the ends of the table */
        ids[r] = r % 5 == 0 ? 3 : r % 11 == 0 ? (int32_t)(vocab - 1) : (int32_t)((r * 7) % vocab);
    const size_t n = (size_t)(rows * cols);
    float *out = regc_test_dev_nan(cpu, n);
    cpu->embedding_fwd(cpu, out, regc_test_upload_ints(cpu, ids, (size_t)rows),
                       regc_test_upload(cpu, htable, (size_t)(vocab * cols)), rows, cols, 0);
    const float *want = cpu_download(out, n);
    float *got = regc_test_host_floats(n), *var = regc_test_host_floats(n);
    for (int64_t i = 0; i < rows * cols; i++)
        cuda_body_embedding_fwd(i, got, ids, htable, cols, 0);
    regc_test_expect_bits("embedding_fwd", got, want, n);
    for (int64_t i = 0; i < rows * cols; i++) /* the row indexed by position, not id */
        var[i] = htable[((i / cols) % vocab) * cols + i % cols];
    regc_test_expect_caught("embedding_fwd", var, want, n);

    /* the table held in bf16: the body widens each value as the CPU does */
    const size_t tn = (size_t)(vocab * cols);
    uint16_t *h16 = calloc(tn + 2, sizeof *h16);
    assert_non_null(h16);
    for (size_t j = 0; j < tn; j++)
        h16[j] = regc_bf16_bits(htable[j]);
    float *out16 = regc_test_dev_nan(cpu, n);
    cpu->embedding_fwd(cpu, out16, regc_test_upload_ints(cpu, ids, (size_t)rows),
                       regc_test_upload(cpu, (const float *)h16, (tn + 1) / 2), rows, cols, 1);
    const float *want16 = cpu_download(out16, n);
    for (int64_t i = 0; i < rows * cols; i++)
        cuda_body_embedding_fwd(i, got, ids, (const float *)h16, cols, 1);
    regc_test_expect_bits("embedding_fwd, table in bf16", got, want16, n);
    for (int64_t i = 0; i < rows * cols; i++) /* the fp32 values, not the bf16 ones */
        cuda_body_embedding_fwd(i, var, ids, htable, cols, 0);
    regc_test_expect_caught("embedding_fwd, table in bf16", var, want16, n);
    free(h16);
    free(ids);
}

static int compare_keys(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The GPU's pipeline on the host: keys, the sort (here a full-key qsort:
 * the keys are distinct, so it gives the order the GPU's stable sort on
 * the id half gives), the zeroing of a fresh table, then the body over its
 * grid of rows x cols threads. Returns the sorted keys. */
static uint64_t *host_embedding_bwd(float *dtable, const int32_t *ids, const float *dout,
                                    int64_t rows, int64_t cols, int64_t vocab, int accumulate,
                                    int64_t pad)
{
    uint64_t *key = malloc((size_t)rows * sizeof *key);
    assert_non_null(key);
    for (int64_t r = 0; r < rows; r++)
        cuda_body_embedding_key(r, key, ids);
    qsort(key, (size_t)rows, sizeof *key, compare_keys);
    if (!cuda_embedding_keys_ok(key, rows, vocab))
        return key;
    if (!accumulate)
        for (int64_t i = 0; i < vocab * cols; i++)
            dtable[i] = 0.0f;
    for (int64_t i = 0; i < rows * cols; i++)
        cuda_body_embedding_bwd(i, dtable, key, dout, rows, cols, pad);
    return key;
}

static void test_embedding_bwd_body(void **state)
{
    (void)state;
    const int64_t vocab = 50, cols = 70, rows = 300;
    const size_t nt = (size_t)(vocab * cols), nd = (size_t)(rows * cols);
    int32_t *ids = malloc((size_t)rows * sizeof *ids);
    assert_non_null(ids);
    for (int64_t r = 0; r < rows; r++) /* id 3 on a fifth of the rows; ids >= 40 unused */
        ids[r] = r % 5 == 0 ? 3 : (int32_t)((r * 13) % 40);
    /* mixed magnitudes, so a sum in another order rounds differently */
    float *hdout = regc_test_spread_edges(nd, 80, 0.0f, 1.0f);
    for (size_t i = 0; i < nd; i++) {
        if (i % 3 == 0)
            hdout[i] *= 4096.0f;
        if (!isfinite(hdout[i])) /* infinities and NaN would swamp every sum they meet */
            hdout[i] = 0.5f;
    }
    float *hinit = regc_test_spread_edges(nt, 81, 0.0f, 1.0f);
    for (size_t i = 0; i < nt; i += 5) /* kept as they are where no id lands */
        hinit[i] = -0.0f;
    int32_t *dids = regc_test_upload_ints(cpu, ids, (size_t)rows);
    const float *dout = regc_test_upload(cpu, hdout, nd);
    for (int pass = 0; pass < 4; pass++) {
        const int accumulate = pass & 1;
        const int64_t pad = pass & 2 ? 3 : -1; /* the busiest id as the padding row */
        float *dtable = regc_test_upload(cpu, hinit, nt);
        cpu->embedding_bwd(cpu, dtable, dids, dout, rows, cols, vocab, accumulate, pad);
        const float *want = cpu_download(dtable, nt);
        float *got = regc_test_host_floats(nt);
        memcpy(got, hinit, nt * sizeof(float));
        uint64_t *key = host_embedding_bwd(got, ids, hdout, rows, cols, vocab, accumulate, pad);
        const char *what = pass == 0   ? "embedding_bwd"
                           : pass == 1 ? "embedding_bwd accumulate"
                           : pass == 2 ? "embedding_bwd padded"
                                       : "embedding_bwd padded accumulate";
        regc_test_expect_bits(what, got, want, nt);
        if (pad >= 0) { /* the padding row took nothing: zeros, or as it was */
            for (int64_t c = 0; c < cols; c++)
                if (memcmp(&want[pad * cols + c], accumulate ? &hinit[pad * cols + c] : &(float){0},
                           sizeof(float)) != 0)
                    fail_msg("%s: the padding row changed at column %lld", what, (long long)c);
            free(key);
            continue;
        }

        /* each id's rows summed in reverse order instead */
        float *var = regc_test_host_floats(nt);
        memcpy(var, accumulate ? hinit : got, nt * sizeof(float));
        for (int64_t g = 0; g < rows;) {
            int64_t end = g;
            while (end < rows && key[end] >> 32 == key[g] >> 32)
                end++;
            const int64_t id = (int64_t)(key[g] >> 32);
            for (int64_t c = 0; c < cols; c++) {
                float acc = 0.0f;
                for (int64_t k = end - 1; k >= g; k--)
                    acc = regc_addf(acc, hdout[(int64_t)(key[k] & UINT32_MAX) * cols + c]);
                var[id * cols + c] = accumulate ? regc_addf(hinit[id * cols + c], acc) : acc;
            }
            g = end;
        }
        regc_test_expect_caught(what, var, want, nt);
        free(key);
    }
    free(ids);
}

/* A bad id is what the sorted keys' last key shows, whether too large or
 * negative; the GPU then writes nothing, and the CPU refuses the call. */
static void test_embedding_bad_ids(void **state)
{
    (void)state;
    const int64_t vocab = 10, cols = 3, rows = 6;
    const int32_t bad_sets[][6] = {{1, 2, 10, 3, 4, 5}, {1, -1, 2, 3, 4, 5}, {9, 0, 0, 9, 0, 9}};
    const int bad[] = {1, 1, 0};
    float *hdout = regc_test_spread_edges((size_t)(rows * cols), 90, 0.0f, 1.0f);
    float *hinit = regc_test_spread_edges((size_t)(vocab * cols), 91, 0.0f, 1.0f);
    for (size_t s = 0; s < sizeof bad / sizeof bad[0]; s++) {
        float *got = regc_test_host_floats((size_t)(vocab * cols));
        memcpy(got, hinit, (size_t)(vocab * cols) * sizeof(float));
        uint64_t *key = host_embedding_bwd(got, bad_sets[s], hdout, rows, cols, vocab, 0, -1);
        assert_int_equal(cuda_embedding_keys_ok(key, rows, vocab), !bad[s]);
        free(key);
        float *dtable = regc_test_upload(cpu, hinit, (size_t)(vocab * cols));
        cpu->embedding_bwd(cpu, dtable, regc_test_upload_ints(cpu, bad_sets[s], (size_t)rows),
                           regc_test_upload(cpu, hdout, (size_t)(rows * cols)), rows, cols, vocab,
                           0, -1);
        assert_int_equal(cpu->sync(cpu), bad[s] ? REGC_ERR_ARG : REGC_OK);
        if (bad[s]) { /* both leave the table as it was */
            regc_test_expect_bits("embedding_bwd bad id, host", got, hinit, (size_t)(vocab * cols));
            regc_test_expect_bits("embedding_bwd bad id, cpu",
                                  cpu_download(dtable, (size_t)(vocab * cols)), hinit,
                                  (size_t)(vocab * cols));
        }
    }
}

/* ---- column sums ---------------------------------------------------------------------------- */

static void test_sum_rows_body(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{1, 1}, {0, 4}, {3, 37}, {1000, 37}, {257, 600}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1];
        const size_t n = (size_t)(rows * cols);
        /* values of 2^-20 to 1 between a first row near 2^40 and a last
         * row that cancels it: every small value is rounded to the big
         * one's last bits, so the sum depends on the order even in double */
        float *hx = regc_test_host_uniform(n ? n : 1, 100 + s, 0.0f, 1.0f);
        for (size_t i = 0; i < n; i++)
            hx[i] = ldexpf(hx[i], (int)(regc_rng_at(101 + s, i) % 21) - 20);
        for (int64_t c = 0; rows >= 2 && c < cols; c++) {
            hx[c] = ldexpf(1.5f + hx[c], 40);
            hx[(rows - 1) * cols + c] = -hx[c];
        }
        float *out = regc_test_dev_nan(cpu, (size_t)cols);
        cpu->sum_rows(cpu, out, regc_test_upload(cpu, hx, n ? n : 1), rows, cols);
        const float *want = cpu_download(out, (size_t)cols);
        float *got = regc_test_host_floats((size_t)cols);
        for (int64_t c = 0; c < cols; c++)
            cuda_body_sum_rows(c, got, hx, rows, cols);
        char what[64];
        snprintf(what, sizeof what, "sum_rows [%lld x %lld]", (long long)rows, (long long)cols);
        regc_test_expect_bits(what, got, want, (size_t)cols);
        if (rows < 100)
            continue;
        /* in float, or in double from the last row up: both caught */
        float *in_float = regc_test_host_floats((size_t)cols);
        float *reversed = regc_test_host_floats((size_t)cols);
        for (int64_t c = 0; c < cols; c++) {
            float f = 0.0f;
            double d = 0.0;
            for (int64_t r = 0; r < rows; r++)
                f += hx[r * cols + c];
            for (int64_t r = rows - 1; r >= 0; r--)
                d += hx[r * cols + c];
            in_float[c] = f;
            reversed[c] = (float)d;
        }
        regc_test_expect_caught(what, in_float, want, (size_t)cols);
        regc_test_expect_caught(what, reversed, want, (size_t)cols);
    }
}

/* ---- transpose --------------------------------------------------------------------------- */

static void check_transpose(int ndim, const int64_t *shape, const int *perm)
{
    int64_t total = 1;
    for (int i = 0; i < ndim; i++)
        total *= shape[i];
    const size_t n = (size_t)total;
    float *hx = regc_test_spread_edges(n, 300 + (uint64_t)ndim, 0.0f, 1.0f);
    float *out = regc_test_dev_nan(cpu, n);
    cpu->transpose(cpu, out, regc_test_upload(cpu, hx, n), ndim, shape, perm);
    const float *want = cpu_download(out, n);
    cuda_transpose_map map;
    assert_int_equal(regc_transpose_check(ndim, shape, perm), REGC_OK);
    cuda_transpose_map_init(&map, ndim, shape, perm);
    assert_int_equal(map.total, total);
    float *got = regc_test_host_floats(n);
    for (int64_t o = 0; o < map.total; o++)
        cuda_body_transpose(o, got, hx, &map);
    char what[128];
    int len = snprintf(what, sizeof what, "transpose perm");
    for (int i = 0; i < ndim; i++)
        len += snprintf(what + len, sizeof what - (size_t)len, " %d", perm[i]);
    regc_test_expect_bits(what, got, want, n);

    /* the map of the reversed permutation, unless it is the same copy */
    int rev[CUDA_TRANSPOSE_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        rev[i] = perm[ndim - 1 - i];
    cuda_transpose_map other;
    cuda_transpose_map_init(&other, ndim, shape, rev);
    float *var = regc_test_host_floats(n);
    for (int64_t o = 0; o < other.total; o++)
        cuda_body_transpose(o, var, hx, &other);
    if (memcmp(&other, &map, sizeof map) != 0 && n > 1)
        regc_test_expect_caught(what, var, want, n);
}

static void test_transpose_body(void **state)
{
    (void)state;
    const int64_t s2[] = {5, 7}, s3[] = {4, 1, 6}, s4[] = {2, 3, 4, 5}, s6[] = {2, 3, 1, 4, 2, 3};
    const int64_t s1[] = {9}, s5[] = {3, 2, 5, 1, 4};
    const int p2[] = {1, 0}, p3[] = {2, 0, 1}, p3b[] = {0, 2, 1}, p4[] = {0, 2, 1, 3};
    const int p4b[] = {3, 1, 0, 2}, p4c[] = {0, 1, 2, 3}, p4d[] = {0, 1, 3, 2};
    const int p6[] = {5, 3, 1, 0, 4, 2}, p6b[] = {0, 1, 2, 3, 5, 4}, p1[] = {0};
    const int p5[] = {4, 2, 3, 0, 1};
    check_transpose(2, s2, p2);
    check_transpose(3, s3, p3);
    check_transpose(3, s3, p3b);
    check_transpose(4, s4, p4); /* a head split: [b, t, h, d] -> [b, h, t, d] */
    check_transpose(4, s4, p4b);
    check_transpose(4, s4, p4c); /* the identity */
    check_transpose(4, s4, p4d);
    check_transpose(6, s6, p6);
    check_transpose(6, s6, p6b);
    check_transpose(1, s1, p1);
    check_transpose(5, s5, p5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_with_buffers(test_rope_body),
        regc_test_with_buffers(test_embedding_fwd_body),
        regc_test_with_buffers(test_embedding_bwd_body),
        regc_test_with_buffers(test_embedding_bad_ids),
        regc_test_with_buffers(test_sum_rows_body),
        regc_test_with_buffers(test_transpose_body),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
