/* edgeport_xnnpack._qd8: dynamically quantized fully connected (qd8 x qc8w, qd8 x qb4w) on the host, for the
 * 2022 libXNNPACK that has neither the qdint8 datatype nor these kernels.
 *
 * fc(x, w, scales, bias, out, m, k, n, group, bits, lo, hi[, parallelize, pool]):
 *   x      float32 [m, k]           the float input (C-contiguous)
 *   w      bits 8: int8 [n, k]; bits 4: uint8 [n, k / 2], value + 8, the even input channel in the low nibble
 *   scales float32 [n, k / group]   (bits 8: group == k, one scale per output channel)
 *   bias   float32 [n] or None
 *   out    float32 [m, n]           clamped to [lo, hi]
 * Each row of x is quantized as XNNPACK's f32 -> qd8 convert does (the arithmetic of
 * edgeport_xnnpack._dynamic_quant.row_params / quantize_rows, float32 step by step, no fused multiply-adds): the
 * range widened to contain 0, inv = 255 / (max - min), a nudged zero point, values rounded half to even. Then per
 * output: exact int32 dot products of (q - zero_point) with the weights per group, each scaled by its group's scale
 * and summed in float32, times 1 / inv, plus the bias. The integers are exact; the float32 scaling and sums follow
 * XNNPACK's formula, not necessarily its operation order (so results agree to float32 rounding).
 * An AVX-512 VNNI loop (vpdpwssd, 32 input channels per step; bits 4 when the groups are 32 channels and even in
 * number) where the CPU has it, else an AVX2 loop (16 input channels per step, vpmaddwd) where the CPU has AVX2,
 * else portable C. The loops differ only in the order of the float32 sums (the integer parts are exact). Columns are split in
 * tasks of 32 on the delegate's pthreadpool when the caller passes it; the GIL is released while computing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QD8_X86 1
#endif

typedef void (*task_fn)(void *, size_t);
typedef void (*parallelize_fn)(void *, task_fn, void *, size_t, uint32_t);

#define COLS_PER_TASK 32
enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_VNNI = 2 };

struct job {
    const int16_t *a;     /* [m][k] q - zero_point; bits 4: per 32 channels, the 16 even then the 16 odd */
    const int32_t *asum;  /* bits 4: [m][k / group] sums of a per group (for the nibbles' +8) */
    const float *rscale;  /* [m] 1 / inv */
    const uint8_t *w;
    const float *scales;
    const float *bias;
    float *out;
    Py_ssize_t m, k, n, group;
    int bits, isa;  /* ISA_PORTABLE, ISA_AVX2 or ISA_VNNI */
    int vnni4;      /* bits 4 on the AVX-512 VNNI loop: `a` is laid out per 64 channels (see quantize_row) */
    float lo, hi;
};

