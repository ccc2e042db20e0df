/* edgeport_xnnpack._gemm: float32 fully-connected layers (and 1x1 convolutions, the same product in NHWC) on the
 * host BLAS, split into tiles run on the executor's XNNPACK thread pool.
 *
 * fully_connected(parallelize, pool, sgemm, sgemv, ilp64, a, w, bias, out, m, k, n, transpose_w, lo, hi, threads)
 *   out[m, n] = clamp(a[m, k] @ W + bias, lo, hi), W = w^T with w [n, k] (XNNPACK's filter layout), or W = w
 *   with w [k, n] when transpose_w; bias is None or n floats; lo / hi may be -inf / inf.
 *   parallelize: the address of pthreadpool_parallelize_1d of the library the pool comes from; pool: a
 *   pthreadpool_t (0: run on the calling thread) of `threads` threads; sgemm / sgemv: the addresses of CBLAS
 *   sgemm and sgemv (cblas_* or OpenBLAS-suffixed ones; sgemv runs a single row, where sgemm would pack the whole
 *   filter for one output row), ilp64: their integers are 64-bit.
 *
 * Why: Debian's 2022 libXNNPACK has no AVX-512-class speed on CPUs with AVX2 only: its FMA3 GEMM micro-kernels run
 * the encoder's fully-connected layers at ~40% of the core's peak, while OpenBLAS's AVX2 kernels reach ~90%
 * (bench/REPORT.md, "XNNPACK per node kind (AVX2 emulated)"). The tiles run on XNNPACK's own pthreadpool so that
 * no second set of worker threads competes with it (OpenBLAS must run single-threaded meanwhile: the caller sets
 * that). Every argument is checked before a pointer is touched; the product runs without the GIL.
 */
#include "_gemm_common.h"
#include <math.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

typedef void (*sgemm32_fn)(int, int, int, int32_t, int32_t, int32_t, float, const float *, int32_t, const float *,
                           int32_t, float, float *, int32_t);
typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                           int64_t, float, float *, int64_t);
typedef void (*sgemv32_fn)(int, int, int32_t, int32_t, float, const float *, int32_t, const float *, int32_t, float,
                           float *, int32_t);
typedef void (*sgemv64_fn)(int, int, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t, float,
                           float *, int64_t);

struct job {
    void *sgemm, *sgemv;
    int ilp64, transpose_w, split_rows;
    const float *a, *w, *bias;
    float *out;
    Py_ssize_t m, k, n, tile;
    float lo, hi;
};

/* row[i] = clamp(row[i] + bias[i], lo, hi), in forms the compiler vectorizes (maxps / minps) */
static void bias_clamp(float *restrict row, const float *restrict bias, Py_ssize_t cols, float lo, float hi) {
    if (bias) {
        for (Py_ssize_t i = 0; i < cols; i++) {
            float v = row[i] + bias[i];
            v = v < lo ? lo : v;
            row[i] = v > hi ? hi : v;
        }
    } else {
        for (Py_ssize_t i = 0; i < cols; i++) {
            float v = row[i];
            v = v < lo ? lo : v;
            row[i] = v > hi ? hi : v;
        }
    }
}

