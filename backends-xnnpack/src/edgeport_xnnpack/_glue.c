/* edgeport_xnnpack._glue: the per-call work around one XNNPACK runtime or channel-shuffle operator, in C.
 *
 * ``Binding.run(arrays)`` takes one buffer per external value, checks each (C-contiguous, exact byte size,
 * writable for outputs), stages an input whose last EXTRA bytes would cross into the next page in a padded
 * copy (XNNPACK may read, never write, that far past an input), re-runs XNNPACK's setup only when a pointer
 * changed, and invokes with the GIL released.  The buffers stay exported (locked against resizing) for the
 * duration of the call and are released before it returns; no reference to them is kept.
 *
 * A call marks the binding busy before anything that can run Python code (iterating ``arrays``, exporting a
 * buffer) and until every buffer is released again, so another thread (or code run by the call itself) gets
 * "already running" from ``run``, and ``close`` / ``expect`` refuse; nothing of a call in progress is touched.
 * The channel-shuffle kind moves ``element_size``-byte elements (4: ``..._nc_x32``, 1: ``..._nc_x8``; the
 * caller passes the matching setup function).
 *
 * The operator kind drives any one-input, one-output operator set up as ``setup(op, batch, input, output, pool)``
 * and run by ``xnn_run_operator`` (a float32 fully connected layer: ``xnn_setup_fully_connected_nc_f32``); its
 * input and output may differ in size.  Several bindings may share one operator (one packed filter, set up at
 * each binding's own batch size and buffers): they then share a ``shared`` cell (a bytearray of 16 bytes) in which
 * the binding that last set the operator up leaves its mark, so a binding whose setup another one replaced sets
 * up again; the second word marks the operator as running, refusing overlapping calls through any of them.
 *
 * The library functions are passed in as addresses (from the ctypes handles edgeport_xnnpack.native opened),
 * so this module links against nothing but libc.  Status codes are turned into exceptions by the ``check``
 * callable the caller supplies (``check(call_name, status)`` raises).  The pure-Python path in
 * ``edgeport_xnnpack._native_run`` does the same work when this extension is not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "_step.h"

int chain_add_type(PyObject *module); /* _chain.c */

typedef struct {
    uint32_t id;
    void *data;
} external_value; /* struct xnn_external_value */

typedef int (*setup_runtime_fn)(void *, size_t, const external_value *);
typedef int (*invoke_runtime_fn)(void *);
typedef int (*setup_shuffle_fn)(void *, size_t, const void *, void *, void *);
typedef int (*run_operator_fn)(void *, void *);

enum { KIND_RUNTIME = 0, KIND_SHUFFLE = 1, KIND_OPERATOR = 2 };
#define SHARED_BYTES (2 * sizeof(uintptr_t)) /* the shared cell: [binding that set up last, busy] */
#define MAX_SLOTS 4096
/* an invoke whose last call took less than this runs with the GIL held: releasing and taking it back costs ~0.1-0.2
   us, a noticeable part of a call of a few microseconds, and another thread waits at most this long */
#define GIL_KEEP_NS 20000LL
#define MAX_EXTRA (1 << 20) /* bytes XNNPACK may read past an input; keeps size and address sums far from overflow */

typedef struct {
    PyObject_HEAD
    int kind;
    void *handle; /* xnn_runtime_t or xnn_operator_t; NULL once closed */
    void *setup_fn;
    void *run_fn;
    void *pool;
    size_t batch;
    Py_ssize_t element_size; /* channel shuffle: bytes per element (1 or 4) */
    Py_ssize_t n;
    external_value *ext;
    void **next; /* per slot: the address this call binds; copied to ext only once every check has passed */
    Py_ssize_t *nbytes;
    char *is_output;
    void **stage; /* padded staging copies of inputs near a page end (malloc'd on demand) */
    Py_buffer *views;
    char *fmt;        /* per slot: expected struct format character (e.g. 'f'), 0 = bytes only */
    Py_ssize_t *ndim; /* per slot: expected rank when fmt is set */
    Py_ssize_t **shape; /* per slot: expected dims when fmt is set */
    size_t extra;
    size_t page;
    int valid; /* the last setup succeeded with the pointers in ext */
    int busy;  /* a call is in progress (possibly in another thread, the GIL released) */
    long long setups;
    long long setup_ns; /* wall time inside the library's setup calls, summed */
    long long run_ns;   /* wall time inside the library's invoke / run calls, summed */
    long long last_ns;  /* the last invoke / run call's wall time (0: none yet) */
    PyObject *check;
    PyObject *shared; /* operator kind: a bytearray shared by the bindings of one operator, or NULL */
} Binding;