/* -- row quantization (XNNPACK's f32 -> qd8) ------------------------------------------------------------------- */
static void quantize_row(const float *x, Py_ssize_t k, int bits, int vnni4, int16_t *a, float *rscale) {
    float mn = 0.0f, mx = 0.0f;
    for (Py_ssize_t i = 0; i < k; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    float span = mx - mn;
    float inv = span == 0.0f ? 1.0f : 255.0f / span;
    float t1 = mn * inv, t2 = mx * inv;
    float lo_err = -128.0f + t1, hi_err = 127.0f + t2;
    float zp = lo_err + hi_err > 0.0f ? -128.0f - t1 : 127.0f - t2;
    zp = rintf(zp < -128.0f ? -128.0f : (zp > 127.0f ? 127.0f : zp));
    float qlo = -128.0f - zp, qhi = 127.0f - zp;
    for (Py_ssize_t i = 0; i < k; i++) {
        float v = x[i] * inv;
        v = v < qlo ? qlo : (v > qhi ? qhi : v);
        int16_t q = (int16_t)rintf(v);
        if (bits == 4 && vnni4) {  /* per 64 channels (two blocks): even of each block, then odd of each block */
            Py_ssize_t base = i & ~(Py_ssize_t)63, j = i & 31;
            a[base + (j & 1) * 32 + ((i >> 5) & 1) * 16 + (j >> 1)] = q;
        } else if (bits == 4) {  /* per block of 32: even channels first, then odd */
            Py_ssize_t base = i & ~(Py_ssize_t)31, j = i & 31;
            a[base + (j & 1) * 16 + (j >> 1)] = q;
        } else {
            a[i] = q;
        }
    }
    *rscale = 1.0f / inv;
}

/* -- dot products ------------------------------------------------------------------------------------------------ */
static int32_t dot8_portable(const int16_t *a, const int8_t *w, Py_ssize_t k) {
    int32_t s = 0;
    for (Py_ssize_t i = 0; i < k; i++)
        s += (int32_t)a[i] * (int32_t)w[i];
    return s;
}

static int32_t dot4_portable(const int16_t *a, const uint8_t *w, Py_ssize_t len) {
    /* len channels (a multiple of 32) from 32-channel blocks; unsigned nibbles (the caller subtracts 8 * sum a) */
    int32_t s = 0;
    for (Py_ssize_t b = 0; b < len; b += 32, a += 32, w += 16)
        for (int j = 0; j < 16; j++)
            s += (int32_t)a[j] * (int32_t)(w[j] & 15) + (int32_t)a[16 + j] * (int32_t)(w[j] >> 4);
    return s;
}

#ifdef QD8_X86
__attribute__((target("avx2"))) static inline int32_t hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* Output column c for rows r .. r + NR - 1, bits 4: per group, 8 lanes of exact int32 sums of a * nibble (lane 0
 * starting at -8 * sum(a) for the nibbles' +8), converted to float (exact: |sum| < 2^24) and scaled by the group's
 * scale into 8 float lanes, summed at the end. The filter bytes are unpacked once for the NR rows. */
static inline __attribute__((always_inline, target("avx2"))) void rows4(const struct job *j, Py_ssize_t c,
                                                                           Py_ssize_t r, const int NR) {
    const __m256i low = _mm256_set1_epi16(15);
    Py_ssize_t groups = j->k / j->group;
    const uint8_t *w = j->w + c * (j->k / 2);
    const float *sc = j->scales + c * groups;
    const int16_t *a = j->a + r * j->k;
    __m256 facc[4];
    for (int t = 0; t < NR; t++)
        facc[t] = _mm256_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g++) {
        __m256i acc[4];
        for (int t = 0; t < NR; t++)
            acc[t] = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-8 * j->asum[(r + t) * groups + g]));
        for (Py_ssize_t i = g * j->group; i < (g + 1) * j->group; i += 32, w += 16) {
            __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)w));
            __m256i even = _mm256_and_si256(bytes, low), odd = _mm256_srli_epi16(bytes, 4);
            for (int t = 0; t < NR; t++) {
                const int16_t *at = a + t * j->k + i;
                acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)at), even));
                acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(at + 16)),
                                                                    odd));
            }
        }
        __m256 s = _mm256_set1_ps(sc[g]);
        for (int t = 0; t < NR; t++)
            facc[t] = _mm256_add_ps(facc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[t]), s));
    }
    float b = j->bias ? j->bias[c] : 0.0f;
    for (int t = 0; t < NR; t++) {
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(facc[t]), _mm256_extractf128_ps(facc[t], 1));
        s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
        float y = _mm_cvtss_f32(s4) * j->rscale[r + t] + b;
        j->out[(r + t) * j->n + c] = y < j->lo ? j->lo : (y > j->hi ? j->hi : y);
    }
}

__attribute__((target("avx2"))) static void column4_avx2(const struct job *j, Py_ssize_t c) {
    Py_ssize_t r = 0;
    for (; r + 4 <= j->m; r += 4)
        rows4(j, c, r, 4);
    for (; r < j->m; r++)
        rows4(j, c, r, 1);
}

