/* edgeport_xnnpack._glue.Chain: a delegate's direct call on the same arrays as the calls before it, as one call.
 *
 * ``Chain(io, n_in, entries)``; ``chain()`` runs the entries in order: a bound step (a capsule of _step.h: an
 * XNNPACK runtime's binding, a small batch product, GELU, a strided copy) by its C function, anything else (a
 * callable) by calling it with no arguments. ``io`` are the arrays the caller passes (the delegate's inputs, then
 * from ``n_in`` on its outputs): the only arrays the entries touch that another party can reach. Their layout
 * (address, byte size, item size, format, shape, strides; outputs writable) is read when the chain is made and
 * checked again, each one exported as a buffer, before any entry runs: one that changed raises ValueError and
 * nothing runs (the caller then takes its general path, which checks everything). The exports are held until the
 * entries are done, so none of those arrays can be resized under a step that runs without the GIL. A chain runs
 * one call at a time ("already running" otherwise).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "_step.h"

#define CHAIN_MAX_DIMS 64
#define CHAIN_FORMAT 16

typedef struct {
    void *buf;
    Py_ssize_t len, itemsize;
    int ndim;
    Py_ssize_t shape[CHAIN_MAX_DIMS], strides[CHAIN_MAX_DIMS];
    char format[CHAIN_FORMAT];
} layout;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n_io, n_in, n_entries;
    PyObject **io;        /* held */
    layout *layouts;      /* per io array, as it was when the chain was made */
    Py_buffer *views;     /* per io array, during a call */
    PyObject **entries;   /* held: capsules or callables */
    edgeport_step **steps; /* per entry: its step, or NULL for a callable */
    int busy;
} Chain;

/* export ``obj`` as the chain exports io array ``i`` (0 or -1 with the exporter's error) */
static int export_io(Chain *self, Py_ssize_t i, PyObject *obj, Py_buffer *v) {
    int flags = PyBUF_RECORDS_RO | (i >= self->n_in ? PyBUF_WRITABLE : 0);
    return PyObject_GetBuffer(obj, v, flags);
}

static int read_layout(const Py_buffer *v, layout *l) {
    const char *f = v->format ? v->format : "B";
    if (v->ndim > CHAIN_MAX_DIMS || strlen(f) >= CHAIN_FORMAT || (v->ndim > 0 && (!v->shape || !v->strides)))
        return 0;
    memset(l, 0, sizeof *l);
    l->buf = v->buf;
    l->len = v->len;
    l->itemsize = v->itemsize;
    l->ndim = v->ndim;
    for (int k = 0; k < v->ndim; k++) {
        l->shape[k] = v->shape[k];
        l->strides[k] = v->strides[k];
    }
    strcpy(l->format, f);
    return 1;
}

static int same_layout(const Py_buffer *v, const layout *l) {
    const char *f = v->format ? v->format : "B";
    if (v->buf != l->buf || v->len != l->len || v->itemsize != l->itemsize || v->ndim != l->ndim ||
        strcmp(f, l->format) != 0 || (v->ndim > 0 && (!v->shape || !v->strides)))
        return 0;
    for (int k = 0; k < v->ndim; k++)
        if (v->shape[k] != l->shape[k] || v->strides[k] != l->strides[k])
            return 0;
    return 1;
}

static void chain_free(Chain *self) {
    for (Py_ssize_t i = 0; self->io && i < self->n_io; i++)
        Py_CLEAR(self->io[i]);
    for (Py_ssize_t i = 0; self->entries && i < self->n_entries; i++)
        Py_CLEAR(self->entries[i]);
    PyMem_Free(self->io);
    PyMem_Free(self->layouts);
    PyMem_Free(self->views);
    PyMem_Free(self->entries);
    PyMem_Free(self->steps);
    self->io = NULL;
    self->layouts = NULL;
    self->views = NULL;
    self->entries = NULL;
    self->steps = NULL;
    self->n_io = self->n_entries = 0;
}

static int Chain_traverse(Chain *self, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; self->io && i < self->n_io; i++)
        Py_VISIT(self->io[i]);
    for (Py_ssize_t i = 0; self->entries && i < self->n_entries; i++)
        Py_VISIT(self->entries[i]);
    return 0;
}

static int Chain_clear(Chain *self) {
    if (self->busy) /* never free what a call in progress uses; the references go with the chain */
        return 0;
    chain_free(self);
    return 0;
}