/* one product of rows x cols (rows from r0, cols from c0), then its bias and clamp while it is in cache */
static void run_block(const struct job *j, Py_ssize_t r0, Py_ssize_t rows, Py_ssize_t c0, Py_ssize_t cols) {
    const float *a = j->a + r0 * j->k;
    const float *w = j->transpose_w ? j->w + c0 : j->w + c0 * j->k;
    Py_ssize_t ldw = j->transpose_w ? j->n : j->k;
    float *c = j->out + r0 * j->n + c0;
    if (rows == 1) {  /* y[cols] = W x: w [n, k] rows c0.. (no transpose), or w [k, n] columns c0.. (transpose) */
        Py_ssize_t vr = j->transpose_w ? j->k : cols, vc = j->transpose_w ? cols : j->k;
        int t = j->transpose_w ? TRANS : NO_TRANS;
        if (j->ilp64)
            ((sgemv64_fn)j->sgemv)(ROW_MAJOR, t, vr, vc, 1.0f, w, ldw, a, 1, 0.0f, c, 1);
        else
            ((sgemv32_fn)j->sgemv)(ROW_MAJOR, t, (int32_t)vr, (int32_t)vc, 1.0f, w, (int32_t)ldw, a, 1, 0.0f, c, 1);
    } else if (j->ilp64) {
        ((sgemm64_fn)j->sgemm)(ROW_MAJOR, NO_TRANS, j->transpose_w ? NO_TRANS : TRANS, rows, cols, j->k, 1.0f, a,
                               j->k, w, ldw, 0.0f, c, j->n);
    } else {
        ((sgemm32_fn)j->sgemm)(ROW_MAJOR, NO_TRANS, j->transpose_w ? NO_TRANS : TRANS, (int32_t)rows, (int32_t)cols,
                               (int32_t)j->k, 1.0f, a, (int32_t)j->k, w, (int32_t)ldw, 0.0f, c, (int32_t)j->n);
    }
    if (j->bias || j->lo > -INFINITY || j->hi < INFINITY)
        for (Py_ssize_t r = 0; r < rows; r++)
            bias_clamp(c + r * j->n, j->bias ? j->bias + c0 : NULL, cols, j->lo, j->hi);
}

/* A tile of whole rows (split_rows) or whole columns. (Splitting it further into row blocks, so that the bias and
   clamp pass finds them in cache, measured slower: each sgemm call packs its filter again.) */
static void run_tile(void *ctx, size_t index) {
    const struct job *j = ctx;
    Py_ssize_t r0 = 0, rows = j->m, c0 = 0, cols = j->n;
    if (j->split_rows) {
        r0 = (Py_ssize_t)index * j->tile;
        rows = j->m - r0 < j->tile ? j->m - r0 : j->tile;
    } else {
        c0 = (Py_ssize_t)index * j->tile;
        cols = j->n - c0 < j->tile ? j->n - c0 : j->tile;
    }
    if (rows > 0 && cols > 0)
        run_block(j, r0, rows, c0, cols);
}

