/* Bound steps of edgeport_xnnpack._kernels for a direct call's chain (_step.h, edgeport_xnnpack._glue.Chain).
 *
 * gelu_plan(x, out): gelu(x, out) on these two C-contiguous float32 arrays of one length, in one thread.
 * copy_plan(src, dst): dst[...] = src, what numpy's assignment of a view does for two arrays of one format:
 *   src any strided view (a transposed head split), dst C-contiguous and writable, of src's shape; the elements are
 *   moved in C order, bytes unchanged. None (the caller keeps numpy's call) when the arrays do not fit these rules,
 *   have more than COPY_MAX_DIMS dims, or share memory (numpy copies through a temporary then).
 * copy_runs_plan(arrays, n_src, table, itemsize): copy_runs (a data-moving host segment) with its checks done once.
 * The addresses, shape and strides are read from the arrays once, when the step is made; the step keeps
 * references to both arrays, so their memory outlives it.
 */
#include "_kernels_bound.h"
#include "_step.h"
#include <string.h>

#define COPY_MAX_DIMS 8

static const char *plain_format(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (*f == '=' || *f == '@' || (*f == '<' && PY_LITTLE_ENDIAN))
        f++;
    return f;
}

typedef struct {
    edgeport_step base;
    PyObject *held[2];
    const float *x;
    float *y;
    Py_ssize_t n;
} gelu_step;

static int gelu_step_run(edgeport_step *s) {
    gelu_step *g = (gelu_step *)s;
    gelu_f32(g->x, g->y, g->n);
    return 0;
}

static void release_two(PyObject **held, void *step) {
    Py_XDECREF(held[0]);
    Py_XDECREF(held[1]);
    PyMem_Free(step);
}

/* A heap copy of ``step`` (``size`` bytes: an edgeport_step, then held[2] = {a, b}, then its own fields) as a
 * capsule, holding a and b. */
static PyObject *two_array_step(const void *step, size_t size, PyObject *a, PyObject *b) {
    void *p = PyMem_Malloc(size);
    if (p == NULL)
        return PyErr_NoMemory();
    memcpy(p, step, size);
    Py_INCREF(a);
    Py_INCREF(b);
    return edgeport_step_capsule((edgeport_step *)p);
}

static void gelu_step_release(edgeport_step *s) {
    release_two(((gelu_step *)s)->held, s);
}

