"""kfuse: rewrite ONNX graphs and run them as fused kernels, from Python.

    import numpy as np, kfuse
    m = kfuse.compile("model.onnx", backend="opencl", dims={"batch": 2})
    (probs,) = m.run({"x": np.random.rand(2, 3, 8, 8).astype(np.float32)})

A thin layer over libkfuse.so (include/kfuse/kfuse.h) through ctypes:
models are ONNX files (a path) or ONNX bytes; inputs are NumPy arrays or
anything with ``__dlpack__`` in host memory, read in place; outputs come
back as NumPy arrays. On CUDA and OpenCL a run may also take tensors that
live on the device (a torch or CuPy CUDA tensor, a kfuse.DeviceArray):
they are read in place, the outputs stay on the device and come back as
the same kind of tensor, and nothing waits for the device:

    m = kfuse.compile("model.onnx", backend="cuda")
    (y,) = m.run([torch_cuda_tensor])   # a torch CUDA tensor, zero copies

Every failure raises kfuse.Error with the library's status code and
message.
"""

import ctypes
import os
import sys

import numpy as np

from . import _device, _dlpack
from ._device import DeviceArray
from ._native import CompileOptions, DeviceTensor, Dim, HostTensor, Output, lib, libc

__all__ = ["Error", "Compiled", "DeviceArray", "compile", "optimize", "fuse", "version", "BACKENDS", "PRECISIONS"]

# kf_status numbers (kfuse.h; they never shift)
OK = 0
ERR_INVALID_ARG = 1
ERR_BAD_MODEL = 2
ERR_UNSUPPORTED = 3
ERR_SHAPE = 4
ERR_NOMEM = 5
ERR_IO = 6
ERR_RUNTIME = 7
ERR_NO_DEVICE = 8
ERR_COMPILE = 9
ERR_INTERNAL = 10

BACKENDS = {"best": 0, "ref": 1, "opencl": 2, "cuda": 3}
PRECISIONS = {"fp32": 0, "tf32": 1, "fp16": 2, "bf16": 3, "int8": 4, "int8-fp16": 5, "fp8": 6}
_SWITCH = {None: 0, True: 1, False: 2}

# ONNX TensorProto.DataType <-> NumPy
_NP_OF = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
          9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}
try:  # bfloat16 has no NumPy type of its own; ml_dtypes provides one when installed
    import ml_dtypes as _ml_dtypes
    _NP_OF[16] = _ml_dtypes.bfloat16
except ImportError:  # then bfloat16 outputs come back as their uint16 bits
    _NP_OF[16] = np.uint16


class Error(Exception):
    """A kfuse call failed: .status is the kf_status number (kfuse.ERR_*),
    .status_name its name ("bad model"), .message the library's message."""

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = lib.kf_status_name(self.status).decode()
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message))


def _check(status):
    if status != OK:
        raise Error(status, lib.kf_last_error().decode(errors="replace"))


def version():
    """The library's version string ("0.1.0")."""
    return lib.kf_version().decode()


def _np_dtype(onnx):
    try:
        return np.dtype(_NP_OF[onnx])
    except KeyError:
        raise Error(ERR_UNSUPPORTED, "ONNX dtype %d has no NumPy type here" % onnx) from None


