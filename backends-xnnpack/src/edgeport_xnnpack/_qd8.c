/* edgeport_xnnpack._qd8: dynamically quantized fully connected (qd8 x qc8w, qd8 x qb4w) on the host, for the
 * 2022 libXNNPACK that has neither the qdint8 datatype nor these kernels.
 *
 * fc(x, w, scales, bias, out, m, k, n, group, bits, lo, hi[, parallelize, pool]):
 *   x      float32 [m, k]           the float input (C-contiguous)
 *   w      bits 8: int8 [n, k]; bits 4: uint8 [n, k / 2], value + 8, the even input channel in the low nibble
 *   scales float32 [n, k / group]   (bits 8: group == k, one scale per output channel)
 *   bias   float32 [n] or None
 *   out    float32 [m, n]           clamped to [lo, hi]
 * pack4(w, scales, n, k, group, into) / packed4_bytes(n, k, group) / fc4(x, packed, bias, out, m, k, n, group, lo,
 * hi[, parallelize, pool]): bits 4 on a filter packed once at load (_qd8_b4.c; fc packs a temporary copy).
 * Each row of x is quantized as XNNPACK's f32 -> qd8 convert does (the arithmetic of
 * edgeport_xnnpack._dynamic_quant.row_params / quantize_rows, float32 step by step, no fused multiply-adds): the
 * range widened to contain 0, inv = 255 / (max - min), a nudged zero point, values rounded half to even. Then per
 * output: exact int32 dot products of (q - zero_point) with the weights per group, each converted to float32,
 * scaled by its group's scale and summed in float32 in group order, times 1 / inv, plus the bias (bits 8: the
 * int32 sum times 1 / inv, times the scale, plus the bias). Bits 4 gives the same bits on every loop (_qd8_b4.c);
 * bits 8 runs an AVX-512 VNNI loop (vpdpwssd, 32 input channels per step) where the CPU has it, else AVX2 (16 per
 * step, vpmaddwd), else portable C (exact integers, the same float32 operations). Columns are split in tasks on the
 * delegate's pthreadpool when the caller passes it; the GIL is released while computing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_qd8.h"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QD8_X86 1
#endif

typedef void (*task_fn)(void *, size_t);
typedef void (*parallelize_fn)(void *, task_fn, void *, size_t, uint32_t);

#define COLS_PER_TASK 32

struct job {  /* bits 8 */
    const int16_t *a;     /* [m][k] q - zero_point */
    const float *rscale;  /* [m] 1 / inv */
    const uint8_t *w;
    const float *scales;
    const float *bias;
    float *out;
    Py_ssize_t m, k, n;
    int isa;  /* ISA_PORTABLE, ISA_AVX2 or ISA_VNNI */
    float lo, hi;
};

/* -- row quantization (XNNPACK's f32 -> qd8) ------------------------------------------------------------------- */
#ifdef QD8_X86
/* the range of x widened to contain 0; the same values as the scalar loop (NaNs skipped, +0 kept over -0) */
__attribute__((target("avx2"))) static void range_avx2(const float *x, Py_ssize_t k, float *mn_out, float *mx_out) {
    __m256 vmn = _mm256_setzero_ps(), vmx = _mm256_setzero_ps();
    Py_ssize_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        vmn = _mm256_min_ps(v, vmn);  /* v < mn ? v : mn */
        vmx = _mm256_max_ps(v, vmx);  /* v > mx ? v : mx */
    }
    float a[8], b[8], mn = 0.0f, mx = 0.0f;
    _mm256_storeu_ps(a, vmn);
    _mm256_storeu_ps(b, vmx);
    for (int t = 0; t < 8; t++) {
        mn = a[t] < mn ? a[t] : mn;
        mx = b[t] > mx ? b[t] : mx;
    }
    for (; i < k; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    *mn_out = mn;
    *mx_out = mx;
}
#endif