static int float_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t floats, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = view->format;
    if (f && (*f == '=' || (*f == '<' && PY_LITTLE_ENDIAN) || *f == '@'))
        f++;
    if (view->itemsize != 4 || !f || strcmp(f, "f") != 0) {
        PyErr_Format(PyExc_TypeError, "fully_connected: %s must be a C-contiguous float32 buffer", what);
        PyBuffer_Release(view);
        return -1;
    }
    if (view->len < floats * 4) {
        PyErr_Format(PyExc_ValueError, "fully_connected: %s holds %zd floats, %zd needed", what, view->len / 4, floats);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *fully_connected(PyObject *Py_UNUSED(module), PyObject *args) {
    unsigned long long parallelize, pool, sgemm, sgemv;
    int ilp64, transpose_w;
    PyObject *a_obj, *w_obj, *bias_obj, *out_obj;
    Py_ssize_t m, k, n, threads;
    double lo, hi;
    if (!PyArg_ParseTuple(args, "KKKKpOOOOnnnpddn:fully_connected", &parallelize, &pool, &sgemm, &sgemv, &ilp64, &a_obj,
                          &w_obj, &bias_obj, &out_obj, &m, &k, &n, &transpose_w, &lo, &hi, &threads))
        return NULL;
    if (m < 1 || k < 1 || n < 1 || threads < 1 || (!ilp64 && (m > INT32_MAX || k > INT32_MAX || n > INT32_MAX))) {
        PyErr_Format(PyExc_ValueError, "fully_connected: bad sizes m=%zd k=%zd n=%zd threads=%zd", m, k, n, threads);
        return NULL;
    }
    if (m > PY_SSIZE_T_MAX / k || m > PY_SSIZE_T_MAX / n || n > PY_SSIZE_T_MAX / k) {
        PyErr_SetString(PyExc_OverflowError, "fully_connected: sizes overflow");
        return NULL;
    }
    if (!sgemm || !sgemv || (pool && !parallelize)) {
        PyErr_SetString(PyExc_ValueError, "fully_connected: null sgemm, sgemv or pthreadpool_parallelize_1d address");
        return NULL;
    }
    if (isnan(lo) || isnan(hi) || lo > hi) {
        PyErr_Format(PyExc_ValueError, "fully_connected: bad output range (%g, %g)", lo, hi);
        return NULL;
    }
    Py_buffer a, w, out, bias = {0};
    if (float_buffer(a_obj, &a, 0, m * k, "input") < 0)
        return NULL;
    if (float_buffer(w_obj, &w, 0, n * k, "filter") < 0) {
        PyBuffer_Release(&a);
        return NULL;
    }
    if (bias_obj != Py_None && float_buffer(bias_obj, &bias, 0, n, "bias") < 0) {
        PyBuffer_Release(&a);
        PyBuffer_Release(&w);
        return NULL;
    }
    if (float_buffer(out_obj, &out, 1, m * n, "output") < 0) {
        PyBuffer_Release(&a);
        PyBuffer_Release(&w);
        if (bias_obj != Py_None)
            PyBuffer_Release(&bias);
        return NULL;
    }
    struct job j = {(void *)(uintptr_t)sgemm, (void *)(uintptr_t)sgemv, ilp64, transpose_w, 0, a.buf, w.buf,
                    bias_obj != Py_None ? bias.buf : NULL, out.buf, m, k, n, n, (float)lo, (float)hi};
    size_t tiles = 1;
    if (pool && threads > 1) {
        /* Each tile's sgemm packs its share of one operand and the whole of the other: split the dimension whose
           operand is bigger (rows when m > n, so that a tall input with few channels is packed once), in tiles of
           >= 16 columns (one micro-kernel width) or whole rows. */
        Py_ssize_t col_tile = ((n + threads - 1) / threads + 15) / 16 * 16;
        if (m > n && m >= 2 * threads) {
            j.split_rows = 1;
            j.tile = (m + threads - 1) / threads;
            tiles = (size_t)((m + j.tile - 1) / j.tile);
        } else if (n >= 16 * threads) {
            j.tile = col_tile;
            tiles = (size_t)((n + col_tile - 1) / col_tile);
        } else if (m >= 2 * threads) {
            j.split_rows = 1;
            j.tile = (m + threads - 1) / threads;
            tiles = (size_t)((m + j.tile - 1) / j.tile);
        }
    }
    Py_BEGIN_ALLOW_THREADS
    if (tiles > 1)
        ((parallelize_fn)(uintptr_t)parallelize)((void *)(uintptr_t)pool, run_tile, &j, tiles, 0);
    else {
        j.split_rows = 0;
        j.tile = n;
        run_tile(&j, 0);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&a);
    PyBuffer_Release(&w);
    if (bias_obj != Py_None)
        PyBuffer_Release(&bias);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* ---- packed_gemm: a 6x16 AVX2/FMA micro-kernel on filters packed once at load ------------------------------------
 * For the shapes OpenBLAS serves worst -- many rows, few input channels (MobileNetV2's early 1x1 convolutions: it
 * packs the whole input before multiplying, which costs as much as the product when k is small) -- and filters
 * small enough to stay in cache: the input is read in place, 6 rows at a time, against each 16-column panel of the
 * packed filter ([ceil(n/16)][k][16] floats, zero-padded, with its bias padded to the same width), and the bias and
 * clamp are applied in registers before the one store. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PACKED_GEMM 1

struct packed_job {
    const float *a, *w, *bias;
    float *out;
    Py_ssize_t m, k, n, rows_per_tile, panels_per_tile, panel_tiles;
    float lo, hi;
};

__attribute__((target("avx2,fma"))) static void panel_rows(const struct packed_job *j, Py_ssize_t r0, Py_ssize_t mr,
                                                            Py_ssize_t p) {
    const Py_ssize_t k = j->k, c0 = p * 16;
    const float *w = j->w + p * k * 16;
    const float *a0 = j->a + r0 * k;
    __m256 acc[6][2];
    __m256 b0 = _mm256_loadu_ps(j->bias + c0), b1 = _mm256_loadu_ps(j->bias + c0 + 8);
    for (int r = 0; r < 6; r++) {
        acc[r][0] = b0;
        acc[r][1] = b1;
    }
    if (mr == 6) {  /* 12 named accumulators: the compiler keeps them in registers */
        __m256 c00 = b0, c01 = b1, c10 = b0, c11 = b1, c20 = b0, c21 = b1, c30 = b0, c31 = b1, c40 = b0, c41 = b1,
               c50 = b0, c51 = b1;
        const float *a1 = a0 + k, *a2 = a1 + k, *a3 = a2 + k, *a4 = a3 + k, *a5 = a4 + k;
        for (Py_ssize_t i = 0; i < k; i++) {
            __m256 w0 = _mm256_loadu_ps(w + i * 16), w1 = _mm256_loadu_ps(w + i * 16 + 8);
            __m256 x = _mm256_broadcast_ss(a0 + i);
            c00 = _mm256_fmadd_ps(x, w0, c00);
            c01 = _mm256_fmadd_ps(x, w1, c01);
            x = _mm256_broadcast_ss(a1 + i);
            c10 = _mm256_fmadd_ps(x, w0, c10);
            c11 = _mm256_fmadd_ps(x, w1, c11);
            x = _mm256_broadcast_ss(a2 + i);
            c20 = _mm256_fmadd_ps(x, w0, c20);
            c21 = _mm256_fmadd_ps(x, w1, c21);
            x = _mm256_broadcast_ss(a3 + i);
            c30 = _mm256_fmadd_ps(x, w0, c30);
            c31 = _mm256_fmadd_ps(x, w1, c31);
            x = _mm256_broadcast_ss(a4 + i);
            c40 = _mm256_fmadd_ps(x, w0, c40);
            c41 = _mm256_fmadd_ps(x, w1, c41);
            x = _mm256_broadcast_ss(a5 + i);
            c50 = _mm256_fmadd_ps(x, w0, c50);
            c51 = _mm256_fmadd_ps(x, w1, c51);
        }
        acc[0][0] = c00; acc[0][1] = c01; acc[1][0] = c10; acc[1][1] = c11; acc[2][0] = c20; acc[2][1] = c21;
        acc[3][0] = c30; acc[3][1] = c31; acc[4][0] = c40; acc[4][1] = c41; acc[5][0] = c50; acc[5][1] = c51;
    } else {
        for (Py_ssize_t i = 0; i < k; i++) {
            __m256 w0 = _mm256_loadu_ps(w + i * 16), w1 = _mm256_loadu_ps(w + i * 16 + 8);
            for (Py_ssize_t r = 0; r < mr; r++) {
                __m256 x = _mm256_broadcast_ss(a0 + r * k + i);
                acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
            }
        }
    }
    __m256 lo = _mm256_set1_ps(j->lo), hi = _mm256_set1_ps(j->hi);
    Py_ssize_t cols = j->n - c0 < 16 ? j->n - c0 : 16;
    for (Py_ssize_t r = 0; r < mr; r++) {
        __m256 v0 = _mm256_min_ps(_mm256_max_ps(acc[r][0], lo), hi);
        __m256 v1 = _mm256_min_ps(_mm256_max_ps(acc[r][1], lo), hi);
        float *o = j->out + (r0 + r) * j->n + c0;
        if (cols == 16) {
            _mm256_storeu_ps(o, v0);
            _mm256_storeu_ps(o + 8, v1);
        } else {
            float tmp[16];
            _mm256_storeu_ps(tmp, v0);
            _mm256_storeu_ps(tmp + 8, v1);
            memcpy(o, tmp, (size_t)cols * sizeof(float));
        }
    }
}

/* tile `index` of a grid of row tiles x panel tiles: its 6-row blocks, each against its panels */
static void packed_tile(void *ctx, size_t index) {
    const struct packed_job *j = ctx;
    Py_ssize_t rt = (Py_ssize_t)index / j->panel_tiles, pt = (Py_ssize_t)index % j->panel_tiles;
    Py_ssize_t r0 = rt * j->rows_per_tile, r1 = r0 + j->rows_per_tile < j->m ? r0 + j->rows_per_tile : j->m;
    Py_ssize_t panels = (j->n + 15) / 16, p0 = pt * j->panels_per_tile;
    Py_ssize_t p1 = p0 + j->panels_per_tile < panels ? p0 + j->panels_per_tile : panels;
    for (Py_ssize_t r = r0; r < r1; r += 6)
        for (Py_ssize_t p = p0; p < p1; p++)
            panel_rows(j, r, r1 - r < 6 ? r1 - r : 6, p);
}
#endif

static PyObject *packed_available(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args)) {
#ifdef PACKED_GEMM
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

static PyObject *packed_gemm(PyObject *Py_UNUSED(module), PyObject *args) {
    unsigned long long parallelize, pool;
    PyObject *a_obj, *w_obj, *bias_obj, *out_obj;
    Py_ssize_t m, k, n, threads;
    double lo, hi;
    if (!PyArg_ParseTuple(args, "KKOOOOnnnddn:packed_gemm", &parallelize, &pool, &a_obj, &w_obj, &bias_obj, &out_obj,
                          &m, &k, &n, &lo, &hi, &threads))
        return NULL;
#ifndef PACKED_GEMM
    PyErr_SetString(PyExc_RuntimeError, "packed_gemm: not built for this CPU architecture");
    return NULL;
#else
    if (PyObject_IsTrue(packed_available(NULL, NULL)) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "packed_gemm: this CPU lacks AVX2 or FMA");
        return NULL;
    }
    if (m < 1 || k < 1 || n < 1 || threads < 1 || m > PY_SSIZE_T_MAX / k || m > PY_SSIZE_T_MAX / n
            || n > PY_SSIZE_T_MAX / 16 / k) {
        PyErr_Format(PyExc_ValueError, "packed_gemm: bad sizes m=%zd k=%zd n=%zd threads=%zd", m, k, n, threads);
        return NULL;
    }
    if (pool && !parallelize) {
        PyErr_SetString(PyExc_ValueError, "packed_gemm: null pthreadpool_parallelize_1d address");
        return NULL;
    }
    if (isnan(lo) || isnan(hi) || lo > hi) {
        PyErr_Format(PyExc_ValueError, "packed_gemm: bad output range (%g, %g)", lo, hi);
        return NULL;
    }
    Py_ssize_t panels = (n + 15) / 16;
    Py_buffer a, w, bias, out;
    if (float_buffer(a_obj, &a, 0, m * k, "input") < 0)
        return NULL;
    if (float_buffer(w_obj, &w, 0, panels * k * 16, "packed filter") < 0) {
        PyBuffer_Release(&a);
        return NULL;
    }
    if (float_buffer(bias_obj, &bias, 0, panels * 16, "packed bias") < 0) {
        PyBuffer_Release(&a);
        PyBuffer_Release(&w);
        return NULL;
    }
    if (float_buffer(out_obj, &out, 1, m * n, "output") < 0) {
        PyBuffer_Release(&a);
        PyBuffer_Release(&w);
        PyBuffer_Release(&bias);
        return NULL;
    }
    struct packed_job j = {a.buf, w.buf, bias.buf, out.buf, m, k, n, m, panels, 1, (float)lo, (float)hi};
    size_t tiles = 1;
    if (pool && threads > 1) {
        /* ~4 tiles per thread: of 6-row blocks when there are enough rows, else of 16-column panels */
        Py_ssize_t want = 4 * threads;
        if (m >= 6 * want) {
            j.rows_per_tile = ((m + want - 1) / want + 5) / 6 * 6;
        } else if (panels >= 2) {
            j.panels_per_tile = (panels + want - 1) / want;
            j.panel_tiles = (panels + j.panels_per_tile - 1) / j.panels_per_tile;
        }
        tiles = (size_t)(((m + j.rows_per_tile - 1) / j.rows_per_tile) * j.panel_tiles);
    }
    Py_BEGIN_ALLOW_THREADS
    if (tiles > 1)
        ((parallelize_fn)(uintptr_t)parallelize)((void *)(uintptr_t)pool, packed_tile, &j, tiles, 0);
    else
        packed_tile(&j, 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&a);
    PyBuffer_Release(&w);
    PyBuffer_Release(&bias);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
#endif
}

static PyMethodDef methods[] = {
    {"fully_connected", fully_connected, METH_VARARGS,
     "fully_connected(parallelize, pool, sgemm, sgemv, ilp64, a, w, bias, out, m, k, n, transpose_w, lo, hi, "
     "threads)"},
    {"packed_available", packed_available, METH_NOARGS, "packed_available() -> the CPU runs packed_gemm"},
    {"qs8_available", qs8_available, METH_NOARGS, "qs8_available() -> the CPU runs qs8_packed_gemm"},
    {"qs8_packed_gemm", qs8_packed_gemm, METH_VARARGS,
     "qs8_packed_gemm(parallelize, pool, a, packed_w, packed_bias, packed_scales, out, m, k, n, zero_point, qmin, "
     "qmax, threads)"},
    {"qs8_im2col", qs8_im2col, METH_VARARGS,
     "qs8_im2col(src, dst, batch, h, w, c, kh, kw, sh, sw, pad_top, pad_left, oh, ow, k_padded, zero_point)"},
    {"conv_isa", conv_isa, METH_NOARGS, "conv_isa() -> 2 (AVX-512 7x32), 1 (AVX2 6x16) or 0: conv_packed's kernels"},
    {"conv_packed", conv_packed, METH_VARARGS,
     "conv_packed(parallelize, pool, level, x, x_len, packed_w, packed_bias, zero, offsets, out, m, taps, c, n, lo, "
     "hi, threads)"},
    {"bmm", bmm, METH_VARARGS,
     "bmm(a, b, out[, lo, hi[, scale]]) -> bool: out = clamp(a @ (b * scale)) for float32 views of rank >= 2 with "
     "numpy matmul's batch broadcasting into a C-contiguous out; False (nothing written) when it does not take them "
     "(see _gemm_bmm.c)"},
    {"bmm_plan", bmm_plan, METH_VARARGS,
     "bmm_plan(a, b, out[, lo, hi[, scale]]) -> the same product bound to these arrays as a step of a direct call's "
     "chain (a capsule; scale: a float or a one-element float32 array read on every run), or None when bmm would "
     "refuse them"},
    {"fc_isa", fc_isa, METH_NOARGS, "fc_isa() -> 2 when this CPU runs HostFullyConnected (AVX-512F), else 0"},
    {"packed_gemm", packed_gemm, METH_VARARGS,
     "packed_gemm(parallelize, pool, a, packed_w, packed_bias, out, m, k, n, lo, hi, threads)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "edgeport_xnnpack._gemm",
                                    "float32 fully-connected layers on the host BLAS, tiled on a pthreadpool", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__gemm(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (add_host_fc(m) < 0 || conv_add_constants(m) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
