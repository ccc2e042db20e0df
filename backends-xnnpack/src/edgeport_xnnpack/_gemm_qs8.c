/* edgeport_xnnpack._gemm, int8 part: qs8_packed_gemm (see below) and qs8_available. */
#include "_gemm_common.h"
#include <math.h>
/* ---- qs8_packed_gemm: int8 x per-channel int8 -> int8 on AVX512-VNNI -------------------------------------------
 * Debian's 2022 libXNNPACK has no VNNI int8 kernels (ExecuTorch's newer XNNPACK has), so on VNNI CPUs the int8 1x1
 * convolutions run here: acc = bias'[c] + sum_k u8(x[r, k]) * w[c, k] with VPDPBUSD (x + 128 as unsigned bytes;
 * bias'[c] = bias[c] - (128 + x_zero_point) * sum_k w[c, k] folds both offsets), then XNNPACK's fp32
 * requantization: y = clamp(acc * scale[c], qmin - zo, qmax - zo), rounded to nearest even, + zo, saturated to int8.
 * The filter is packed once at load as [ceil(n/16)][k/4][16][4] bytes (k a multiple of 4). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QS8_GEMM 1

struct qs8_job {
    const int8_t *a, *w;
    const int32_t *bias;
    const float *scale;
    int8_t *out;
    Py_ssize_t m, k, n, rows_per_tile, panels_per_tile, panel_tiles;
    float lo, hi;
    int32_t zo;
};

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void qs8_panel_rows(
        const struct qs8_job *j, Py_ssize_t r0, Py_ssize_t mr, Py_ssize_t p) {
    const Py_ssize_t k = j->k, c0 = p * 16, k4 = k / 4;
    const int8_t *w = j->w + p * k * 16;
    const int8_t *a0 = j->a + r0 * k;
    const __m512i flip = _mm512_set1_epi32((int)0x80808080u);
    __m512i bias = _mm512_loadu_si512(j->bias + c0);
    __m512i acc[8];
    for (int r = 0; r < 8; r++)
        acc[r] = bias;
    if (mr == 8) {
        __m512i c0v = bias, c1 = bias, c2 = bias, c3 = bias, c4 = bias, c5 = bias, c6 = bias, c7 = bias;
        for (Py_ssize_t i = 0; i < k4; i++) {
            __m512i wv = _mm512_loadu_si512(w + i * 64);
            const int8_t *ai = a0 + i * 4;
            int32_t v;
#define QS8_ROW(cr, r) memcpy(&v, ai + (r) * k, 4); \
            cr = _mm512_dpbusd_epi32(cr, _mm512_xor_si512(_mm512_set1_epi32(v), flip), wv);
            QS8_ROW(c0v, 0) QS8_ROW(c1, 1) QS8_ROW(c2, 2) QS8_ROW(c3, 3)
            QS8_ROW(c4, 4) QS8_ROW(c5, 5) QS8_ROW(c6, 6) QS8_ROW(c7, 7)
#undef QS8_ROW
        }
        acc[0] = c0v; acc[1] = c1; acc[2] = c2; acc[3] = c3; acc[4] = c4; acc[5] = c5; acc[6] = c6; acc[7] = c7;
    } else {
        for (Py_ssize_t i = 0; i < k4; i++) {
            __m512i wv = _mm512_loadu_si512(w + i * 64);
            for (Py_ssize_t r = 0; r < mr; r++) {
                int32_t v;
                memcpy(&v, a0 + r * k + i * 4, 4);
                acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_xor_si512(_mm512_set1_epi32(v), flip), wv);
            }
        }
    }
    const __m512 scale = _mm512_loadu_ps(j->scale + c0), lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    const __m512i zo = _mm512_set1_epi32(j->zo);
    Py_ssize_t cols = j->n - c0 < 16 ? j->n - c0 : 16;
    __mmask16 mask = (__mmask16)((1u << cols) - 1u);
    for (Py_ssize_t r = 0; r < mr; r++) {
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), scale);
        f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
        __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(f), zo);  /* MXCSR default: round to nearest even */
        _mm_mask_storeu_epi8(j->out + (r0 + r) * j->n + c0, mask, _mm512_cvtsepi32_epi8(q));
    }
}

static void qs8_tile(void *ctx, size_t index) {
    const struct qs8_job *j = ctx;
    Py_ssize_t rt = (Py_ssize_t)index / j->panel_tiles, pt = (Py_ssize_t)index % j->panel_tiles;
    Py_ssize_t r0 = rt * j->rows_per_tile, r1 = r0 + j->rows_per_tile < j->m ? r0 + j->rows_per_tile : j->m;
    Py_ssize_t panels = (j->n + 15) / 16, p0 = pt * j->panels_per_tile;
    Py_ssize_t p1 = p0 + j->panels_per_tile < panels ? p0 + j->panels_per_tile : panels;
    for (Py_ssize_t r = r0; r < r1; r += 8)
        for (Py_ssize_t p = p0; p < p1; p++)
            qs8_panel_rows(j, r, r1 - r < 8 ? r1 - r : 8, p);
}
#endif