/* The shared cell's two words, or NULL when there is no cell or someone shrank the bytearray (checked per use). */
static uintptr_t *shared_words(Binding *self) {
    if (self->shared == NULL || PyByteArray_GET_SIZE(self->shared) < (Py_ssize_t)SHARED_BYTES) return NULL;
    return (uintptr_t *)PyByteArray_AS_STRING(self->shared);
}

/* Forget this binding's mark in the shared cell (it is closed or freed: another binding allocated at the same
 * address must not take the operator's setup for its own). */
static void shared_forget(Binding *self) {
    uintptr_t *w = shared_words(self);
    if (w != NULL && w[0] == (uintptr_t)self) w[0] = 0;
}

static void binding_free_memory(Binding *self) {
    if (self->stage) {
        for (Py_ssize_t i = 0; i < self->n; i++) free(self->stage[i]);
    }
    if (self->shape) {
        for (Py_ssize_t i = 0; i < self->n; i++) PyMem_Free(self->shape[i]);
    }
    PyMem_Free(self->fmt);
    PyMem_Free(self->ndim);
    PyMem_Free(self->shape);
    self->fmt = NULL;
    self->ndim = NULL;
    self->shape = NULL;
    PyMem_Free(self->ext);
    PyMem_Free(self->next);
    self->next = NULL;
    PyMem_Free(self->nbytes);
    PyMem_Free(self->is_output);
    PyMem_Free(self->stage);
    PyMem_Free(self->views);
    self->ext = NULL;
    self->nbytes = NULL;
    self->is_output = NULL;
    self->stage = NULL;
    self->views = NULL;
}

static int Binding_traverse(Binding *self, visitproc visit, void *arg) {
    Py_VISIT(self->check);
    Py_VISIT(self->shared);
    return 0;
}

static int Binding_clear(Binding *self) {
    Py_CLEAR(self->check);
    shared_forget(self);
    Py_CLEAR(self->shared);
    return 0;
}

