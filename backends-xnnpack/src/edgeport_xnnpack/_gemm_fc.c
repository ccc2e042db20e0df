/* edgeport_xnnpack._gemm, float32 fully connected operator part: HostFullyConnected, FC_SETUP, FC_RUN, fc_isa.
 *
 * A stand-in for libXNNPACK's float32 fully connected *operator* on AVX-512 CPUs, driven exactly like it: the C glue
 * (and _fc_ops' Python path) call ``setup(op, batch, input, output, pool)`` and ``run(op, pool)`` by address, as
 * they call xnn_setup_fully_connected_nc_f32 / xnn_run_operator. Why: a decoder's one-token step is a chain of
 * matrix-vector products that stream every filter from memory once; Debian's 2022 libXNNPACK runs them with its 1x16
 * micro-kernel, one 16-output panel at a time (~12 GiB/s on this kind of host), where reading four panels at once
 * with a software prefetch streams 10-30% faster (bench/REPORT.md, "LLM generation").
 *
 * Each output is accumulated as libXNNPACK does -- its bias, then one fused multiply-add per input channel in order
 * -- then clamped (max with lo, min with hi), so the results are bit-identical to the library's for any batch.
 * The object packs its own copy of the filter once, as [ceil(n/16)][k][16] floats (zero-padded, 64-byte aligned;
 * the layout of packed_gemm and of the library's 1x16 / 7x16 kernels), and the bias as ceil(n/16)*16. Batch 1:
 * four panels in flight; more rows: 7 rows x 32 outputs (two panels) per micro-kernel call, like the newer
 * library's 7x32 (14 accumulators), and 7 x 16 for a lone last panel, each 7-row block against every panel of a
 * FC_CHUNK_BYTES chunk of the filter (its input read once from L1, its outputs written row by row: a 1x1
 * convolution's 12544 x 16 -> 96 took 1.36x the library's time panel pair by panel pair, 0.75x so). Work is split
 * on the executor's pthreadpool by rows when the whole filter is one chunk, else by output panels (and by rows
 * when there are few panels and many rows).
 */
#include "_gemm_common.h"
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

/* more rows: how many bytes of packed filter one pass of 7-row blocks keeps in cache (a chunk of panels) */
#ifndef FC_CHUNK_BYTES
#define FC_CHUNK_BYTES (128 * 1024)
#endif

/* how far ahead (in floats) the one-row path prefetches each panel's stream */
#ifndef FC_PREFETCH
#define FC_PREFETCH 256
#endif

typedef size_t (*threads_fn)(void *);

struct host_fc {
    const float *w, *bias;
    Py_ssize_t k, n, panels;
    float lo, hi;
    parallelize_fn parallelize;
    threads_fn threads_count;
    /* set up for a run */
    Py_ssize_t m;
    const float *in;
    float *out;
    Py_ssize_t col_tiles, pairs_per_tile, rows_per_tile, chunk_panels;
};

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FC_AVX512 1