PyObject *qs8_available(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args)) {
#ifdef QS8_GEMM
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")
            && __builtin_cpu_supports("avx512vnni"))
        Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

PyObject *qs8_packed_gemm(PyObject *Py_UNUSED(module), PyObject *args) {
    unsigned long long parallelize, pool;
    PyObject *a_obj, *w_obj, *bias_obj, *scale_obj, *out_obj;
    Py_ssize_t m, k, n, threads;
    int zo, qmin, qmax;
    if (!PyArg_ParseTuple(args, "KKOOOOOnnniiin:qs8_packed_gemm", &parallelize, &pool, &a_obj, &w_obj, &bias_obj,
                          &scale_obj, &out_obj, &m, &k, &n, &zo, &qmin, &qmax, &threads))
        return NULL;
#ifndef QS8_GEMM
    PyErr_SetString(PyExc_RuntimeError, "qs8_packed_gemm: not built for this CPU architecture");
    return NULL;
#else
    if (PyObject_IsTrue(qs8_available(NULL, NULL)) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "qs8_packed_gemm: this CPU lacks AVX512-VNNI");
        return NULL;
    }
    if (m < 1 || k < 4 || k % 4 || n < 1 || threads < 1 || m > PY_SSIZE_T_MAX / k || m > PY_SSIZE_T_MAX / n
            || n > PY_SSIZE_T_MAX / 16 / k) {
        PyErr_Format(PyExc_ValueError, "qs8_packed_gemm: bad sizes m=%zd k=%zd (a multiple of 4) n=%zd threads=%zd",
                     m, k, n, threads);
        return NULL;
    }
    if (zo < -128 || zo > 127 || qmin < -128 || qmax > 127 || qmin > qmax) {
        PyErr_Format(PyExc_ValueError, "qs8_packed_gemm: bad output zero point %d or range [%d, %d]", zo, qmin, qmax);
        return NULL;
    }
    if (pool && !parallelize) {
        PyErr_SetString(PyExc_ValueError, "qs8_packed_gemm: null pthreadpool_parallelize_1d address");
        return NULL;
    }
    Py_ssize_t panels = (n + 15) / 16;
    Py_buffer a, w, bias, scale, out;
    if (typed_buffer(a_obj, &a, 0, m * k, "b", 1, "qs8_packed_gemm: input") < 0)
        return NULL;
    if (typed_buffer(w_obj, &w, 0, panels * k * 16, "b", 1, "qs8_packed_gemm: packed filter") < 0)
        goto release_a;
    if (typed_buffer(bias_obj, &bias, 0, panels * 16, "i", 4, "qs8_packed_gemm: packed bias") < 0)
        goto release_w;
    if (typed_buffer(scale_obj, &scale, 0, panels * 16, "f", 4, "qs8_packed_gemm: packed scales") < 0)
        goto release_bias;
    if (typed_buffer(out_obj, &out, 1, m * n, "b", 1, "qs8_packed_gemm: output") < 0)
        goto release_scale;
    struct qs8_job j = {a.buf, w.buf, bias.buf, scale.buf, out.buf, m, k, n, m, panels, 1, (float)(qmin - zo),
                        (float)(qmax - zo), zo};
    size_t tiles = 1;
    if (pool && threads > 1) {
        Py_ssize_t want = 4 * threads;
        if (m >= 8 * want) {
            j.rows_per_tile = ((m + want - 1) / want + 7) / 8 * 8;
        } else if (panels >= 2) {
            j.panels_per_tile = (panels + want - 1) / want;
            j.panel_tiles = (panels + j.panels_per_tile - 1) / j.panels_per_tile;
        }
        tiles = (size_t)(((m + j.rows_per_tile - 1) / j.rows_per_tile) * j.panel_tiles);
    }
    Py_BEGIN_ALLOW_THREADS
    if (tiles > 1)
        ((parallelize_fn)(uintptr_t)parallelize)((void *)(uintptr_t)pool, qs8_tile, &j, tiles, 0);
    else
        qs8_tile(&j, 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
release_scale:
    PyBuffer_Release(&scale);
release_bias:
    PyBuffer_Release(&bias);
release_w:
    PyBuffer_Release(&w);
release_a:
    PyBuffer_Release(&a);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
#endif
}


