/* cpu_transpose.c — axis permutation of a row-major tensor (ndim <= 6).
 * Size-1 axes are dropped and runs of axes that stay adjacent are merged
 * first, so the common cases reduce to a row copy or a 2-D transpose. When
 * the source's contiguous axis does not stay last, the copy goes through
 * square tiles so neither side is read or written with a large stride. */
#include <string.h>

#include "cpu_kernels.h"
#include "kernel_checks.h"
#include "regc_common.h"

#define CPU_TILE 32
#define CPU_MAX_DIMS REGC_TRANSPOSE_MAX_DIMS

typedef struct {
    int nd;
    int64_t dim[CPU_MAX_DIMS]; /* output shape */
    int64_t src[CPU_MAX_DIMS]; /* source stride of each output axis */
} cpu_perm_plan;

/* Output axes in order with their source strides, size-1 axes dropped and
 * neighbours that are also neighbours in the source merged. */
static void cpu_plan_permutation(cpu_perm_plan *p, int ndim, const int64_t *shape, const int *perm)
{
    int64_t in_stride[CPU_MAX_DIMS];
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        in_stride[i] = s;
        s *= shape[i];
    }
    p->nd = 0;
    for (int i = 0; i < ndim; i++) {
        int64_t d = shape[perm[i]], st = in_stride[perm[i]];
        if (d == 1)
            continue;
        if (p->nd > 0 && p->src[p->nd - 1] == st * d) {
            p->dim[p->nd - 1] *= d;
            p->src[p->nd - 1] = st;
        } else {
            p->dim[p->nd] = d;
            p->src[p->nd] = st;
            p->nd++;
        }
    }
}

/* Source offset of the output index whose leading `nd` axes are `flat`. */
static int64_t cpu_source_offset(const cpu_perm_plan *p, int nd, int64_t flat)
{
    int64_t off = 0;
    for (int i = nd - 1; i >= 0; i--) {
        off += (flat % p->dim[i]) * p->src[i];
        flat /= p->dim[i];
    }
    return off;
}

void regc_cpu_transpose_tensor(regc_backend *be, float *out, const float *x, int ndim,
                               const int64_t *shape, const int *perm)
{
    const int status = regc_transpose_check(ndim, shape, perm);
    if (status != REGC_OK) {
        regc_cpu_set_failure(be, status);
        return;
    }
    int64_t total = 1;
    for (int i = 0; i < ndim; i++)
        total *= shape[i];
    if (total == 0)
        return;
    const int threads = regc_cpu_threads(be);
    cpu_perm_plan p;
    cpu_plan_permutation(&p, ndim, shape, perm);
    if (p.nd == 0 || (p.nd == 1 && p.src[0] == 1)) { /* the identity */
        if (out != x)
            memcpy(out, x, (size_t)total * sizeof(float));
        return;
    }

    const int last = p.nd - 1;
    int cont = -1; /* the output axis that is contiguous in the source */
    for (int i = 0; i < p.nd; i++)
        if (p.src[i] == 1)
            cont = i;

    if (cont == last) {
        /* rows of the source stay rows: one memcpy per output row */
        const int64_t len = p.dim[last], n_rows = total / len;
#pragma omp parallel for num_threads(threads) if (total >= regc_cpu_par_min(be)) schedule(static)
        for (int64_t r = 0; r < n_rows; r++)
            memcpy(out + r * len, x + cpu_source_offset(&p, last, r), (size_t)len * sizeof(float));
        return;
    }

    /* Tile the plane of output axes `cont` (source-contiguous) and `last`
     * (output-contiguous); every other output axis indexes a whole plane. */
    int64_t out_stride[CPU_MAX_DIMS];
    int64_t s = 1;
    for (int i = last; i >= 0; i--) {
        out_stride[i] = s;
        s *= p.dim[i];
    }
    cpu_perm_plan outer = {0}; /* the remaining axes, in output order */
    int64_t outer_out[CPU_MAX_DIMS];
    for (int i = 0; i < last; i++) {
        if (i == cont)
            continue;
        outer.dim[outer.nd] = p.dim[i];
        outer.src[outer.nd] = p.src[i];
        outer_out[outer.nd] = out_stride[i];
        outer.nd++;
    }
    const int64_t rows = p.dim[cont], cols = p.dim[last];
    const int64_t src_col = p.src[last], dst_row = out_stride[cont];
    const int64_t tr = (rows + CPU_TILE - 1) / CPU_TILE, tc = (cols + CPU_TILE - 1) / CPU_TILE;
    const int64_t n_planes = total / (rows * cols), n_tasks = n_planes * tr * tc;
#pragma omp parallel for num_threads(threads) if (total >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t task = 0; task < n_tasks; task++) {
        int64_t plane = task / (tr * tc), tile = task % (tr * tc);
        int64_t r0 = tile / tc * CPU_TILE, c0 = tile % tc * CPU_TILE;
        int64_t src_base = 0, dst_base = 0, f = plane;
        for (int i = outer.nd - 1; i >= 0; i--) {
            int64_t idx = f % outer.dim[i];
            f /= outer.dim[i];
            src_base += idx * outer.src[i];
            dst_base += idx * outer_out[i];
        }
        int64_t r1 = r0 + CPU_TILE < rows ? r0 + CPU_TILE : rows;
        int64_t c1 = c0 + CPU_TILE < cols ? c0 + CPU_TILE : cols;
        for (int64_t c = c0; c < c1; c++) {
            const float *src = x + src_base + c * src_col; /* contiguous along r */
            float *dst = out + dst_base + c;
            for (int64_t r = r0; r < r1; r++)
                dst[r * dst_row] = src[r];
        }
    }
}