/* one row against panels p0..p1: four panels in flight, each the bias then a chain of k fused multiply-adds */
__attribute__((target("avx512f"))) static void fc_row(const struct host_fc *f, const float *x, float *y,
                                                       Py_ssize_t p0, Py_ssize_t p1) {
    const Py_ssize_t k = f->k, stride = k * 16;
    const __m512 lo = _mm512_set1_ps(f->lo), hi = _mm512_set1_ps(f->hi);
    Py_ssize_t p = p0;
    for (; p + 4 <= p1; p += 4) {
        const float *w0 = f->w + p * stride, *w1 = w0 + stride, *w2 = w1 + stride, *w3 = w2 + stride;
        __m512 a0 = _mm512_loadu_ps(f->bias + p * 16), a1 = _mm512_loadu_ps(f->bias + p * 16 + 16);
        __m512 a2 = _mm512_loadu_ps(f->bias + p * 16 + 32), a3 = _mm512_loadu_ps(f->bias + p * 16 + 48);
        for (Py_ssize_t i = 0; i < k; i++) {
            const __m512 v = _mm512_set1_ps(x[i]);
            _mm_prefetch((const char *)(w0 + FC_PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char *)(w1 + FC_PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char *)(w2 + FC_PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char *)(w3 + FC_PREFETCH), _MM_HINT_T0);
            a0 = _mm512_fmadd_ps(v, _mm512_loadu_ps(w0), a0);
            a1 = _mm512_fmadd_ps(v, _mm512_loadu_ps(w1), a1);
            a2 = _mm512_fmadd_ps(v, _mm512_loadu_ps(w2), a2);
            a3 = _mm512_fmadd_ps(v, _mm512_loadu_ps(w3), a3);
            w0 += 16;
            w1 += 16;
            w2 += 16;
            w3 += 16;
        }
        __m512 acc[4] = {a0, a1, a2, a3};
        for (int q = 0; q < 4; q++) {
            Py_ssize_t c0 = (p + q) * 16, cols = f->n - c0 < 16 ? f->n - c0 : 16;
            __mmask16 mask = (__mmask16)(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u);
            _mm512_mask_storeu_ps(y + c0, mask, _mm512_min_ps(_mm512_max_ps(acc[q], lo), hi));
        }
    }
    for (; p < p1; p++) {
        const float *w = f->w + p * stride;
        __m512 a = _mm512_loadu_ps(f->bias + p * 16);
        for (Py_ssize_t i = 0; i < k; i++) {
            a = _mm512_fmadd_ps(_mm512_set1_ps(x[i]), _mm512_loadu_ps(w), a);
            w += 16;
        }
        Py_ssize_t c0 = p * 16, cols = f->n - c0 < 16 ? f->n - c0 : 16;
        __mmask16 mask = (__mmask16)(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u);
        _mm512_mask_storeu_ps(y + c0, mask, _mm512_min_ps(_mm512_max_ps(a, lo), hi));
    }
}

/* the 7 row pointers of the block at r0 (a short last block repeats its last row; only real rows are stored) */
#define FC_ROWS(a, f, r0)                                                                                   \
    const float *a[7];                                                                                      \
    for (int r = 0; r < 7; r++)                                                                             \
        a[r] = (f)->in + ((r0) + r < (f)->m ? (r0) + r : (f)->m - 1) * (f)->k;

/* rows r0..r0+6 against panel p alone (the last of an odd count) */
__attribute__((target("avx512f"))) static void fc_7x16(const struct host_fc *f, Py_ssize_t r0, Py_ssize_t p) {
    FC_ROWS(a, f, r0)
    const float *w = f->w + p * f->k * 16;
    __m512 b = _mm512_loadu_ps(f->bias + p * 16);
    __m512 c0 = b, c1 = b, c2 = b, c3 = b, c4 = b, c5 = b, c6 = b;
    for (Py_ssize_t i = 0; i < f->k; i++) {
        __m512 x = _mm512_loadu_ps(w + i * 16);
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(a[0][i]), x, c0);
        c1 = _mm512_fmadd_ps(_mm512_set1_ps(a[1][i]), x, c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(a[2][i]), x, c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(a[3][i]), x, c3);
        c4 = _mm512_fmadd_ps(_mm512_set1_ps(a[4][i]), x, c4);
        c5 = _mm512_fmadd_ps(_mm512_set1_ps(a[5][i]), x, c5);
        c6 = _mm512_fmadd_ps(_mm512_set1_ps(a[6][i]), x, c6);
    }
    __m512 acc[7] = {c0, c1, c2, c3, c4, c5, c6};
    const __m512 lo = _mm512_set1_ps(f->lo), hi = _mm512_set1_ps(f->hi);
    Py_ssize_t c = p * 16, cols = f->n - c < 16 ? f->n - c : 16;
    __mmask16 mask = (__mmask16)(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u);
    for (Py_ssize_t r = 0; r < 7 && r0 + r < f->m; r++)
        _mm512_mask_storeu_ps(f->out + (r0 + r) * f->n + c, mask, _mm512_min_ps(_mm512_max_ps(acc[r], lo), hi));
}

