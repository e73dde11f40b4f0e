"""Reading host memory through the DLPack protocol (``__dlpack__``) without
a copy. The structs are DLPack's stable C ABI (dlpack.h, version 0.x
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
KDL_CUDA_HOST = 3
KDL_ROCM_HOST = 11
HOST_DEVICES = (KDL_CPU, KDL_CUDA_HOST, KDL_ROCM_HOST)

# (DLDataTypeCode, bits) -> ONNX TensorProto.DataType
_ONNX_OF = {
    (2, 32): 1, (1, 8): 2, (0, 8): 3, (1, 16): 4, (0, 16): 5, (0, 32): 6, (0, 64): 7,
    (6, 8): 9, (2, 16): 10, (2, 64): 11, (1, 32): 12, (1, 64): 13, (4, 16): 16,
}

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


def view(obj, what):
    """The host view of obj.__dlpack__(); ValueError (why) when the memory is
    not on the host, the type has no ONNX twin, or the layout is not
    row-major contiguous."""
    if hasattr(obj, "__dlpack_device__"):
        dev = obj.__dlpack_device__()
        if int(dev[0]) not in HOST_DEVICES:
            raise ValueError("%s: DLPack device type %d is not host memory (kfuse reads host memory only)"
                             % (what, int(dev[0])))
    capsule = obj.__dlpack__()
    if not _is_valid(capsule, b"dltensor"):
        raise ValueError("%s: __dlpack__ returned no 'dltensor' capsule" % what)
    managed = DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor"))
    t = managed.dl_tensor
    if t.device.device_type not in HOST_DEVICES:
        raise ValueError("%s: DLPack device type %d is not host memory" % (what, t.device.device_type))
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
    data = (t.data or 0) + t.byte_offset
    return HostView(capsule, onnx, shape, data)
