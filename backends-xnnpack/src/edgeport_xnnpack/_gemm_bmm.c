/* edgeport_xnnpack._gemm.bmm: small batch matrix products (the attention's scores and weighted values of a decode
 * step) on strided float32 views, for the executor's host segments.
 *
 * bmm(a, b, out[, lo, hi[, scale]]) -> bool
 *   out[..., m, n] = clamp(a[..., m, k] @ (b[..., k, n] * scale), lo, hi) with numpy matmul's batch broadcasting
 *   (b * scale rounded element by element, as if materialized: the attention's K^T times its scale; leading
 *   dims of size 1 or missing broadcast); a and b are any float32 arrays of rank >= 2 (views: a transposed key
 *   cache, a head split, a size-1 dim broadcast), out is C-contiguous and writable. False (nothing written) when
 *   the operands do not fit these rules, or out shares memory with a or b: the caller runs numpy then.
 *
 * bmm_plan(a, b, out[, lo, hi[, scale]]) -> a bound step (see _step.h) of the same product on these very arrays
 *   (scale: a float, or a float32 array of one element read on every run), or None when bmm would refuse them.
 *
 * Why: numpy's matmul costs ~2-5 us of dispatch per call plus OpenBLAS's per-call set-up per batch element (a
 * 1 x 64 x 128 product is ~100 ns of arithmetic); the executor also caps OpenBLAS to one thread around it. Here the
 * whole batch is one call, without the GIL. Three loops: rows of b^T contiguous (a key cache read as K^T: dot
 * products, 8 columns at once), rows of b contiguous (the value cache: a broadcast row of a times rows of b, the
 * 64 output columns at a time in registers), else a scalar loop. The sums run in another order than OpenBLAS's, so
 * results agree with numpy's to float32 rounding (checked in tests/test_host_bmm.py), not bit for bit.
 */
#include "_gemm_common.h"
#include "_step.h"
#include <math.h>

#define BMM_MAX_DIMS 8
#define BMM_GIL_MACS (1 << 16) /* a bound product this large runs without the GIL */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BMM_X86 1
#endif

/* one product: c[m, n] (contiguous) = a[m, k] (strides sa_m, sa_k) @ (b[k, n] * s) (strides sb_k, sb_n; in
   floats); each element of b is rounded times s before its multiply-add, as if b * s were materialized */
typedef void (*product_fn)(const float *, Py_ssize_t, Py_ssize_t, const float *, Py_ssize_t, Py_ssize_t, float *,
                           Py_ssize_t, Py_ssize_t, Py_ssize_t, float);

static void product_portable(const float *a, Py_ssize_t sa_m, Py_ssize_t sa_k, const float *b, Py_ssize_t sb_k,
                             Py_ssize_t sb_n, float *c, Py_ssize_t m, Py_ssize_t k, Py_ssize_t n, float s) {
    for (Py_ssize_t i = 0; i < m; i++) {
        float *row = c + i * n;
        for (Py_ssize_t j = 0; j < n; j++)
            row[j] = 0.0f;
        for (Py_ssize_t p = 0; p < k; p++) {
            float x = a[i * sa_m + p * sa_k];
            const float *bp = b + p * sb_k;
            for (Py_ssize_t j = 0; j < n; j++) {
                float y = bp[j * sb_n] * s;
                row[j] += x * y;
            }
        }
    }
}

#ifdef BMM_X86
__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the 8 sums of s0..s7 (each a vector of 8 partial sums) as one vector */
__attribute__((target("avx2,fma"))) static inline __m256 hsum8x8(__m256 s0, __m256 s1, __m256 s2, __m256 s3,
                                                                 __m256 s4, __m256 s5, __m256 s6, __m256 s7) {
    __m256 t0 = _mm256_hadd_ps(s0, s1), t1 = _mm256_hadd_ps(s2, s3), t2 = _mm256_hadd_ps(s4, s5),
           t3 = _mm256_hadd_ps(s6, s7);
    t0 = _mm256_hadd_ps(t0, t1);  /* [0 1 2 3 | 0 1 2 3]: low and high halves' sums */
    t2 = _mm256_hadd_ps(t2, t3);  /* [4 5 6 7 | 4 5 6 7] */
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t2, 0x20), _mm256_permute2f128_ps(t0, t2, 0x31));
}