/* rows r0..r0+6 against panels p and p + 1 */
__attribute__((target("avx512f"))) static void fc_7x32(const struct host_fc *f, Py_ssize_t r0, Py_ssize_t p) {
    const Py_ssize_t k = f->k;
    FC_ROWS(a, f, r0)
    const float *w0 = f->w + p * k * 16, *w1 = w0 + k * 16;
    __m512 b0 = _mm512_loadu_ps(f->bias + p * 16), b1 = _mm512_loadu_ps(f->bias + p * 16 + 16);
    __m512 c00 = b0, c01 = b1, c10 = b0, c11 = b1, c20 = b0, c21 = b1, c30 = b0, c31 = b1, c40 = b0, c41 = b1,
           c50 = b0, c51 = b1, c60 = b0, c61 = b1;
    for (Py_ssize_t i = 0; i < k; i++) {
        __m512 x0 = _mm512_loadu_ps(w0 + i * 16), x1 = _mm512_loadu_ps(w1 + i * 16);
        __m512 v = _mm512_set1_ps(a[0][i]);
        c00 = _mm512_fmadd_ps(v, x0, c00);
        c01 = _mm512_fmadd_ps(v, x1, c01);
        v = _mm512_set1_ps(a[1][i]);
        c10 = _mm512_fmadd_ps(v, x0, c10);
        c11 = _mm512_fmadd_ps(v, x1, c11);
        v = _mm512_set1_ps(a[2][i]);
        c20 = _mm512_fmadd_ps(v, x0, c20);
        c21 = _mm512_fmadd_ps(v, x1, c21);
        v = _mm512_set1_ps(a[3][i]);
        c30 = _mm512_fmadd_ps(v, x0, c30);
        c31 = _mm512_fmadd_ps(v, x1, c31);
        v = _mm512_set1_ps(a[4][i]);
        c40 = _mm512_fmadd_ps(v, x0, c40);
        c41 = _mm512_fmadd_ps(v, x1, c41);
        v = _mm512_set1_ps(a[5][i]);
        c50 = _mm512_fmadd_ps(v, x0, c50);
        c51 = _mm512_fmadd_ps(v, x1, c51);
        v = _mm512_set1_ps(a[6][i]);
        c60 = _mm512_fmadd_ps(v, x0, c60);
        c61 = _mm512_fmadd_ps(v, x1, c61);
    }
    __m512 acc[7][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}, {c60, c61}};
    const __m512 lo = _mm512_set1_ps(f->lo), hi = _mm512_set1_ps(f->hi);
    Py_ssize_t c0 = p * 16, cols = f->n - c0 < 32 ? f->n - c0 : 32;
    __mmask16 m0 = (__mmask16)(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u);
    __mmask16 m1 = (__mmask16)(cols >= 32 ? 0xFFFFu : cols > 16 ? (1u << (cols - 16)) - 1u : 0u);
    for (Py_ssize_t r = 0; r < 7 && r0 + r < f->m; r++) {
        float *o = f->out + (r0 + r) * f->n + c0;
        _mm512_mask_storeu_ps(o, m0, _mm512_min_ps(_mm512_max_ps(acc[r][0], lo), hi));
        _mm512_mask_storeu_ps(o + 16, m1, _mm512_min_ps(_mm512_max_ps(acc[r][1], lo), hi));
    }
}

/* work item `index` of the grid: row tile x tile of panel pairs */
static void fc_item(void *ctx, size_t index) {
    const struct host_fc *f = ctx;
    Py_ssize_t rt = (Py_ssize_t)index / f->col_tiles, ct = (Py_ssize_t)index % f->col_tiles;
    Py_ssize_t p0 = ct * f->pairs_per_tile * 2, p1 = p0 + f->pairs_per_tile * 2;
    if (p1 > f->panels)
        p1 = f->panels;
    Py_ssize_t r0 = rt * f->rows_per_tile, r1 = r0 + f->rows_per_tile < f->m ? r0 + f->rows_per_tile : f->m;
    if (f->m == 1) {
        fc_row(f, f->in, f->out, p0, p1);
        return;
    }
    /* panels in chunks whose filter stays in cache; within a chunk each 7-row block against all its panels, so a
       block's input is read from L1 and its outputs are written row by row */
    for (Py_ssize_t c0 = p0; c0 < p1; c0 += f->chunk_panels) {
        Py_ssize_t c1 = c0 + f->chunk_panels < p1 ? c0 + f->chunk_panels : p1;
        for (Py_ssize_t r = r0; r < r1; r += 7)
            for (Py_ssize_t p = c0; p < c1; p += 2)
                if (p + 1 < c1)
                    fc_7x32(f, r, p);
                else
                    fc_7x16(f, r, p);
    }
}
#endif

/* xnn_status values the glue reports: 0 success, 2 invalid parameter */
static int fc_setup(void *op, size_t batch, const void *input, void *output, void *pool) {
    struct host_fc *f = op;
    if (!f || !input || !output || batch < 1 || batch > (size_t)(PY_SSIZE_T_MAX / f->k) ||
            batch > (size_t)(PY_SSIZE_T_MAX / f->n))
        return 2;
    f->m = (Py_ssize_t)batch;
    f->in = input;
    f->out = output;
    return 0;
}

