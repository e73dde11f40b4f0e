"""Device memory for kfuse.Compiled: the caller's side of kf_run_device.

A compiled plan on CUDA or OpenCL runs on tensors that stay on the device:
inputs come as DLPack tensors in device memory (a torch/CuPy CUDA tensor,
or a kfuse.DeviceArray), outputs go to device buffers, and nothing passes
through the host. The driver calls this takes (allocate, copy, streams,
events) go through ctypes to the driver library the plan already uses:
libcuda.so.1 for CUDA, libOpenCL.so.1 for OpenCL.

Streams. CUDA: a run goes on the stream the caller names (a CUstream
handle as an int, torch.cuda.current_stream().cuda_stream for instance),
else on a non-blocking stream the plan keeps, which kfuse may capture into
a CUDA Graph. Inputs are asked for with __dlpack__(stream=that stream), so
their producer orders its pending work before the run; an output handed to
a consumer on another stream makes that stream wait for the run with an
event. OpenCL: a cl_command_queue handle, else a queue the plan keeps; an
output read from any other queue waits for the run's queue to finish.
"""

import ctypes

from . import _dlpack

KDL_CUDA = _dlpack.KDL_CUDA
KDL_OPENCL = _dlpack.KDL_OPENCL
P = ctypes.c_void_p


def _fail(what, code):
    raise RuntimeError("%s failed (error %d)" % (what, code))


class _Cuda:
    """CUDA driver calls; handles are ints (CUstream, CUdeviceptr)."""

    kind = KDL_CUDA

    def __init__(self, ctx):
        lib = ctypes.CDLL("libcuda.so.1")
        sig = {
            "cuCtxSetCurrent": [P], "cuCtxGetDevice": [ctypes.POINTER(ctypes.c_int)],
            "cuStreamCreate": [ctypes.POINTER(P), ctypes.c_uint], "cuStreamSynchronize": [P],
            "cuMemAlloc_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t], "cuMemFree_v2": [ctypes.c_uint64],
            "cuMemcpyHtoDAsync_v2": [ctypes.c_uint64, P, ctypes.c_size_t, P],
            "cuMemcpyDtoHAsync_v2": [P, ctypes.c_uint64, ctypes.c_size_t, P],
            "cuEventCreate": [ctypes.POINTER(P), ctypes.c_uint], "cuEventRecord": [P, P],
            "cuStreamWaitEvent": [P, P, ctypes.c_uint], "cuEventDestroy_v2": [P],
        }
        for name, args in sig.items():
            getattr(lib, name).argtypes = args
            getattr(lib, name).restype = ctypes.c_int
        self.lib, self.ctx = lib, ctx
        self._call("cuCtxSetCurrent", ctx)
        dev = ctypes.c_int()
        self._call("cuCtxGetDevice", ctypes.byref(dev))
        self.device_id = dev.value
        s = P()
        self._call("cuStreamCreate", ctypes.byref(s), 1)  # CU_STREAM_NON_BLOCKING
        self.default_stream = s.value or 0

    def _call(self, name, *args):
        r = getattr(self.lib, name)(*args)
        if r:
            _fail(name, r)

    def current(self):
        self._call("cuCtxSetCurrent", self.ctx)

    @staticmethod
    def dlpack_stream(stream):
        """The stream as DLPack's __dlpack__(stream=) names it."""
        return stream if stream else 1  # 1: the legacy default stream

    def alloc(self, n):
        self.current()
        p = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(p), max(1, n))
        return p.value

    def free(self, buf):
        self.current()
        self.lib.cuMemFree_v2(buf)

    def upload(self, stream, buf, src, n):
        self.current()
        if n:
            self._call("cuMemcpyHtoDAsync_v2", buf, src, n, stream)
        self._call("cuStreamSynchronize", stream)

    def download(self, stream, buf, dst, n):
        self.current()
        if n:
            self._call("cuMemcpyDtoHAsync_v2", dst, buf, n, stream)
        self._call("cuStreamSynchronize", stream)

    def order(self, done_on, consumer):
        """Makes stream consumer (DLPack's numbering) wait for work on done_on."""
        if consumer == -1:
            return
        target = {None: 0, 1: 0}.get(consumer, consumer)
        if target == done_on:
            return
        self.current()
        ev = P()
        self._call("cuEventCreate", ctypes.byref(ev), 2)  # CU_EVENT_DISABLE_TIMING
        try:
            self._call("cuEventRecord", ev, done_on)
            self._call("cuStreamWaitEvent", target, ev, 0)
        finally:
            self.lib.cuEventDestroy_v2(ev)


