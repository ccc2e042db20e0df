/* qd8 x qb4w fully connected on a filter packed at load (see _qd8.h for the layout), for edgeport_xnnpack._qd8.
 *
 * Output columns are the vector lanes (16 per block): one row's 4 quantized input channels are broadcast to every
 * lane and multiplied with the columns' unsigned nibbles, so no horizontal sums are needed and a decode step
 * (one row) uses full vectors. Per group and column the exact int32
 *     sum (q - zp) (nibble - 8) = sum q * nibble + 8 (zp * group - sum q) - zp * nibsum
 * is converted to float32 (exact: |sum| < 2^24; groups of at most 2048 keep nibsum within int16), times the group's
 * scale, added to a float32 accumulator in group order; then times 1 / inv, plus the bias, clamped. Every loop
 * (AVX-512 VNNI vpdpbusd, AVX2 vpmaddubsw, portable C) computes the same integers and the same float32 operations in
 * the same order, so they give the same bits (and the same as the unpacked portable loop this replaced).
 */
#include "_qd8.h"

#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define B4_X86 1
#endif

size_t b4_block_bytes(ptrdiff_t k, ptrdiff_t group) {
    size_t bytes = (size_t)k * B4_COLS / 2 + (size_t)(k / group) * B4_COLS * (sizeof(uint16_t) + sizeof(float));
    return (bytes + 63) & ~(size_t)63;
}

void b4_pack(const uint8_t *w, const float *scales, ptrdiff_t n, ptrdiff_t k, ptrdiff_t group, uint8_t *p) {
    ptrdiff_t groups = k / group, blocks = (n + B4_COLS - 1) / B4_COLS;
    size_t bb = b4_block_bytes(k, group);
    memset(p, 0, bb * (size_t)blocks);
    for (ptrdiff_t c = 0; c < n; c++) {
        uint8_t *blk = p + (size_t)(c / B4_COLS) * bb;
        ptrdiff_t lane = c % B4_COLS;
        uint16_t *ns = (uint16_t *)(void *)(blk + (size_t)k * B4_COLS / 2);
        float *sc = (float *)(void *)(blk + (size_t)k * B4_COLS / 2 + (size_t)groups * B4_COLS * sizeof(uint16_t));
        const uint8_t *row = w + (size_t)c * (size_t)(k / 2);
        for (ptrdiff_t i = 0; i < k; i++) {
            unsigned nib = (row[i / 2] >> (4 * (i & 1))) & 15;
            ptrdiff_t t = i & 7;
            uint8_t *byte = blk + (size_t)(i / 8) * 64 + (size_t)lane * 4 + (size_t)(t & 3);
            *byte |= (uint8_t)(t < 4 ? nib : nib << 4);
            ns[(i / group) * B4_COLS + lane] = (uint16_t)(ns[(i / group) * B4_COLS + lane] + nib);
        }
        for (ptrdiff_t g = 0; g < groups; g++)
            sc[g * B4_COLS + lane] = scales[c * groups + g];
    }
}

static inline float clampf(float y, float lo, float hi) { return y < lo ? lo : (y > hi ? hi : y); }

static inline int32_t load4(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return v;
}

/* -- portable C: the same integers and float32 order ---------------------------------------------------------- */
static void block_portable(const struct b4job *j, ptrdiff_t b) {
    ptrdiff_t groups = j->k / j->group, c0 = b * B4_COLS;
    ptrdiff_t cols = j->n - c0 < B4_COLS ? j->n - c0 : B4_COLS;
    const uint8_t *blk = j->p + (size_t)b * (size_t)j->block_bytes;
    const uint16_t *ns = (const uint16_t *)(const void *)(blk + (size_t)j->k * B4_COLS / 2);
    const float *sc = (const float *)(const void *)(blk + (size_t)j->k * B4_COLS / 2 +
                                                     (size_t)groups * B4_COLS * sizeof(uint16_t));
    for (ptrdiff_t r = 0; r < j->m; r++) {
        const int8_t *q = j->q + r * j->k;
        int32_t nzp = (int16_t)(j->nzp[r] & 0xFFFF);
        for (ptrdiff_t c = 0; c < cols; c++) {
            float acc = 0.0f;
            for (ptrdiff_t g = 0; g < groups; g++) {
                int32_t s = j->kc[r * groups + g] + nzp * (int32_t)ns[g * B4_COLS + c];
                for (ptrdiff_t i = g * j->group; i < (g + 1) * j->group; i++) {
                    uint8_t byte = blk[(i / 8) * 64 + c * 4 + (i & 3)];
                    s += (int32_t)q[i] * (int32_t)((i & 7) < 4 ? byte & 15 : byte >> 4);
                }
                acc += (float)s * sc[g * B4_COLS + c];
            }
            float y = acc * j->rscale[r] + (j->bias ? j->bias[c0 + c] : 0.0f);
            j->out[r * j->n + c0 + c] = clampf(y, j->lo, j->hi);
        }
    }
}