static int fc_run(void *op, void *pool) {
#ifdef FC_AVX512
    struct host_fc *f = op;
    if (!f || !f->in || !f->out)
        return 2;
    Py_ssize_t pairs = (f->panels + 1) / 2, blocks = (f->m + 6) / 7;
    size_t threads = pool && f->threads_count ? f->threads_count(pool) : 1;
    f->col_tiles = 1;
    f->pairs_per_tile = pairs;
    f->rows_per_tile = f->m;
    /* an even number of panels (pairs for the 7x32 tile) whose filter fits FC_CHUNK_BYTES */
    f->chunk_panels = (Py_ssize_t)(FC_CHUNK_BYTES / ((size_t)f->k * 64)) & ~(Py_ssize_t)1;
    if (f->chunk_panels < 2)
        f->chunk_panels = 2;
    if (threads > 1 && f->parallelize && f->m > 1 && f->chunk_panels >= f->panels &&
            blocks >= 4 * (Py_ssize_t)threads) {
        /* the whole filter stays in cache: split by rows only, each thread's blocks against every panel */
        Py_ssize_t row_tiles = 4 * (Py_ssize_t)threads;
        f->rows_per_tile = (blocks + row_tiles - 1) / row_tiles * 7;
    } else if (threads > 1 && f->parallelize) {
        Py_ssize_t want = 4 * (Py_ssize_t)threads;
        f->pairs_per_tile = (pairs + want - 1) / want;
        f->col_tiles = (pairs + f->pairs_per_tile - 1) / f->pairs_per_tile;
        if (f->col_tiles < want && blocks > 1) {
            Py_ssize_t row_tiles = (want + f->col_tiles - 1) / f->col_tiles;
            f->rows_per_tile = (blocks + row_tiles - 1) / row_tiles * 7;
        }
    }
    size_t items = (size_t)(f->col_tiles * ((f->m + f->rows_per_tile - 1) / f->rows_per_tile));
    if (items > 1)
        f->parallelize(pool, fc_item, f, items, 0);
    else
        fc_item(f, 0);
    return 0;
#else
    return 2;
#endif
}

typedef struct {
    PyObject_HEAD
    struct host_fc fc;
    float *packed; /* 64-byte aligned: the filter panels, then the bias */
} HostFC;