class _Model:
    """An owned kf_model handle, freed on close."""

    def __init__(self, model):
        self.h = ctypes.c_void_p()
        if isinstance(model, (bytes, bytearray, memoryview)):
            buf = bytes(model)
            _check(lib.kf_model_load_memory(buf, len(buf), None, ctypes.byref(self.h)))
        elif isinstance(model, (str, os.PathLike)):
            _check(lib.kf_model_load(os.fsencode(model), ctypes.byref(self.h)))
        else:
            raise TypeError("model: a path or ONNX bytes, not %s" % type(model).__name__)

    def save(self):
        data, n = ctypes.c_void_p(), ctypes.c_size_t()
        _check(lib.kf_model_save_memory(self.h, ctypes.byref(data), ctypes.byref(n)))
        try:
            return ctypes.string_at(data.value, n.value) if n.value else b""
        finally:
            libc.free(data)

    def close(self):
        if self.h:
            lib.kf_model_free(self.h)
            self.h = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _options(backend="best", precision="fp32", target=None, device=0, cache_dir=None, patterns=(), dims=None,
             workspace_bytes=0, fusion=None, batching=None):
    """kf_compile_options from keyword arguments, plus the objects that must
    outlive the call (ctypes arrays the struct points into)."""
    if backend not in BACKENDS:
        raise Error(ERR_INVALID_ARG, "backend %r (%s)" % (backend, ", ".join(BACKENDS)))
    if precision not in PRECISIONS:
        raise Error(ERR_INVALID_ARG, "precision %r (%s)" % (precision, ", ".join(PRECISIONS)))
    for name, v in (("fusion", fusion), ("batching", batching)):
        if v not in _SWITCH:
            raise Error(ERR_INVALID_ARG, "%s: None (the environment decides), True or False, not %r" % (name, v))
    o = CompileOptions()
    o.struct_size = ctypes.sizeof(CompileOptions)
    o.backend = BACKENDS[backend]
    o.precision = PRECISIONS[precision]
    o.target = target.encode() if target else None
    o.device = int(device)
    o.cache_dir = os.fsencode(cache_dir) if cache_dir else None
    keep = []
    files = [os.fsencode(p) for p in ([patterns] if isinstance(patterns, (str, os.PathLike)) else patterns)]
    if files:
        arr = (ctypes.c_char_p * len(files))(*files)
        keep.append(arr)
        o.pattern_files = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
        o.npattern_files = len(files)
    if dims:
        items = list(dims.items())
        arr = (Dim * len(items))(*[Dim(str(k).encode(), int(v)) for k, v in items])
        keep.append(arr)
        o.dims = ctypes.cast(arr, ctypes.POINTER(Dim))
        o.ndims = len(items)
    o.workspace_bytes = int(workspace_bytes)
    o.fusion = _SWITCH[fusion]
    o.batching = _SWITCH[batching]
    return o, keep


def optimize(model):
    """The model (a path or ONNX bytes) rewritten with the built-in rules, as
    `kfuse opt` does: ONNX bytes of a smaller standard model."""
    with _Model(model) as m:
        _check(lib.kf_model_optimize(m.h))
        return m.save()


def fuse(model, target=None, dims=None, precision="fp32", patterns=(), fusion=None, report=False):
    """What `kfuse fuse` does: the model (path or bytes) optimized, planned for
    the target device profile ("h200" default, "h100", "a100", a .target
    file, "none") with symbolic dims fixed by dims ({"batch": 8}), each kernel
    group a model-local ONNX function. Returns the ONNX bytes; with
    report=True, (bytes, dict) where dict is the `--json` report."""
    opts, keep = _options(precision=precision, target=target, dims=dims, patterns=patterns, fusion=fusion)
    rep = ctypes.c_void_p()
    with _Model(model) as m:
        _check(lib.kf_model_fuse(m.h, ctypes.byref(opts), ctypes.byref(rep) if report else None))
        out = m.save()
    del keep
    if not report:
        return out
    try:
        import json
        return out, json.loads(ctypes.string_at(rep.value).decode())
    finally:
        libc.free(rep)


def _in_order(names, inputs):
    """inputs (a dict by name, or a sequence) as a list in the order of names."""
    if isinstance(inputs, dict):
        missing = [n for n in names if n not in inputs]
        extra = [n for n in inputs if n not in names]
        if missing or extra:
            raise Error(ERR_INVALID_ARG, "inputs: the model takes %s; missing %s, unknown %s" % (names, missing, extra))
        inputs = [inputs[n] for n in names]
    else:
        inputs = list(inputs)
    if len(inputs) != len(names):
        raise Error(ERR_INVALID_ARG, "the model has %d inputs, %d were given" % (len(names), len(inputs)))
    return inputs