static void Binding_dealloc(Binding *self) {
    PyObject_GC_UnTrack(self);
    binding_free_memory(self);
    Py_CLEAR(self->check);
    shared_forget(self);
    Py_CLEAR(self->shared);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ``*out`` = the address ``o`` (an int; None is NULL); returns -1 with TypeError set when it is not one. */
static int as_pointer(PyObject *o, const char *what, void **out) {
    *out = NULL;
    if (o == Py_None) return 0;
    void *p = PyLong_AsVoidPtr(o);
    if (p == NULL && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s must be an address (int)", what);
        return -1;
    }
    *out = p;
    return 0;
}

/* A tuple of the items of ``o`` (a new reference), or NULL with TypeError(``message``): unlike
 * ``PySequence_Fast``, which hands a list back as is, its items cannot change (nor be freed) while code run by
 * the caller (``__bool__``, another thread) mutates the caller's list. */
static PyObject *as_tuple(PyObject *o, const char *message) {
    PyObject *seq = PySequence_Fast(o, message);
    if (seq == NULL || !PyList_Check(seq)) return seq;
    PyObject *t = PyList_AsTuple(seq);
    Py_DECREF(seq);
    return t;
}

/* ``expect(slot, format_char, dims)``: from now on the buffer at ``slot`` must also have this struct format
 * (e.g. "f" for float32; byte-order prefixes '<', '=', '@' accepted) and these dims. */
static PyObject *Binding_expect(Binding *self, PyObject *args) {
    Py_ssize_t i;
    PyObject *fmt, *dims;
    if (self->ext == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Binding is not initialized");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "cannot change the expectations of an XNNPACK runtime while it runs");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "nUO", &i, &fmt, &dims)) return NULL;
    if (i < 0 || i >= self->n || PyUnicode_GetLength(fmt) != 1) {
        PyErr_SetString(PyExc_ValueError, "expect(slot, format character, dims): bad slot or format");
        return NULL;
    }
    Py_UCS4 c = PyUnicode_ReadChar(fmt, 0);
    PyObject *d = as_tuple(dims, "dims must be a sequence");
    if (d == NULL) return NULL;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(d);
    if (c == 0 || c > 127 || nd > 64) {
        Py_DECREF(d);
        PyErr_SetString(PyExc_ValueError, "expect: bad format character or rank");
        return NULL;
    }
    Py_ssize_t *shape = PyMem_Calloc((size_t)(nd ? nd : 1), sizeof(Py_ssize_t));
    if (shape == NULL) {
        Py_DECREF(d);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < nd; k++) {
        shape[k] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(d, k));
        if (shape[k] == -1 && PyErr_Occurred()) {
            Py_DECREF(d);
            PyMem_Free(shape);
            return NULL;
        }
    }
    Py_DECREF(d);
    if (self->busy) { /* iterating dims ran Python code: a call may have started meanwhile */
        PyMem_Free(shape);
        PyErr_SetString(PyExc_RuntimeError, "cannot change the expectations of an XNNPACK runtime while it runs");
        return NULL;
    }
    PyMem_Free(self->shape[i]);
    self->shape[i] = shape;
    self->fmt[i] = (char)c;
    self->ndim[i] = nd;
    Py_RETURN_NONE;
}

/* Whether view ``v`` has slot ``i``'s expected format and dims (always true without an expectation). */
static int matches_expect(Binding *self, Py_ssize_t i, const Py_buffer *v) {
    if (!self->fmt[i]) return 1;
    const char *f = v->format ? v->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (f[0] != self->fmt[i] || f[1] != 0 || v->ndim != self->ndim[i]) return 0;
    if (v->ndim > 0 && v->shape == NULL) return 0; /* an exporter that ignored PyBUF_ND: never dereference */
    for (Py_ssize_t k = 0; k < v->ndim; k++)
        if (v->shape[k] != self->shape[i][k]) return 0;
    return 1;
}

static int Binding_init(Binding *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kind", "handle", "setup", "run", "ids", "nbytes", "outputs", "extra", "page",
                             "check", "pool", "batch", "element_size", "shared", NULL};
    int kind;
    PyObject *handle, *setup, *run, *ids, *nbytes, *outputs, *check, *pool = Py_None, *shared = Py_None;
    Py_ssize_t extra, page, batch = 0, element_size = 4;
    if (self->ext != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Binding is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOOOOOOnnO|On$nO", kwlist, &kind, &handle, &setup, &run, &ids,
                                     &nbytes, &outputs, &extra, &page, &check, &pool, &batch, &element_size,
                                     &shared))
        return -1;
    if (kind != KIND_RUNTIME && kind != KIND_SHUFFLE && kind != KIND_OPERATOR) {
        PyErr_SetString(PyExc_ValueError, "kind must be 0 (runtime), 1 (channel shuffle) or 2 (operator)");
        return -1;
    }
    if (shared != Py_None && (kind != KIND_OPERATOR || !PyByteArray_CheckExact(shared) ||
                              PyByteArray_GET_SIZE(shared) < (Py_ssize_t)SHARED_BYTES)) {
        PyErr_Format(PyExc_ValueError, "shared must be None or, for an operator, a bytearray of %d bytes",
                     (int)SHARED_BYTES);
        return -1;
    }
    if (!PyCallable_Check(check)) {
        PyErr_SetString(PyExc_TypeError, "check must be callable");
        return -1;
    }
    if (extra < 0 || page <= 0 || batch < 0) {
        PyErr_SetString(PyExc_ValueError, "extra, batch must be >= 0 and page > 0");
        return -1;
    }
    if (extra > MAX_EXTRA) {
        PyErr_Format(PyExc_ValueError, "extra must be at most %d bytes", MAX_EXTRA);
        return -1;
    }
    if (kind == KIND_SHUFFLE ? element_size != 1 && element_size != 4 : element_size != 4) {
        PyErr_Format(PyExc_ValueError, "element_size must be 1 or 4 for a channel shuffle, 4 for a runtime; got %zd",
                     element_size);
        return -1;
    }
    void *h, *setup_fn, *run_fn, *pool_h;
    if (as_pointer(handle, "handle", &h) < 0 || as_pointer(setup, "setup", &setup_fn) < 0 ||
        as_pointer(run, "run", &run_fn) < 0 || as_pointer(pool, "pool", &pool_h) < 0)
        return -1;
    if (!h || !setup_fn || !run_fn) {
        PyErr_SetString(PyExc_ValueError, "handle, setup and run must be non-null addresses");
        return -1;
    }
    /* Everything is read into local tuples and arrays first and stored in self only at the end: the
     * conversions below may run Python code (iteration, __bool__) that mutates the caller's lists or calls this
     * binding's methods, which must keep seeing an uninitialized binding until then. */
    PyObject *ids_f = as_tuple(ids, "ids must be a sequence");
    PyObject *nb_f = ids_f ? as_tuple(nbytes, "nbytes must be a sequence") : NULL;
    PyObject *out_f = nb_f ? as_tuple(outputs, "outputs must be a sequence") : NULL;
    external_value *ext = NULL;
    Py_ssize_t *nbs = NULL, *ndim = NULL, **shape = NULL;
    char *is_output = NULL, *fmt = NULL;
    void **stage = NULL, **next = NULL;
    Py_buffer *views = NULL;
    int ok = 0;
    if (!out_f) goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(ids_f);
    if (PyTuple_GET_SIZE(nb_f) != n || PyTuple_GET_SIZE(out_f) != n) {
        PyErr_SetString(PyExc_ValueError, "ids, nbytes and outputs must have the same length");
        goto done;
    }
    if (n < 0 || n > MAX_SLOTS || (kind != KIND_RUNTIME && n != 2)) {
        PyErr_Format(PyExc_ValueError, "bad number of external values: %zd", n);
        goto done;
    }
    size_t slots = (size_t)(n ? n : 1); /* a runtime may have no external value at all */
    ext = PyMem_Calloc(slots, sizeof(external_value));
    next = PyMem_Calloc(slots, sizeof(void *));
    nbs = PyMem_Calloc(slots, sizeof(Py_ssize_t));
    is_output = PyMem_Calloc(slots, 1);
    stage = PyMem_Calloc(slots, sizeof(void *));
    views = PyMem_Calloc(slots, sizeof(Py_buffer));
    fmt = PyMem_Calloc(slots, 1);
    ndim = PyMem_Calloc(slots, sizeof(Py_ssize_t));
    shape = PyMem_Calloc(slots, sizeof(Py_ssize_t *));
    if (!ext || !next || !nbs || !is_output || !stage || !views || !fmt || !ndim || !shape) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long id = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(ids_f, i));
        if (id == (unsigned long)-1 && PyErr_Occurred()) goto done;
        Py_ssize_t nb = PyLong_AsSsize_t(PyTuple_GET_ITEM(nb_f, i));
        if (nb == -1 && PyErr_Occurred()) goto done;
        int o = PyObject_IsTrue(PyTuple_GET_ITEM(out_f, i));
        if (o < 0) goto done;
        if (id > 0xFFFFFFFFUL || nb < 0) {
            PyErr_Format(PyExc_ValueError, "external value %zd: bad id or byte size", i);
            goto done;
        }
        ext[i].id = (uint32_t)id;
        nbs[i] = nb;
        is_output[i] = (char)o;
    }
    /* A channel shuffle reads and writes the same number of whole elements, into its output only: anything
     * else would let XNNPACK run past a buffer or write into one exported read-only (bytes, say). */
    if (kind == KIND_SHUFFLE &&
        (nbs[0] != nbs[1] || nbs[0] % element_size != 0 || is_output[0] || !is_output[1])) {
        PyErr_SetString(PyExc_ValueError,
                        "a channel shuffle binds an input and an output of the same size in whole elements");
        goto done;
    }
    if (kind == KIND_OPERATOR && (nbs[0] % element_size != 0 || nbs[1] % element_size != 0 || is_output[0] ||
                                  !is_output[1])) {
        PyErr_SetString(PyExc_ValueError, "an operator binds an input and an output, in whole elements");
        goto done;
    }
    if (self->ext != NULL) { /* initialized meanwhile by code the conversions ran */
        PyErr_SetString(PyExc_RuntimeError, "Binding is already initialized");
        goto done;
    }
    self->kind = kind;
    self->handle = h;
    self->setup_fn = setup_fn;
    self->run_fn = run_fn;
    self->pool = pool_h;
    self->n = n;
    self->batch = (size_t)batch;
    self->element_size = element_size;
    self->extra = (size_t)extra;
    self->page = (size_t)page;
    self->ext = ext;
    self->next = next;
    self->nbytes = nbs;
    self->is_output = is_output;
    self->stage = stage;
    self->views = views;
    self->fmt = fmt;
    self->ndim = ndim;
    self->shape = shape;
    self->valid = 0;
    self->busy = 0;
    Py_INCREF(check);
    Py_XSETREF(self->check, check);
    if (shared != Py_None) {
        Py_INCREF(shared);
        Py_XSETREF(self->shared, shared);
    }
    ok = 1;
