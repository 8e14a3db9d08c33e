/* kernel_math.h — private to kernels/: the per-element math of every
 * kernel, as static inline functions that both the CPU backend (C) and the
 * CUDA backend (device code) compile, so that a GPU computes the same
 * formula in the same float operations as the CPU and gets the same bits.
 *
 * What makes the bits agree:
 * - only +, -, *, / and sqrt, which IEEE 754 rounds exactly, and the
 *   conversions between float and double;
 * - no contraction of a*b+c into an fma: the C build passes
 *   -ffp-contract=off and the CUDA build --fmad=false;
 * - no libm call whose last bit is the library's choice: exp is regc's own
 *   (regc_expf below), and so is erfc (regc_erfcf), which libm and CUDA
 *   implement differently.
 * Kernels whose results still differ by backend (GEMMs, and reductions the
 * GPU runs in another order) say so where they are written. */
#ifndef REGC_KERNEL_MATH_H
#define REGC_KERNEL_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "regc_backend.h" /* and REGC_HD */

/* ---- bits */

static inline REGC_HD float regc_bits_to_float(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

static inline REGC_HD double regc_bits_to_double(uint64_t u)
{
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)u);
#else
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
#endif
}

static inline REGC_HD uint64_t regc_double_to_bits(double d)
{
#if defined(__CUDA_ARCH__)
    return (uint64_t)__double_as_longlong(d);
#else
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
#endif
}

static inline REGC_HD uint32_t regc_float_to_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

/* x rounded to bfloat16 (the upper 16 bits of a float), to nearest with
 * ties to even, returned as the float it stands for; NaN stays NaN (quiet),
 * infinities stay, a finite value past bf16's range becomes infinite, as
 * the conversion instructions (vcvtneps2bf16, __float2bfloat16_rn) do. */
