/* A bound step: one kernel call on arrays fixed when it was made, as a C struct the chain of a delegate's direct
 * call (edgeport_xnnpack._glue.Chain) runs without going through Python.
 *
 * Shared by the extensions that make such steps (_glue: an XNNPACK runtime's binding; _gemm: a small batch matrix
 * product; _kernels: GELU, a strided copy). A step travels between them as a capsule named EDGEPORT_STEP_CAPSULE
 * whose pointer is the step; the capsule owns it (its destructor calls ``release``). A step holds references to
 * every array whose memory it reads or writes, so that memory outlives it; the addresses it keeps are taken from
 * those arrays when it is made. The chain checks, before running its steps, that the arrays the caller passes (the
 * delegate's inputs and outputs, the only ones another party can reach) still have the layout they had then.
 */
#ifndef EDGEPORT_STEP_H
#define EDGEPORT_STEP_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define EDGEPORT_STEP_CAPSULE "edgeport_xnnpack.step"

typedef struct edgeport_step edgeport_step;
struct edgeport_step {
    /* runs the step with the GIL held: 0 when done, -1 with an exception set */
    int (*run)(edgeport_step *);
    /* frees the step and drops its references (the GIL held) */
    void (*release)(edgeport_step *);
};

static void edgeport_step_destroy(PyObject *capsule) {
    edgeport_step *s = (edgeport_step *)PyCapsule_GetPointer(capsule, EDGEPORT_STEP_CAPSULE);
    if (s != NULL)
        s->release(s);
    else
        PyErr_Clear();
}

/* A capsule owning ``s`` (released right away when the capsule cannot be made). */
static inline PyObject *edgeport_step_capsule(edgeport_step *s) {
    PyObject *c = PyCapsule_New(s, EDGEPORT_STEP_CAPSULE, edgeport_step_destroy);
    if (c == NULL)
        s->release(s);
    return c;
}

#endif