done:
    Py_XDECREF(ids_f);
    Py_XDECREF(nb_f);
    Py_XDECREF(out_f);
    if (!ok) {
        PyMem_Free(ext);
        PyMem_Free(next);
        PyMem_Free(nbs);
        PyMem_Free(is_output);
        PyMem_Free(stage); /* all NULL: nothing was staged yet */
        PyMem_Free(views);
        PyMem_Free(fmt);
        PyMem_Free(ndim);
        PyMem_Free(shape); /* all NULL: no expectation yet */
    }
    return ok ? 0 : -1;
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int near_page_end(const char *p, size_t nbytes, size_t extra, size_t page) {
    uintptr_t end = (uintptr_t)p + nbytes; /* exclusive; extra <= MAX_EXTRA: no wrap-around */
    return (end - 1) / page != (end - 1 + extra) / page;
}

static void slot_name(Binding *self, Py_ssize_t i, char *name, size_t size) {
    if (self->kind != KIND_RUNTIME)
        snprintf(name, size, "%s", i == 0 ? "input" : "output");
    else
        snprintf(name, size, "%u", (unsigned)self->ext[i].id);
}

/* Raise ValueError saying why buffer ``obj`` cannot be bound at slot ``i`` (the Python path's wording). */
static void bad_buffer(Binding *self, Py_ssize_t i, PyObject *obj) {
    char name[32];
    slot_name(self, i, name, sizeof name);
    Py_buffer probe;
    if (PyObject_GetBuffer(obj, &probe, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "external value %s needs a C-contiguous array of %zd bytes, got %s", name,
                     self->nbytes[i], Py_TYPE(obj)->tp_name);
        return;
    }
    Py_ssize_t len = probe.len, itemsize = probe.itemsize;
    int contiguous = PyBuffer_IsContiguous(&probe, 'C');
    int expected = matches_expect(self, i, &probe);
    PyBuffer_Release(&probe);
    if (!contiguous)
        PyErr_Format(PyExc_ValueError, "external value %s needs a C-contiguous array of %zd bytes, got %s", name,
                     self->nbytes[i], Py_TYPE(obj)->tp_name);
    else if (!expected)
        PyErr_Format(PyExc_ValueError, "external value %s does not have the expected dtype '%c' and shape", name,
                     self->fmt[i]);
    else if (len != self->nbytes[i])
        PyErr_Format(PyExc_ValueError, "external value %s needs a C-contiguous array of %zd bytes, got %zd", name,
                     self->nbytes[i], len);
    else if (self->kind != KIND_RUNTIME && itemsize != self->element_size)
        PyErr_Format(PyExc_ValueError, "%s %d-bit elements",
                     self->kind == KIND_SHUFFLE ? "channel shuffle moves" : "the operator takes",
                     (int)self->element_size * 8);
    else if (self->is_output[i])
        PyErr_Format(PyExc_ValueError, "external output %s is read-only", name);
    else /* the export failed the first time only (an exporter that changed its mind) */
        PyErr_Format(PyExc_ValueError, "external value %s needs a C-contiguous array of %zd bytes, got %s", name,
                     self->nbytes[i], Py_TYPE(obj)->tp_name);
}

