/* cpu_sgemm.c — regc's own GEMM, the part every kernel shares:
 * C[m, n] = alpha op(A) op(B), or C + that, all row-major.
 *
 * The blocking of Goto and van de Geijn (as in BLIS), in row-major terms:
 *
 *   for each block of NC columns of C:
 *     for each slice of KC along k:
 *       pack op(B)[KC, NC] as panels of NR columns          (L3)
 *       for each block of MC rows of C:
 *         pack op(A)[MC, KC] as panels of MR rows           (L2)
 *         for each B panel, for each A panel:
 *           one MR x NR tile of C in vector registers       (B panel in L1)
 *           on the last slice, the epilogue on that tile     (C tile in L1)
 *
 * Packing lays each panel out in the order the micro-kernel reads it, with
 * zeros past the matrix edge, so the micro-kernel has no edge cases; only
 * the store of a partial tile does.
 *
 * Where a thread's rows fit one A block (m <= MC, as for a small batch of
 * tokens), each B panel serves one row of tiles, and B is packed a strip
 * of panels at a time just before them instead, the next strip's op(B)
 * fetched from memory while the tiles run (sgemm_compute_rows); in the
 * loops above, the next A block is fetched likewise. Neither changes which
 * products are summed, or in what order.
 *
 * Threads own disjoint blocks of C (panels of columns when n >= m, else of
 * rows), and every element of C is summed by one thread, slice after slice
 * in the same order, so the result does not depend on the thread count.
 * The calls run in regc's OpenMP team: no second thread pool.
 *
 * The epilogue writes C and aux while other tiles still read A and B, so
 * neither may overlap A or B (as with cuBLASLt).
 *
 * A kernel (regc_cpu_gemm_kernel) brings the tile, the packed format and
 * the micro-kernel, each in a file built for its instructions
 * (cpu_sgemm_avx512.c, cpu_sgemm_avx2.c, cpu_bgemm.c), and may store a
 * whole tile into C itself, from its registers (product_c); this file is
 * portable C, the loops and the other stores of C, whose cost grows with
 * m n rather than m n k.
 *
 * A B held in NF4 (b_nf4) is dequantised a slice at a time as it is
 * packed (sgemm_pack_b). */
#include "cpu_kernels.h"
#include "regc_backend.h"
#include "regc_common.h"

#ifdef REGC_CPU_OWN_SGEMM

/* MC and NC are multiples of every kernel's MR and NR. */
#define SGEMM_MC 264   /* an A block, MC x KC floats = 264 KiB at KC = 256, fits L2 */
#define SGEMM_NC 4096  /* a B block, KC x NC floats = 4 MiB */
#define SGEMM_STRIP 64 /* columns of B packed at a time where m fits one A block */

static int64_t sgemm_round_up(int64_t x, int64_t unit) { return (x + unit - 1) / unit * unit; }

