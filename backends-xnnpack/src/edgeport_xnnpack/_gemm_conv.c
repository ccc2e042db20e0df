/* edgeport_xnnpack._gemm, float32 dense convolution part: conv_packed and conv_isa (see below).
 *
 * Debian's 2022 libXNNPACK runs float32 convolutions on AVX-512 CPUs with its 7x16 igemm micro-kernel (one zmm of
 * output channels, 7 accumulators: FMA latency is not hidden), where ExecuTorch's 2025 XNNPACK runs a 7x32 one (14
 * accumulators); ResNet-18's 3x3 convolutions take 1.25-1.7x ExecuTorch's time in the 2022 library on this kind of
 * host. conv_packed is a stand-in for the newer kernel: the same indirect GEMM (each output pixel reads, for every
 * kernel tap in (ky, kx) order, the input pixel's channels -- or a zero row where the tap falls in the padding),
 * each output element accumulated as libXNNPACK does -- bias, then one fused multiply-add per (tap, channel) in
 * that order -- then clamped (max with lo, min with hi), so its results are bit-identical to libXNNPACK's.
 *
 * AVX-512: 7 pixels x 32 channels per micro-kernel call; AVX2 + FMA: 6 x 16. The filter is packed once at load as
 * [ceil(n/NR)][taps][c][NR] floats (zero-padded), the bias as ceil(n/NR)*NR; the taps' input offsets (in floats
 * from the input's start, -1: padding) as [ceil(m/MR)][taps][MR], the last tile's missing pixels repeating its last
 * pixel, so the kernel only adds the input pointer. Work items: one panel of NR channels x a block of pixel tiles,
 * on the executor's pool. A large filter is read in chunks of taps shared by a group of tiles (partial sums kept
 * between chunks: the same fused multiply-adds in the same order, so the same bits) with the next chunk prefetched,
 * so memory delivers it while the FMA units work instead of stalling them at each panel's first tile.
 */
#include "_gemm_common.h"
#include <math.h>
#include <stdatomic.h>

#ifndef CONV_ITEMS_PER_THREAD
#define CONV_ITEMS_PER_THREAD 16
#endif
/* a packed filter up to this size is split by pixels between threads (it stays in each core's cache), a larger
   one by output channels, and read in chunks (below) */
#define CONV_LARGE_FILTER_BYTES (1 << 20)
/* a larger filter comes from memory (a network's filters together outgrow the last-level cache): up to CONV_GROUP
   tiles go through a panel's filter one chunk of about CONV_CHUNK_BYTES at a time, while the next chunk is
   prefetched into L2 (ResNet-18's last 3x3 convolutions, 576 KB per panel: 17% less time, AMD EPYC) */
#ifndef CONV_GROUP
#define CONV_GROUP 8
#endif
#ifndef CONV_CHUNK_BYTES
#define CONV_CHUNK_BYTES (64 << 10)
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CONV_GEMM 1

struct conv_job {
    const float *x, *w, *bias, *zero;
    const int64_t *offsets;
    float *out;
    Py_ssize_t m, taps, c, n, mr, nr, tiles_per_item, row_items, panels, chunk_taps;
    int pixel_major, prefetch;
    float lo, hi;
    int64_t last; /* the largest valid offset: x_len - c */
    _Atomic int bad; /* an offset outside [-1, last] was met (its row read as zeros; the call raises) */
};

/* every offset is checked where it is used (in parallel, on data the kernel reads anyway): one outside the input
   reads the zero row instead and marks the job bad */
#define CONV_PTRS(MR)                                                                                      \
    const float *a[MR];                                                                                    \
    for (int r = 0; r < MR; r++) {                                                                         \
        int64_t o = off[r];                                                                                \
        if (__builtin_expect(o < -1 || o > j->last, 0)) {                                                  \
            atomic_store_explicit((_Atomic int *)&j->bad, 1, memory_order_relaxed);                        \
            o = -1;                                                                                        \
        }                                                                                                  \
        a[r] = o < 0 ? j->zero : x + o;                                                                    \
    }                                                                                                      \
    off += MR;