static inline REGC_HD float regc_round_bf16(float x)
{
    uint32_t u = regc_float_to_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it, quiet */
        return regc_bits_to_float((u | 0x00400000u) & 0xffff0000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return regc_bits_to_float(u & 0xffff0000u);
}

/* A tensor stored in bf16 (compile.precision "bf16" keeps a tensor that
 * only bf16 GEMMs read in half the bytes): each element the upper half of
 * regc_round_bf16's float, so a GEMM reading it sees exactly what it would
 * have rounded from the fp32 value. */
static inline REGC_HD uint16_t regc_bf16_bits(float x)
{
    return (uint16_t)(regc_float_to_bits(regc_round_bf16(x)) >> 16);
}

static inline REGC_HD float regc_bf16_value(uint16_t h)
{
    return regc_bits_to_float((uint32_t)h << 16);
}

/* Element i of an input held in fp32, or in bf16 when bf16 (its value
 * exactly: every bf16 value is a float): the one load every kernel with a
 * bf16 input makes. */
static inline REGC_HD float regc_load_f32_or_bf16(const void *x, int bf16, int64_t i)
{
    return bf16 ? regc_bf16_value(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* Element i of an output held in fp32, or in bf16 when bf16: the one store
 * every kernel with a bf16 output makes. */
static inline REGC_HD void regc_store_f32_or_bf16(void *y, int bf16, int64_t i, float v)
{
    if (bf16)
        ((uint16_t *)y)[i] = regc_bf16_bits(v);
    else
        ((float *)y)[i] = v;
}

/* ---- dropout's masks: Philox4x32-10 (Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3", Random123), a counter-based generator: an
 * element's draw is a function of its index and the keys alone, so any
 * thread on any device, a recomputation, or a resumed run, draws the same. */

static inline REGC_HD uint32_t regc_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi)
{
    const uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* The four 32-bit words of Philox4x32-10 at counter c under key k. */
static inline REGC_HD void regc_philox4x32_10(const uint32_t c_in[4], const uint32_t k_in[2],
                                              uint32_t out[4])
{
    uint32_t c0 = c_in[0], c1 = c_in[1], c2 = c_in[2], c3 = c_in[3], k0 = k_in[0], k1 = k_in[1];
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        const uint32_t lo0 = regc_mulhilo32(0xD2511F53u, c0, &hi0);
        const uint32_t lo1 = regc_mulhilo32(0xCD9E8D57u, c2, &hi1);
        c0 = hi1 ^ c1 ^ k0, c1 = lo1, c2 = hi0 ^ c3 ^ k1, c3 = lo0;
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* Dropout's draw for elements 4q .. 4q + 3 of a tensor: key the run's seed,
 * counter (q, the dropout site, the micro-batch). draw[4]: seed's low and
 * high words, the micro-batch, 1 in training (regc_dropout_draw). */
static inline REGC_HD void regc_dropout_words(const int32_t *draw, int32_t site, int64_t q,
                                              uint32_t out[4])
{
    const uint32_t c[4] = {(uint32_t)q, (uint32_t)((uint64_t)q >> 32), (uint32_t)site,
                           (uint32_t)draw[2]};
    const uint32_t k[2] = {(uint32_t)draw[0], (uint32_t)draw[1]};
    regc_philox4x32_10(c, k, out);
}

/* An element kept with probability 1 - p, from its 32-bit word: the top 24
 * bits as a uniform u in [0, 1), kept when u >= p; kept, it is scaled as
 * torch scales it (x * (1 / (1 - p)), the factor rounded to float). */
static inline REGC_HD float regc_dropout_apply(float x, uint32_t word, float p, float scale)
{
    return (float)(word >> 8) * 0x1p-24f >= p ? x * scale : 0.0f;
}

/* ---- exp and erfc */

/* exp(x) to about one ulp (Cephes' polynomial after Cody-Waite reduction),
 * branch-free so CPU loops over it vectorise: glibc's expf and tanhf are
 * scalar calls, and with them softmax and GELU cost as much as the GEMMs
 * beside them. Inputs are clamped to [-87, 88] (exp(-87) ~ 1.6e-38 stands
 * in for zero); NaN propagates. The same operations in the same order
 * whether vectorised or not, on the CPU or the GPU. */
static inline REGC_HD float regc_expf(float x)
{
    x = x > 88.0f ? 88.0f : x;
    x = x < -87.0f ? -87.0f : x;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * 1.44269504088896341f + magic;
    float n = t - magic; /* round(x / ln 2) */
    uint32_t scale = (regc_float_to_bits(t) - regc_float_to_bits(magic) + 127u) << 23;
    float r = x - n * 0.693359375f; /* ln 2 in two parts: r stays exact */
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    return p * regc_bits_to_float(scale);
}

/* erfc(x) with a relative error of about 2e-7 everywhere, the tail
 * included: t exp(-z^2 + P(t)) with t = 1 / (1 + z/2), z = |x|, and P the
 * degree-9 Chebyshev fit of Numerical Recipes' erfcc (fractional error
 * below 1.2e-7 in exact arithmetic); erfc(-z) = 2 - erfc(z). Relative
 * accuracy of erfc is what the exact GELU needs: 0.5 x erfc(-x / sqrt 2)
 * is a product, where 1 + erf(x / sqrt 2) cancels for negative x. */
static inline REGC_HD float regc_erfcf(float x)
{
    const float z = x < 0.0f ? -x : x;
    const float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    const float r = t * regc_expf(p - z * z);
    return x < 0.0f ? 2.0f - r : r;
}

/* log(x) in double to about two ulps, from +, -, * and / alone: libm's and
 * CUDA's logs may round the last bit differently (CUDA's also contracts
 * into fma), and a log-sum-exp saved as a float must be the same on both.
 * x = m 2^e with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s) with
 * s = (m - 1) / (m + 1), |s| < 0.1716, summed as the odd series to s^23
 * (the next term is below 1e-19 of the sum); e ln 2 with ln 2 in two parts,
 * the first exact times any exponent. 0 gives -inf, a negative x or NaN
 * NaN, +inf itself. */
static inline REGC_HD double regc_log(double x)
{
    if (!(x > 0.0) || x == (double)INFINITY)
        return x == 0.0 ? -(double)INFINITY : x > 0.0 ? x : (double)NAN;
    int64_t e = 0;
    if (x < 2.2250738585072014e-308) { /* subnormal: scale into the normal range */
        x *= 18014398509481984.0;      /* 2^54 */
        e = -54;
    }
    const uint64_t bits = regc_double_to_bits(x);
    e += (int64_t)((bits >> 52) & 0x7ff) - 1023;
    double m = regc_bits_to_double((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e += 1;
    }
    const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double p = 1.0 / 23.0;
    p = p * s2 + 1.0 / 21.0;
    p = p * s2 + 1.0 / 19.0;
    p = p * s2 + 1.0 / 17.0;
    p = p * s2 + 1.0 / 15.0;
    p = p * s2 + 1.0 / 13.0;
    p = p * s2 + 1.0 / 11.0;
    p = p * s2 + 1.0 / 9.0;
    p = p * s2 + 1.0 / 7.0;
    p = p * s2 + 1.0 / 5.0;
    p = p * s2 + 1.0 / 3.0;
    const double log_m = 2.0 * (s + s * (s2 * p));
    const double de = (double)e;
    return de * 6.93147180369123816490e-01 + (de * 1.90821492927058770002e-10 + log_m);
}

/* ---- the elementwise kernels: one definition each, used by the single
 * kernels, the GEMM epilogues and the fused chain on every backend, so a
 * fused chain cannot drift from the kernels it replaces by a single bit */

static inline REGC_HD float regc_addf(float a, float b) { return a + b; }

static inline REGC_HD float regc_mulf(float a, float b) { return a * b; }

static inline REGC_HD float regc_scalef(float value, float x) { return value * x; }

/* GPT-2's gelu_new, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3),
 * evaluated as x * s with s = 1 / (1 + exp(-2u)), the same function: it
 * needs only exp and avoids the cancellation in 1 + tanh(u) for negative x.
 * The derivative is s + 2 x s (1 - s) du/dx, with s (1 - s) = e / (1 + e)^2
 * for e = exp(-2u), again free of cancellation. */
#define REGC_GELU_BETA 0.7978845608028654f /* sqrt(2 / pi) */
#define REGC_GELU_KAPPA 0.044715f

static inline REGC_HD float regc_gelu(float x)
{
    float u = REGC_GELU_BETA * (x + REGC_GELU_KAPPA * (x * x * x));
    return x / (1.0f + regc_expf(-2.0f * u));
}

static inline REGC_HD float regc_gelu_grad(float x)
{
    float x_sq = x * x;
    float u = REGC_GELU_BETA * (x + REGC_GELU_KAPPA * (x_sq * x));
    float e = regc_expf(-2.0f * u);
    float d = 1.0f + e;
    float du = REGC_GELU_BETA * (1.0f + 3.0f * REGC_GELU_KAPPA * x_sq);
    return 1.0f / d + 2.0f * x * (e / (d * d)) * du;
}

static inline REGC_HD float regc_gelu_dx(float dy, float x) { return dy * regc_gelu_grad(x); }

/* sigmoid through the vectorisable exp; 1 / (1 + e^-x) saturates cleanly at
 * both ends (the exp is clamped, never inf) */
static inline REGC_HD float regc_sigmoid(float x) { return 1.0f / (1.0f + regc_expf(-x)); }

static inline REGC_HD float regc_silu(float x) { return x * regc_sigmoid(x); }

/* d/dx x s(x) = s + x s (1 - s) */
static inline REGC_HD float regc_silu_dx(float dy, float x)
{
    const float s = regc_sigmoid(x);
    return dy * (s * (1.0f + x * (1.0f - s)));
}

#define REGC_INV_SQRT2 0.70710678118654752f   /* 1 / sqrt(2) */
#define REGC_INV_SQRT2PI 0.39894228040143268f /* 1 / sqrt(2 pi) */

/* the exact GELU, x Phi(x) = 0.5 x erfc(-x / sqrt 2) */
static inline REGC_HD float regc_gelu_erf(float x)
{
    return 0.5f * x * regc_erfcf(-x * REGC_INV_SQRT2);
}

/* d/dx x Phi(x) = Phi(x) + x phi(x), phi the standard normal density */
static inline REGC_HD float regc_gelu_erf_dx(float dy, float x)
{
    const float cdf = 0.5f * regc_erfcf(-x * REGC_INV_SQRT2);
    const float pdf = REGC_INV_SQRT2PI * regc_expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
}

static inline REGC_HD float regc_relu(float x) { return x > 0.0f ? x : 0.0f; }

static inline REGC_HD float regc_subf(float a, float b) { return a - b; }

static inline REGC_HD float regc_divf(float a, float b) { return a / b; }

static inline REGC_HD float regc_negf(float x) { return -x; }

static inline REGC_HD float regc_add_scalarf(float value, float x) { return x + value; }

/* value where the mask is set (any non-zero), else x */
static inline REGC_HD float regc_masked_fillf(float value, float x, float mask)
{
    return mask != 0.0f ? value : x;
}

/* tanh(x) to a few ulps (Cephes' tanhf): below |x| = 0.625 the odd
 * polynomial x + x^3 P(x^2), where 1 - 2 / (e^2x + 1) would cancel; above
 * it that form, whose exp saturates to +-1 for large |x|. NaN propagates. */
static inline REGC_HD float regc_tanhf(float x)
{
    const float z = x < 0.0f ? -x : x;
    if (z < 0.625f) {
        const float s = x * x;
        float p = -5.70498872745e-3f;
        p = p * s + 2.06390887954e-2f;
        p = p * s - 5.37397155531e-2f;
        p = p * s + 1.33314422036e-1f;
        p = p * s - 3.33332819422e-1f;
        return p * s * x + x;
    }
    const float r = 1.0f - 2.0f / (regc_expf(2.0f * z) + 1.0f);
    return x < 0.0f ? -r : r;
}

/* d tanh x = (1 - y^2) dx, from the saved y = tanh x */
static inline REGC_HD float regc_tanh_dy(float dy, float y) { return dy * (1.0f - y * y); }

/* Gemma 2's soft-capping of a scaled attention score, cap tanh(x / cap), as
 * Transformers' eager attention rounds it (a division, tanh, a product);
 * *slope, when asked, gets its derivative 1 - tanh^2 for the backward. */
static inline REGC_HD float regc_softcap(float x, float cap, float *slope)
{
    const float th = regc_tanhf(x / cap);
    if (slope)
        *slope = 1.0f - th * th;
    return cap * th;
}

/* 1 / sqrt(x): IEEE's correctly rounded sqrt and division on the CPU and
 * (without fast math) on the GPU, so both give the same bits. */
static inline REGC_HD float regc_rsqrtf(float x) { return 1.0f / sqrtf(x); }

/* x^p. Whole exponents up to 64 in magnitude multiply by squaring (the
 * same products everywhere, and a negative base keeps its sign, as
 * PyTorch's pow does); a half is sqrt; any other exponent is
 * exp(p log x), NaN for a negative base, as libm's. */
static inline REGC_HD float regc_powf(float x, float p)
{
    const float ap = p < 0.0f ? -p : p;
    if (ap <= 64.0f && ap == (float)(int)ap) {
        int k = (int)ap;
        float r = 1.0f, b = x;
        while (k) {
            if (k & 1)
                r *= b;
            b *= b;
            k >>= 1;
        }
        return p < 0.0f ? 1.0f / r : r;
    }
    if (ap == 0.5f)
        return p < 0.0f ? 1.0f / sqrtf(x) : sqrtf(x);
    if (x == 0.0f)
        return p > 0.0f ? 0.0f : (float)INFINITY;
    if (!(x > 0.0f))
        return (float)NAN;
    return regc_expf(p * (float)regc_log((double)x));
}

/* the subgradient at 0 is 0, PyTorch's choice (threshold_backward) */
static inline REGC_HD float regc_relu_dx(float dy, float x) { return x > 0.0f ? dy : 0.0f; }

/* The element of input i that element e of a chain reads: each value held
 * over `inner` neighbours (a row's statistic), the whole repeated every
 * `period` (a bias). */
static inline REGC_HD int64_t regc_ew_index(const regc_ew_program *p, int i, int64_t e)
{
    const int64_t inner = p->inner[i], period = p->period[i];
    const int64_t k = inner > 1 ? e / inner : e;
    return period > 0 ? k % period : k;
}

/* One step of a fused elementwise chain (regc_ew_program) on one element:
 * the GPU's interpreter calls it per element; the CPU's loops call the same
 * functions a block at a time, the switch outside the loop. */
static inline REGC_HD float regc_ew_eval(const regc_ew_step *st, float a, float b)
{
    const float v = st->value;
    (void)b, (void)v;
    switch (st->op) {
#define REGC_EW_CASE(id, name, arity, costly, f)                                                   \
    case REGC_EW_##id: return f;
        REGC_EW_OPS(REGC_EW_CASE)
#undef REGC_EW_CASE
    default: return a; /* refused before any element is read */
    }
}

/* ---- rotary embedding: one pair (x1, x2) of a head rotated by (c, s),
 * s already negated for the inverse */
static inline REGC_HD void regc_rope_pair(float *y1, float *y2, float x1, float x2, float c,
                                          float s)
{
    *y1 = x1 * c - x2 * s;
    *y2 = x2 * c + x1 * s;
}

/* ---- the norms' finalisation: row statistics (summed in double, in an
 * order each backend states) to the saved float, and each element */

/* 1 / sqrt(var + eps), var the biased variance (LayerNorm) or the mean
 * square (RMSNorm) */
static inline REGC_HD float regc_norm_rstd(double var, float eps)
{
    return (float)(1.0 / sqrt(var + (double)eps));
}

/* a double sum over cols, divided, as a float (0 for an empty row) */
static inline REGC_HD float regc_norm_mean_f(double sum, int64_t cols)
{
    return cols > 0 ? (float)(sum / (double)cols) : 0.0f;
}

static inline REGC_HD float regc_layernorm_y(float x, float m, float s, float w, float b)
{
    const float n = (x - m) * s;
    return n * w + b;
}

/* LayerNorm's dx from the row's means of dnorm and of dnorm * xhat */
static inline REGC_HD float regc_layernorm_dx(float x, float dy, float w, float m, float s,
                                              float dnorm_mean, float dnorm_xhat_mean)
{
    const float xhat = (x - m) * s;
    const float dnorm = w * dy;
    return (dnorm - dnorm_mean - xhat * dnorm_xhat_mean) * s;
}

/* (x * rstd) * w: the order HF applies them in */
static inline REGC_HD float regc_rmsnorm_y(float x, float s, float w) { return (x * s) * w; }

/* with xhat = x * rstd and g = w * dy: dx = rstd * (g - xhat * mean(g * xhat)) */
static inline REGC_HD float regc_rmsnorm_dx(float x, float dy, float w, float s, float gx_mean)
{
    return (w * dy - (x * s) * gx_mean) * s;
}

/* ---- cross-entropy's gradient at one logit: g (softmax - onehot), the
 * softmax from the row's log-sum-exp l */
/* softmax's or log-softmax's output at x, l the row's log-sum-exp */
static inline REGC_HD float regc_softmax_y(float x, float l, int log)
{
    return log ? x - l : regc_expf(x - l);
}

static inline REGC_HD float regc_ce_dx(float x, float l, float g, int is_target)
{
    return is_target ? g * (regc_expf(x - l) - 1.0f) : g * regc_expf(x - l);
}

/* ---- AdamW on one element: the same float operations in the same order
 * as PyTorch's (the gradient first scaled by the clip, as
 * clip_grad_norm_ does in place); returns the new parameter. decay is
 * c->decay, or 1 for a parameter in a group of weight_decay 0 (p * 1 is
 * p, as torch leaves it). */
static inline REGC_HD float regc_adamw_one(float *m, float *v, float p, float g,
                                           const regc_step_scalars *c, float decay)
{
    g = g * c->clip_scale;
    *m = *m * c->beta1_f + c->one_minus_beta1 * g;
    *v = *v * c->beta2_f + (c->one_minus_beta2 * g) * g;
    const float denom = sqrtf(*v) / c->bc2_sqrt + c->eps_f;
    return p * decay + (c->neg_step_size * *m) / denom;
}

#endif