/* sb_k == 1 and sa_k == 1: c[i, j] = dot(a row i, b column j), both contiguous in k; 8 columns at a time */
__attribute__((target("avx2,fma"))) static void product_dot(const float *a, Py_ssize_t sa_m, Py_ssize_t sa_k,
                                                            const float *b, Py_ssize_t sb_k, Py_ssize_t sb_n,
                                                            float *c, Py_ssize_t m, Py_ssize_t k, Py_ssize_t n,
                                                            float scale) {
    Py_ssize_t k8 = k & ~(Py_ssize_t)7;
    const __m256 sv = _mm256_set1_ps(scale);
    for (Py_ssize_t i = 0; i < m; i++) {
        const float *x = a + i * sa_m;
        float *row = c + i * n;
        Py_ssize_t j = 0;
        if (k8 == k) {
            for (; j + 8 <= n; j += 8) {
                const float *bj = b + j * sb_n;
                __m256 s[8];
                for (int v = 0; v < 8; v++)
                    s[v] = _mm256_setzero_ps();
                for (Py_ssize_t p = 0; p < k; p += 8) {
                    __m256 xv = _mm256_loadu_ps(x + p);
                    for (int v = 0; v < 8; v++)
                        s[v] = _mm256_fmadd_ps(xv, _mm256_mul_ps(_mm256_loadu_ps(bj + v * sb_n + p), sv), s[v]);
                }
                _mm256_storeu_ps(row + j, hsum8x8(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]));
            }
        }
        for (; j < n; j++) {
            const float *b0 = b + j * sb_n;
            __m256 s0 = _mm256_setzero_ps();
            for (Py_ssize_t p = 0; p < k8; p += 8)
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + p), _mm256_mul_ps(_mm256_loadu_ps(b0 + p), sv), s0);
            float t0 = hsum8(s0);
            for (Py_ssize_t p = k8; p < k; p++) {
                float y = b0[p] * scale;
                t0 += x[p] * y;
            }
            row[j] = t0;
        }
    }
}

/* sb_n == 1: c[i, :] = sum_p a[i, p] * b[p, :], rows of b contiguous; 64 output columns at a time in registers */
__attribute__((target("avx2,fma"))) static void product_rows(const float *a, Py_ssize_t sa_m, Py_ssize_t sa_k,
                                                             const float *b, Py_ssize_t sb_k, Py_ssize_t sb_n,
                                                             float *c, Py_ssize_t m, Py_ssize_t k, Py_ssize_t n,
                                                             float scale) {
    const __m256 sv = _mm256_set1_ps(scale);
    for (Py_ssize_t i = 0; i < m; i++) {
        const float *x = a + i * sa_m;
        float *row = c + i * n;
        Py_ssize_t j = 0;
        for (; j + 64 <= n; j += 64) {
            __m256 acc[8];
            for (int v = 0; v < 8; v++)
                acc[v] = _mm256_setzero_ps();
            for (Py_ssize_t p = 0; p < k; p++) {
                __m256 xv = _mm256_set1_ps(x[p * sa_k]);
                const float *bp = b + p * sb_k + j;
                for (int v = 0; v < 8; v++)
                    acc[v] = _mm256_fmadd_ps(xv, _mm256_mul_ps(_mm256_loadu_ps(bp + 8 * v), sv), acc[v]);
            }
            for (int v = 0; v < 8; v++)
                _mm256_storeu_ps(row + j + 8 * v, acc[v]);
        }
        for (; j + 8 <= n; j += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (Py_ssize_t p = 0; p < k; p++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(x[p * sa_k]), _mm256_mul_ps(_mm256_loadu_ps(b + p * sb_k + j), sv),
                                      acc);
            _mm256_storeu_ps(row + j, acc);
        }
        for (; j < n; j++) {
            float t = 0.0f;
            for (Py_ssize_t p = 0; p < k; p++) {
                float y = b[p * sb_k + j] * scale;
                t += x[p * sa_k] * y;
            }
            row[j] = t;
        }
    }
}
#endif

static int avx2_fma(void) {
#ifdef BMM_X86
    static int level = -1;
    if (level < 0)
        level = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return level;
#else
    return 0;
#endif
}

static product_fn pick(Py_ssize_t sa_k, Py_ssize_t sb_k, Py_ssize_t sb_n) {
#ifdef BMM_X86
    if (avx2_fma()) {
        if (sa_k == 1 && sb_k == 1)
            return product_dot;
        if (sb_n == 1)
            return product_rows;
    }
#endif
    return product_portable;
}

/* a float32 view: shape and strides in floats; 0 when not float32 or a stride is not a whole number of floats */
static int float_view(PyObject *obj, Py_buffer *v, int writable) {
    int flags = PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) != 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = v->format;
    if (f && (*f == '=' || *f == '@' || (*f == '<' && PY_LITTLE_ENDIAN)))
        f++;
    int ok = v->itemsize == 4 && f && strcmp(f, "f") == 0 && v->ndim >= 2 && v->ndim <= BMM_MAX_DIMS;
    for (int d = 0; ok && d < v->ndim; d++)
        ok = v->strides[d] % 4 == 0;
    if (!ok)
        PyBuffer_Release(v);
    return ok;
}