/* the lines of the filter chunk the next pass reads, fetched into L2 a few at a time while this pass computes
   (every `every` iterations of the channel loop, one 64-byte line, until `end`) */
struct conv_pf {
    const char *at, *end;
    Py_ssize_t every, count;
};

/* the channel loop of one tap, with `BODY` per channel i; while a prefetch stream is open, one line of it every
   `every` channels (counters in registers) */
#define CONV_CHANNELS(BODY)                                                                                \
    if (pfa < pfe) {                                                                                       \
        for (Py_ssize_t i = 0; i < c; i++) {                                                               \
            BODY                                                                                           \
            if (--count == 0) {                                                                            \
                count = every;                                                                             \
                if (pfa < pfe) {                                                                           \
                    _mm_prefetch(pfa, _MM_HINT_T1);                                                        \
                    pfa += 64;                                                                             \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    } else {                                                                                               \
        for (Py_ssize_t i = 0; i < c; i++) {                                                               \
            BODY                                                                                           \
        }                                                                                                  \
    }

#define CONV_FMA7                                                                                          \
    __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);                                         \
    w += 32;                                                                                               \
    __m512 v = _mm512_set1_ps(a[0][i]);                                                                    \
    c00 = _mm512_fmadd_ps(v, w0, c00);                                                                     \
    c01 = _mm512_fmadd_ps(v, w1, c01);                                                                     \
    v = _mm512_set1_ps(a[1][i]);                                                                           \
    c10 = _mm512_fmadd_ps(v, w0, c10);                                                                     \
    c11 = _mm512_fmadd_ps(v, w1, c11);                                                                     \
    v = _mm512_set1_ps(a[2][i]);                                                                           \
    c20 = _mm512_fmadd_ps(v, w0, c20);                                                                     \
    c21 = _mm512_fmadd_ps(v, w1, c21);                                                                     \
    v = _mm512_set1_ps(a[3][i]);                                                                           \
    c30 = _mm512_fmadd_ps(v, w0, c30);                                                                     \
    c31 = _mm512_fmadd_ps(v, w1, c31);                                                                     \
    v = _mm512_set1_ps(a[4][i]);                                                                           \
    c40 = _mm512_fmadd_ps(v, w0, c40);                                                                     \
    c41 = _mm512_fmadd_ps(v, w1, c41);                                                                     \
    v = _mm512_set1_ps(a[5][i]);                                                                           \
    c50 = _mm512_fmadd_ps(v, w0, c50);                                                                     \
    c51 = _mm512_fmadd_ps(v, w1, c51);                                                                     \
    v = _mm512_set1_ps(a[6][i]);                                                                           \
    c60 = _mm512_fmadd_ps(v, w0, c60);                                                                     \
    c61 = _mm512_fmadd_ps(v, w1, c61);

#define CONV_FMA6                                                                                          \
    __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);                                          \
    w += 16;                                                                                               \
    __m256 v = _mm256_broadcast_ss(a[0] + i);                                                              \
    c00 = _mm256_fmadd_ps(v, w0, c00);                                                                     \
    c01 = _mm256_fmadd_ps(v, w1, c01);                                                                     \
    v = _mm256_broadcast_ss(a[1] + i);                                                                     \
    c10 = _mm256_fmadd_ps(v, w0, c10);                                                                     \
    c11 = _mm256_fmadd_ps(v, w1, c11);                                                                     \
    v = _mm256_broadcast_ss(a[2] + i);                                                                     \
    c20 = _mm256_fmadd_ps(v, w0, c20);                                                                     \
    c21 = _mm256_fmadd_ps(v, w1, c21);                                                                     \
    v = _mm256_broadcast_ss(a[3] + i);                                                                     \
    c30 = _mm256_fmadd_ps(v, w0, c30);                                                                     \
    c31 = _mm256_fmadd_ps(v, w1, c31);                                                                     \
    v = _mm256_broadcast_ss(a[4] + i);                                                                     \
    c40 = _mm256_fmadd_ps(v, w0, c40);                                                                     \
    c41 = _mm256_fmadd_ps(v, w1, c41);                                                                     \
    v = _mm256_broadcast_ss(a[5] + i);                                                                     \
    c50 = _mm256_fmadd_ps(v, w0, c50);                                                                     \
    c51 = _mm256_fmadd_ps(v, w1, c51);

/* one micro-kernel call: pixels r0.. of the output against panel p, reading `taps` rows of `c` floats per pixel
   at x + off[tap][row] (-1: the zero row) */

__attribute__((target("avx512f"))) static void conv_7x32(const struct conv_job *j, const float *x, const int64_t *off,
                                                          Py_ssize_t ta, Py_ssize_t tb, Py_ssize_t c, Py_ssize_t r0,
                                                          Py_ssize_t p, float *part, struct conv_pf *pf) {
    const Py_ssize_t c0 = p * 32;
    const float *w = j->w + (p * j->taps + ta) * c * 32;
    __m512 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, c60, c61;
    if (ta == 0) {
        __m512 b0 = _mm512_loadu_ps(j->bias + c0), b1 = _mm512_loadu_ps(j->bias + c0 + 16);
        c00 = c10 = c20 = c30 = c40 = c50 = c60 = b0;
        c01 = c11 = c21 = c31 = c41 = c51 = c61 = b1;
    } else {
        c00 = _mm512_loadu_ps(part), c01 = _mm512_loadu_ps(part + 16), c10 = _mm512_loadu_ps(part + 32);
        c11 = _mm512_loadu_ps(part + 48), c20 = _mm512_loadu_ps(part + 64), c21 = _mm512_loadu_ps(part + 80);
        c30 = _mm512_loadu_ps(part + 96), c31 = _mm512_loadu_ps(part + 112), c40 = _mm512_loadu_ps(part + 128);
        c41 = _mm512_loadu_ps(part + 144), c50 = _mm512_loadu_ps(part + 160), c51 = _mm512_loadu_ps(part + 176);
        c60 = _mm512_loadu_ps(part + 192), c61 = _mm512_loadu_ps(part + 208);
    }
    const char *pfa = pf->at, *pfe = pf->end;
    Py_ssize_t every = pf->every, count = pf->count;
    for (Py_ssize_t t = ta; t < tb; t++) {
        CONV_PTRS(7)
        CONV_CHANNELS(CONV_FMA7)
    }
    pf->at = pfa;
    pf->count = count;
    __m512 acc[7][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}, {c60, c61}};
    if (tb < j->taps) { /* a partial sum: the next chunk of taps goes on from it */
        for (int r = 0; r < 7; r++) {
            _mm512_storeu_ps(part + r * 32, acc[r][0]);
            _mm512_storeu_ps(part + r * 32 + 16, acc[r][1]);
        }
        return;
    }
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    Py_ssize_t cols = j->n - c0 < 32 ? j->n - c0 : 32;
    __mmask16 m0 = (__mmask16)(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u);
    __mmask16 m1 = (__mmask16)(cols >= 32 ? 0xFFFFu : cols > 16 ? (1u << (cols - 16)) - 1u : 0u);
    for (Py_ssize_t r = 0; r < 7 && r0 + r < j->m; r++) {
        float *o = j->out + (r0 + r) * j->n + c0;
        _mm512_mask_storeu_ps(o, m0, _mm512_min_ps(_mm512_max_ps(acc[r][0], lo), hi));
        _mm512_mask_storeu_ps(o + 16, m1, _mm512_min_ps(_mm512_max_ps(acc[r][1], lo), hi));
    }
}