static int raise_status(Binding *self, const char *call, int status) {
    if (self->check != NULL) {
        PyObject *r = PyObject_CallFunction(self->check, "si", call, status);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    PyErr_Format(PyExc_RuntimeError, "%s failed with status %d", call, status);
    return -1;
}

/* The library's invoke (a runtime) or run (an operator) call, set up already, without the GIL unless the last one
 * took less than GIL_KEEP_NS; its wall time is added to run_ns. The caller holds the binding busy. */
static int invoke_timed(Binding *self) {
    void *h = self->handle, *fn = self->run_fn, *pool = self->pool;
    int kind = self->kind, status;
    PyThreadState *released = self->last_ns > 0 && self->last_ns < GIL_KEEP_NS ? NULL : PyEval_SaveThread();
    long long t0 = now_ns();
    status = kind == KIND_RUNTIME ? ((invoke_runtime_fn)fn)(h) : ((run_operator_fn)fn)(h, pool);
    long long t1 = now_ns();
    if (released != NULL) PyEval_RestoreThread(released);
    self->run_ns += t1 - t0;
    self->last_ns = t1 > t0 ? t1 - t0 : 1;
    return status;
}

static PyObject *Binding_run(Binding *self, PyObject *arrays) {
    if (self->ext == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Binding is not initialized");
        return NULL;
    }
    if (self->handle == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the runtime or operator was deleted");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "this XNNPACK runtime is already running (calls must not overlap)");
        return NULL;
    }
    /* Busy from here until every view is released: iterating ``arrays`` and exporting or releasing a buffer may
     * run Python code (a generator, and with it a switch to another thread), which must neither start a second
     * call on the shared views, ext and staging buffers nor close the handle under this one. */
    self->busy = 1;
    PyObject *seq = as_tuple(arrays, "arrays must be a sequence"); /* its items stay referenced to the end */
    if (seq == NULL) {
        self->busy = 0;
        return NULL;
    }
    Py_ssize_t n = self->n, got = 0;
    if (PyTuple_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_ValueError, "expected %zd buffers, got %zd", n, PyTuple_GET_SIZE(seq));
        Py_DECREF(seq);
        self->busy = 0;
        return NULL;
    }
    int changed = !self->valid, failed = 0;
    uintptr_t *shared = NULL;
    if (self->shared != NULL) {
        shared = shared_words(self);
        if (shared == NULL || shared[1]) {
            PyErr_SetString(shared == NULL ? PyExc_ValueError : PyExc_RuntimeError,
                            shared == NULL ? "the shared cell was resized"
                                           : "this XNNPACK operator is already running (calls must not overlap)");
            Py_DECREF(seq);
            self->busy = 0;
            return NULL;
        }
        shared[1] = 1; /* until the end of this call: no other binding of the operator starts one */
        if (shared[0] != (uintptr_t)self) changed = 1; /* another binding set the operator up since */
    }
    for (Py_ssize_t i = 0; i < n; i++, got++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        Py_buffer *v = &self->views[i];
        int flags = PyBUF_C_CONTIGUOUS | (self->is_output[i] ? PyBUF_WRITABLE : 0) | (self->fmt[i] ? PyBUF_FORMAT : 0);
        if (PyObject_GetBuffer(item, v, flags) != 0) {
            /* an object that is no fitting buffer becomes our message; anything else (MemoryError,
             * KeyboardInterrupt from a Python exporter) propagates as it is */
            if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_TypeError) ||
                PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyErr_Clear();
                bad_buffer(self, i, item);
            }
            failed = 1;
            break;
        }
        if (v->len != self->nbytes[i] || (self->kind != KIND_RUNTIME && v->itemsize != self->element_size) ||
            (self->is_output[i] && v->readonly) || (v->len > 0 && v->buf == NULL) ||
            !PyBuffer_IsContiguous(v, 'C') || !matches_expect(self, i, v)) {
            PyBuffer_Release(v);
            bad_buffer(self, i, item);
            failed = 1;
            break;
        }
        void *ptr = v->buf;
        if (!self->is_output[i] && v->len > 0 && near_page_end(v->buf, (size_t)v->len, self->extra, self->page)) {
            if (self->stage[i] == NULL) {
                self->stage[i] = calloc(1, (size_t)v->len + self->extra); /* len == nbytes[i] on every call */
                if (self->stage[i] == NULL) {
                    PyBuffer_Release(v);
                    PyErr_NoMemory();
                    failed = 1;
                    break;
                }
            }
            memcpy(self->stage[i], v->buf, (size_t)v->len);
            ptr = self->stage[i];
        }
        self->next[i] = ptr;
    }
    for (Py_ssize_t i = 0; i < got && !failed; i++) /* got == n unless a buffer was refused */
        if (self->next[i] != self->ext[i].data) changed = 1;
    int status = 0;
    const char *call = NULL;
    if (!failed && self->handle == NULL) { /* cannot happen (close refuses while busy); never call through NULL */
        PyErr_SetString(PyExc_RuntimeError, "the runtime or operator was deleted");
        failed = 1;
    }
    if (!failed && changed && self->kind == KIND_RUNTIME) {
        /* an output must not share memory with any other external value: XNNPACK would read what it already
         * overwrote (or write one output over another); inputs may share memory with each other */
        for (Py_ssize_t i = 0; i < n && !failed; i++) {
            if (!self->is_output[i] || self->views[i].len == 0) continue;
            uintptr_t a = (uintptr_t)self->views[i].buf;
            size_t la = (size_t)self->views[i].len;
            for (Py_ssize_t j = 0; j < n; j++) {
                uintptr_t b = (uintptr_t)self->next[j]; /* a staged input: its copy, taken before the call */
                size_t lb = (size_t)self->views[j].len;
                if (j == i || lb == 0 || (j < i && self->is_output[j])) continue; /* each output pair once */
                if (a < b + lb && b < a + la) {
                    PyErr_Format(PyExc_ValueError, "external values %u and %u overlap (an output must have memory "
                                 "of its own)", (unsigned)self->ext[i].id, (unsigned)self->ext[j].id);
                    failed = 1;
                    break;
                }
            }
        }
    }
    if (!failed && changed && self->kind != KIND_RUNTIME) {
        uintptr_t a = (uintptr_t)self->views[0].buf, b = (uintptr_t)self->views[1].buf;
        size_t la = (size_t)self->views[0].len, lb = (size_t)self->views[1].len;
        if (la && lb && a < b + lb && b < a + la) {
            PyErr_SetString(PyExc_ValueError, self->kind == KIND_SHUFFLE ? "channel shuffle input and output overlap"
                                                                         : "operator input and output overlap");
            failed = 1;
        }
    }
    if (!failed) {
        if (changed) {
            self->valid = 0;
            for (Py_ssize_t i = 0; i < n; i++) self->ext[i].data = self->next[i]; /* every check passed */
            call = self->kind == KIND_RUNTIME       ? "xnn_setup_runtime"
                   : self->kind == KIND_OPERATOR    ? "xnn_setup_fully_connected_nc_f32"
                   : self->element_size == 1        ? "xnn_setup_channel_shuffle_nc_x8"
                                                    : "xnn_setup_channel_shuffle_nc_x32";
            if (shared != NULL) shared[0] = 0; /* the operator's setup is nobody's until this one succeeds */
            long long t0 = now_ns();
            if (self->kind == KIND_RUNTIME)
                status = ((setup_runtime_fn)self->setup_fn)(self->handle, (size_t)n, self->ext);
            else
                status = ((setup_shuffle_fn)self->setup_fn)(self->handle, self->batch, self->ext[0].data,
                                                             self->ext[1].data, self->pool);
            self->setup_ns += now_ns() - t0;
            if (status == 0) {
                self->valid = 1;
                self->setups++;
                if (shared != NULL) shared[0] = (uintptr_t)self;
            }
        }
        if (status == 0) {
            call = self->kind == KIND_RUNTIME ? "xnn_invoke_runtime" : "xnn_run_operator";
            status = invoke_timed(self);
        }
    }
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&self->views[i]);
    /* a refused call changed nothing: ext still holds the pointers of the last successful setup */
    if (shared != NULL) shared[1] = 0; /* (the cell is referenced by self: still there) */
    Py_DECREF(seq);
    self->busy = 0;
    if (failed) return NULL;
    if (status != 0) {
        raise_status(self, call, status);
        return NULL;
    }
    if (changed) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* Binding.plan: the binding as a step of a direct call's chain (_step.h, _chain.c). Its run invokes the runtime or
 * operator straight away while nothing changed since it was made (the binding is set up with the very addresses
 * it saw then, no call in progress, the shared operator set up by this binding; an input ``run`` staged in its
 * padded copy is copied there first, as ``run`` does); otherwise it runs ``run`` on the arrays it holds, which checks
 * everything again. The chain checks the caller's arrays before any step runs. */