static int64_t sgemm_min(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t sgemm_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* One thread's packing buffers for g: an A block and a B block, each a
 * whole number of cache lines, no larger than g needs, and where B is held
 * in NF4 room for a slice of op(B) dequantised before it is packed. */
static void sgemm_pack_sizes(const regc_gemm *g, const regc_cpu_gemm_kernel *kern, size_t *a_bytes,
                             size_t *b_bytes, size_t *dq_bytes)
{
    const int64_t kc = sgemm_round_up(sgemm_min(g->k, kern->kc), kern->k_unit);
    const int64_t vb = (int64_t)kern->value_bytes;
    *a_bytes =
        (size_t)sgemm_round_up(sgemm_min(sgemm_round_up(g->m, kern->mr), SGEMM_MC) * kc * vb, 64);
    *b_bytes =
        (size_t)sgemm_round_up(kc * sgemm_min(sgemm_round_up(g->n, kern->nr), SGEMM_NC) * vb, 64);
    *dq_bytes = g->b_nf4 ? (size_t)sgemm_round_up(kc * sgemm_min(g->n, SGEMM_NC) * 4, 64) : 0;
}

/* op(B)[p0 .. p0+kc, j0 .. j0+nc] packed as the kernel packs it. A B held
 * in NF4 is dequantised first into dq ([kc][nc] fp32, a thread's own),
 * stored row after stored row so each block's absmax is read once, and
 * packed from there as an fp32 B (rounded to bf16 as packed, in a bf16
 * GEMM): the weight is never whole in fp32, and the kernels know nothing of
 * NF4. */
static void sgemm_pack_b(const regc_gemm *g, const regc_cpu_gemm_kernel *kern, char *bpack,
                         float *dq, int64_t j0, int64_t nc, int64_t p0, int64_t kc)
{
    if (!g->b_nf4) {
        kern->pack_b(bpack, g, j0, nc, p0, kc);
        return;
    }
    static const float levels[16] = REGC_NF4_LEVELS;
    static const float dynamic_map[256] = REGC_NF4_DYNAMIC_MAP;
    const uint8_t *blob = (const uint8_t *)g->b;
    const int64_t cols = g->ldb; /* contiguous: B's columns as stored */
    const regc_nf4_layout_t l = regc_nf4_layout((g->trans_b ? g->n : g->k) * cols);
    if (!g->trans_b) /* B is [k, n]: row p0 + p holds op(B)'s row */
        for (int64_t p = 0; p < kc; p++)
            regc_nf4_read(blob, &l, levels, dynamic_map, (p0 + p) * cols + j0, nc, dq + p * nc, 1);
    else /* B is [n, k]: row j0 + j holds op(B)'s column */
        for (int64_t j = 0; j < nc; j++)
            regc_nf4_read(blob, &l, levels, dynamic_map, (j0 + j) * cols + p0, kc, dq + j, nc);
    regc_gemm h = *g;
    h.b = dq, h.ldb = nc, h.trans_b = 0, h.b_bf16 = 0, h.b_nf4 = 0;
    kern->pack_b(bpack, &h, 0, nc, 0, kc);
}

/* The elementwise epilogue on the rows x cols tile of C at [i, j] just
 * finished, while it is in L1, and with out16 (the last slice of a C held
 * in bf16) its rounding into out16->c. */
static void sgemm_finish_tile(const regc_gemm *g, int64_t i, int64_t j, int rows, int cols,
                              int epilogue, const regc_gemm *out16)
{
    if (epilogue)
        for (int r = 0; r < rows; r++)
            regc_cpu_apply_epilogue_span(g, i + r, j, cols);
    if (out16)
        for (int r = 0; r < rows; r++)
            regc_cpu_store_bf16((uint16_t *)out16->c + (i + r) * out16->ldc + j,
                                g->c + (i + r) * g->ldc + j, cols);
}

/* The rows x cols tile (at most MR x NR) of C at [i, j] becomes alpha * t
 * (t: [MR][nr]), added to what C holds when `add`. Once per tile and
 * slice, in the widest vectors the CPU has: in a build for no particular
 * CPU, in the baseline's, the GEMMs ran 3 to 4% slower on AVX-512. */
REGC_CPU_WIDE_VECTORS static void sgemm_store_tile(const regc_gemm *g, const float *restrict t,
                                                   int nr, int64_t i, int64_t j, int rows, int cols,
                                                   int add)
{
    const float alpha = g->alpha;
    for (int r = 0; r < rows; r++) {
        float *restrict c = g->c + (i + r) * g->ldc + j; /* [cols] */
        const float *restrict tr = t + r * nr;           /* [cols] */
        if (add)
            for (int q = 0; q < cols; q++)
                c[q] = c[q] + alpha * tr[q];
        else
            for (int q = 0; q < cols; q++)
                c[q] = alpha * tr[q];
    }
}

/* One tile of C at [i, j] (rows x cols of it inside C): the product of
 * the packed panels a and b over kc, stored (added when `add`), then
 * finished. A whole tile at alpha = 1 goes from the kernel's registers
 * straight into C where the kernel can (product_c: the same values);
 * others through t, [MR][NR], aligned. */
static inline __attribute__((always_inline)) void
sgemm_tile(const regc_gemm *g, const regc_cpu_gemm_kernel *kern, float *restrict t, int64_t kc,
           const char *a, const char *b, int64_t i, int64_t j, int rows, int cols, int add,
           int epilogue, const regc_gemm *out16)
{
    if (kern->product_c && rows == kern->mr && cols == kern->nr && g->alpha == 1.0f) {
        kern->product_c(g->c + i * g->ldc + j, g->ldc, add, kc, a, b);
    } else {
        kern->product(t, kc, a, b);
        sgemm_store_tile(g, t, kern->nr, i, j, rows, cols, add);
    }
    sgemm_finish_tile(g, i, j, rows, cols, epilogue, out16);
}

/* The rows x cols tile of C at [i, j], fetched for writing before its
 * product is computed: C is read (later slices add to it) and written
 * once per slice, most often from memory, as m n floats outgrow L2, and
 * the product's time covers the fetch rather than the store waiting for
 * it (about a tenth of the GEMM's time at m = 256, n = 2304 on Zen 3). */
static inline __attribute__((always_inline)) void sgemm_prefetch_tile(const regc_gemm *g, int64_t i,
                                                                      int64_t j, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        const char *c = (const char *)(g->c + (i + r) * g->ldc + j); /* [cols] floats */
        for (int64_t at = 0; at < (int64_t)cols * 4; at += 64)
            __builtin_prefetch(c + at, 1, 3);
        __builtin_prefetch(c + (int64_t)cols * 4 - 1, 1,
                           3); /* the last line, where j is mid-line */
    }
}