__attribute__((target("avx2,fma"))) static void conv_6x16(const struct conv_job *j, const float *x, const int64_t *off,
                                                           Py_ssize_t ta, Py_ssize_t tb, Py_ssize_t c, Py_ssize_t r0,
                                                           Py_ssize_t p, float *part, struct conv_pf *pf) {
    const Py_ssize_t c0 = p * 16;
    const float *w = j->w + (p * j->taps + ta) * c * 16;
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (ta == 0) {
        __m256 b0 = _mm256_loadu_ps(j->bias + c0), b1 = _mm256_loadu_ps(j->bias + c0 + 8);
        c00 = c10 = c20 = c30 = c40 = c50 = b0;
        c01 = c11 = c21 = c31 = c41 = c51 = b1;
    } else {
        c00 = _mm256_loadu_ps(part), c01 = _mm256_loadu_ps(part + 8), c10 = _mm256_loadu_ps(part + 16);
        c11 = _mm256_loadu_ps(part + 24), c20 = _mm256_loadu_ps(part + 32), c21 = _mm256_loadu_ps(part + 40);
        c30 = _mm256_loadu_ps(part + 48), c31 = _mm256_loadu_ps(part + 56), c40 = _mm256_loadu_ps(part + 64);
        c41 = _mm256_loadu_ps(part + 72), c50 = _mm256_loadu_ps(part + 80), c51 = _mm256_loadu_ps(part + 88);
    }
    const char *pfa = pf->at, *pfe = pf->end;
    Py_ssize_t every = pf->every, count = pf->count;
    for (Py_ssize_t t = ta; t < tb; t++) {
        CONV_PTRS(6)
        CONV_CHANNELS(CONV_FMA6)
    }
    pf->at = pfa;
    pf->count = count;
    __m256 acc[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (tb < j->taps) { /* a partial sum: the next chunk of taps goes on from it */
        for (int r = 0; r < 6; r++) {
            _mm256_storeu_ps(part + r * 16, acc[r][0]);
            _mm256_storeu_ps(part + r * 16 + 8, acc[r][1]);
        }
        return;
    }
    const __m256 lo = _mm256_set1_ps(j->lo), hi = _mm256_set1_ps(j->hi);
    Py_ssize_t cols = j->n - c0 < 16 ? j->n - c0 : 16;
    for (Py_ssize_t r = 0; r < 6 && r0 + r < j->m; r++) {
        float *o = j->out + (r0 + r) * j->n + c0;
        __m256 v0 = _mm256_min_ps(_mm256_max_ps(acc[r][0], lo), hi);
        __m256 v1 = _mm256_min_ps(_mm256_max_ps(acc[r][1], lo), hi);
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

/* taps [ta, tb) of tile t against panel p: from the bias (ta == 0) or the partial sum in `part`, to `part` (tb <
   taps) or clamped into the output */
static void conv_tile(const struct conv_job *j, Py_ssize_t t, Py_ssize_t p, Py_ssize_t ta, Py_ssize_t tb,
                      float *part, struct conv_pf *pf) {
    const int64_t *off = j->offsets + (t * j->taps + ta) * j->mr;
    if (j->mr == 7)
        conv_7x32(j, j->x, off, ta, tb, j->c, t * 7, p, part, pf);
    else
        conv_6x16(j, j->x, off, ta, tb, j->c, t * 6, p, part, pf);
}

/* item = (panel, block of pixel tiles): pixel-major (a thread's contiguous share of the items is a band of output
   pixels, all channels, as in the previous and next convolutions) or panel-major (a share is a set of panels: each
   thread streams only its part of a filter too big to stay in its cache) */
static void conv_item(void *ctx, size_t index) {
    const struct conv_job *j = ctx;
    Py_ssize_t p, block;
    if (j->pixel_major) {
        block = (Py_ssize_t)index / j->panels;
        p = (Py_ssize_t)index % j->panels;
    } else {
        p = (Py_ssize_t)index / j->row_items;
        block = (Py_ssize_t)index % j->row_items;
    }
    Py_ssize_t tiles = (j->m + j->mr - 1) / j->mr, t0 = block * j->tiles_per_item;
    Py_ssize_t t1 = t0 + j->tiles_per_item < tiles ? t0 + j->tiles_per_item : tiles;
    /* up to CONV_GROUP tiles go through the panel's filter one chunk of taps at a time (partial sums in `part`):
       a chunk is read from memory once and from cache by the group's other tiles -- the same fused multiply-adds in
       the same order, so the same bits as one pass per tile */
    float part[CONV_GROUP * 7 * 32];
    const Py_ssize_t row = j->c * j->nr, nt = j->chunk_taps * row;
    const float *wend = j->w + j->panels * j->taps * row;
    for (Py_ssize_t g = t0; g < t1; g += CONV_GROUP) {
        Py_ssize_t g1 = g + CONV_GROUP < t1 ? g + CONV_GROUP : t1;
        for (Py_ssize_t ta = 0; ta < j->taps; ta += j->chunk_taps) {
            Py_ssize_t tb = ta + j->chunk_taps < j->taps ? ta + j->chunk_taps : j->taps;
            /* the next chunk: this panel's next taps, its first ones again for the next group, or the next panel's */
            const float *next = j->w + (p * j->taps + (tb < j->taps ? tb : g1 < t1 ? 0 : j->taps)) * row;
            Py_ssize_t lines = (Py_ssize_t)(nt * sizeof(float) / 64);
            Py_ssize_t per_tile = (lines + (g1 - g) - 1) / (g1 - g), iters = (tb - ta) * j->c;
            struct conv_pf pf = {(const char *)next, (const char *)(next + nt < wend ? next + nt : wend),
                                 per_tile > 0 && iters / per_tile > 0 ? iters / per_tile : 1, 1};
            if (!j->prefetch)
                pf.end = pf.at;
            for (Py_ssize_t t = g; t < g1; t++)
                conv_tile(j, t, p, ta, tb, part + (t - g) * 7 * 32, &pf);
        }
    }
}
#endif

/* 2: AVX-512 (7x32; also HostFullyConnected's level), 1: AVX2 + FMA (6x16), 0: neither (or not built for this
   architecture) */
int gemm_isa_level(void) {
#ifdef CONV_GEMM
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 1;
#endif
    return 0;
}

PyObject *conv_isa(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args)) { return PyLong_FromLong(gemm_isa_level()); }

int conv_add_constants(PyObject *module) {
    if (PyModule_AddIntConstant(module, "CONV_LARGE_FILTER_BYTES", CONV_LARGE_FILTER_BYTES) < 0)
        return -1;
    return PyModule_AddIntConstant(module, "CONV_CHUNK_BYTES", CONV_CHUNK_BYTES);
}

PyObject *conv_packed(PyObject *Py_UNUSED(module), PyObject *args) {
    unsigned long long parallelize, pool;
    PyObject *x_obj, *w_obj, *b_obj, *zero_obj, *off_obj, *out_obj;
    Py_ssize_t x_len, m, taps, c, n, threads;
    int level;
    double lo, hi;
    if (!PyArg_ParseTuple(args, "KKiOnOOOOOnnnnddn:conv_packed", &parallelize, &pool, &level, &x_obj, &x_len, &w_obj,
                          &b_obj, &zero_obj, &off_obj, &out_obj, &m, &taps, &c, &n, &lo, &hi, &threads))
        return NULL;
#ifndef CONV_GEMM
    PyErr_SetString(PyExc_RuntimeError, "conv_packed: not built for this CPU architecture");
    return NULL;
#else
    if (level < 1 || level > gemm_isa_level()) {
        PyErr_Format(PyExc_RuntimeError, "conv_packed: kernel level %d is not available on this CPU (it runs %d)",
                     level, gemm_isa_level());
        return NULL;
    }
    Py_ssize_t mr = level == 2 ? 7 : 6, nr = level == 2 ? 32 : 16;
    if (m < 1 || taps < 1 || c < 1 || n < 1 || threads < 1 || x_len < c || taps > PY_SSIZE_T_MAX / c / nr
            || m > PY_SSIZE_T_MAX / n || m > PY_SSIZE_T_MAX / taps - mr) {
        PyErr_Format(PyExc_ValueError, "conv_packed: bad sizes m=%zd taps=%zd c=%zd n=%zd threads=%zd", m, taps, c, n,
                     threads);
        return NULL;
    }
    if (pool && !parallelize) {
        PyErr_SetString(PyExc_ValueError, "conv_packed: null pthreadpool_parallelize_1d address");
        return NULL;
    }
    if (isnan(lo) || isnan(hi) || lo > hi) {
        PyErr_Format(PyExc_ValueError, "conv_packed: bad output range (%g, %g)", lo, hi);
        return NULL;
    }
    Py_ssize_t panels = (n + nr - 1) / nr, tiles = (m + mr - 1) / mr;
    Py_buffer x, w, b, zero, off, out;
    Py_buffer *held[6] = {&x, &w, &b, &zero, &off, &out};
    int got = 0;
    if (typed_buffer(x_obj, &x, 0, x_len, "f", 4, "conv_packed: input") < 0)
        goto fail;
    got++;
    if (typed_buffer(w_obj, &w, 0, panels * taps * c * nr, "f", 4, "conv_packed: packed filter") < 0)
        goto fail;
    got++;
    if (typed_buffer(b_obj, &b, 0, panels * nr, "f", 4, "conv_packed: packed bias") < 0)
        goto fail;
    got++;
    if (typed_buffer(zero_obj, &zero, 0, c, "f", 4, "conv_packed: zero row") < 0)
        goto fail;
    got++;
    if (typed_buffer(off_obj, &off, 0, tiles * taps * mr, sizeof(long) == 8 ? "l" : "q", 8,
                     "conv_packed: tap offsets (int64)") < 0)
        goto fail;
    got++;
    if (typed_buffer(out_obj, &out, 1, m * n, "f", 4, "conv_packed: output") < 0)
        goto fail;
    got++;
    const int64_t *offsets = off.buf;
    /* a filter that stays in cache: one pass per tile; a larger one: chunks of taps, the next one prefetched */
    int large = panels * taps * c * nr * (Py_ssize_t)sizeof(float) > CONV_LARGE_FILTER_BYTES;
    Py_ssize_t chunk_taps = large ? CONV_CHUNK_BYTES / (c * nr * (Py_ssize_t)sizeof(float)) : taps;
    struct conv_job j = {x.buf, w.buf, b.buf, zero.buf, offsets, out.buf, m, taps, c, n, mr, nr, tiles, 1, panels,
                         chunk_taps < 1 ? 1 : chunk_taps, 0, large, (float)lo, (float)hi, (int64_t)(x_len - c), 0};
    size_t items = (size_t)panels;
    if (pool && threads > 1) {
        /* ~CONV_ITEMS_PER_THREAD items per thread, each one panel x a block of pixel tiles: small enough that a
           thread that starts late (or is preempted) leaves little for the others to wait for */
        Py_ssize_t want = CONV_ITEMS_PER_THREAD * threads, blocks = (want + panels - 1) / panels;
        blocks = blocks < tiles ? blocks : tiles;
        j.tiles_per_item = (tiles + blocks - 1) / blocks;
        j.row_items = (tiles + j.tiles_per_item - 1) / j.tiles_per_item;
        items = (size_t)(panels * j.row_items);
        j.pixel_major = !large;
    }
    Py_BEGIN_ALLOW_THREADS
    if (pool && threads > 1 && items > 1)
        ((parallelize_fn)(uintptr_t)parallelize)((void *)(uintptr_t)pool, conv_item, &j, items, 0);
    else
        for (size_t i = 0; i < items; i++)
            conv_item(&j, i);
    Py_END_ALLOW_THREADS
    if (atomic_load(&j.bad)) {
        Py_ssize_t i = 0;
        while (i < tiles * taps * mr - 1 && offsets[i] >= -1 && offsets[i] <= x_len - c)
            i++;
        PyErr_Format(PyExc_ValueError, "conv_packed: tap offset %lld outside an input of %zd floats (the output is "
                     "not valid)", (long long)offsets[i], x_len);
        goto fail;
    }
    for (int i = 0; i < got; i++)
        PyBuffer_Release(held[i]);
    Py_RETURN_NONE;
fail:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(held[i]);
    return NULL;
#endif
}