/* ---- qs8_im2col: the rows of a KxK int8 convolution as the input of qs8_packed_gemm -------------------------------
 * src: [batch][h][w][c] int8 (NHWC); dst: [batch * oh * ow][k_padded] int8, row (b, oy, ox) holding the patch
 * (ky, kx, c) -- the order of XNNPACK's [oc][kh][kw][ic] filter -- with taps outside the input set to the input zero
 * point (they then add nothing after qs8_packed_gemm's offset folding) and the last k_padded - kh * kw * c bytes 0 (the
 * packed filter's padding columns are 0). Sizes are checked against the buffers before a byte is touched, and every
 * tap against the input's bounds. */
/* n bytes, exactly: a first layer's patch row is a few bytes, copied with two overlapping fixed-size moves */
static inline void copy_bytes(int8_t *restrict to, const int8_t *restrict from, Py_ssize_t n) {
    if (n >= 16) {
        memcpy(to, from, (size_t)n);
    } else if (n >= 8) {
        memcpy(to, from, 8);
        memcpy(to + n - 8, from + n - 8, 8);
    } else if (n >= 4) {
        memcpy(to, from, 4);
        memcpy(to + n - 4, from + n - 4, 4);
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            to[i] = from[i];
    }
}

PyObject *qs8_im2col(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *src_obj, *dst_obj;
    Py_ssize_t batch, h, w, c, kh, kw, sh, sw, pt, pl, oh, ow, kp;
    int zero;
    if (!PyArg_ParseTuple(args, "OOnnnnnnnnnnnnni:qs8_im2col", &src_obj, &dst_obj, &batch, &h, &w, &c, &kh, &kw,
                          &sh, &sw, &pt, &pl, &oh, &ow, &kp, &zero))
        return NULL;
    const Py_ssize_t big = (Py_ssize_t)1 << 40;
    if (batch < 1 || h < 1 || w < 1 || c < 1 || kh < 1 || kw < 1 || sh < 1 || sw < 1 || pt < 0 || pl < 0 || oh < 1
            || ow < 1 || batch > big || h > big || w > big || c > big || kh > 64 || kw > 64 || sh > 64 || sw > 64
            || pt > 64 || pl > 64 || oh > big || ow > big || kp < kh * kw * c || kp > kh * kw * c + 64
            || batch * h > big / w || batch * h * w > big / c || batch * oh > big / ow || batch * oh * ow > big / kp
            || zero < -128 || zero > 127) {
        PyErr_Format(PyExc_ValueError, "qs8_im2col: bad geometry batch=%zd h=%zd w=%zd c=%zd kernel %zdx%zd stride "
                     "%zdx%zd pads %zd,%zd out %zdx%zd k_padded=%zd zero=%d", batch, h, w, c, kh, kw, sh, sw, pt, pl,
                     oh, ow, kp, zero);
        return NULL;
    }
    Py_buffer src, dst;
    if (typed_buffer(src_obj, &src, 0, batch * h * w * c, "b", 1, "qs8_im2col: input") < 0)
        return NULL;
    if (typed_buffer(dst_obj, &dst, 1, batch * oh * ow * kp, "b", 1, "qs8_im2col: output") < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    const int8_t *s = src.buf;
    int8_t *d = dst.buf;
    const Py_ssize_t patch = kh * kw * c;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < batch; b++)
        for (Py_ssize_t oy = 0; oy < oh; oy++)
            for (Py_ssize_t ox = 0; ox < ow; ox++) {
                int8_t *row = d + ((b * oh + oy) * ow + ox) * kp;
                Py_ssize_t x0 = ox * sw - pl;  /* the taps kx0 <= kx < kx1 lie inside the row: one run of bytes */
                Py_ssize_t kx0 = x0 < 0 ? -x0 : 0, kx1 = x0 + kw > w ? w - x0 : kw;
                if (kx1 < kx0)
                    kx1 = kx0;
                for (Py_ssize_t ky = 0; ky < kh; ky++) {
                    Py_ssize_t iy = oy * sh - pt + ky;
                    int8_t *to = row + ky * kw * c;
                    if (iy < 0 || iy >= h || kx1 == kx0) {
                        memset(to, zero, (size_t)(kw * c));
                        continue;
                    }
                    if (kx0 > 0)
                        memset(to, zero, (size_t)(kx0 * c));
                    copy_bytes(to + kx0 * c, s + ((b * h + iy) * w + x0 + kx0) * c, (kx1 - kx0) * c);
                    if (kx1 < kw)
                        memset(to + kx1 * c, zero, (size_t)((kw - kx1) * c));
                }
                memset(row + patch, 0, (size_t)(kp - patch));
            }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
}