/* Row r, output columns c .. c + NC - 1, bits 4 (m < 4, decode): NC independent chains, activations loaded once. */
static inline __attribute__((always_inline, target("avx2"))) void cols4_avx2(const struct job *j, Py_ssize_t c,
                                                                               Py_ssize_t r, const int NC) {
    const __m256i low = _mm256_set1_epi16(15);
    Py_ssize_t groups = j->k / j->group, half = j->k / 2;
    const int16_t *a = j->a + r * j->k;
    __m256 facc[4];
    for (int u = 0; u < NC; u++)
        facc[u] = _mm256_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g++) {
        __m256i acc[4];
        __m256i init = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-8 * j->asum[r * groups + g]));
        for (int u = 0; u < NC; u++)
            acc[u] = init;
        for (Py_ssize_t i = g * j->group; i < (g + 1) * j->group; i += 32) {
            __m256i ae = _mm256_loadu_si256((const __m256i *)(a + i));
            __m256i ao = _mm256_loadu_si256((const __m256i *)(a + i + 16));
            for (int u = 0; u < NC; u++) {
                __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(j->w + (c + u) * half + i / 2)));
                acc[u] = _mm256_add_epi32(acc[u], _mm256_madd_epi16(ae, _mm256_and_si256(bytes, low)));
                acc[u] = _mm256_add_epi32(acc[u], _mm256_madd_epi16(ao, _mm256_srli_epi16(bytes, 4)));
            }
        }
        for (int u = 0; u < NC; u++)
            facc[u] = _mm256_add_ps(facc[u], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[u]),
                                                           _mm256_set1_ps(j->scales[(c + u) * groups + g])));
    }
    for (int u = 0; u < NC; u++) {
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(facc[u]), _mm256_extractf128_ps(facc[u], 1));
        s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
        float b = j->bias ? j->bias[c + u] : 0.0f;
        float y = _mm_cvtss_f32(s4) * j->rscale[r] + b;
        j->out[r * j->n + c + u] = y < j->lo ? j->lo : (y > j->hi ? j->hi : y);
    }
}

__attribute__((target("avx2"))) static void few_rows4_avx2(const struct job *j, Py_ssize_t c0, Py_ssize_t c1) {
    for (Py_ssize_t r = 0; r < j->m; r++) {
        Py_ssize_t c = c0;
        for (; c + 4 <= c1; c += 4)
            cols4_avx2(j, c, r, 4);
        for (; c < c1; c++)
            cols4_avx2(j, c, r, 1);
    }
}

/* Output column c for rows r .. r + NR - 1, bits 8: the filter row is widened once per 16 channels for NR rows. */
static inline __attribute__((always_inline, target("avx2"))) void rows8(const struct job *j, Py_ssize_t c,
                                                                           Py_ssize_t r, const int NR) {
    const int8_t *w = (const int8_t *)j->w + c * j->k;
    __m256i acc[4];
    for (int t = 0; t < NR; t++)
        acc[t] = _mm256_setzero_si256();
    Py_ssize_t i = 0;
    for (; i + 16 <= j->k; i += 16) {
        __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + i)));
        for (int t = 0; t < NR; t++)
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(
                _mm256_loadu_si256((const __m256i *)(j->a + (r + t) * j->k + i)), wv));
    }
    float sc = j->scales[c], b = j->bias ? j->bias[c] : 0.0f;
    for (int t = 0; t < NR; t++) {
        int32_t s = hsum(acc[t]) + dot8_portable(j->a + (r + t) * j->k + i, w + i, j->k - i);
        float y = (float)s * j->rscale[r + t];
        y = y * sc + b;
        j->out[(r + t) * j->n + c] = y < j->lo ? j->lo : (y > j->hi ? j->hi : y);
    }
}

__attribute__((target("avx2"))) static void column8_avx2(const struct job *j, Py_ssize_t c) {
    Py_ssize_t r = 0;
    for (; r + 4 <= j->m; r += 4)
        rows8(j, c, r, 4);
    for (; r < j->m; r++)
        rows8(j, c, r, 1);
}

/* AVX-512 VNNI (vpdpwssd: int16 pairs multiplied and accumulated into int32 lanes in one instruction), 512-bit.
 * bits 4 with groups of 32 and an even group count: two groups per step, lanes 0-7 of the int32 accumulator hold
 * group g's partial sums and lanes 8-15 group g + 1's (lane 0 / 8 starting at -8 * sum(a) of its group), each
 * converted to float (exact) and scaled by its group's scale. bits 8: 32 input channels per step, exact int32. */
#define VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