typedef struct {
    const void *src;
    void *dst;
    size_t len;
} staging; /* an input near a page end, copied into the binding's padded copy before each invoke */

typedef struct {
    edgeport_step base;
    Binding *binding;
    PyObject *arrays; /* the tuple ``run`` takes when the quick way is closed */
    void **ptrs;      /* ext[i].data when the step was made */
    Py_ssize_t n;
    staging *staged;  /* n_staged entries */
    Py_ssize_t n_staged;
} binding_step;

static int binding_step_run(edgeport_step *s) {
    binding_step *p = (binding_step *)s;
    Binding *b = p->binding;
    int quick = b->ext != NULL && b->handle != NULL && !b->busy && b->valid && b->n == p->n;
    for (Py_ssize_t i = 0; quick && i < p->n; i++)
        quick = b->ext[i].data == p->ptrs[i];
    uintptr_t *shared = NULL;
    if (quick && b->shared != NULL) {
        shared = shared_words(b);
        quick = shared != NULL && !shared[1] && shared[0] == (uintptr_t)b;
    }
    if (!quick) {
        PyObject *r = Binding_run(b, p->arrays);
        if (r == NULL) return -1;
        Py_DECREF(r);
        return 0;
    }
    b->busy = 1;
    if (shared != NULL) shared[1] = 1;
    for (Py_ssize_t i = 0; i < p->n_staged; i++)
        memcpy(p->staged[i].dst, p->staged[i].src, p->staged[i].len);
    int status = invoke_timed(b);
    if (shared != NULL) shared[1] = 0;
    b->busy = 0;
    if (status != 0) {
        raise_status(b, b->kind == KIND_RUNTIME ? "xnn_invoke_runtime" : "xnn_run_operator", status);
        return -1;
    }
    return 0;
}

