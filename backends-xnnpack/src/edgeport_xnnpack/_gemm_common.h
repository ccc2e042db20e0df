/* Shared by the C files of edgeport_xnnpack._gemm: the pthreadpool entry point's type and a checked buffer getter. */
#ifndef EDGEPORT_GEMM_COMMON_H
#define EDGEPORT_GEMM_COMMON_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef void (*task_fn)(void *, size_t);
typedef void (*parallelize_fn)(void *, task_fn, void *, size_t, uint32_t);

/* a C-contiguous buffer of `items` items of this struct format and size (writable if asked), else an exception */
static inline int typed_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t items, const char *format,
                        Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = view->format;
    if (f && (*f == '=' || (*f == '<' && PY_LITTLE_ENDIAN) || *f == '@'))
        f++;
    if (view->itemsize != itemsize || !f || strcmp(f, format) != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous buffer of format '%s'", what,
                     format);
        PyBuffer_Release(view);
        return -1;
    }
    if (view->len < items * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd items, %zd needed", what,
                     view->len / itemsize, items);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}


PyObject *qs8_available(PyObject *module, PyObject *args);
PyObject *qs8_packed_gemm(PyObject *module, PyObject *args);
PyObject *qs8_im2col(PyObject *module, PyObject *args);
PyObject *conv_isa(PyObject *module, PyObject *args);
PyObject *conv_packed(PyObject *module, PyObject *args);
/* CONV_LARGE_FILTER_BYTES (a packed filter above it is read in chunks of about CONV_CHUNK_BYTES) */
int conv_add_constants(PyObject *module);
PyObject *bmm(PyObject *module, PyObject *args);
PyObject *bmm_plan(PyObject *module, PyObject *args);
PyObject *fc_isa(PyObject *module, PyObject *args);
int gemm_isa_level(void);
int add_host_fc(PyObject *module);

#endif
