"""C source of the launch shim: a tiny CPython extension that calls a compiled kernel entry point
(``int entry(void *, void *, void *, void *, void *)``, the shape of ``tr_gemm_call`` / ``tr_conv2d_call`` /
``ts_f32_call``) with the data pointers of its arguments, without ctypes' per-call argument conversion.

Arguments may be NumPy arrays (the pointer is read from the array object, as ``PyArray_DATA`` does), Python
ints (addresses, e.g. ``torch.Tensor.data_ptr()``) or None (NULL). The GIL is released around the kernel,
as ctypes does. Loaded by :mod:`tracea_cpu.launch_shim`, which falls back to ctypes when it cannot be built.
"""

from __future__ import annotations

#: module name (and so ``PyInit_<name>``) of the compiled shim
MODULE = "_tracea_launch_shim"

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The head of NumPy's PyArrayObject_fields: the object header, then the data pointer (stable since
   NumPy 1.7, unchanged in 2.x); only objects that pass the ndarray type check are read this way. */
typedef struct { PyObject_HEAD char *data; } tr_array_head;
typedef int (*tr_entry5)(void *, void *, void *, void *, void *);

static PyTypeObject *tr_ndarray = NULL;

static int tr_pointer(PyObject *o, void **p) {
    if (o == Py_None) { *p = NULL; return 0; }
    if (tr_ndarray != NULL && PyObject_TypeCheck(o, tr_ndarray)) { *p = ((tr_array_head *)o)->data; return 0; }
    if (PyLong_Check(o)) {
        *p = PyLong_AsVoidPtr(o);
        return (*p == NULL && PyErr_Occurred()) ? -1 : 0;
    }
    PyErr_Format(PyExc_TypeError, "launch shim: expected an array, an address or None, got %.100s",
                 Py_TYPE(o)->tp_name);
    return -1;
}

/* call5(entry, a0, a1, a2, a3, a4) -> int: entry(ptr(a0), ..., ptr(a4)) with the GIL released */
static PyObject *tr_call5(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *p[5];
    void *entry;
    int rc;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "call5 takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    entry = PyLong_AsVoidPtr(args[0]);
    if (entry == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "call5: NULL entry point");
        return NULL;
    }
    for (int i = 0; i < 5; i++)
        if (tr_pointer(args[i + 1], &p[i]) != 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ((tr_entry5)entry)(p[0], p[1], p[2], p[3], p[4]);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* set_array_type(numpy.ndarray): which objects are read as arrays (until it is called: ints and None only) */
static PyObject *tr_set_array_type(PyObject *self, PyObject *t) {
    if (!PyType_Check(t)) {
        PyErr_SetString(PyExc_TypeError, "set_array_type expects a type");
        return NULL;
    }
    Py_INCREF(t);
    Py_XDECREF((PyObject *)tr_ndarray);
    tr_ndarray = (PyTypeObject *)t;
    Py_RETURN_NONE;
}

static PyMethodDef tr_methods[] = {
    {"call5", (PyCFunction)(void (*)(void))tr_call5, METH_FASTCALL,
     "call5(entry, a0, a1, a2, a3, a4) -> int: call a kernel entry point on five pointers"},
    {"set_array_type", tr_set_array_type, METH_O, "set_array_type(type): the NumPy array type"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef tr_module = {PyModuleDef_HEAD_INIT, "MODULE_NAME", NULL, -1, tr_methods};

PyMODINIT_FUNC PyInit_MODULE_NAME(void) { return PyModule_Create(&tr_module); }
""".replace("MODULE_NAME", MODULE)