static void row_params(const float *x, Py_ssize_t k, int isa, float *inv_out, float *zp_out) {
    float mn = 0.0f, mx = 0.0f;
#ifdef QD8_X86
    if (isa != ISA_PORTABLE)
        range_avx2(x, k, &mn, &mx);
    else
#endif
        for (Py_ssize_t i = 0; i < k; i++) {
            mn = x[i] < mn ? x[i] : mn;
            mx = x[i] > mx ? x[i] : mx;
        }
    float span = mx - mn;
    float inv = span == 0.0f ? 1.0f : 255.0f / span;
    float t1 = mn * inv, t2 = mx * inv;
    float lo_err = -128.0f + t1, hi_err = 127.0f + t2;
    float zp = lo_err + hi_err > 0.0f ? -128.0f - t1 : 127.0f - t2;
    *zp_out = rintf(zp < -128.0f ? -128.0f : (zp > 127.0f ? 127.0f : zp));
    *inv_out = inv;
}

/* q - zero_point as int16 (bits 8) */
static void quantize_row8(const float *x, Py_ssize_t k, int isa, int16_t *a, float *rscale) {
    float inv, zp;
    row_params(x, k, isa, &inv, &zp);
    float qlo = -128.0f - zp, qhi = 127.0f - zp;
    for (Py_ssize_t i = 0; i < k; i++) {
        float v = x[i] * inv;
        a[i] = (int16_t)rintf(v < qlo ? qlo : (v > qhi ? qhi : v));
    }
    *rscale = 1.0f / inv;
}

#ifdef QD8_X86
/* quantize_row4's loop, 8 channels per step: the same float32 operations (vroundps rounds half to even, as rintf
 * in the default rounding mode) */
__attribute__((target("avx2"))) static void quantize_row4_avx2(const float *x, Py_ssize_t k, Py_ssize_t group,
                                                               float inv, float zp, int8_t *q, int32_t *kc) {
    const __m256 vinv = _mm256_set1_ps(inv), qlo = _mm256_set1_ps(-128.0f - zp), qhi = _mm256_set1_ps(127.0f - zp);
    const __m256i z = _mm256_set1_epi32((int32_t)zp);
    for (Py_ssize_t g = 0; g < k / group; g++) {
        __m256i sum = _mm256_setzero_si256();
        for (Py_ssize_t i = g * group; i < (g + 1) * group; i += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
            v = _mm256_min_ps(qhi, _mm256_max_ps(qlo, v));
            __m256i qi = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT |
                                                                                  _MM_FROUND_NO_EXC)), z);
            sum = _mm256_add_epi32(sum, qi);
            __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
            _mm_storel_epi64((__m128i *)(void *)(q + i), _mm_packs_epi16(p16, p16));
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        kc[g] = 8 * ((int32_t)zp * (int32_t)group - _mm_cvtsi128_si32(s4));
    }
}
#endif

/* q as int8 and the per-group constants of _qd8_b4.c (bits 4) */
static void quantize_row4(const float *x, Py_ssize_t k, Py_ssize_t group, int isa, int8_t *q, int32_t *kc,
                          int32_t *nzp, float *rscale) {
    float inv, zp;
    row_params(x, k, isa, &inv, &zp);
    float qlo = -128.0f - zp, qhi = 127.0f - zp;
    int32_t z = (int32_t)zp;
    *nzp = (int32_t)(uint16_t)(int16_t)(-z);
    *rscale = 1.0f / inv;
#ifdef QD8_X86
    if (isa != ISA_PORTABLE) {
        quantize_row4_avx2(x, k, group, inv, zp, q, kc);
        return;
    }
#endif
    for (Py_ssize_t g = 0; g < k / group; g++) {
        int32_t sum = 0;
        for (Py_ssize_t i = g * group; i < (g + 1) * group; i++) {
            float v = x[i] * inv;
            int32_t qi = (int32_t)rintf(v < qlo ? qlo : (v > qhi ? qhi : v)) + z;
            q[i] = (int8_t)qi;
            sum += qi;
        }
        kc[g] = 8 * (z * (int32_t)group - sum);
    }
}