/* The cache lines of x[r0 .. r0+rows, c0 .. c0+cols] (row stride ld),
 * fetched ahead of their packing while tiles are multiplied, a few lines
 * after each tile (sgemm_fetch_some): spread out, the fetches are served
 * beside the arithmetic rather than as one burst. Into L1 (T0): on AMD
 * Zen 5, lines fetched for L2 alone (T1, T2) were read back two to four
 * times slower than those, where their rows lie pages apart as op(B)'s
 * rows of weights [k, n] do. */
typedef struct {
    const char *x;             /* the rectangle's first value */
    int64_t row_bytes;         /* bytes between its rows */
    int64_t rows, span;        /* its rows, and the bytes of one */
    int64_t per_row, per_call; /* lines a row can touch, lines a call fetches */
    int64_t r, l;              /* the next line: line l of row r */
} sgemm_fetch;

/* A walk over the rectangle in `calls` calls of sgemm_fetch_some; a
 * rectangle with no rows or columns fetches nothing. */
static void sgemm_fetch_start(sgemm_fetch *f, const void *x, int64_t elem, int64_t ld, int64_t r0,
                              int64_t rows, int64_t c0, int64_t cols, int64_t calls)
{
    f->rows = cols > 0 ? rows : 0;
    f->x = (const char *)x + (f->rows > 0 ? (r0 * ld + c0) * elem : 0); /* never past x */
    f->row_bytes = ld * elem;
    f->span = cols * elem;
    f->per_row = (f->span + 63) / 64 + 1; /* one more where a row starts mid-line */
    f->per_call = f->rows > 0 ? (f->rows * f->per_row + calls - 1) / calls : 0;
    f->r = f->l = 0;
}

/* The walk's next per_call lines. Always inlined: GCC takes a function
 * that only prefetches for one without effects and drops its calls. */
static inline __attribute__((always_inline)) void sgemm_fetch_some(sgemm_fetch *f)
{
    for (int64_t t = 0; t < f->per_call && f->r < f->rows; t++) {
        const char *row = f->x + f->r * f->row_bytes; /* [span] bytes */
        const uintptr_t first = (uintptr_t)row & ~(uintptr_t)63,
                        last = (uintptr_t)(row + f->span - 1);
        if (first + 64 * (uintptr_t)f->l <= last)
            __builtin_prefetch((const void *)(first + 64 * (uintptr_t)f->l), 0, 3);
        if (++f->l == f->per_row)
            f->l = 0, f->r++;
    }
}

/* The walk over op(A)[i0 .. i0+mc, p0 .. p0+kc] as stored. */
static void sgemm_fetch_a(sgemm_fetch *f, const regc_gemm *g, int64_t i0, int64_t mc, int64_t p0,
                          int64_t kc, int64_t calls)
{
    const int64_t elem = g->a_bf16 ? 2 : 4; /* bytes of a value as stored */
    if (g->trans_a)                         /* A is [k, m] */
        sgemm_fetch_start(f, g->a, elem, g->lda, p0, kc, i0, mc, calls);
    else
        sgemm_fetch_start(f, g->a, elem, g->lda, i0, mc, p0, kc, calls);
}

/* The walk over op(B)[p0 .. p0+kc, j0 .. j0+nc] as stored. */
static void sgemm_fetch_b(sgemm_fetch *f, const regc_gemm *g, int64_t j0, int64_t nc, int64_t p0,
                          int64_t kc, int64_t calls)
{
    const int64_t elem = g->b_bf16 ? 2 : 4;
    if (g->b_nf4) /* its bytes are not laid out as values */
        sgemm_fetch_start(f, g->b, 1, 0, 0, 0, 0, 0, calls);
    else if (g->trans_b) /* B is [n, k] */
        sgemm_fetch_start(f, g->b, elem, g->ldb, j0, nc, p0, kc, calls);
    else
        sgemm_fetch_start(f, g->b, elem, g->ldb, p0, kc, j0, nc, calls);
}