static inline __attribute__((always_inline)) VNNI void rows4_vnni(const struct job *j, Py_ssize_t c, Py_ssize_t r,
                                                                    const int NR) {
    const __m512i low = _mm512_set1_epi16(15);
    const __m512i pick = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    Py_ssize_t groups = j->k / 32;
    const uint8_t *w = j->w + c * (j->k / 2);
    const float *sc = j->scales + c * groups;
    __m512 facc[4];
    for (int t = 0; t < NR; t++)
        facc[t] = _mm512_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g += 2, w += 32) {
        __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)w));
        __m512i even = _mm512_and_si512(bytes, low), odd = _mm512_srli_epi16(bytes, 4);
        __m512 s = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(
            _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(sc + g)))));
        for (int t = 0; t < NR; t++) {
            const int16_t *at = j->a + (r + t) * j->k + g * 32;
            __m128i sums = _mm_loadl_epi64((const __m128i *)(j->asum + (r + t) * groups + g));
            sums = _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(sums, 3));
            __m512i acc = _mm512_maskz_permutexvar_epi32(0x0101, pick, _mm512_castsi128_si512(sums));
            acc = _mm512_dpwssd_epi32(acc, _mm512_loadu_si512((const void *)at), even);
            acc = _mm512_dpwssd_epi32(acc, _mm512_loadu_si512((const void *)(at + 32)), odd);
            facc[t] = _mm512_add_ps(facc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(acc), s));
        }
    }
    float b = j->bias ? j->bias[c] : 0.0f;
    for (int t = 0; t < NR; t++) {
        float y = _mm512_reduce_add_ps(facc[t]) * j->rscale[r + t] + b;
        j->out[(r + t) * j->n + c] = y < j->lo ? j->lo : (y > j->hi ? j->hi : y);
    }
}

VNNI static void column4_vnni(const struct job *j, Py_ssize_t c) {
    Py_ssize_t r = 0;
    for (; r + 4 <= j->m; r += 4)
        rows4_vnni(j, c, r, 4);
    for (; r < j->m; r++)
        rows4_vnni(j, c, r, 1);
}

static inline __attribute__((always_inline)) VNNI void rows8_vnni(const struct job *j, Py_ssize_t c, Py_ssize_t r,
                                                                    const int NR) {
    const int8_t *w = (const int8_t *)j->w + c * j->k;
    __m512i acc[4];
    for (int t = 0; t < NR; t++)
        acc[t] = _mm512_setzero_si512();
    Py_ssize_t i = 0;
    for (; i + 32 <= j->k; i += 32) {
        __m512i wv = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + i)));
        for (int t = 0; t < NR; t++)
            acc[t] = _mm512_dpwssd_epi32(acc[t], _mm512_loadu_si512((const void *)(j->a + (r + t) * j->k + i)), wv);
    }
    float sc = j->scales[c], b = j->bias ? j->bias[c] : 0.0f;
    for (int t = 0; t < NR; t++) {
        int32_t s = _mm512_reduce_add_epi32(acc[t]) + dot8_portable(j->a + (r + t) * j->k + i, w + i, j->k - i);
        float y = (float)s * j->rscale[r + t];
        y = y * sc + b;
        j->out[(r + t) * j->n + c] = y < j->lo ? j->lo : (y > j->hi ? j->hi : y);
    }
}

/* Row r, output columns c .. c + NC - 1, bits 4 (m < 4, decode): the NC columns' chains are independent, so they
 * overlap instead of waiting on one accumulator, and the row's activations are loaded once for all of them. */
static inline __attribute__((always_inline)) VNNI void cols4_vnni(const struct job *j, Py_ssize_t c, Py_ssize_t r,
                                                                    const int NC) {
    const __m512i low = _mm512_set1_epi16(15);
    const __m512i pick = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    Py_ssize_t groups = j->k / 32, half = j->k / 2;
    const int16_t *a = j->a + r * j->k;
    const int32_t *as = j->asum + r * groups;
    __m512 facc[4];
    for (int u = 0; u < NC; u++)
        facc[u] = _mm512_setzero_ps();
    for (Py_ssize_t g = 0; g < groups; g += 2) {
        __m512i ae = _mm512_loadu_si512((const void *)(a + g * 32));
        __m512i ao = _mm512_loadu_si512((const void *)(a + g * 32 + 32));
        __m128i sums = _mm_loadl_epi64((const __m128i *)(as + g));
        sums = _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(sums, 3));
        __m512i init = _mm512_maskz_permutexvar_epi32(0x0101, pick, _mm512_castsi128_si512(sums));
        for (int u = 0; u < NC; u++) {
            const uint8_t *w = j->w + (c + u) * half + g * 16;
            __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)w));
            __m512i acc = _mm512_dpwssd_epi32(init, ae, _mm512_and_si512(bytes, low));
            acc = _mm512_dpwssd_epi32(acc, ao, _mm512_srli_epi16(bytes, 4));
            __m512 s = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(
                _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(j->scales + (c + u) * groups + g)))));
            facc[u] = _mm512_add_ps(facc[u], _mm512_mul_ps(_mm512_cvtepi32_ps(acc), s));
        }
    }
    for (int u = 0; u < NC; u++) {
        float b = j->bias ? j->bias[c + u] : 0.0f;
        float y = _mm512_reduce_add_ps(facc[u]) * j->rscale[r] + b;
        j->out[r * j->n + c + u] = y < j->lo ? j->lo : (y > j->hi ? j->hi : y);
    }
}

