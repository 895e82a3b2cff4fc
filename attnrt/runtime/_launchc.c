/* attnrt.runtime._launchc: the compiled hot path of CudaRuntime.launch (optional accelerator).
 *
 * One Launcher per runtime. Its `launch(fn, grid, block, args, shared_mem=0)` does what the
 * Python hot path in runtime.py does -- one dict lookup of the cached CUlaunchConfig, the
 * argument packing (still Function.pack_c), one cuLaunchKernelEx with the GIL released --
 * without the Python frame and the ctypes call in between. Anything that is not the hot
 * path (a config seen for the first time, an unhashable grid, keyword arguments, a kernel
 * whose empty argument list is not yet checked) goes to the Python implementation, which
 * stays the reference behaviour; a nonzero CUresult goes to a Python callable that raises.
 *
 * Built against the stable ABI (Python >= 3.10), so one binary serves every interpreter.
 * The driver entry point arrives as an address (from ctypes), so this file needs no CUDA
 * headers and links nothing.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*launch_ex_t)(const void *config, void *f, void **params, void **extra);

typedef struct {
    PyObject_HEAD
    launch_ex_t entry;
    PyObject *configs;   /* dict: (grid, block, shared_mem) -> (config address int, keep-alive) */
    PyObject *slow;      /* callable(fn, grid, block, args, shared_mem): the Python launch */
    PyObject *on_error;  /* callable(err, fn, grid, block, shared_mem): raises */
    unsigned long long count;
} Launcher;

static PyObject *s_handle_int, *s_params, *s_pack_c, *s_value, *s_ensure_shared, *s_zero;

#define DEFAULT_SHMEM_LIMIT 49152

static int
Launcher_clear(Launcher *self)
{
    Py_CLEAR(self->configs);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->on_error);
    return 0;
}

static int
Launcher_init(Launcher *self, PyObject *args, PyObject *kwds)
{
    PyObject *entry, *configs, *slow, *on_error;
    static char *kwlist[] = {"entry", "configs", "slow", "on_error", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO", kwlist, &entry, &configs, &slow, &on_error))
        return -1;
    if (!PyDict_Check(configs)) {
        PyErr_SetString(PyExc_TypeError, "configs must be a dict");
        return -1;
    }
    if (!PyCallable_Check(slow) || !PyCallable_Check(on_error)) {
        PyErr_SetString(PyExc_TypeError, "slow and on_error must be callable");
        return -1;
    }
    void *p = PyLong_AsVoidPtr(entry);
    if (p == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "entry must be a non-zero function address");
        return -1;
    }
    self->entry = (launch_ex_t)p;
    Py_INCREF(configs);
    Py_INCREF(slow);
    Py_INCREF(on_error);
    Launcher_clear(self);  /* __init__ may run twice */
    self->configs = configs;
    self->slow = slow;
    self->on_error = on_error;
    self->count = 0;
    return 0;
}

static int
Launcher_traverse(Launcher *self, visitproc visit, void *arg)
{
    Py_VISIT(self->configs);
    Py_VISIT(self->slow);
    Py_VISIT(self->on_error);
    return 0;
}