#ifdef B4_X86
/* -- AVX2: 8 columns per vector (a block in two halves), NR rows per pass ------------------------------------- */
static inline __attribute__((always_inline, target("avx2"))) void half_avx2(const struct b4job *j, ptrdiff_t b,
                                                                             int h, ptrdiff_t r, const int NR) {
    ptrdiff_t groups = j->k / j->group, chunks = j->group / 8, c0 = b * B4_COLS + h * 8;
    const uint8_t *blk = j->p + (size_t)b * (size_t)j->block_bytes;
    const uint8_t *wp = blk + h * 32;
    const uint16_t *ns = (const uint16_t *)(const void *)(blk + (size_t)j->k * B4_COLS / 2) + h * 8;
    const float *sc = (const float *)(const void *)(blk + (size_t)j->k * B4_COLS / 2 +
                                                     (size_t)groups * B4_COLS * sizeof(uint16_t)) + h * 8;
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 facc[4];
    __m256i nzp[4];
    for (int t = 0; t < NR; t++) {
        facc[t] = _mm256_setzero_ps();
        nzp[t] = _mm256_set1_epi32(j->nzp[r + t]);
    }
    for (ptrdiff_t g = 0; g < groups; g++) {
        __m256i nsv = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(ns + g * B4_COLS)));
        __m256i acc[4];
        for (int t = 0; t < NR; t++)
            acc[t] = _mm256_add_epi32(_mm256_set1_epi32(j->kc[(r + t) * groups + g]), _mm256_madd_epi16(nsv, nzp[t]));
        for (ptrdiff_t ch = 0; ch < chunks; ch++, wp += 64) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)wp);
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            for (int t = 0; t < NR; t++) {
                const int8_t *q = j->q + (r + t) * j->k + (g * chunks + ch) * 8;
                __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(load4(q))),
                                               _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load4(q + 4))));
                acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p16, ones));
            }
        }
        __m256 s = _mm256_loadu_ps(sc + g * B4_COLS);
        for (int t = 0; t < NR; t++)
            facc[t] = _mm256_add_ps(facc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[t]), s));
    }
    ptrdiff_t cols = j->n - c0 < 8 ? j->n - c0 : 8;
    if (cols <= 0)
        return;
    float buf[8] = {0};
    if (j->bias)
        for (ptrdiff_t c = 0; c < cols; c++)
            buf[c] = j->bias[c0 + c];
    const __m256 bias = _mm256_loadu_ps(buf), vlo = _mm256_set1_ps(j->lo), vhi = _mm256_set1_ps(j->hi);
    for (int t = 0; t < NR; t++) {
        __m256 y = _mm256_add_ps(_mm256_mul_ps(facc[t], _mm256_set1_ps(j->rscale[r + t])), bias);
        y = _mm256_min_ps(vhi, _mm256_max_ps(vlo, y));  /* NaN stays NaN, as clampf */
        float *o = j->out + (r + t) * j->n + c0;
        if (cols == 8) {
            _mm256_storeu_ps(o, y);
        } else {
            _mm256_storeu_ps(buf, y);
            memcpy(o, buf, (size_t)cols * sizeof(float));
        }
    }
}

__attribute__((target("avx2"))) static void block_avx2(const struct b4job *j, ptrdiff_t b) {
    for (int h = 0; h < 2; h++) {
        ptrdiff_t r = 0;
        for (; r + 4 <= j->m; r += 4)
            half_avx2(j, b, h, r, 4);
        for (; r < j->m; r++)
            half_avx2(j, b, h, r, 1);
    }
}

/* -- AVX-512 VNNI: 16 columns per vector, NB blocks x NR rows per pass --------------------------------------------
 * The nibbles are unpacked once for the NR rows. One row (decode): the high nibbles as 16 * nibble (v & 0xF0, one
 * operation) into a second accumulator shifted back (exact) at the end of the group, which also gives two
 * dependency chains per block, and NB = 4 blocks at once for more chains; several rows: the rows are the chains,
 * the high nibbles shifted down once for all of them, one accumulator per row. */
#define VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