/* One slice of k, [p0, p0 + kc), as both loops below run it. */
typedef struct {
    int64_t kc;            /* its depth */
    int64_t stride;        /* bytes per row (A) or column (B) of a packed panel */
    int add;               /* later slices add to C, as does an accumulating GEMM */
    int epilogue;          /* the elementwise epilogue runs after the last slice */
    const regc_gemm *last; /* the bf16 C to round into, after the last slice only */
} sgemm_slice;

static sgemm_slice sgemm_slice_at(const regc_gemm *g, const regc_cpu_gemm_kernel *kern, int64_t p0,
                                  int elementwise, const regc_gemm *out16)
{
    sgemm_slice s;
    s.kc = sgemm_min(g->k - p0, kern->kc);
    s.stride = sgemm_round_up(s.kc, kern->k_unit) * (int64_t)kern->value_bytes;
    s.add = g->accumulate || p0 > 0;
    const int last = p0 + s.kc == g->k;
    s.epilogue = elementwise && last;
    s.last = last ? out16 : NULL;
    return s;
}

/* The tiles of C[i0 .. i0+mc, j0 .. j0+nc] from packed A and B panels of
 * slice s, a B panel's column of tiles after another, each tile's C
 * fetched before its product and `next` walked a part after it. */
static inline __attribute__((always_inline)) void
sgemm_tiles(const regc_gemm *g, const regc_cpu_gemm_kernel *kern, float *restrict t,
            const sgemm_slice *s, const char *apack, const char *bpack, int64_t i0, int64_t mc,
            int64_t j0, int64_t nc, sgemm_fetch *next)
{
    const int mr = kern->mr, nr = kern->nr;
    for (int64_t jr = 0; jr < nc; jr += nr) {
        const int cols = (int)sgemm_min(nc - jr, nr);
        for (int64_t ir = 0; ir < mc; ir += mr) {
            const int rows = (int)sgemm_min(mc - ir, mr);
            sgemm_prefetch_tile(g, i0 + ir, j0 + jr, rows, cols);
            sgemm_tile(g, kern, t, s->kc, apack + ir * s->stride, bpack + jr * s->stride, i0 + ir,
                       j0 + jr, rows, cols, s->add, s->epilogue, s->last);
            sgemm_fetch_some(next);
        }
    }
}

/* sgemm_compute_block where the rows fit one A block (m1 - m0 <= MC), as
 * in the GEMMs of a small batch of tokens (m = 256), whose op(B) is then
 * mostly weights that no earlier kernel left in the caches. Each B panel is
 * used by one row of tiles only, so B is packed a strip of panels at a
 * time, just before its tiles, rather than a whole block ahead (4 MiB of
 * fp32, out of L2), and while those tiles run the next strip's op(B), the
 * next columns or the next slice's first, is fetched a part after each
 * tile: its reads from memory overlap the arithmetic instead of stalling
 * the packing. Each tile's sums come slice after slice as in the general
 * loop, in the same order. */
static void sgemm_compute_rows(const regc_gemm *g, const regc_cpu_gemm_kernel *kern, int64_t m0,
                               int64_t m1, int64_t n0, int64_t n1, int elementwise, char *apack,
                               char *bpack, float *dq, const regc_gemm *out16)
{
    float t[REGC_CPU_GEMM_TILE_MAX] __attribute__((aligned(64))); /* one tile's sums, [MR][NR] */
    const int64_t mc = m1 - m0, tiles = (mc + kern->mr - 1) / kern->mr;
    const int64_t strip = SGEMM_STRIP;
    for (int64_t p0 = 0; p0 < g->k; p0 += kern->kc) {
        const sgemm_slice s = sgemm_slice_at(g, kern, p0, elementwise, out16);
        kern->pack_a(apack, g, m0, mc, p0, s.kc);
        for (int64_t j0 = n0; j0 < n1; j0 += strip) {
            const int64_t nc = sgemm_min(n1 - j0, strip);
            sgemm_pack_b(g, kern, bpack, dq, j0, nc, p0, s.kc);
            const int64_t next_j0 = j0 + strip < n1 ? j0 + strip : n0;
            const int64_t next_p0 = j0 + strip < n1 ? p0 : p0 + kern->kc;
            const int64_t next_nc = sgemm_min(n1 - next_j0, strip);
            const int64_t next_kc = sgemm_min(g->k - next_p0, kern->kc); /* <= 0 past k */
            sgemm_fetch next;
            sgemm_fetch_b(&next, g, next_j0, next_nc, next_p0, sgemm_max(next_kc, 0),
                          (nc + kern->nr - 1) / kern->nr * tiles);
            sgemm_tiles(g, kern, t, &s, apack, bpack, m0, mc, j0, nc, &next);
        }
    }
}

