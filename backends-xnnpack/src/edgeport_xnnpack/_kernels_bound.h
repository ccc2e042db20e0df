/* Between the files of edgeport_xnnpack._kernels: the GELU loop and the bound steps of _kernels_bound.c. */
#ifndef EDGEPORT_KERNELS_BOUND_H
#define EDGEPORT_KERNELS_BOUND_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define COPY_MAX_SLOTS 64
#define COPY_ROW 7 /* src slot, dst slot, src offset, dst offset, count, len, src step (elements) */

void gelu_f32(const float *x, float *y, Py_ssize_t n);
void copy_rows(char *const *base, const int64_t *t, Py_ssize_t rows, Py_ssize_t isz);
int copy_runs_check(PyObject *seq, Py_ssize_t n_src, const Py_buffer *table, Py_ssize_t isz, Py_buffer *views,
                    char **base, Py_ssize_t *got, Py_ssize_t *total);
PyObject *copy_runs_plan(PyObject *module, PyObject *args);
PyObject *gelu_plan(PyObject *module, PyObject *args);
PyObject *copy_plan(PyObject *module, PyObject *args);

#endif
