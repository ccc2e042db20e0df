/* edgeport_xnnpack._kernels: elementwise kernels the 2022 libXNNPACK lacks, for the executor's host segments.
 *
 * gelu(x, out): the exact (erf) GELU of a C-contiguous float32 buffer into another of the same length,
 *   gelu(x) = 0.5 * (x + |x| * erf(|x| / sqrt(2)))   (equal to 0.5 * x * (1 + erf(x / sqrt(2))))
 * with erf from Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7) and exp(-u^2) from a range reduction to
 * [-ln2/2, ln2/2] and its Taylor series to degree 7 (truncation error < 1e-8 relative), an AVX2/FMA loop of
 * intrinsics where the CPU has both (8 floats per step), else a loop the compiler vectorizes for the baseline ISA.
 * transpose_scale(src, out, batch, rows, cols[, scale]): out[b, c, r] = src[b, r, c] * scale (the key cache's
 *   transpose times the attention scale) or a plain transposing copy, in 16 x 16 tiles; numpy's strided copy
 *   of the transposed view is several times slower.
 * copy_runs(arrays, n_src, table, itemsize): the data movement of a host segment of reshapes, transposes, slices
 *   and concatenations as one call: rows of strided runs planned once (edgeport_xnnpack._copies), checked
 *   against the buffers on every call.
 * gelu_plan / copy_plan: the same GELU and a strided copy bound to their arrays, for a direct call's chain
 *   (_kernels_bound.c).
 * Arguments are checked before any pointer is touched; the loop runs without the GIL, on the delegate's pthreadpool
 * in chunks of 8192 floats when the caller passes it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_kernels_bound.h"

static inline __attribute__((always_inline)) float exp_nonpositive(float v) {
    /* e^v for v <= 0, flushed to 0 below -87 (where e^v is under FLT_MIN anyway) */
    const float ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-6f, log2e = 1.44269504f;
    float small = v < -87.0f ? 0.0f : 1.0f;
    v = v < -87.0f ? -87.0f : v;
    float z = -v * log2e;
    int32_t k = (int32_t)(z + 0.5f);        /* round(z), z >= 0 */
    float kf = (float)k;
    float r = (v + kf * ln2_hi) + kf * ln2_lo;  /* v = -k ln2 + r, |r| <= ln2/2 */
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720
              + r * (1.0f / 5040)))))));
    int32_t bits = (127 - k) << 23;         /* 2^-k, k <= 126: a normal float */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale * small;
}