static void Chain_dealloc(Chain *self) {
    PyObject_GC_UnTrack(self);
    chain_free(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Chain_init(Chain *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"io", "n_in", "entries", NULL};
    PyObject *io, *entries;
    Py_ssize_t n_in;
    if (self->io != NULL || self->entries != NULL || self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Chain is already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnO", kwlist, &io, &n_in, &entries))
        return -1;
    PyObject *io_t = PySequence_Tuple(io);
    if (io_t == NULL)
        return -1;
    PyObject *en_t = PySequence_Tuple(entries);
    if (en_t == NULL) {
        Py_DECREF(io_t);
        return -1;
    }
    Py_ssize_t n_io = PyTuple_GET_SIZE(io_t), n_en = PyTuple_GET_SIZE(en_t);
    int ok = 0;
    PyObject **io_a = PyMem_Calloc((size_t)(n_io ? n_io : 1), sizeof(PyObject *));
    layout *lay = PyMem_Calloc((size_t)(n_io ? n_io : 1), sizeof(layout));
    Py_buffer *views = PyMem_Calloc((size_t)(n_io ? n_io : 1), sizeof(Py_buffer));
    PyObject **en_a = PyMem_Calloc((size_t)(n_en ? n_en : 1), sizeof(PyObject *));
    edgeport_step **steps = PyMem_Calloc((size_t)(n_en ? n_en : 1), sizeof(edgeport_step *));
    if (!io_a || !lay || !views || !en_a || !steps) {
        PyErr_NoMemory();
        goto done;
    }
    if (n_in < 0 || n_in > n_io) {
        PyErr_SetString(PyExc_ValueError, "n_in must be between 0 and the number of io arrays");
        goto done;
    }
    self->n_in = n_in; /* export_io reads it */
    for (Py_ssize_t i = 0; i < n_io; i++) {
        Py_buffer v;
        if (export_io(self, i, PyTuple_GET_ITEM(io_t, i), &v) != 0)
            goto done;
        int fits = read_layout(&v, &lay[i]);
        PyBuffer_Release(&v);
        if (!fits) {
            PyErr_Format(PyExc_ValueError, "io array %zd: more than %d dims or an unusual format", i,
                         CHAIN_MAX_DIMS);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n_en; i++) {
        PyObject *e = PyTuple_GET_ITEM(en_t, i);
        if (PyCapsule_CheckExact(e)) {
            steps[i] = (edgeport_step *)PyCapsule_GetPointer(e, EDGEPORT_STEP_CAPSULE);
            if (steps[i] == NULL)
                goto done;
        } else if (!PyCallable_Check(e)) {
            PyErr_Format(PyExc_TypeError, "entry %zd is neither a bound step nor callable", i);
            goto done;
        }
    }
    if (self->io != NULL || self->entries != NULL || self->busy) { /* initialized meanwhile */
        PyErr_SetString(PyExc_RuntimeError, "Chain is already initialized");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_io; i++) {
        io_a[i] = PyTuple_GET_ITEM(io_t, i);
        Py_INCREF(io_a[i]);
    }
    for (Py_ssize_t i = 0; i < n_en; i++) {
        en_a[i] = PyTuple_GET_ITEM(en_t, i);
        Py_INCREF(en_a[i]);
    }
    self->io = io_a;
    self->layouts = lay;
    self->views = views;
    self->entries = en_a;
    self->steps = steps;
    self->n_io = n_io;
    self->n_entries = n_en;
    ok = 1;
done:
    Py_DECREF(io_t);
    Py_DECREF(en_t);
    if (!ok) {
        PyMem_Free(io_a);
        PyMem_Free(lay);
        PyMem_Free(views);
        PyMem_Free(en_a);
        PyMem_Free(steps);
    }
    return ok ? 0 : -1;
}

static PyObject *Chain_call(Chain *self, PyObject *args, PyObject *kwds) {
    if ((args != NULL && PyTuple_GET_SIZE(args) != 0) || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "a chain takes no arguments");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "this chain is already running (calls must not overlap)");
        return NULL;
    }
    if (self->steps == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Chain is not initialized");
        return NULL;
    }
    self->busy = 1; /* exporting and the callables may run Python code: no second call meanwhile */
    Py_ssize_t got = 0;
    int failed = 0;
    for (; got < self->n_io; got++) {
        Py_buffer *v = &self->views[got];
        if (export_io(self, got, self->io[got], v) != 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "delegate value %zd can no longer be bound as it was", got);
            failed = 1;
            break;
        }
        if (!same_layout(v, &self->layouts[got])) {
            PyBuffer_Release(v);
            PyErr_Format(PyExc_ValueError, "delegate value %zd changed its layout since the chain was made", got);
            failed = 1;
            break;
        }
    }
    for (Py_ssize_t i = 0; !failed && i < self->n_entries; i++) {
        edgeport_step *s = self->steps[i];
        if (s != NULL) {
            failed = s->run(s) != 0;
        } else {
            PyObject *r = PyObject_CallNoArgs(self->entries[i]);
            failed = r == NULL;
            Py_XDECREF(r);
        }
    }
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&self->views[i]);
    self->busy = 0;
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Chain_len(Chain *self, void *Py_UNUSED(closure)) {
    Py_ssize_t native = 0;
    for (Py_ssize_t i = 0; self->steps && i < self->n_entries; i++)
        native += self->steps[i] != NULL;
    return Py_BuildValue("(nn)", self->n_entries, native);
}

static PyGetSetDef Chain_getset[] = {
    {"counts", (getter)Chain_len, NULL, "(entries, bound steps among them)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ChainType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "edgeport_xnnpack._glue.Chain",
    .tp_basicsize = sizeof(Chain),
    .tp_dealloc = (destructor)Chain_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Chain_traverse,
    .tp_clear = (inquiry)Chain_clear,
    .tp_free = PyObject_GC_Del,
    .tp_doc = "Chain(io, n_in, entries): a direct call's steps on fixed arrays as one call (see _chain.c).",
    .tp_call = (ternaryfunc)Chain_call,
    .tp_getset = Chain_getset,
    .tp_init = (initproc)Chain_init,
    .tp_new = PyType_GenericNew,
};

int chain_add_type(PyObject *module) {
    if (PyType_Ready(&ChainType) < 0)
        return -1;
    Py_INCREF(&ChainType);
    if (PyModule_AddObject(module, "Chain", (PyObject *)&ChainType) < 0) {
        Py_DECREF(&ChainType);
        return -1;
    }
    return 0;
}