class _Inputs:
    """kf_host_tensor views over the caller's inputs (in input order), and
    whatever keeps their memory alive while the library reads it."""

    def __init__(self, compiled, inputs, shapes_only=False):
        names = compiled.input_names
        inputs = _in_order(names, inputs)
        self.keep = []
        self.addresses = []
        self.arr = (HostTensor * max(1, len(inputs)))()
        for i, x in enumerate(inputs):
            what = "input '%s'" % names[i]
            if shapes_only and isinstance(x, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in x):
                onnx, shape, data = compiled._onnx_dtype_of(i), tuple(int(d) for d in x), None
            else:
                onnx, shape, data = self._memory(x, what)
            dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
            self.keep.append(dims)
            self.arr[i] = HostTensor(onnx, len(shape), ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)), data)
            self.addresses.append(data)

    def _memory(self, x, what):
        """(ONNX dtype, shape, address) of x's memory, kept alive in self.keep."""
        if isinstance(x, np.ndarray):
            a = np.ascontiguousarray(x)  # x itself when packed; a strided array is packed here
        elif hasattr(x, "__dlpack__"):
            try:
                v = _dlpack.view(x, what)
            except (ValueError, TypeError, BufferError) as e:
                raise Error(ERR_INVALID_ARG, str(e)) from None
            self.keep.append((x, v))
            return v.dtype, v.shape, v.data
        else:
            a = np.ascontiguousarray(x)
        self.keep.append(a)
        onnx = next((k for k, t in _NP_OF.items() if np.dtype(t) == a.dtype and k != 16), None)
        if onnx is None:
            raise Error(ERR_INVALID_ARG, "%s: NumPy dtype %s has no ONNX type kfuse runs" % (what, a.dtype))
        return onnx, a.shape, a.ctypes.data if a.size else None