/* the byte range [lo, hi) a view touches (an empty view touches nothing) */
static void extent(const Py_buffer *v, const char **lo, const char **hi) {
    const char *l = v->buf, *h = v->buf;
    for (int d = 0; d < v->ndim; d++) {
        if (v->shape[d] == 0) {
            *lo = *hi = v->buf;
            return;
        }
        Py_ssize_t span = (v->shape[d] - 1) * v->strides[d];
        if (span < 0)
            l += span;
        else
            h += span;
    }
    *lo = l;
    *hi = h + v->itemsize;
}

/* one product's operands, checked: everything bmm_execute needs (addresses taken from the views) */
typedef struct {
    const float *a, *b;
    float *c;
    Py_ssize_t m, k, n, sa_m, sa_k, sb_k, sb_n, batches, c_len;
    int nb;
    Py_ssize_t batch_shape[BMM_MAX_DIMS], a_step[BMM_MAX_DIMS], b_step[BMM_MAX_DIMS];
    float lo, hi;
    int clamp;
    product_fn product;
} bmm_job;

/* 1 and ``j`` filled when the views fit bmm's rules (see the header), else 0 */
static int bmm_prepare(const Py_buffer *a, const Py_buffer *b, const Py_buffer *c, double lo, double hi, bmm_job *j) {
    int nd = c->ndim;
    Py_ssize_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1], n = b->shape[b->ndim - 1];
    int ok = nd == (a->ndim > b->ndim ? a->ndim : b->ndim) && b->shape[b->ndim - 2] == k && c->shape[nd - 2] == m &&
             c->shape[nd - 1] == n && PyBuffer_IsContiguous(c, 'C');
    /* batch dims, aligned from the right: each operand's dim is the output's or 1 (broadcast) */
    j->nb = nd - 2;
    j->batches = 1;
    for (int d = 0; ok && d < j->nb; d++) {
        int da = d - (nd - a->ndim), db = d - (nd - b->ndim);
        Py_ssize_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        j->batch_shape[d] = c->shape[d];
        ok = (sa == c->shape[d] || sa == 1) && (sb == c->shape[d] || sb == 1);
        j->a_step[d] = da >= 0 && sa != 1 ? a->strides[da] / 4 : 0;
        j->b_step[d] = db >= 0 && sb != 1 ? b->strides[db] / 4 : 0;
        j->batches *= c->shape[d];
    }
    if (ok && c->len > 0) {  /* out must not share memory with an operand (numpy copies through a temporary then) */
        const char *clo = c->buf, *chi = (const char *)c->buf + c->len, *lo_, *hi_;
        extent(a, &lo_, &hi_);
        ok = !(lo_ < chi && clo < hi_);
        extent(b, &lo_, &hi_);
        ok = ok && !(lo_ < chi && clo < hi_);
    }
    if (!ok)
        return 0;
    j->m = m, j->k = k, j->n = n;
    j->sa_m = a->strides[a->ndim - 2] / 4, j->sa_k = a->strides[a->ndim - 1] / 4;
    j->sb_k = b->strides[b->ndim - 2] / 4, j->sb_n = b->strides[b->ndim - 1] / 4;
    j->product = pick(j->sa_k, j->sb_k, j->sb_n);
    j->lo = (float)lo, j->hi = (float)hi;
    j->clamp = j->lo > -INFINITY || j->hi < INFINITY;
    j->a = a->buf, j->b = b->buf, j->c = c->buf, j->c_len = c->len;
    return 1;
}

/* the products of a prepared job (no Python API: may run without the GIL) */
static void bmm_execute(const bmm_job *j, float scale) {
    if (j->c_len == 0)
        return;
    Py_ssize_t m = j->m, k = j->k, n = j->n;
    Py_ssize_t idx[BMM_MAX_DIMS] = {0};
    Py_ssize_t a_off = 0, b_off = 0;
    for (Py_ssize_t t = 0; t < j->batches; t++) {
        float *dst = j->c + t * m * n;
        if (k == 0)
            memset(dst, 0, (size_t)(m * n) * sizeof(float));
        else
            j->product(j->a + a_off, j->sa_m, j->sa_k, j->b + b_off, j->sb_k, j->sb_n, dst, m, k, n, scale);
        if (j->clamp)
            for (Py_ssize_t e = 0; e < m * n; e++) {
                float v = dst[e] < j->lo ? j->lo : dst[e];
                dst[e] = v > j->hi ? j->hi : v;
            }
        for (int d = j->nb - 1; d >= 0; d--) {  /* next batch index, offsets updated incrementally */
            a_off += j->a_step[d];
            b_off += j->b_step[d];
            if (++idx[d] < j->batch_shape[d])
                break;
            a_off -= j->a_step[d] * j->batch_shape[d];
            b_off -= j->b_step[d] * j->batch_shape[d];
            idx[d] = 0;
        }
    }
}