VNNI static void few_rows4_vnni(const struct job *j, Py_ssize_t c0, Py_ssize_t c1) {
    for (Py_ssize_t r = 0; r < j->m; r++) {
        Py_ssize_t c = c0;
        for (; c + 4 <= c1; c += 4)
            cols4_vnni(j, c, r, 4);
        for (; c < c1; c++)
            cols4_vnni(j, c, r, 1);
    }
}

VNNI static void column8_vnni(const struct job *j, Py_ssize_t c) {
    Py_ssize_t r = 0;
    for (; r + 4 <= j->m; r += 4)
        rows8_vnni(j, c, r, 4);
    for (; r < j->m; r++)
        rows8_vnni(j, c, r, 1);
}
#endif

static void columns(void *ctx, size_t task) {
    const struct job *j = ctx;
    Py_ssize_t c0 = (Py_ssize_t)task * COLS_PER_TASK;
    Py_ssize_t c1 = c0 + COLS_PER_TASK < j->n ? c0 + COLS_PER_TASK : j->n;
    Py_ssize_t groups = j->k / j->group;
#ifdef QD8_X86
    if (j->vnni4 && j->m < 4) {
        few_rows4_vnni(j, c0, c1);
        return;
    }
    if (j->isa == ISA_VNNI && (j->bits == 8 || j->vnni4)) {
        for (Py_ssize_t c = c0; c < c1; c++) {
            if (j->bits == 4)
                column4_vnni(j, c);
            else
                column8_vnni(j, c);
        }
        return;
    }
    if (j->isa != ISA_PORTABLE && j->bits == 4 && j->m < 4 && !j->vnni4) {
        few_rows4_avx2(j, c0, c1);
        return;
    }
    if (j->isa != ISA_PORTABLE) {
        for (Py_ssize_t c = c0; c < c1; c++) {
            if (j->bits == 4)
                column4_avx2(j, c);
            else
                column8_avx2(j, c);
        }
        return;
    }
#endif
    for (Py_ssize_t c = c0; c < c1; c++) {
        const float *sc = j->scales + c * groups;
        float b = j->bias ? j->bias[c] : 0.0f;
        for (Py_ssize_t r = 0; r < j->m; r++) {
            const int16_t *a = j->a + r * j->k;
            float y;
            if (j->bits == 8) {
                const int8_t *w = (const int8_t *)j->w + c * j->k;
                int32_t s = dot8_portable(a, w, j->k);
                y = (float)s * j->rscale[r];
                y = y * sc[0] + b;
            } else {
                const uint8_t *w = j->w + c * (j->k / 2);
                const int32_t *as = j->asum + r * groups;
                float acc = 0.0f;
                for (Py_ssize_t g = 0; g < groups; g++) {
                    Py_ssize_t off = g * j->group;
                    int32_t s = dot4_portable(a + off, w + off / 2, j->group);
                    acc += (float)(s - 8 * as[g]) * sc[g];
                }
                y = acc * j->rscale[r] + b;
            }
            y = y < j->lo ? j->lo : (y > j->hi ? j->hi : y);
            j->out[r * j->n + c] = y;
        }
    }
}

static int loop_isa(void) {
#ifdef QD8_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || getenv("EDGEPORT_XNNPACK_QD8_PORTABLE"))
        return ISA_PORTABLE;
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") &&
        !getenv("EDGEPORT_XNNPACK_QD8_AVX2"))
        return ISA_VNNI;
    return ISA_AVX2;
#else
    return ISA_PORTABLE;
#endif
}

static PyObject *simd(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args)) {
    static const char *names[] = {"portable", "avx2", "avx512vnni"};
    return PyUnicode_FromString(names[loop_isa()]);
}

/* -- argument checks ----------------------------------------------------------------------------------------------- */
static int need(Py_buffer *v, Py_ssize_t bytes, const char *what) {
    if (v->len != bytes) {
        PyErr_Format(PyExc_ValueError, "qd8 fc: %s has %zd bytes, %zd expected", what, v->len, bytes);
        return -1;
    }
    return 0;
}