static inline __attribute__((always_inline)) VNNI void tile_vnni(const struct b4job *j, ptrdiff_t b, ptrdiff_t r,
                                                                   const int NB, const int NR) {
    ptrdiff_t groups = j->k / j->group, chunks = j->group / 8, bb = j->block_bytes;
    ptrdiff_t nsoff = j->k * B4_COLS / 2, scoff = nsoff + groups * B4_COLS * (ptrdiff_t)sizeof(uint16_t);
    const uint8_t *blk = j->p + b * bb;
    const __m512i m4 = _mm512_set1_epi8(15), mf0 = _mm512_set1_epi8((char)0xF0);
    __m512 facc[4][8];
    for (int u = 0; u < NB; u++)
        for (int t = 0; t < NR; t++)
            facc[u][t] = _mm512_setzero_ps();
    for (ptrdiff_t g = 0; g < groups; g++) {
        __m512i acc[4][8], a16[4][8];
        for (int u = 0; u < NB; u++) {
            __m512i nsv = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                (const __m256i *)(const void *)(blk + u * bb + nsoff + g * B4_COLS * 2)));
            for (int t = 0; t < NR; t++) {
                acc[u][t] = _mm512_dpwssd_epi32(_mm512_set1_epi32(j->kc[(r + t) * groups + g]), nsv,
                                                _mm512_set1_epi32(j->nzp[r + t]));
                a16[u][t] = _mm512_setzero_si512();  /* one row only */
            }
        }
        for (ptrdiff_t ch = 0; ch < chunks; ch++) {
            ptrdiff_t off = (g * chunks + ch) * 64;
            for (int u = 0; u < NB; u++) {
                _mm_prefetch((const char *)(blk + u * bb + off + 1024), _MM_HINT_T0);
                __m512i v = _mm512_loadu_si512((const void *)(blk + u * bb + off));
                __m512i lo = _mm512_and_si512(v, m4);
                __m512i hi = NR == 1 ? _mm512_and_si512(v, mf0) : _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                for (int t = 0; t < NR; t++) {
                    const int8_t *q = j->q + (r + t) * j->k + off / 8;
                    acc[u][t] = _mm512_dpbusd_epi32(acc[u][t], lo, _mm512_set1_epi32(load4(q)));
                    if (NR == 1)
                        a16[u][t] = _mm512_dpbusd_epi32(a16[u][t], hi, _mm512_set1_epi32(load4(q + 4)));
                    else
                        acc[u][t] = _mm512_dpbusd_epi32(acc[u][t], hi, _mm512_set1_epi32(load4(q + 4)));
                }
            }
        }
        for (int u = 0; u < NB; u++) {
            __m512 s = _mm512_loadu_ps((const float *)(const void *)(blk + u * bb + scoff) + g * B4_COLS);
            for (int t = 0; t < NR; t++) {
                __m512i sum = NR == 1 ? _mm512_add_epi32(acc[u][t], _mm512_srai_epi32(a16[u][t], 4)) : acc[u][t];
                facc[u][t] = _mm512_add_ps(facc[u][t], _mm512_mul_ps(_mm512_cvtepi32_ps(sum), s));
            }
        }
    }
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    for (int u = 0; u < NB; u++) {
        ptrdiff_t c0 = (b + u) * B4_COLS, cols = j->n - c0 < B4_COLS ? j->n - c0 : B4_COLS;
        __mmask16 mask = (__mmask16)((1u << cols) - 1u);
        __m512 bias = j->bias ? _mm512_maskz_loadu_ps(mask, j->bias + c0) : _mm512_setzero_ps();
        for (int t = 0; t < NR; t++) {
            __m512 y = _mm512_add_ps(_mm512_mul_ps(facc[u][t], _mm512_set1_ps(j->rscale[r + t])), bias);
            y = _mm512_min_ps(hi, _mm512_max_ps(lo, y));  /* NaN stays NaN, as clampf */
            _mm512_mask_storeu_ps(j->out + (r + t) * j->n + c0, mask, y);
        }
    }
}

VNNI static void blocks_vnni(const struct b4job *j, ptrdiff_t b0, ptrdiff_t b1) {
    ptrdiff_t r = 0;
    for (ptrdiff_t b = b0; b < b1; b++) {  /* rows in eights and fours, one block at a time (kept in L1) */
        for (r = 0; r + 8 <= j->m; r += 8)
            tile_vnni(j, b, r, 1, 8);
        for (; r + 4 <= j->m; r += 4)
            tile_vnni(j, b, r, 1, 4);
    }
    for (r = j->m - j->m % 4; r < j->m; r++) {
        ptrdiff_t b = b0;
        for (; b + 4 <= b1; b += 4)
            tile_vnni(j, b, r, 4, 1);
        for (; b + 2 <= b1; b += 2)
            tile_vnni(j, b, r, 2, 1);
        for (; b < b1; b++)
            tile_vnni(j, b, r, 1, 1);
    }
}
#endif

void b4_task(void *ctx, size_t task) {
    const struct b4job *j = ctx;
    ptrdiff_t blocks = (j->n + B4_COLS - 1) / B4_COLS;
    ptrdiff_t b0 = (ptrdiff_t)task * j->blocks_per_task;
    ptrdiff_t b1 = b0 + j->blocks_per_task < blocks ? b0 + j->blocks_per_task : blocks;
#ifdef B4_X86
    if (j->isa == ISA_VNNI) {
        blocks_vnni(j, b0, b1);
        return;
    }
#endif
    for (ptrdiff_t b = b0; b < b1; b++) {
#ifdef B4_X86
        if (j->isa == ISA_AVX2) {
            block_avx2(j, b);
            continue;
        }
#endif
        block_portable(j, b);
    }
}