PyObject *gelu_plan(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *src, *dst;
    if (!PyArg_ParseTuple(args, "OO:gelu_plan", &src, &dst))
        return NULL;
    Py_buffer in, out;
    if (PyObject_GetBuffer(src, &in, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(dst, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
        PyErr_Clear();
        PyBuffer_Release(&in);
        Py_RETURN_NONE;
    }
    int fits = in.itemsize == 4 && out.itemsize == 4 && strcmp(plain_format(&in), "f") == 0 &&
               strcmp(plain_format(&out), "f") == 0 && in.len == out.len;
    gelu_step g = {{gelu_step_run, gelu_step_release}, {src, dst}, in.buf, out.buf, in.len / 4};
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    if (!fits)
        Py_RETURN_NONE;
    return two_array_step(&g, sizeof g, src, dst);
}

typedef struct {
    edgeport_step base;
    PyObject *held[2];
    const char *src;
    char *dst;
    int nd;
    Py_ssize_t itemsize;
    Py_ssize_t shape[COPY_MAX_DIMS], strides[COPY_MAX_DIMS]; /* src's, in bytes */
} copy_step;

/* the innermost dim: a run of elements, one memcpy when they are adjacent in src */
static char *copy_row(const copy_step *c, const char *s, char *d) {
    Py_ssize_t n = c->nd ? c->shape[c->nd - 1] : 1, st = c->nd ? c->strides[c->nd - 1] : c->itemsize;
    Py_ssize_t isz = c->itemsize;
    if (st == isz) {
        memcpy(d, s, (size_t)(n * isz));
        return d + n * isz;
    }
    if (isz == 4) {
        for (Py_ssize_t i = 0; i < n; i++, s += st, d += 4)
            memcpy(d, s, 4);
        return d;
    }
    for (Py_ssize_t i = 0; i < n; i++, s += st, d += isz)
        memcpy(d, s, (size_t)isz);
    return d;
}

static int copy_step_run(edgeport_step *s) {
    copy_step *c = (copy_step *)s;
    int outer = c->nd > 1 ? c->nd - 1 : 0;
    Py_ssize_t rows = 1;
    for (int k = 0; k < outer; k++)
        rows *= c->shape[k];
    Py_ssize_t idx[COPY_MAX_DIMS] = {0};
    const char *src = c->src;
    char *d = c->dst;
    for (Py_ssize_t r = 0; r < rows; r++) {
        d = copy_row(c, src, d);
        for (int k = outer - 1; k >= 0; k--) { /* the next row's index, the source offset updated with it */
            src += c->strides[k];
            if (++idx[k] < c->shape[k])
                break;
            src -= c->strides[k] * c->shape[k];
            idx[k] = 0;
        }
    }
    return 0;
}

static void copy_step_release(edgeport_step *s) {
    release_two(((copy_step *)s)->held, s);
}

PyObject *copy_plan(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *src, *dst;
    if (!PyArg_ParseTuple(args, "OO:copy_plan", &src, &dst))
        return NULL;
    Py_buffer in, out;
    if (PyObject_GetBuffer(src, &in, PyBUF_RECORDS_RO) != 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(dst, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
        PyErr_Clear();
        PyBuffer_Release(&in);
        Py_RETURN_NONE;
    }
    int fits = in.ndim == out.ndim && in.ndim <= COPY_MAX_DIMS && in.itemsize == out.itemsize && in.itemsize > 0 &&
               strcmp(plain_format(&in), plain_format(&out)) == 0 && in.len == out.len && in.len > 0;
    for (int k = 0; fits && k < in.ndim; k++)
        fits = in.shape[k] == out.shape[k];
    if (fits) { /* the bytes src touches must not meet dst's */
        const char *lo = in.buf, *hi = in.buf;
        for (int k = 0; k < in.ndim; k++) {
            Py_ssize_t span = (in.shape[k] - 1) * in.strides[k];
            if (span < 0)
                lo += span;
            else
                hi += span;
        }
        hi += in.itemsize;
        const char *dlo = out.buf, *dhi = (const char *)out.buf + out.len;
        fits = !(lo < dhi && dlo < hi);
    }
    copy_step c = {{copy_step_run, copy_step_release}, {src, dst}, in.buf, out.buf, in.ndim, in.itemsize, {0}, {0}};
    for (int k = 0; fits && k < in.ndim; k++) {
        c.shape[k] = in.shape[k];
        c.strides[k] = in.strides[k];
    }
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    if (!fits)
        Py_RETURN_NONE;
    return two_array_step(&c, sizeof c, src, dst);
}

/* copy_runs_plan(arrays, n_src, table, itemsize): copy_runs on these arrays (a data-moving host segment's), its
 * checks done once; holds the arrays' tuple and the table. */
typedef struct {
    edgeport_step base;
    PyObject *held[2]; /* the arrays' tuple, the table */
    char *bases[COPY_MAX_SLOTS];
    const int64_t *rows_at;
    Py_ssize_t rows, isz, total;
} runs_step;

static int runs_step_run(edgeport_step *s) {
    runs_step *r = (runs_step *)s;
    if (r->total * r->isz < (1 << 16)) {
        copy_rows(r->bases, r->rows_at, r->rows, r->isz);
    } else {
        Py_BEGIN_ALLOW_THREADS
        copy_rows(r->bases, r->rows_at, r->rows, r->isz);
        Py_END_ALLOW_THREADS
    }
    return 0;
}

static void runs_step_release(edgeport_step *s) {
    release_two(((runs_step *)s)->held, s);
}

PyObject *copy_runs_plan(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *arrays, *table_obj;
    Py_ssize_t n_src, isz;
    if (!PyArg_ParseTuple(args, "OnOn:copy_runs_plan", &arrays, &n_src, &table_obj, &isz))
        return NULL;
    PyObject *seq = PySequence_Tuple(arrays); /* held by the step: its items cannot change */
    if (seq == NULL)
        return NULL;
    Py_buffer table;
    if (PyObject_GetBuffer(table_obj, &table, PyBUF_C_CONTIGUOUS) != 0) {
        Py_DECREF(seq);
        return NULL;
    }
    runs_step *r = PyMem_Calloc(1, sizeof(runs_step));
    if (r == NULL) {
        PyBuffer_Release(&table);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_buffer views[COPY_MAX_SLOTS];
    Py_ssize_t got = 0;
    int ok = copy_runs_check(seq, n_src, &table, isz, views, r->bases, &got, &r->total);
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    r->rows_at = table.buf;
    r->rows = table.len / (Py_ssize_t)(COPY_ROW * sizeof(int64_t));
    r->isz = isz;
    PyBuffer_Release(&table); /* the table is held below: its buffer stays where it is */
    if (ok != 1) {
        PyMem_Free(r);
        Py_DECREF(seq);
        if (ok < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    r->base.run = runs_step_run;
    r->base.release = runs_step_release;
    r->held[0] = seq;
    Py_INCREF(table_obj);
    r->held[1] = table_obj;
    return edgeport_step_capsule(&r->base);
}