static void
Launcher_dealloc(Launcher *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Launcher_clear(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

/* The Python launch for everything off the hot path. */
static PyObject *
go_slow(Launcher *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    PyObject *tuple = PyTuple_New(nargs);
    if (tuple == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SetItem(tuple, i, args[i]);
    }
    PyObject *kw = NULL;
    if (nkw) {
        kw = PyDict_New();
        if (kw == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < nkw; i++) {
            if (PyDict_SetItem(kw, PyTuple_GetItem(kwnames, i), args[nargs + i]) < 0) {
                Py_DECREF(tuple);
                Py_DECREF(kw);
                return NULL;
            }
        }
    }
    PyObject *res = PyObject_Call(self->slow, tuple, kw);
    Py_DECREF(tuple);
    Py_XDECREF(kw);
    return res;
}

/* Address held by a ctypes c_void_p (or None -> NULL). Returns -1 with an exception set. */
static int
pointer_value(PyObject *obj, void **out)
{
    if (obj == Py_None) {
        *out = NULL;
        return 0;
    }
    PyObject *v = PyObject_GetAttr(obj, s_value);
    if (v == NULL)
        return -1;
    if (v == Py_None) {
        *out = NULL;
    } else {
        *out = PyLong_AsVoidPtr(v);
        if (*out == NULL && PyErr_Occurred()) {
            Py_DECREF(v);
            return -1;
        }
    }
    Py_DECREF(v);
    return 0;
}

static PyObject *
Launcher_launch(Launcher *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (kwnames != NULL || nargs < 4 || nargs > 5 || self->configs == NULL)
        return go_slow(self, args, nargs, kwnames);
    PyObject *fn = args[0], *grid = args[1], *block = args[2], *kargs = args[3];
    PyObject *shm = nargs == 5 ? args[4] : s_zero;

    PyObject *key = PyTuple_Pack(3, grid, block, shm);
    if (key == NULL)
        return NULL;
    PyObject *entry = PyDict_GetItemWithError(self->configs, key);  /* borrowed */
    Py_DECREF(key);
    if (entry == NULL) {
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError))  /* unhashable grid: normalised there */
                return NULL;
            PyErr_Clear();
        }
        return go_slow(self, args, nargs, kwnames);
    }
    if (!PyLong_Check(shm))
        return go_slow(self, args, nargs, kwnames);
    long long shared = PyLong_AsLongLong(shm);
    if (shared == -1 && PyErr_Occurred())
        return NULL;
    if (shared > DEFAULT_SHMEM_LIMIT) {
        PyObject *r = PyObject_CallMethodObjArgs(fn, s_ensure_shared, shm, NULL);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    void *config = PyLong_AsVoidPtr(PyTuple_GetItem(entry, 0));
    if (config == NULL)
        return PyErr_Occurred() ? NULL : go_slow(self, args, nargs, kwnames);

    PyObject *h = PyObject_GetAttr(fn, s_handle_int);
    if (h == NULL)
        return NULL;
    void *handle = PyLong_AsVoidPtr(h);
    Py_DECREF(h);
    if (handle == NULL && PyErr_Occurred())
        return NULL;

    void *params = NULL;
    Py_ssize_t n = PyObject_Length(kargs);
    if (n < 0)
        return NULL;
    if (n == 0) {
        /* Only a kernel already checked to take no parameters launches without any. */
        PyObject *p = PyObject_GetAttr(fn, s_params);
        if (p == NULL)
            return NULL;
        int empty = PyTuple_Check(p) && PyTuple_Size(p) == 0;
        Py_DECREF(p);
        if (!empty)
            return go_slow(self, args, nargs, kwnames);
    } else {
        PyObject *packed = PyObject_CallMethodObjArgs(fn, s_pack_c, kargs, NULL);
        if (packed == NULL)
            return NULL;
        int bad = pointer_value(packed, &params);
        Py_DECREF(packed);
        if (bad)
            return NULL;
    }

    int err;
    launch_ex_t call = self->entry;
    Py_BEGIN_ALLOW_THREADS
    err = call(config, handle, (void **)params, NULL);
    Py_END_ALLOW_THREADS
    if (err != 0)
        return PyObject_CallFunction(self->on_error, "iOOOO", err, fn, grid, block, shm);
    self->count++;
    Py_RETURN_NONE;
}

static PyObject *
Launcher_get_count(Launcher *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(self->count);
}

static PyMethodDef Launcher_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))Launcher_launch, METH_FASTCALL | METH_KEYWORDS,
     "launch(fn, grid, block, args, shared_mem=0): CudaRuntime.launch's hot path."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Launcher_getset[] = {
    {"count", (getter)Launcher_get_count, NULL, "launches made through the compiled path", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Launcher_slots[] = {
    {Py_tp_doc, "Launcher(entry, configs, slow, on_error): the compiled launch path of one runtime."},
    {Py_tp_init, Launcher_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, Launcher_dealloc},
    {Py_tp_traverse, Launcher_traverse},
    {Py_tp_clear, Launcher_clear},
    {Py_tp_methods, Launcher_methods},
    {Py_tp_getset, Launcher_getset},
    {0, NULL},
};

static PyType_Spec Launcher_spec = {
    "attnrt.runtime._launchc.Launcher", sizeof(Launcher), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Launcher_slots,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_launchc",
    "The compiled launch path of attnrt.CudaRuntime (optional; runtime.py falls back to ctypes).",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__launchc(void)
{
    s_handle_int = PyUnicode_InternFromString("handle_int");
    s_params = PyUnicode_InternFromString("_params");
    s_pack_c = PyUnicode_InternFromString("pack_c");
    s_value = PyUnicode_InternFromString("value");
    s_ensure_shared = PyUnicode_InternFromString("ensure_shared");
    s_zero = PyLong_FromLong(0);
    if (!s_handle_int || !s_params || !s_pack_c || !s_value || !s_ensure_shared || !s_zero)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    PyObject *tp = PyType_FromSpec(&Launcher_spec);
    if (tp == NULL || PyModule_AddObject(m, "Launcher", tp) < 0) {
        Py_XDECREF(tp);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