/* The portable loop (the baseline ISA, SSE2: gcc vectorizes it 4 floats per step). */
static void gelu_f32_portable(const float *x, float *y, Py_ssize_t n) {
    const float a1 = 0.254829592f, a2 = -0.284496736f, a3 = 1.421413741f, a4 = -1.453152027f,
                a5 = 1.061405429f, p = 0.3275911f, inv_sqrt2 = 0.70710678f;
    for (Py_ssize_t i = 0; i < n; i++) {
        float xv = x[i];
        float ax = fabsf(xv);
        float u = ax * inv_sqrt2;
        float t = 1.0f / (1.0f + p * u);
        float poly = ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t;
        float e = exp_nonpositive(-u * u);
        float term = e > 0.0f ? ax * poly * e : 0.0f;  /* beyond |x| ~ 13 erf is 1: also keeps gelu(+inf) = inf */
        y[i] = 0.5f * (xv + ax - term);
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_AVX2_GELU 1

/* The same formula, 8 floats per step with AVX2 + FMA intrinsics (gcc does not vectorize the portable loop for
   AVX2 well: its automatic AVX2 clone measured slower than SSE2). The tail runs the portable loop. */
__attribute__((target("avx2,fma"))) static void gelu_f32_avx2(const float *x, float *y, Py_ssize_t n) {
    const __m256 a1 = _mm256_set1_ps(0.254829592f), a2 = _mm256_set1_ps(-0.284496736f),
                 a3 = _mm256_set1_ps(1.421413741f), a4 = _mm256_set1_ps(-1.453152027f),
                 a5 = _mm256_set1_ps(1.061405429f), p = _mm256_set1_ps(0.3275911f),
                 inv_sqrt2 = _mm256_set1_ps(0.70710678f), one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f),
                 zero = _mm256_setzero_ps(), lowest = _mm256_set1_ps(-87.0f), log2e = _mm256_set1_ps(1.44269504f),
                 ln2_hi = _mm256_set1_ps(0.693145752f), ln2_lo = _mm256_set1_ps(1.42860677e-6f),
                 c2 = _mm256_set1_ps(0.5f), c3 = _mm256_set1_ps(1.0f / 6), c4 = _mm256_set1_ps(1.0f / 24),
                 c5 = _mm256_set1_ps(1.0f / 120), c6 = _mm256_set1_ps(1.0f / 720), c7 = _mm256_set1_ps(1.0f / 5040);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i bias = _mm256_set1_epi32(127);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        __m256 ax = _mm256_andnot_ps(sign, xv);
        __m256 u = _mm256_mul_ps(ax, inv_sqrt2);
        __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(p, u, one));
        __m256 poly = _mm256_fmadd_ps(a5, t, a4);
        poly = _mm256_fmadd_ps(poly, t, a3);
        poly = _mm256_fmadd_ps(poly, t, a2);
        poly = _mm256_fmadd_ps(poly, t, a1);
        poly = _mm256_mul_ps(poly, t);
        /* e = exp(v), v = -u^2 <= 0, flushed to 0 below -87 */
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(u, u), _mm256_set1_ps(-1.0f));
        __m256 keep = _mm256_cmp_ps(v, lowest, _CMP_GE_OQ);
        v = _mm256_max_ps(v, lowest);
        __m256 kf = _mm256_round_ps(_mm256_mul_ps(v, _mm256_xor_ps(log2e, sign)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  /* k = round(-v log2e) */
        __m256 r = _mm256_fmadd_ps(kf, ln2_lo, _mm256_fmadd_ps(kf, ln2_hi, v));
        __m256 e = _mm256_fmadd_ps(c7, r, c6);
        e = _mm256_fmadd_ps(e, r, c5);
        e = _mm256_fmadd_ps(e, r, c4);
        e = _mm256_fmadd_ps(e, r, c3);
        e = _mm256_fmadd_ps(e, r, c2);
        e = _mm256_fmadd_ps(e, r, one);
        e = _mm256_fmadd_ps(e, r, one);
        __m256i bits = _mm256_slli_epi32(_mm256_sub_epi32(bias, _mm256_cvtps_epi32(kf)), 23);  /* 2^-k */
        e = _mm256_and_ps(_mm256_mul_ps(e, _mm256_castsi256_ps(bits)), keep);
        __m256 term = _mm256_mul_ps(_mm256_mul_ps(ax, poly), e);
        term = _mm256_and_ps(term, _mm256_cmp_ps(e, zero, _CMP_GT_OQ));  /* keeps gelu(+inf) = inf */
        _mm256_storeu_ps(y + i, _mm256_mul_ps(half, _mm256_sub_ps(_mm256_add_ps(xv, ax), term)));
    }
    gelu_f32_portable(x + i, y + i, n - i);
}
#endif

void gelu_f32(const float *x, float *y, Py_ssize_t n) {
#ifdef HAVE_AVX2_GELU
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        gelu_f32_avx2(x, y, n);
        return;
    }
#endif
    gelu_f32_portable(x, y, n);
}

static int float_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous%s float32 array", what,
                     writable ? " writable" : "");
        return -1;
    }
    const char *f = view->format;
    if (f && (*f == '=' || *f == '@' || (*f == '<' && PY_LITTLE_ENDIAN)))
        f++;  /* native order, spelled explicitly (numpy's '<f4' arrays) */
    if (view->itemsize != 4 || f == NULL || strcmp(f, "f") != 0) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be float32", what);
        return -1;
    }
    return 0;
}

typedef void (*task_fn)(void *, size_t);
typedef void (*parallelize_fn)(void *, task_fn, void *, size_t, uint32_t);

#define GELU_CHUNK 8192  /* floats per pool task: a multiple of the vector width, 32 KiB in and out */

struct gelu_job {
    const float *x;
    float *y;
    Py_ssize_t n;
};