/* the three views of bmm's operands, or 0 (nothing held) when one is not a float32 view bmm takes */
static int bmm_views(PyObject *a_obj, PyObject *b_obj, PyObject *out_obj, Py_buffer *a, Py_buffer *b, Py_buffer *c) {
    if (!float_view(a_obj, a, 0))
        return 0;
    if (!float_view(b_obj, b, 0)) {
        PyBuffer_Release(a);
        return 0;
    }
    if (!float_view(out_obj, c, 1)) {
        PyBuffer_Release(a);
        PyBuffer_Release(b);
        return 0;
    }
    return 1;
}

static int bad_range(double lo, double hi) {
    if (isnan(lo) || isnan(hi) || lo > hi) {
        PyErr_Format(PyExc_ValueError, "bmm: bad output range (%g, %g)", lo, hi);
        return 1;
    }
    return 0;
}

PyObject *bmm(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *a_obj, *b_obj, *out_obj;
    double lo = -INFINITY, hi = INFINITY, scale = 1.0;
    if (!PyArg_ParseTuple(args, "OOO|ddd:bmm", &a_obj, &b_obj, &out_obj, &lo, &hi, &scale))
        return NULL;
    if (bad_range(lo, hi))
        return NULL;
    Py_buffer a, b, c;
    if (!bmm_views(a_obj, b_obj, out_obj, &a, &b, &c))
        Py_RETURN_FALSE;
    bmm_job j;
    int ok = bmm_prepare(&a, &b, &c, lo, hi, &j);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        bmm_execute(&j, (float)scale);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&c);
    if (ok)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* A bound product (bmm_plan): the job, and references to the arrays whose memory it reads and writes. */
typedef struct {
    edgeport_step base;
    bmm_job job;
    PyObject *held[4]; /* a, b, out, the scale array (or NULL) */
    const float *scale_at; /* the scale read on every run, or NULL: ``scale`` */
    float scale;
} bmm_step;

static int bmm_step_run(edgeport_step *s) {
    bmm_step *p = (bmm_step *)s;
    float scale = p->scale_at != NULL ? *p->scale_at : p->scale;
    if (p->job.batches * p->job.m * p->job.n * (p->job.k + 1) > BMM_GIL_MACS) {
        Py_BEGIN_ALLOW_THREADS
        bmm_execute(&p->job, scale);
        Py_END_ALLOW_THREADS
    } else {
        bmm_execute(&p->job, scale);
    }
    return 0;
}

static void bmm_step_release(edgeport_step *s) {
    bmm_step *p = (bmm_step *)s;
    for (int i = 0; i < 4; i++)
        Py_XDECREF(p->held[i]);
    PyMem_Free(p);
}

PyObject *bmm_plan(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *a_obj, *b_obj, *out_obj, *scale_obj = NULL;
    double lo = -INFINITY, hi = INFINITY, scale = 1.0;
    if (!PyArg_ParseTuple(args, "OOO|ddO:bmm_plan", &a_obj, &b_obj, &out_obj, &lo, &hi, &scale_obj))
        return NULL;
    if (bad_range(lo, hi))
        return NULL;
    const float *scale_at = NULL;
    if (scale_obj != NULL && PyFloat_Check(scale_obj)) {
        scale = PyFloat_AS_DOUBLE(scale_obj);
        scale_obj = NULL;
    } else if (scale_obj != NULL) { /* a float32 array of one element, read on every run */
        Py_buffer sv;
        if (PyObject_GetBuffer(scale_obj, &sv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        const char *f = sv.format ? sv.format : "B";
        if (*f == '=' || *f == '@' || (*f == '<' && PY_LITTLE_ENDIAN))
            f++;
        int fits = sv.itemsize == 4 && strcmp(f, "f") == 0 && sv.len == 4;
        scale_at = sv.buf;
        PyBuffer_Release(&sv);
        if (!fits)
            Py_RETURN_NONE;
    }
    Py_buffer a, b, c;
    if (!bmm_views(a_obj, b_obj, out_obj, &a, &b, &c))
        Py_RETURN_NONE;
    bmm_job j;
    int ok = bmm_prepare(&a, &b, &c, lo, hi, &j);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&c);
    if (!ok)
        Py_RETURN_NONE;
    bmm_step *p = PyMem_Calloc(1, sizeof(bmm_step));
    if (p == NULL)
        return PyErr_NoMemory();
    p->base.run = bmm_step_run;
    p->base.release = bmm_step_release;
    p->job = j;
    p->scale_at = scale_at;
    p->scale = (float)scale;
    PyObject *held[4] = {a_obj, b_obj, out_obj, scale_obj};
    for (int i = 0; i < 4; i++) {
        Py_XINCREF(held[i]);
        p->held[i] = held[i];
    }
    return edgeport_step_capsule(&p->base);
}
