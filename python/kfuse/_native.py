"""ctypes declarations of include/kfuse/kfuse.h and the library they bind.

libkfuse.so is the one inside this package (lib/libkfuse.so, put there by
`pip install .`); KFUSE_LIBRARY names another (a build tree's), for
working on the library itself. Struct layouts follow the header field by
field; kf_compile_options carries its own struct_size, so a library newer
than these declarations still accepts them.
"""

import ctypes
import os
import sys

c_int64_p = ctypes.POINTER(ctypes.c_int64)


class HostTensor(ctypes.Structure):
    """kf_host_tensor"""
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("dims", c_int64_p),
        ("data", ctypes.c_void_p),
    ]


class Output(ctypes.Structure):
    """kf_output"""
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("dims", ctypes.c_int64 * 8),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
    ]


class DeviceTensor(ctypes.Structure):
    """kf_device_tensor"""
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("dims", c_int64_p),
        ("buffer", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
    ]


class Dim(ctypes.Structure):
    """kf_dim"""
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_int64)]


class CompileOptions(ctypes.Structure):
    """kf_compile_options (every field of this kfuse.h)"""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("backend", ctypes.c_int),
        ("precision", ctypes.c_int),
        ("target", ctypes.c_char_p),
        ("device", ctypes.c_int),
        ("cache_dir", ctypes.c_char_p),
        ("pattern_files", ctypes.POINTER(ctypes.c_char_p)),
        ("npattern_files", ctypes.c_int),
        ("dims", ctypes.POINTER(Dim)),
        ("ndims", ctypes.c_int),
        ("workspace_bytes", ctypes.c_size_t),
        ("fusion", ctypes.c_int),
        ("batching", ctypes.c_int),
    ]


def _library_path():
    env = os.environ.get("KFUSE_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "lib", "libkfuse.so")


def _load():
    path = _library_path()
    if not os.path.exists(path):
        raise ImportError(
            "kfuse: no native library at %s (install the package with `pip install .` from the "
            "kfuse source tree, or set KFUSE_LIBRARY to a libkfuse.so)" % path)
    lib = ctypes.CDLL(path)
    P = ctypes.c_void_p
    S = ctypes.c_int  # kf_status
    sigs = {
        "kf_status_name": (ctypes.c_char_p, [ctypes.c_int]),
        "kf_last_error": (ctypes.c_char_p, []),
        "kf_version": (ctypes.c_char_p, []),
        "kf_model_load": (S, [ctypes.c_char_p, ctypes.POINTER(P)]),
        "kf_model_load_memory": (S, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(P)]),
        "kf_model_save_memory": (S, [P, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]),
        "kf_model_free": (None, [P]),
        "kf_model_optimize": (S, [P]),
        "kf_model_fuse": (S, [P, ctypes.POINTER(CompileOptions), ctypes.POINTER(ctypes.c_void_p)]),
        "kf_backend_name": (ctypes.c_char_p, [ctypes.c_int]),
        "kf_precision_name": (ctypes.c_char_p, [ctypes.c_int]),
        "kf_compile_ex": (S, [P, ctypes.POINTER(CompileOptions), ctypes.POINTER(P)]),
        "kf_compiled_backend": (ctypes.c_int, [P]),
        "kf_compiled_num_inputs": (ctypes.c_int, [P]),
        "kf_compiled_input_name": (ctypes.c_char_p, [P, ctypes.c_int]),
        "kf_compiled_input_info": (S, [P, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                                       c_int64_p]),
        "kf_compiled_num_outputs": (ctypes.c_int, [P]),
        "kf_compiled_output_name": (ctypes.c_char_p, [P, ctypes.c_int]),
        "kf_compiled_output_info": (S, [P, ctypes.POINTER(HostTensor), ctypes.c_int, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), c_int64_p]),
        "kf_run": (S, [P, ctypes.POINTER(HostTensor), ctypes.c_int, ctypes.POINTER(Output), ctypes.c_int]),
        "kf_output_release": (None, [ctypes.POINTER(Output)]),
        "kf_compiled_device_context": (S, [P, ctypes.POINTER(P)]),
        "kf_run_device": (S, [P, P, ctypes.POINTER(DeviceTensor), ctypes.c_int, ctypes.POINTER(DeviceTensor),
                              ctypes.c_int]),
        "kf_sync": (S, [P, P]),
        "kf_compiled_free": (None, [P]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    return lib


lib = _load()
# free() of the C library the kfuse library uses, for buffers it hands over
libc = ctypes.CDLL(None if sys.platform != "win32" else "msvcrt")
libc.free.argtypes = [ctypes.c_void_p]
libc.free.restype = None