static void gelu_chunk(void *ctx, size_t index) {
    const struct gelu_job *j = ctx;
    Py_ssize_t start = (Py_ssize_t)index * GELU_CHUNK;
    Py_ssize_t len = j->n - start < GELU_CHUNK ? j->n - start : GELU_CHUNK;
    gelu_f32(j->x + start, j->y + start, len);
}

static PyObject *gelu(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *src, *dst;
    unsigned long long parallelize = 0, pool = 0;
    if (!PyArg_ParseTuple(args, "OO|KK:gelu", &src, &dst, &parallelize, &pool))
        return NULL;
    if (pool && !parallelize) {
        PyErr_SetString(PyExc_ValueError, "gelu: a pool needs the address of its pthreadpool_parallelize_1d");
        return NULL;
    }
    Py_buffer in, out;
    if (float_buffer(src, &in, 0, "gelu's input") != 0)
        return NULL;
    if (float_buffer(dst, &out, 1, "gelu's output") != 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    if (in.len != out.len) {
        PyErr_Format(PyExc_ValueError, "gelu: input has %zd bytes, output %zd", in.len, out.len);
        PyBuffer_Release(&in);
        PyBuffer_Release(&out);
        return NULL;
    }
    struct gelu_job j = {(const float *)in.buf, (float *)out.buf, in.len / 4};
    size_t chunks = (size_t)((j.n + GELU_CHUNK - 1) / GELU_CHUNK);
    Py_BEGIN_ALLOW_THREADS
    if (pool && chunks > 1)
        ((parallelize_fn)(uintptr_t)parallelize)((void *)(uintptr_t)pool, gelu_chunk, &j, chunks, 0);
    else
        gelu_f32(j.x, j.y, j.n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

#define TILE 16  /* a 16 x 16 float tile: 1 KiB read, 1 KiB written, both in L1 */

/* out[b, c, r] = src[b, r, c] * scale (or a plain copy when !scaled): one IEEE single multiply per element, the
 * same operation numpy's multiply does, so the result is bit-identical to multiplying the transposed view. */
static void transpose_scale_f32(const float *src, float *out, Py_ssize_t batch, Py_ssize_t rows, Py_ssize_t cols,
                                float scale, int scaled) {
    for (Py_ssize_t b = 0; b < batch; b++) {
        const float *s = src + b * rows * cols;
        float *o = out + b * rows * cols;
        for (Py_ssize_t r0 = 0; r0 < rows; r0 += TILE) {
            Py_ssize_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
            for (Py_ssize_t c0 = 0; c0 < cols; c0 += TILE) {
                Py_ssize_t c1 = c0 + TILE < cols ? c0 + TILE : cols;
                if (scaled) {
                    for (Py_ssize_t c = c0; c < c1; c++)
                        for (Py_ssize_t r = r0; r < r1; r++)
                            o[c * rows + r] = s[r * cols + c] * scale;
                } else {
                    for (Py_ssize_t c = c0; c < c1; c++)
                        for (Py_ssize_t r = r0; r < r1; r++)
                            o[c * rows + r] = s[r * cols + c];
                }
            }
        }
    }
}

static PyObject *transpose_scale(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *src, *dst, *scale_obj = Py_None;
    Py_ssize_t batch, rows, cols;
    if (!PyArg_ParseTuple(args, "OOnnn|O:transpose_scale", &src, &dst, &batch, &rows, &cols, &scale_obj))
        return NULL;
    float scale = 1.0f;
    int scaled = scale_obj != Py_None;
    if (scaled) {
        double v = PyFloat_AsDouble(scale_obj);
        if (v == -1.0 && PyErr_Occurred())
            return NULL;
        scale = (float)v;  /* the caller passes a float32 value: exact */
    }
    if (batch < 0 || rows < 0 || cols < 0 || (rows && cols && batch > PY_SSIZE_T_MAX / 4 / rows / cols)) {
        PyErr_Format(PyExc_ValueError, "transpose_scale: bad sizes %zd x %zd x %zd", batch, rows, cols);
        return NULL;
    }
    Py_buffer in, out;
    if (float_buffer(src, &in, 0, "transpose_scale's input") != 0)
        return NULL;
    if (float_buffer(dst, &out, 1, "transpose_scale's output") != 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    Py_ssize_t n = batch * rows * cols;
    if (in.len != n * 4 || out.len != n * 4) {
        PyErr_Format(PyExc_ValueError, "transpose_scale: %zd x %zd x %zd floats, got %zd and %zd bytes", batch,
                     rows, cols, in.len, out.len);
        PyBuffer_Release(&in);
        PyBuffer_Release(&out);
        return NULL;
    }
    if ((const char *)in.buf < (const char *)out.buf + out.len && (const char *)out.buf < (const char *)in.buf + in.len) {
        PyBuffer_Release(&in);  /* the caller falls back to numpy, which copies through a temporary */
        PyBuffer_Release(&out);
        Py_RETURN_FALSE;
    }
    Py_BEGIN_ALLOW_THREADS
    transpose_scale_f32((const float *)in.buf, (float *)out.buf, batch, rows, cols, scale, scaled);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    Py_RETURN_TRUE;
}


/* A host segment that only moves data (reshapes, transposes, slices, concatenations): each row copies ``count``
 * runs of ``len`` elements, run c from src[src_off + c * src_step] to dst[dst_off + c * len]. */
void copy_rows(char *const *base, const int64_t *t, Py_ssize_t rows, Py_ssize_t isz) {
    for (Py_ssize_t r = 0; r < rows; r++, t += COPY_ROW) {
        const char *s = base[t[0]] + t[2] * isz;
        char *d = base[t[1]] + t[3] * isz;
        int64_t count = t[4], len = t[5], step = t[6] * isz;
        size_t bytes = (size_t)(len * isz);
        if (len == 1 && isz == 4) {
            for (int64_t k = 0; k < count; k++, s += step, d += 4)
                memcpy(d, s, 4);
        } else {
            for (int64_t k = 0; k < count; k++, s += step, d += bytes)
                memcpy(d, s, bytes);
        }
    }
}

/* copy_runs' checks: 1 with ``views`` / ``base`` filled (``*got`` views held, release them) when every run lies in
 * its buffers and no destination shares memory with another array, 0 when declined, -1 with an exception set;
 * ``*total``: the elements the table copies (saturating). */
int copy_runs_check(PyObject *seq, Py_ssize_t n_src, const Py_buffer *table, Py_ssize_t isz, Py_buffer *views,
                    char **base, Py_ssize_t *got, Py_ssize_t *total) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    *got = 0;
    *total = 0;
    if (n > COPY_MAX_SLOTS || n_src < 0 || n_src > n || (isz != 1 && isz != 2 && isz != 4 && isz != 8)) {
        PyErr_Format(PyExc_ValueError, "copy_runs: %zd arrays (%zd sources), item size %zd", n, n_src, isz);
        return -1;
    }
    Py_ssize_t rows = table->len / (Py_ssize_t)(COPY_ROW * sizeof(int64_t));
    const int64_t *t = table->buf;
    if (table->len % (Py_ssize_t)(COPY_ROW * sizeof(int64_t)) != 0) {
        PyErr_SetString(PyExc_ValueError, "copy_runs: the table is not rows of 7 int64");
        return -1;
    }
    for (; *got < n; (*got)++) {
        int flags = PyBUF_C_CONTIGUOUS | (*got >= n_src ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, *got), &views[*got], flags) != 0) {
            PyErr_Clear(); /* not a C-contiguous (writable) buffer: declined, numpy handles or explains it */
            return 0;
        }
        base[*got] = views[*got].buf;
        if (views[*got].itemsize != isz) {
            (*got)++;
            return 0;
        }
    }
    for (Py_ssize_t r = 0; r < rows; r++) { /* every run inside its buffers, or nothing is copied */
        const int64_t *w = t + r * COPY_ROW;
        if (w[0] < 0 || w[0] >= n_src || w[1] < n_src || w[1] >= n || w[4] < 1 || w[5] < 1 || w[2] < 0 ||
            w[3] < 0 || w[2] > PY_SSIZE_T_MAX / 4 || w[3] > PY_SSIZE_T_MAX / 4 || w[4] > PY_SSIZE_T_MAX / 8 / w[5] ||
            w[6] > PY_SSIZE_T_MAX / 8 / w[4] || w[6] < -(PY_SSIZE_T_MAX / 8 / w[4])) {
            PyErr_Format(PyExc_ValueError, "copy_runs: bad row %zd", r);
            return -1;
        }
        int64_t s_last = w[2] + (w[4] - 1) * w[6], s_lo = w[2] < s_last ? w[2] : s_last;
        int64_t s_hi = (w[2] > s_last ? w[2] : s_last) + w[5];
        int64_t d_hi = w[3] + w[4] * w[5];
        if (*total < PY_SSIZE_T_MAX / 16)
            *total += w[4] * w[5]; /* elements copied (saturating: only compared with a small threshold) */
        if (s_lo < 0 || s_hi > views[w[0]].len / isz || d_hi > views[w[1]].len / isz)
            return 0; /* arrays smaller than planned: declined */
    }
    for (Py_ssize_t i = n_src; i < n; i++) /* a destination sharing memory with any other array: numpy does it */
        for (Py_ssize_t j = 0; j < n; j++)
            if (j != i && base[i] < base[j] + views[j].len && base[j] < base[i] + views[i].len)
                return 0;
    return 1;
}

static PyObject *copy_runs(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *arrays, *table_obj;
    Py_ssize_t n_src, isz;
    if (!PyArg_ParseTuple(args, "OnOn:copy_runs", &arrays, &n_src, &table_obj, &isz))
        return NULL;
    PyObject *seq = PySequence_Fast(arrays, "copy_runs: arrays must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_buffer table;
    if (PyObject_GetBuffer(table_obj, &table, PyBUF_C_CONTIGUOUS) != 0) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_buffer views[COPY_MAX_SLOTS];
    char *base[COPY_MAX_SLOTS];
    Py_ssize_t got = 0, total = 0;
    int ok = copy_runs_check(seq, n_src, &table, isz, views, base, &got, &total);
    if (ok == 1) {
        Py_ssize_t rows = table.len / (Py_ssize_t)(COPY_ROW * sizeof(int64_t));
        if (total * isz < (1 << 16)) { /* a few microseconds at most: not worth releasing the GIL */
            copy_rows(base, table.buf, rows, isz);
        } else {
            Py_BEGIN_ALLOW_THREADS
            copy_rows(base, table.buf, rows, isz);
            Py_END_ALLOW_THREADS
        }
    }
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyBuffer_Release(&table);
    Py_DECREF(seq);
    if (ok < 0)
        return NULL;
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"gelu", gelu, METH_VARARGS,
     "gelu(x, out[, parallelize, pool]): exact GELU of a float32 buffer into out (same length), in chunks on a "
     "pthreadpool when given one (parallelize: the address of its pthreadpool_parallelize_1d)."},
    {"transpose_scale", transpose_scale, METH_VARARGS,
     "transpose_scale(src, out, batch, rows, cols[, scale]): out[b, c, r] = src[b, r, c] (* scale, a float32 "
     "value), C-contiguous float32 buffers of batch * rows * cols floats; False (nothing written) when they "
     "overlap, else True."},
    {"copy_runs", copy_runs, METH_VARARGS,
     "copy_runs(arrays, n_src, table, itemsize): the copies of a data-moving host segment; arrays: its sources "
     "(the first n_src) then destinations, C-contiguous; table: int64 rows (src, dst, src_off, dst_off, count, "
     "len, src_step) in elements; False (nothing copied) when an array is not such a buffer of the item size, is "
     "smaller than the table needs, or a destination shares memory with another array."},
    {"copy_runs_plan", copy_runs_plan, METH_VARARGS,
     "copy_runs_plan(arrays, n_src, table, itemsize) -> copy_runs bound to these arrays as a step of a direct call's "
     "chain (a capsule), or None when copy_runs would decline them (see _kernels_bound.c)."},
    {"gelu_plan", gelu_plan, METH_VARARGS,
     "gelu_plan(x, out) -> gelu(x, out) bound to these arrays as a step of a direct call's chain (a capsule), or "
     "None when they are not C-contiguous float32 arrays of one length (see _kernels_bound.c)."},
    {"copy_plan", copy_plan, METH_VARARGS,
     "copy_plan(src, dst) -> dst[...] = src bound to these arrays as a step of a direct call's chain (a capsule): "
     "src any strided view, dst C-contiguous, writable, of src's shape and format; None otherwise or when they "
     "share memory (see _kernels_bound.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