static void binding_step_release(edgeport_step *s) {
    binding_step *p = (binding_step *)s;
    Py_XDECREF((PyObject *)p->binding);
    Py_XDECREF(p->arrays);
    PyMem_Free(p->ptrs);
    PyMem_Free(p->staged);
    PyMem_Free(p);
}

static PyObject *Binding_plan(Binding *self, PyObject *arrays) {
    if (self->ext == NULL || self->handle == NULL || self->busy || !self->valid) Py_RETURN_NONE;
    PyObject *seq = as_tuple(arrays, "arrays must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq), n_staged = 0;
    void **ptrs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(void *));
    staging *staged = PyMem_Calloc((size_t)(n ? n : 1), sizeof(staging));
    if (ptrs == NULL || staged == NULL) {
        PyMem_Free(ptrs);
        PyMem_Free(staged);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    int fits = n == self->n;
    for (Py_ssize_t i = 0; fits && i < n; i++) { /* each array is what the last setup bound, or its staged copy */
        Py_buffer v;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(seq, i), &v, PyBUF_SIMPLE) != 0) {
            PyErr_Clear();
            fits = 0;
            break;
        }
        fits = v.len == self->nbytes[i];
        if (fits && v.len > 0 && v.buf != self->ext[i].data) { /* an input near a page end: its padded copy */
            fits = !self->is_output[i] && self->stage[i] != NULL && self->ext[i].data == self->stage[i] &&
                   near_page_end(v.buf, (size_t)v.len, self->extra, self->page);
            staged[n_staged].src = v.buf;
            staged[n_staged].dst = self->stage[i];
            staged[n_staged].len = (size_t)v.len;
            n_staged += fits;
        }
        PyBuffer_Release(&v);
    }
    /* exporting may have run Python code: the binding must still be as it was */
    fits = fits && self->ext != NULL && self->handle != NULL && !self->busy && self->valid && self->n == n;
    for (Py_ssize_t i = 0; fits && i < n; i++) ptrs[i] = self->ext[i].data;
    if (!fits) {
        PyMem_Free(ptrs);
        PyMem_Free(staged);
        Py_DECREF(seq);
        Py_RETURN_NONE;
    }
    binding_step *p = PyMem_Calloc(1, sizeof(binding_step));
    if (p == NULL) {
        PyMem_Free(ptrs);
        PyMem_Free(staged);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    p->base.run = binding_step_run;
    p->base.release = binding_step_release;
    Py_INCREF(self);
    p->binding = self;
    p->arrays = seq;
    p->ptrs = ptrs;
    p->n = n;
    p->staged = staged;
    p->n_staged = n_staged;
    return edgeport_step_capsule(&p->base);
}