class _OpenCL:
    """OpenCL calls; handles are ints (cl_command_queue, cl_mem)."""

    kind = KDL_OPENCL

    def __init__(self, ctx):
        lib = ctypes.CDLL("libOpenCL.so.1")
        err = ctypes.POINTER(ctypes.c_int32)
        lib.clGetContextInfo.argtypes = [P, ctypes.c_uint32, ctypes.c_size_t, P, ctypes.POINTER(ctypes.c_size_t)]
        lib.clGetContextInfo.restype = ctypes.c_int32
        lib.clCreateCommandQueue.argtypes = [P, P, ctypes.c_uint64, err]
        lib.clCreateCommandQueue.restype = P
        lib.clCreateBuffer.argtypes = [P, ctypes.c_uint64, ctypes.c_size_t, P, err]
        lib.clCreateBuffer.restype = P
        lib.clReleaseMemObject.argtypes = [P]
        for name in ("clEnqueueWriteBuffer", "clEnqueueReadBuffer"):
            getattr(lib, name).argtypes = [P, P, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_size_t, P, ctypes.c_uint32,
                                           P, P]
            getattr(lib, name).restype = ctypes.c_int32
        lib.clFinish.argtypes = [P]
        lib.clFinish.restype = ctypes.c_int32
        self.lib, self.ctx = lib, ctx
        dev = P()
        r = lib.clGetContextInfo(ctx, 0x1081, ctypes.sizeof(dev), ctypes.byref(dev), None)  # CL_CONTEXT_DEVICES
        if r:
            _fail("clGetContextInfo", r)
        self.device_id = 0
        e = ctypes.c_int32()
        q = lib.clCreateCommandQueue(ctx, dev, 0, ctypes.byref(e))
        if not q:
            _fail("clCreateCommandQueue", e.value)
        self.default_stream = q

    @staticmethod
    def dlpack_stream(stream):
        return stream

    def alloc(self, n):
        e = ctypes.c_int32()
        m = self.lib.clCreateBuffer(self.ctx, 1, max(1, n), None, ctypes.byref(e))  # CL_MEM_READ_WRITE
        if not m:
            _fail("clCreateBuffer", e.value)
        return m

    def free(self, buf):
        self.lib.clReleaseMemObject(buf)

    def upload(self, stream, buf, src, n):
        r = self.lib.clEnqueueWriteBuffer(stream, buf, 1, 0, n, src, 0, None, None) if n else 0
        if r:
            _fail("clEnqueueWriteBuffer", r)

    def download(self, stream, buf, dst, n):
        r = self.lib.clEnqueueReadBuffer(stream, buf, 1, 0, n, dst, 0, None, None) if n else self.lib.clFinish(stream)
        if r:
            _fail("clEnqueueReadBuffer", r)

    def order(self, done_on, consumer):
        if consumer not in (-1, done_on):
            r = self.lib.clFinish(done_on)
            if r:
                _fail("clFinish", r)


def open_side(backend, ctx):
    """The device calls for a plan of backend ("cuda" or "opencl") in ctx."""
    return _Cuda(ctx) if backend == "cuda" else _OpenCL(ctx)


class DeviceArray:
    """A tensor in device memory that kfuse allocated (a run's output, or
    Compiled.to_device): DLPack producer (__dlpack__, __dlpack_device__), so
    torch.from_dlpack, cupy.from_dlpack and kfuse runs take it without a
    copy. .numpy() copies it to the host. The memory is freed when the
    array and every tensor made from it through DLPack are gone."""

    def __init__(self, side, onnx_dtype, shape, stream, owner=None):
        self._side = side
        self.onnx_dtype = onnx_dtype
        self.shape = tuple(int(d) for d in shape)
        n = 1
        for d in self.shape:
            n *= d
        self.nbytes = n * _dlpack.onnx_size(onnx_dtype)
        self._stream = stream  # where the work that writes it was enqueued
        self._owner = owner    # keeps the compiled plan (and its context) alive
        self.handle = side.alloc(self.nbytes)

    def __dlpack_device__(self):
        return (self._side.kind, self._side.device_id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("kfuse.DeviceArray: no copying export")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("kfuse.DeviceArray: lives on device %s" % (self.__dlpack_device__(),))
        self._side.order(self._stream, stream)
        return _dlpack.export(self, self.handle, self.__dlpack_device__(), self.onnx_dtype, self.shape)

    def numpy(self):
        """A host copy, after the work that writes the array."""
        import numpy as np
        from . import _np_dtype
        a = np.empty(self.shape, dtype=_np_dtype(self.onnx_dtype))
        self._side.download(self._stream, self.handle, a.ctypes.data if a.size else None, self.nbytes)
        return a

    def __repr__(self):
        return "kfuse.DeviceArray(shape=%s, dtype=%d, device=%s)" % (self.shape, self.onnx_dtype, self.__dlpack_device__())

    def __del__(self):
        h = getattr(self, "handle", None)
        if h:
            self.handle = None
            try:
                self._side.free(h)
            except Exception:  # interpreter shutdown: the driver may be gone
                pass