class Compiled:
    """A model compiled for one backend (kfuse.compile). run() may be called
    many times, from several threads at once."""

    def __init__(self, model, **options):
        opts, keep = _options(**options)
        self._h = ctypes.c_void_p()
        with _Model(model) as m:
            _check(lib.kf_compile_ex(m.h, ctypes.byref(opts), ctypes.byref(self._h)))
        del keep
        n = lib.kf_compiled_num_inputs(self._h)
        self.input_names = [lib.kf_compiled_input_name(self._h, i).decode() for i in range(n)]
        n = lib.kf_compiled_num_outputs(self._h)
        self.output_names = [lib.kf_compiled_output_name(self._h, i).decode() for i in range(n)]

    @property
    def backend(self):
        """The backend it runs on ("ref", "opencl", "cuda"; best resolved)."""
        return lib.kf_backend_name(lib.kf_compiled_backend(self._handle())).decode()

    def _handle(self):
        if not self._h:
            raise Error(ERR_INVALID_ARG, "the compiled model was closed")
        return self._h

    def _onnx_dtype_of(self, i):
        dtype, rank, dims = ctypes.c_int(), ctypes.c_int(), (ctypes.c_int64 * 8)()
        _check(lib.kf_compiled_input_info(self._handle(), i, ctypes.byref(dtype), ctypes.byref(rank), dims))
        return dtype.value

    def input_info(self, i):
        """(NumPy dtype, shape) input i declares; None for a symbolic dim,
        shape None when the rank is undeclared."""
        if isinstance(i, str):
            i = self.input_names.index(i)
        dtype, rank, dims = ctypes.c_int(), ctypes.c_int(), (ctypes.c_int64 * 8)()
        _check(lib.kf_compiled_input_info(self._handle(), i, ctypes.byref(dtype), ctypes.byref(rank), dims))
        shape = None if rank.value < 0 else tuple(None if d < 0 else d for d in dims[:rank.value])
        return _np_dtype(dtype.value), shape

    @property
    def inputs(self):
        """[(name, NumPy dtype, shape)] of the inputs, as input_info."""
        return [(n,) + self.input_info(i) for i, n in enumerate(self.input_names)]

    def output_info(self, inputs):
        """[(NumPy dtype, shape)] of the outputs a run on these inputs gives,
        before running: inputs as run() takes them, or just their shapes
        (tuples, dtype as declared); no data is read. A dim only a run can
        tell (NonZero's count) is None; shape None when even the rank is."""
        ins = _Inputs(self, inputs, shapes_only=True)
        out = []
        for i in range(len(self.output_names)):
            dtype, rank, dims = ctypes.c_int(), ctypes.c_int(), (ctypes.c_int64 * 8)()
            _check(lib.kf_compiled_output_info(self._handle(), ins.arr, len(self.input_names), i, ctypes.byref(dtype),
                                               ctypes.byref(rank), dims))
            shape = None if rank.value < 0 else tuple(None if d < 0 else d for d in dims[:rank.value])
            out.append((_np_dtype(dtype.value), shape))
        return out

    def run(self, inputs, outputs=None, stream=None):
        """Runs the model: inputs a dict by name or a list in input order.
        Host inputs (NumPy arrays, anything with __dlpack__ in host memory)
        give a list of NumPy arrays, in output order; NumPy arrays are read
        where they are (a strided one is packed first), other objects
        through DLPack, also in place. Device inputs (DLPack tensors in the
        plan's CUDA or OpenCL device memory) run on the device (kf_run_device):
        see run_device."""
        listed = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
        on_device = [_dlpack.device_type(x) in _dlpack.DEVICE_TYPES for x in listed]
        if any(on_device) or outputs is not None or stream is not None:
            return self.run_device(inputs, outputs, stream)
        ins = _Inputs(self, inputs)
        n = len(self.output_names)
        outs = (Output * max(1, n))()
        _check(lib.kf_run(self._handle(), ins.arr, len(self.input_names), outs, n))
        result = []
        try:
            for o in outs[:n]:
                a = np.empty(tuple(o.dims[:o.rank]), dtype=_np_dtype(o.dtype))
                if o.nbytes:
                    ctypes.memmove(a.ctypes.data, o.data, min(o.nbytes, a.nbytes))
                result.append(a)
        finally:
            for i in range(n):
                lib.kf_output_release(ctypes.byref(outs[i]))
        return result

    __call__ = run

    # ---- device-side runs ----------------------------------------------------------

    def _side(self):
        """The device calls of this plan's backend (made at first use)."""
        if getattr(self, "_dev", None) is None:
            backend = self.backend
            if backend not in ("cuda", "opencl"):
                raise Error(ERR_UNSUPPORTED, "device tensors: backend %s runs on the host (compile for cuda or opencl)"
                            % backend)
            ctx = ctypes.c_void_p()
            _check(lib.kf_compiled_device_context(self._handle(), ctypes.byref(ctx)))
            try:
                self._dev = _device.open_side(backend, ctx.value)
            except (OSError, RuntimeError) as e:
                raise Error(ERR_NO_DEVICE, "device tensors on %s: %s" % (backend, e)) from None
        return self._dev

    def _stream(self, stream):
        side = self._side()
        return side.default_stream if stream is None else int(stream)

    def to_device(self, array, stream=None):
        """A copy of array (NumPy, or anything np.asarray takes) in this
        plan's device memory, as a kfuse.DeviceArray."""
        a = np.ascontiguousarray(array)
        onnx = next((k for k, t in _NP_OF.items() if np.dtype(t) == a.dtype and k != 16), None)
        if onnx is None:
            raise Error(ERR_INVALID_ARG, "to_device: NumPy dtype %s has no ONNX type kfuse runs" % a.dtype)
        side, s = self._side(), self._stream(stream)
        try:
            d = DeviceArray(side, onnx, a.shape, s, owner=self)
            side.upload(s, d.handle, a.ctypes.data if a.size else None, d.nbytes)
        except RuntimeError as e:
            raise Error(ERR_RUNTIME, "to_device: %s" % e) from None
        return d

    def run_device(self, inputs, outputs=None, stream=None):
        """Runs the model on device tensors without copying them or waiting
        for the device (kf_run_device). inputs as run() takes them, each a
        DLPack tensor in this plan's device memory (a torch/CuPy CUDA
        tensor, a kfuse.DeviceArray), read in place. outputs: DLPack device
        tensors to write the outputs into (returned as given), else new
        device arrays of the first input's kind (torch tensors for torch
        inputs, through DLPack, no copy; kfuse.DeviceArray otherwise).
        stream: a CUstream / cl_command_queue handle (an int) to enqueue on,
        else one the plan keeps. Runs given the same buffers as the run
        before replay a captured CUDA Graph: pass outputs to bind them.
        Errors a kernel finds (a bad index) surface at sync(). On the plan's
        own stream the run is ordered after the inputs' producers (DLPack's
        stream handshake) and before whoever takes a returned array through
        DLPack; bound outputs read on another stream, and inputs the caller
        frees right after, need sync() first, or stream= the stream the
        caller works on."""
        names = self.input_names
        inputs = _in_order(names, inputs)
        side, s = self._side(), self._stream(stream)
        keep = []

        def views(objs, kind, names):
            arr = (DeviceTensor * max(1, len(objs)))()
            for i, x in enumerate(objs):
                what = "%s '%s'" % (kind, names[i])
                if _dlpack.device_type(x) not in _dlpack.DEVICE_TYPES:
                    raise Error(ERR_INVALID_ARG, "%s: not a DLPack tensor in device memory (a run takes all its "
                                "inputs on the host, or all on the device)" % what)
                try:
                    v = _dlpack.device_view(x, what, side.dlpack_stream(s))
                except (ValueError, TypeError, BufferError) as e:
                    raise Error(ERR_INVALID_ARG, str(e)) from None
                if v.device != (side.kind, side.device_id):
                    raise Error(ERR_INVALID_ARG, "%s: on DLPack device %s, the plan runs on %s"
                                % (what, v.device, (side.kind, side.device_id)))
                dims = (ctypes.c_int64 * max(1, len(v.shape)))(*v.shape)
                n = _dlpack.onnx_size(v.dtype)
                for d in v.shape:
                    n *= d
                keep.append((x, v, dims))
                arr[i] = DeviceTensor(v.dtype, len(v.shape), ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)),
                                      v.data, n)
            return arr

        ins = views(inputs, "input", names)
        if outputs is None:
            info = []
            hin = (HostTensor * max(1, len(names)))()
            for i in range(len(names)):
                hin[i] = HostTensor(ins[i].dtype, ins[i].rank, ins[i].dims, None)
            for o in range(len(self.output_names)):
                dtype, rank, dims = ctypes.c_int(), ctypes.c_int(), (ctypes.c_int64 * 8)()
                _check(lib.kf_compiled_output_info(self._handle(), hin, len(names), o, ctypes.byref(dtype),
                                                   ctypes.byref(rank), dims))
                if rank.value < 0 or any(d < 0 for d in dims[:rank.value]):
                    raise Error(ERR_UNSUPPORTED, "output '%s': its size depends on values; pass outputs="
                                % self.output_names[o])
                info.append((dtype.value, tuple(dims[:rank.value])))
            try:
                made = [DeviceArray(side, dt, shp, s, owner=self) for dt, shp in info]
            except RuntimeError as e:
                raise Error(ERR_NOMEM, "device outputs: %s" % e) from None
            outs = views(made, "output", self.output_names)
        else:
            made = None
            outs = views(list(outputs), "output", self.output_names)
            if len(outputs) != len(self.output_names):
                raise Error(ERR_INVALID_ARG, "the model has %d outputs, %d were given"
                            % (len(self.output_names), len(outputs)))
        _check(lib.kf_run_device(self._handle(), ctypes.c_void_p(s), ins, len(names), outs, len(self.output_names)))
        if made is None:
            return list(outputs)
        return [_as_kind(d, inputs[0]) for d in made]

    def sync(self, stream=None):
        """Waits for this plan's runs on stream (None: the plan's own) and
        raises what a kernel found there (a bad index), as kf_sync."""
        _check(lib.kf_sync(self._handle(), ctypes.c_void_p(self._stream(stream))))

    def close(self):
        """Frees the compiled model now (also done when it is collected)."""
        if getattr(self, "_h", None):
            lib.kf_compiled_free(self._h)
            self._h = ctypes.c_void_p()

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _as_kind(d, like):
    """Device array d as the kind of tensor `like` is (its framework's
    from_dlpack: torch, CuPy...), without a copy; d itself for kfuse's own
    arrays and frameworks without from_dlpack."""
    if isinstance(like, DeviceArray):
        return d
    mod = sys.modules.get(type(like).__module__.split(".")[0])
    f = getattr(mod, "from_dlpack", None)
    return f(d) if f else d


def compile(model, backend="best", precision="fp32", target=None, dims=None, device=0, cache_dir=None,
            patterns=(), workspace_bytes=0, fusion=None, batching=None):
    """Compiles the model (a path or ONNX bytes) for backend "best" (cuda,
    else opencl, else ref), "ref", "opencl" or "cuda", at precision "fp32",
    "tf32", "fp16", "bf16", "int8", "int8-fp16" or "fp8": kf_compile_ex. target: the device profile
    fusion plans for (KFUSE_TARGET, else "h200"); dims: symbolic dims fixed
    ({"batch": 8}); device: the device ordinal; cache_dir: the kernel cache
    (KFUSE_CACHE_DIR ...); patterns: extra .kfp rule files;
    workspace_bytes: vendor-library scratch per run (0: default);
    fusion/batching: False turns them off, None leaves it to the
    environment. Returns a Compiled."""
    return Compiled(model, backend=backend, precision=precision, target=target, dims=dims, device=device,
                    cache_dir=cache_dir, patterns=patterns, workspace_bytes=workspace_bytes, fusion=fusion,
                    batching=batching)