static PyObject *Binding_close(Binding *self, PyObject *Py_UNUSED(ignored)) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "cannot close an XNNPACK runtime while it runs");
        return NULL;
    }
    self->handle = NULL;
    self->valid = 0;
    shared_forget(self);
    Py_RETURN_NONE;
}

static PyObject *Binding_get_setups(Binding *self, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(self->setups);
}

static PyObject *Binding_get_setup_ns(Binding *self, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(self->setup_ns);
}

static PyObject *Binding_get_run_ns(Binding *self, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(self->run_ns);
}

static PyObject *Binding_get_staged(Binding *self, void *Py_UNUSED(closure)) {
    PyObject *out = PyList_New(0);
    if (out == NULL || self->stage == NULL) return out;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        if (self->stage[i] != NULL) {
            PyObject *k = PyLong_FromSsize_t(i);
            if (k == NULL || PyList_Append(out, k) != 0) {
                Py_XDECREF(k);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(k);
        }
    }
    return out;
}

static PyMethodDef Binding_methods[] = {
    {"run", (PyCFunction)Binding_run, METH_O,
     "run(arrays) -> bool: bind one buffer per external value, set up if a pointer changed (returned), run."},
    {"plan", (PyCFunction)Binding_plan, METH_O,
     "plan(arrays) -> this binding on these arrays as a step of a direct call's chain (a capsule), or None when the "
     "last call did not set it up with these very addresses."},
    {"expect", (PyCFunction)Binding_expect, METH_VARARGS,
     "expect(slot, format_char, dims): also require this struct format and these dims at slot."},
    {"close", (PyCFunction)Binding_close, METH_NOARGS,
     "Forget the handle (call before deleting the runtime or operator)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Binding_getset[] = {
    {"setups", (getter)Binding_get_setups, NULL, "how many times setup ran", NULL},
    {"setup_ns", (getter)Binding_get_setup_ns, NULL, "nanoseconds spent inside the library's setup calls", NULL},
    {"run_ns", (getter)Binding_get_run_ns, NULL, "nanoseconds spent inside the library's invoke / run calls", NULL},
    {"staged", (getter)Binding_get_staged, NULL, "slots whose inputs were staged in padded copies", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject BindingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "edgeport_xnnpack._glue.Binding",
    .tp_basicsize = sizeof(Binding),
    .tp_dealloc = (destructor)Binding_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Binding_traverse,
    .tp_clear = (inquiry)Binding_clear,
    .tp_free = PyObject_GC_Del,
    .tp_doc = "Checked external-buffer binding, setup caching and invocation of one XNNPACK runtime/operator.",
    .tp_methods = Binding_methods,
    .tp_getset = Binding_getset,
    .tp_init = (initproc)Binding_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef glue_module = {PyModuleDef_HEAD_INIT, "_glue",
                                         "Per-call glue around XNNPACK runtimes and operators.", -1, NULL};

PyMODINIT_FUNC PyInit__glue(void) {
    if (PyType_Ready(&BindingType) < 0) return NULL;
    PyObject *m = PyModule_Create(&glue_module);
    if (m == NULL) return NULL;
    Py_INCREF(&BindingType);
    if (PyModule_AddObject(m, "Binding", (PyObject *)&BindingType) < 0) {
        Py_DECREF(&BindingType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "KIND_RUNTIME", KIND_RUNTIME) < 0 ||
        PyModule_AddIntConstant(m, "KIND_SHUFFLE", KIND_SHUFFLE) < 0 ||
        PyModule_AddIntConstant(m, "KIND_OPERATOR", KIND_OPERATOR) < 0 || chain_add_type(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