static PyObject *fc(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer x = {0}, w = {0}, sc = {0}, bias = {0}, out = {0};
    PyObject *bias_obj;
    Py_ssize_t m, k, n, group;
    int bits;
    float lo, hi;
    unsigned long long parallelize = 0, pool = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*Ow*nnnniff|KK:fc", &x, &w, &sc, &bias_obj, &out, &m, &k, &n, &group, &bits,
                          &lo, &hi, &parallelize, &pool))
        return NULL;
    PyObject *result = NULL;
    int16_t *a = NULL;
    int32_t *asum = NULL;
    float *rscale = NULL;
    int has_bias = bias_obj != Py_None;
    if (has_bias && PyObject_GetBuffer(bias_obj, &bias, PyBUF_SIMPLE) != 0)
        goto done;
    if (m < 0 || k <= 0 || n <= 0 || group <= 0 || k % group || (bits != 4 && bits != 8) ||
        (bits == 4 && group % 32) || (bits == 8 && group != k) || (pool && !parallelize)) {
        PyErr_Format(PyExc_ValueError, "qd8 fc: bad sizes m=%zd k=%zd n=%zd group=%zd bits=%d", m, k, n, group, bits);
        goto done;
    }
    if (need(&x, m * k * 4, "x") || need(&w, n * k * bits / 8, "w") || need(&sc, n * (k / group) * 4, "scales") ||
        need(&out, m * n * 4, "out") || (has_bias && need(&bias, n * 4, "bias")))
        goto done;
    if (m == 0) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    a = PyMem_Malloc((size_t)(m * k) * sizeof *a);
    asum = PyMem_Malloc((size_t)(m * (k / group)) * sizeof *asum);
    rscale = PyMem_Malloc((size_t)m * sizeof *rscale);
    if (!a || !asum || !rscale) {
        PyErr_NoMemory();
        goto done;
    }
    struct job j = {a, asum, rscale, w.buf, sc.buf, has_bias ? bias.buf : NULL, out.buf, m, k, n, group, bits, 0, 0,
                    lo, hi};
#ifdef QD8_X86
    j.isa = loop_isa();
    j.vnni4 = j.isa == ISA_VNNI && bits == 4 && group == 32 && (k / group) % 2 == 0;
#endif
    size_t tasks = (size_t)((n + COLS_PER_TASK - 1) / COLS_PER_TASK);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < m; r++) {
        quantize_row((const float *)x.buf + r * k, k, bits, j.vnni4, a + r * k, rscale + r);
        if (bits == 4)
            for (Py_ssize_t g = 0; g < k / group; g++) {
                int32_t s = 0;
                if (j.vnni4) {  /* group g's 16 even and 16 odd channels (see quantize_row) */
                    const int16_t *p = a + r * k + (g >> 1) * 64 + (g & 1) * 16;
                    for (Py_ssize_t i = 0; i < 16; i++)
                        s += p[i] + p[32 + i];
                } else {
                    for (Py_ssize_t i = 0; i < group; i++)
                        s += a[r * k + g * group + i];
                }
                asum[r * (k / group) + g] = s;
            }
    }
    if (pool && tasks > 1)
        ((parallelize_fn)(uintptr_t)parallelize)((void *)(uintptr_t)pool, columns, &j, tasks, 0);
    else
        for (size_t t = 0; t < tasks; t++)
            columns(&j, t);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(a);
    PyMem_Free(asum);
    PyMem_Free(rscale);
    PyBuffer_Release(&x);
    PyBuffer_Release(&w);
    PyBuffer_Release(&sc);
    PyBuffer_Release(&out);
    if (has_bias && bias.obj)
        PyBuffer_Release(&bias);
    return result;
}

static PyMethodDef methods[] = {
    {"fc", fc, METH_VARARGS,
     "fc(x, w, scales, bias, out, m, k, n, group, bits, lo, hi[, parallelize, pool]): dynamically quantized fully "
     "connected (qd8 x qc8w for bits 8, qd8 x qb4w for bits 4) of float32 x into out; see the module comment."},
    {"simd", simd, METH_NOARGS, "simd(): which loop fc runs here, 'avx512vnni', 'avx2' or 'portable' (the baseline ISA's; "
     "EDGEPORT_XNNPACK_QD8_PORTABLE=1 forces it, EDGEPORT_XNNPACK_QD8_AVX2=1 keeps off AVX-512)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qd8", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__qd8(void) { return PyModule_Create(&module); }