/* The block [m0, m1) x [n0, n1) of C, by one thread with its own buffers
 * apack (an A block) and bpack (a B block). */
static void sgemm_compute_block(const regc_gemm *g, const regc_cpu_gemm_kernel *kern, int64_t m0,
                                int64_t m1, int64_t n0, int64_t n1, char *apack, char *bpack,
                                float *dq, const regc_gemm *out16)
{
    /* BGRAD's sums are of B and DGELU_BGRAD's of all of C: both come after */
    const int elementwise = g->epilogue != REGC_EPI_NONE && g->epilogue != REGC_EPI_BGRAD &&
                            g->epilogue != REGC_EPI_DGELU_BGRAD;
    if (m1 - m0 <= SGEMM_MC) {
        sgemm_compute_rows(g, kern, m0, m1, n0, n1, elementwise, apack, bpack, dq, out16);
        return;
    }
    float t[REGC_CPU_GEMM_TILE_MAX] __attribute__((aligned(64))); /* one tile's sums, [MR][NR] */
    for (int64_t j0 = n0; j0 < n1; j0 += SGEMM_NC) {
        const int64_t nc = sgemm_min(n1 - j0, SGEMM_NC);
        for (int64_t p0 = 0; p0 < g->k; p0 += kern->kc) {
            const sgemm_slice s = sgemm_slice_at(g, kern, p0, elementwise, out16);
            sgemm_pack_b(g, kern, bpack, dq, j0, nc, p0, s.kc);
            for (int64_t i0 = m0; i0 < m1; i0 += SGEMM_MC) {
                const int64_t mc = sgemm_min(m1 - i0, SGEMM_MC);
                kern->pack_a(apack, g, i0, mc, p0, s.kc);
                /* the next A block is fetched while this one's tiles run:
                 * with m in the tens of thousands (the vocabulary) op(A) is
                 * too large to stay in the caches from the kernel before */
                const int64_t next_mc = sgemm_min(m1 - i0 - SGEMM_MC, SGEMM_MC); /* <= 0: none */
                sgemm_fetch next;
                sgemm_fetch_a(&next, g, i0 + SGEMM_MC, sgemm_max(next_mc, 0), p0, s.kc,
                              (nc + kern->nr - 1) / kern->nr * ((mc + kern->mr - 1) / kern->mr));
                sgemm_tiles(g, kern, t, &s, apack, bpack, i0, mc, j0, nc, &next);
            }
        }
    }
}

int regc_cpu_gemm_blocked(regc_backend *be, const regc_gemm *g, const regc_cpu_gemm_kernel *kern,
                          const regc_gemm *out16)
{
    const int threads = regc_cpu_threads(be);
    size_t a_bytes, b_bytes, dq_bytes;
    sgemm_pack_sizes(g, kern, &a_bytes, &b_bytes, &dq_bytes);
    const size_t per_thread = a_bytes + b_bytes + dq_bytes;
    char *pack = regc_cpu_get_scratch(be, (size_t)threads * per_thread);
    if (!pack)
        return REGC_ERR_MEMORY;
    const double madds = (double)g->m * (double)g->n * (double)g->k;
#pragma omp parallel num_threads(threads) if (madds >= (double)REGC_CPU_GEMM_PAR_MIN *             \
                                                           (double)regc_cpu_par_scale(be))
    {
        char *apack = pack + (size_t)omp_get_thread_num() * per_thread;
        char *bpack = apack + a_bytes;
        float *dq = (float *)(bpack + b_bytes); /* dq_bytes: none unless B is NF4 */
        int64_t lo, hi;
        if (g->n >= g->m) {
            regc_cpu_team_range(g->n, kern->nr, &lo, &hi);
            if (lo < hi)
                sgemm_compute_block(g, kern, 0, g->m, lo, hi, apack, bpack, dq, out16);
        } else {
            regc_cpu_team_range(g->m, kern->mr, &lo, &hi);
            if (lo < hi)
                sgemm_compute_block(g, kern, lo, hi, 0, g->n, apack, bpack, dq, out16);
        }
    }
    return REGC_OK;
}

#endif /* REGC_CPU_OWN_SGEMM */
