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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

typedef void (*sgemm32_fn)(int, int, int, int32_t, int32_t, int32_t, float, const float *, int32_t, const float *,
                           int32_t, float, float *, int32_t);
typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                           int64_t, float, float *, int64_t);
typedef void (*sgemv32_fn)(int, int, int32_t, int32_t, float, const float *, int32_t, const float *, int32_t, float,
                           float *, int32_t);
typedef void (*sgemv64_fn)(int, int, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t, float,
                           float *, int64_t);
typedef void (*task_fn)(void *, size_t);
typedef void (*parallelize_fn)(void *, task_fn, void *, size_t, uint32_t);

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
        /* column tiles of >= 16 (one micro-kernel width) when there are enough columns, else row tiles */
        Py_ssize_t col_tile = ((n + threads - 1) / threads + 15) / 16 * 16;
        if (n >= 16 * threads) {
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

static PyMethodDef methods[] = {
    {"fully_connected", fully_connected, METH_VARARGS,
     "fully_connected(parallelize, pool, sgemm, sgemv, ilp64, a, w, bias, out, m, k, n, transpose_w, lo, hi, "
     "threads)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "edgeport_xnnpack._gemm",
                                    "float32 fully-connected layers on the host BLAS, tiled on a pthreadpool", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__gemm(void) { return PyModule_Create(&module); }
