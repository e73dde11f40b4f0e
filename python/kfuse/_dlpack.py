"""Tensors through the DLPack protocol (``__dlpack__``) without a copy:
reading host memory (kf_run) and device memory (kf_run_device), and
handing out kfuse's own device arrays (export). The structs are DLPack's stable C ABI (dlpack.h, version 0.x
"dltensor" capsules, which every producer still hands out when asked
without arguments):

    DLManagedTensor { DLTensor dl_tensor; void *manager_ctx; void (*deleter)(...); }
    DLTensor { void *data; DLDevice device; int32 ndim; DLDataType dtype;
               int64 *shape; int64 *strides; uint64 byte_offset; }

The capsule is not consumed (not renamed "used_dltensor"): the caller
keeps it alive while the library reads the memory, and the producer's
capsule destructor frees the managed tensor after.
"""

import ctypes


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


# DLDeviceType values whose memory the CPU reads directly
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_OPENCL = 4
KDL_ROCM_HOST = 11
HOST_DEVICES = (KDL_CPU, KDL_CUDA_HOST, KDL_ROCM_HOST)

# device memory kf_run_device takes: CUDA device pointers, OpenCL cl_mem
DEVICE_TYPES = (KDL_CUDA, KDL_OPENCL)

# (DLDataTypeCode, bits) -> ONNX TensorProto.DataType
_ONNX_OF = {
    (2, 32): 1, (1, 8): 2, (0, 8): 3, (1, 16): 4, (0, 16): 5, (0, 32): 6, (0, 64): 7,
    (6, 8): 9, (2, 16): 10, (2, 64): 11, (1, 32): 12, (1, 64): 13, (4, 16): 16,
}

_DL_OF = {v: k for k, v in _ONNX_OF.items()}


def onnx_size(onnx_dtype):
    """Bytes of one element of an ONNX dtype kfuse runs."""
    return _DL_OF[onnx_dtype][1] // 8

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


class HostView:
    """A DLPack tensor's memory as the library reads it. Keep the view alive
    while the memory is in use: it holds the capsule."""

    def __init__(self, capsule, onnx_dtype, shape, data):
        self.capsule = capsule
        self.dtype = onnx_dtype
        self.shape = shape
        self.data = data  # int address


def _layout(t, what):
    """(ONNX dtype, shape) of DLTensor t; ValueError unless row-major contiguous."""
    if t.dtype.lanes != 1:
        raise ValueError("%s: DLPack vector type (%d lanes)" % (what, t.dtype.lanes))
    onnx = _ONNX_OF.get((t.dtype.code, t.dtype.bits))
    if onnx is None:
        raise ValueError("%s: DLPack type code %d, %d bits has no ONNX type kfuse runs"
                         % (what, t.dtype.code, t.dtype.bits))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        expect, compact = 1, True
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] != expect:
                compact = False
            expect *= shape[i]
        if not compact:
            raise ValueError("%s: strided (not row-major contiguous) memory; pass a contiguous array" % what)
    return onnx, shape


def _managed(capsule, what):
    if not _is_valid(capsule, b"dltensor"):
        raise ValueError("%s: __dlpack__ returned no 'dltensor' capsule" % what)
    return DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor")).dl_tensor


def device_type(obj):
    """obj's DLPack device type, or None when it has no __dlpack_device__."""
    return int(obj.__dlpack_device__()[0]) if hasattr(obj, "__dlpack_device__") else None


class DeviceView(HostView):
    """A DLPack tensor in device memory: data is the CUDA device pointer or
    the OpenCL cl_mem; device is (type, id)."""

    def __init__(self, capsule, onnx_dtype, shape, data, device):
        HostView.__init__(self, capsule, onnx_dtype, shape, data)
        self.device = device


def device_view(obj, what, stream):
    """The device view of obj.__dlpack__(stream=stream) (the producer
    orders its pending writes before work on that stream); ValueError (why)
    when the memory is not CUDA or OpenCL device memory, the type has no
    ONNX twin, or the layout is not row-major contiguous."""
    try:
        capsule = obj.__dlpack__(stream=stream)
    except TypeError:  # a producer of the older protocol, without stream
        capsule = obj.__dlpack__()
    t = _managed(capsule, what)
    if t.device.device_type not in DEVICE_TYPES:
        raise ValueError("%s: DLPack device type %d is not CUDA or OpenCL device memory" % (what, t.device.device_type))
    onnx, shape = _layout(t, what)
    if t.device.device_type == KDL_OPENCL and t.byte_offset:
        raise ValueError("%s: an OpenCL tensor must start at its cl_mem's first byte (byte_offset %d)"
                         % (what, t.byte_offset))
    return DeviceView(capsule, onnx, shape, (t.data or 0) + t.byte_offset, (t.device.device_type, t.device.device_id))


# ---- export: kfuse's device arrays as DLPack producers ----------------------
# A capsule holds a DLManagedTensor whose deleter (called by the consumer
# once done, or by the capsule's destructor when nobody consumed it) drops
# the entry of _EXPORTS that keeps the struct, its shape and the array alive.
_EXPORTS = {}
_NAME = ctypes.create_string_buffer(b"dltensor")
# own prototypes: the capsule destructor gets a bare PyObject * (the
# pythonapi attributes above are typed for Python objects, and shared)
_new_capsule = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_valid_at = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_pointer_at = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CALLBACK
def _deleter(managed):
    _EXPORTS.pop(managed, None)


@_CALLBACK
def _capsule_destructor(capsule):
    if _valid_at(capsule, b"dltensor"):  # never consumed: its deleter is ours to call
        _EXPORTS.pop(_pointer_at(capsule, b"dltensor"), None)


def export(owner, data, device, onnx_dtype, shape):
    """A 'dltensor' capsule of owner's memory at data (contiguous)."""
    code, bits = _DL_OF[onnx_dtype]
    dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    m = DLManagedTensor()
    m.dl_tensor.data = data
    m.dl_tensor.device = DLDevice(device[0], device[1])
    m.dl_tensor.ndim = len(shape)
    m.dl_tensor.dtype = DLDataType(code, bits, 1)
    m.dl_tensor.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    m.dl_tensor.strides = None
    m.dl_tensor.byte_offset = 0
    m.deleter = ctypes.cast(_deleter, ctypes.c_void_p).value
    addr = ctypes.addressof(m)
    _EXPORTS[addr] = (m, dims, owner)
    return _new_capsule(addr, ctypes.addressof(_NAME), ctypes.cast(_capsule_destructor, ctypes.c_void_p).value)


def view(obj, what):
    """The host view of obj.__dlpack__(); ValueError (why) when the memory is
    not on the host, the type has no ONNX twin, or the layout is not
    row-major contiguous."""
    if hasattr(obj, "__dlpack_device__"):
        dev = obj.__dlpack_device__()
        if int(dev[0]) not in HOST_DEVICES:
            raise ValueError("%s: DLPack device type %d is not host memory (a run takes all its inputs on the host, "
                             "or all on the plan's CUDA or OpenCL device)" % (what, int(dev[0])))
    capsule = obj.__dlpack__()
    t = _managed(capsule, what)
    if t.device.device_type not in HOST_DEVICES:
        raise ValueError("%s: DLPack device type %d is not host memory" % (what, t.device.device_type))
    onnx, shape = _layout(t, what)
    data = (t.data or 0) + t.byte_offset
    return HostView(capsule, onnx, shape, data)