static void hostfc_dealloc(HostFC *self) {
    free(self->packed);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* the filter ([n][k] floats, or [k][n] when `transposed`) as [panels][k][16] and the bias (or zeros) as
   [panels * 16], zero-padded */
static void fc_pack(float *w, float *bias, const float *filter, const float *b, Py_ssize_t k, Py_ssize_t n,
                    Py_ssize_t panels, int transposed) {
    memset(bias, 0, (size_t)(panels * 16) * sizeof(float));
    if (b)
        memcpy(bias, b, (size_t)n * sizeof(float));
    for (Py_ssize_t p = 0; p < panels; p++) {
        float *dst = w + p * k * 16;
        Py_ssize_t cols = n - p * 16 < 16 ? n - p * 16 : 16;
        if (cols < 16)
            memset(dst, 0, (size_t)(k * 16) * sizeof(float));
        if (transposed) {
            for (Py_ssize_t i = 0; i < k; i++)
                memcpy(dst + i * 16, filter + i * n + p * 16, (size_t)cols * sizeof(float));
        } else { /* 16 x 16 blocks: 16 rows' 64-byte pieces in, one 1 KiB piece of the panel out */
            for (Py_ssize_t i0 = 0; i0 < k; i0 += 16) {
                Py_ssize_t depth = k - i0 < 16 ? k - i0 : 16;
                for (Py_ssize_t j = 0; j < cols; j++) {
                    const float *row = filter + (p * 16 + j) * k + i0;
                    for (Py_ssize_t i = 0; i < depth; i++)
                        dst[(i0 + i) * 16 + j] = row[i];
                }
            }
        }
    }
}

static int hostfc_init(HostFC *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"filter", "bias", "k", "n", "lo", "hi", "transposed", "parallelize", "threads_count",
                            NULL};
    PyObject *w_obj, *bias_obj;
    Py_ssize_t k, n;
    double lo, hi;
    int transposed = 0;
    unsigned long long parallelize = 0, threads_count = 0;
    if (self->packed) {
        PyErr_SetString(PyExc_RuntimeError, "HostFullyConnected is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOnndd|pKK:HostFullyConnected", names, &w_obj, &bias_obj, &k, &n,
                                     &lo, &hi, &transposed, &parallelize, &threads_count))
        return -1;
    if (gemm_isa_level() < 2) {
        PyErr_SetString(PyExc_RuntimeError, "HostFullyConnected: this CPU lacks AVX-512F");
        return -1;
    }
    if (k < 1 || n < 1 || n > PY_SSIZE_T_MAX / 64 / k) {
        PyErr_Format(PyExc_ValueError, "HostFullyConnected: bad sizes k=%zd n=%zd", k, n);
        return -1;
    }
    if (isnan(lo) || isnan(hi) || lo > hi) {
        PyErr_Format(PyExc_ValueError, "HostFullyConnected: bad output range (%g, %g)", lo, hi);
        return -1;
    }
    if ((parallelize == 0) != (threads_count == 0)) {
        PyErr_SetString(PyExc_ValueError, "HostFullyConnected: give both pool function addresses or neither");
        return -1;
    }
    Py_ssize_t panels = (n + 15) / 16;
    Py_buffer w, b;
    if (typed_buffer(w_obj, &w, 0, k * n, "f", 4, "filter") < 0)
        return -1;
    int has_bias = bias_obj != Py_None;
    if (has_bias && typed_buffer(bias_obj, &b, 0, n, "f", 4, "bias") < 0) {
        PyBuffer_Release(&w);
        return -1;
    }
    size_t floats = (size_t)(panels * k * 16 + panels * 16);
    float *packed = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    if (!packed) {
        PyBuffer_Release(&w);
        if (has_bias)
            PyBuffer_Release(&b);
        PyErr_NoMemory();
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    fc_pack(packed, packed + panels * k * 16, w.buf, has_bias ? b.buf : NULL, k, n, panels, transposed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&w);
    if (has_bias)
        PyBuffer_Release(&b);
    self->packed = packed;
    struct host_fc f = {packed, packed + panels * k * 16, k, n, panels, (float)lo, (float)hi,
                        (parallelize_fn)(uintptr_t)parallelize, (threads_fn)(uintptr_t)threads_count,
                        0, NULL, NULL, 1, 1, 1};
    self->fc = f;
    return 0;
}

static PyObject *hostfc_handle(HostFC *self, void *Py_UNUSED(closure)) {
    if (!self->packed) {
        PyErr_SetString(PyExc_RuntimeError, "HostFullyConnected is not initialized");
        return NULL;
    }
    return PyLong_FromVoidPtr(&self->fc);
}

static PyGetSetDef hostfc_getset[] = {
    {"handle", (getter)hostfc_handle, NULL, "the address setup / run take as their operator", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HostFCType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "edgeport_xnnpack._gemm.HostFullyConnected",
    .tp_basicsize = sizeof(HostFC),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "HostFullyConnected(filter, bias, k, n, lo, hi[, transposed, parallelize, threads_count]): a float32 "
              "fully connected operator; filter: [n][k] floats ([k][n] when transposed), bias: n floats or None. "
              "It packs its own copy ([ceil(n/16)][k][16], see _gemm_fc.c); FC_SETUP and FC_RUN take its handle.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)hostfc_init,
    .tp_dealloc = (destructor)hostfc_dealloc,
    .tp_getset = hostfc_getset,
};

PyObject *fc_isa(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args)) {
    return PyLong_FromLong(gemm_isa_level() == 2 ? 2 : 0);
}

int add_host_fc(PyObject *module) {
    if (PyType_Ready(&HostFCType) < 0)
        return -1;
    Py_INCREF(&HostFCType);
    if (PyModule_AddObject(module, "HostFullyConnected", (PyObject *)&HostFCType) < 0) {
        Py_DECREF(&HostFCType);
        return -1;
    }
    PyObject *setup = PyLong_FromVoidPtr((void *)(uintptr_t)fc_setup);
    if (!setup || PyModule_AddObject(module, "FC_SETUP", setup) < 0) {
        Py_XDECREF(setup);
        return -1;
    }
    PyObject *run = PyLong_FromVoidPtr((void *)(uintptr_t)fc_run);
    if (!run || PyModule_AddObject(module, "FC_RUN", run) < 0) {
        Py_XDECREF(run);
        return -1;
    }
    return 0;
}