/* -- dot products ------------------------------------------------------------------------------------------------ */
static int32_t dot8_portable(const int16_t *a, const int8_t *w, Py_ssize_t k) {
    int32_t s = 0;
    for (Py_ssize_t i = 0; i < k; i++)
        s += (int32_t)a[i] * (int32_t)w[i];
    return s;
}

#ifdef QD8_X86
__attribute__((target("avx2"))) static inline int32_t hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
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

/* AVX-512 VNNI (vpdpwssd: int16 pairs multiplied and accumulated into int32 lanes in one instruction), 512-bit:
 * 32 input channels per step, exact int32. */
#define VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

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

VNNI static void column8_vnni(const struct job *j, Py_ssize_t c) {
    Py_ssize_t r = 0;
    for (; r + 4 <= j->m; r += 4)
        rows8_vnni(j, c, r, 4);
    for (; r < j->m; r++)
        rows8_vnni(j, c, r, 1);
}
#endif

static void columns(void *ctx, size_t task) {  /* bits 8 */
    const struct job *j = ctx;
    Py_ssize_t c0 = (Py_ssize_t)task * COLS_PER_TASK;
    Py_ssize_t c1 = c0 + COLS_PER_TASK < j->n ? c0 + COLS_PER_TASK : j->n;
#ifdef QD8_X86
    if (j->isa != ISA_PORTABLE) {
        for (Py_ssize_t c = c0; c < c1; c++) {
            if (j->isa == ISA_VNNI)
                column8_vnni(j, c);
            else
                column8_avx2(j, c);
        }
        return;
    }
#endif
    for (Py_ssize_t c = c0; c < c1; c++) {
        float b = j->bias ? j->bias[c] : 0.0f;
        for (Py_ssize_t r = 0; r < j->m; r++) {
            int32_t s = dot8_portable(j->a + r * j->k, (const int8_t *)j->w + c * j->k, j->k);
            float y = (float)s * j->rscale[r];
            y = y * j->scales[c] + b;
            j->out[r * j->n + c] = y < j->lo ? j->lo : (y > j->hi ? j->hi : y);
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

static void run(parallelize_fn parallelize, void *pool, task_fn fn, void *job, size_t tasks) {
    if (pool && tasks > 1)
        parallelize(pool, fn, job, tasks, 0);
    else
        for (size_t t = 0; t < tasks; t++)
            fn(job, t);
}

/* bits 4 on a packed filter; the caller checked the sizes. Returns -1 (MemoryError set) or 0. */
static int fc4_run(const float *x, const uint8_t *packed, const float *bias, float *out, Py_ssize_t m, Py_ssize_t k,
                   Py_ssize_t n, Py_ssize_t group, float lo, float hi, parallelize_fn parallelize, void *pool) {
    Py_ssize_t groups = k / group;
    int8_t *q = PyMem_Malloc((size_t)(m * k));
    int32_t *kc = PyMem_Malloc((size_t)(m * groups) * sizeof *kc), *nzp = PyMem_Malloc((size_t)m * sizeof *nzp);
    float *rscale = PyMem_Malloc((size_t)m * sizeof *rscale);
    if (!q || !kc || !nzp || !rscale) {
        PyMem_Free(q);
        PyMem_Free(kc);
        PyMem_Free(nzp);
        PyMem_Free(rscale);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t blocks = (n + B4_COLS - 1) / B4_COLS;
    struct b4job j = {q, kc, nzp, rscale, packed, bias, out, m, k, n, group, (ptrdiff_t)b4_block_bytes(k, group),
                      pool ? 4 : blocks, loop_isa(), lo, hi};  /* tasks of 64 columns on a pool, else one */
    size_t tasks = (size_t)((blocks + j.blocks_per_task - 1) / j.blocks_per_task);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < m; r++)
        quantize_row4(x + r * k, k, group, j.isa, q + r * k, kc + r * groups, nzp + r, rscale + r);
    run(parallelize, pool, b4_task, &j, tasks);
    Py_END_ALLOW_THREADS
    PyMem_Free(q);
    PyMem_Free(kc);
    PyMem_Free(nzp);
    PyMem_Free(rscale);
    return 0;
}

static int bad_sizes(Py_ssize_t m, Py_ssize_t k, Py_ssize_t n, Py_ssize_t group, int bits) {
    if (m < 0 || k <= 0 || n <= 0 || group <= 0 || k % group || (bits != 4 && bits != 8) ||
        (bits == 4 && (group % 32 || group > 2048)) || (bits == 8 && group != k) || m > PY_SSIZE_T_MAX / k ||
        n > PY_SSIZE_T_MAX / k) {
        PyErr_Format(PyExc_ValueError, "qd8 fc: bad sizes m=%zd k=%zd n=%zd group=%zd bits=%d (k a multiple of the "
                     "group; bits 4: groups a multiple of 32 up to 2048; bits 8: group == k)", m, k, n, group, bits);
        return 1;
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
    float *rscale = NULL;
    uint8_t *packed = NULL;
    int has_bias = bias_obj != Py_None;
    if (has_bias && PyObject_GetBuffer(bias_obj, &bias, PyBUF_SIMPLE) != 0)
        goto done;
    if (bad_sizes(m, k, n, group, bits))
        goto done;
    if (pool && !parallelize) {
        PyErr_SetString(PyExc_ValueError, "qd8 fc: a pool without its parallelize function");
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
    if (bits == 4) {  /* a temporary packed copy (the executor packs once at load: pack4 / fc4) */
        Py_ssize_t blocks = (n + B4_COLS - 1) / B4_COLS;
        packed = PyMem_Malloc((size_t)blocks * b4_block_bytes(k, group));
        if (!packed) {
            PyErr_NoMemory();
            goto done;
        }
        b4_pack(w.buf, sc.buf, n, k, group, packed);
        if (fc4_run(x.buf, packed, has_bias ? bias.buf : NULL, out.buf, m, k, n, group, lo, hi,
                    (parallelize_fn)(uintptr_t)parallelize, (void *)(uintptr_t)pool) == 0) {
            result = Py_None;
            Py_INCREF(result);
        }
        goto done;
    }
    a = PyMem_Malloc((size_t)(m * k) * sizeof *a);
    rscale = PyMem_Malloc((size_t)m * sizeof *rscale);
    if (!a || !rscale) {
        PyErr_NoMemory();
        goto done;
    }
    struct job j = {a, rscale, w.buf, sc.buf, has_bias ? bias.buf : NULL, out.buf, m, k, n, loop_isa(), lo, hi};
    size_t tasks = (size_t)((n + COLS_PER_TASK - 1) / COLS_PER_TASK);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < m; r++)
        quantize_row8((const float *)x.buf + r * k, k, j.isa, a + r * k, rscale + r);
    run((parallelize_fn)(uintptr_t)parallelize, (void *)(uintptr_t)pool, columns, &j, tasks);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(a);
    PyMem_Free(rscale);
    PyMem_Free(packed);
    PyBuffer_Release(&x);
    PyBuffer_Release(&w);
    PyBuffer_Release(&sc);
    PyBuffer_Release(&out);
    if (has_bias && bias.obj)
        PyBuffer_Release(&bias);
    return result;
}

static PyObject *packed4_bytes(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_ssize_t n, k, group;
    if (!PyArg_ParseTuple(args, "nnn:packed4_bytes", &n, &k, &group) || bad_sizes(0, k, n, group, 4))
        return NULL;
    return PyLong_FromSize_t((size_t)((n + B4_COLS - 1) / B4_COLS) * b4_block_bytes(k, group));
}

static PyObject *pack4(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer w = {0}, sc = {0}, into = {0};
    Py_ssize_t n, k, group;
    if (!PyArg_ParseTuple(args, "y*y*nnnw*:pack4", &w, &sc, &n, &k, &group, &into))
        return NULL;
    PyObject *result = NULL;
    if (bad_sizes(0, k, n, group, 4) || need(&w, n * k / 2, "w") || need(&sc, n * (k / group) * 4, "scales") ||
        need(&into, ((n + B4_COLS - 1) / B4_COLS) * (Py_ssize_t)b4_block_bytes(k, group), "into"))
        goto done;
    Py_BEGIN_ALLOW_THREADS
    b4_pack(w.buf, sc.buf, n, k, group, into.buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&w);
    PyBuffer_Release(&sc);
    PyBuffer_Release(&into);
    return result;
}

static PyObject *fc4(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer x = {0}, p = {0}, bias = {0}, out = {0};
    PyObject *bias_obj;
    Py_ssize_t m, k, n, group;
    float lo, hi;
    unsigned long long parallelize = 0, pool = 0;
    if (!PyArg_ParseTuple(args, "y*y*Ow*nnnnff|KK:fc4", &x, &p, &bias_obj, &out, &m, &k, &n, &group, &lo, &hi,
                          &parallelize, &pool))
        return NULL;
    PyObject *result = NULL;
    int has_bias = bias_obj != Py_None;
    if (has_bias && PyObject_GetBuffer(bias_obj, &bias, PyBUF_SIMPLE) != 0)
        goto done;
    if (bad_sizes(m, k, n, group, 4))
        goto done;
    if (pool && !parallelize) {
        PyErr_SetString(PyExc_ValueError, "qd8 fc4: a pool without its parallelize function");
        goto done;
    }
    if (need(&x, m * k * 4, "x") || need(&out, m * n * 4, "out") || (has_bias && need(&bias, n * 4, "bias")) ||
        need(&p, ((n + B4_COLS - 1) / B4_COLS) * (Py_ssize_t)b4_block_bytes(k, group), "packed"))
        goto done;
    if (m == 0 || fc4_run(x.buf, p.buf, has_bias ? bias.buf : NULL, out.buf, m, k, n, group, lo, hi,
                          (parallelize_fn)(uintptr_t)parallelize, (void *)(uintptr_t)pool) == 0) {
        result = Py_None;
        Py_INCREF(result);
    }
done:
    PyBuffer_Release(&x);
    PyBuffer_Release(&p);
    PyBuffer_Release(&out);
    if (has_bias && bias.obj)
        PyBuffer_Release(&bias);
    return result;
}

static PyMethodDef methods[] = {
    {"fc", fc, METH_VARARGS,
     "fc(x, w, scales, bias, out, m, k, n, group, bits, lo, hi[, parallelize, pool]): dynamically quantized fully "
     "connected (qd8 x qc8w for bits 8, qd8 x qb4w for bits 4) of float32 x into out; see the module comment."},
    {"packed4_bytes", packed4_bytes, METH_VARARGS,
     "packed4_bytes(n, k, group): the size of pack4's output for an [n, k] 4-bit filter in groups of `group`."},
    {"pack4", pack4, METH_VARARGS,
     "pack4(w, scales, n, k, group, into): the packed layout of a 4-bit filter (w: [n, k / 2] bytes as fc takes "
     "them, float32 scales [n, k / group]) written into the writable buffer `into` of packed4_bytes bytes."},
    {"fc4", fc4, METH_VARARGS,
     "fc4(x, packed, bias, out, m, k, n, group, lo, hi[, parallelize, pool]): fc with bits 4 on pack4's output."},
    {"simd", simd, METH_NOARGS, "simd(): which loop fc runs here, 'avx512vnni', 'avx2' or 'portable' (the baseline ISA's; "
     "EDGEPORT_XNNPACK_QD8_PORTABLE=1 forces it, EDGEPORT_XNNPACK_QD8_AVX2=1 keeps off AVX-512)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qd8", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__qd8(void) { return PyModule_Create(&module); }
