"""The kfuse Python module against ONNX Runtime and its own contracts.

Whole models are compared with ONNX Runtime at the tolerance the repo's
other whole-model comparisons use (bench/models/check_opt.py: fp32 atol
1e-4, rtol 1e-3, |got - want| <= atol + rtol |want| per element), on fresh
random NumPy inputs whose seed is printed. Run from the repository root
or anywhere: paths are found from this file.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kfuse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = os.path.join(ROOT, "bench", "models", "small")
ATOL, RTOL = 1e-4, 1e-3


def model_path(pattern):
    paths = sorted(glob.glob(os.path.join(SMALL, pattern, "model.onnx")))
    assert paths, "no bundled model matches bench/models/small/%s/model.onnx" % pattern
    return paths[0]


@pytest.fixture
def rng():
    seed = int.from_bytes(os.urandom(4), "little")
    print("seed", seed)
    return np.random.default_rng(seed)


@pytest.fixture
def cache(tmp_path):
    return str(tmp_path / "kernel-cache")


def random_inputs(sess, rng, batch=2, seq=6):
    """NumPy inputs for an ORT session: symbolic dims batch at axis 0, seq
    elsewhere; floats in [-1, 1), integers 0 or 1 (token ids and masks
    inside every table they index)."""
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else (batch if k == 0 else seq) for k, d in enumerate(i.shape)]
        if i.type == "tensor(float)":
            feeds[i.name] = rng.uniform(-1, 1, shape).astype(np.float32)
        elif i.type == "tensor(int64)":
            feeds[i.name] = rng.integers(0, 2, shape).astype(np.int64)
        else:
            pytest.fail("input %s: type %s not handled by this test" % (i.name, i.type))
    return feeds


def assert_close(got, want, what):
    assert got.shape == want.shape, "%s: shape %s, ONNX Runtime %s" % (what, got.shape, want.shape)
    assert got.dtype == want.dtype, "%s: dtype %s, ONNX Runtime %s" % (what, got.dtype, want.dtype)
    bad = np.abs(got.astype(np.float64) - want) > ATOL + RTOL * np.abs(want.astype(np.float64))
    assert not bad.any(), "%s: %d of %d elements differ, largest %g" % (
        what, int(bad.sum()), bad.size, float(np.max(np.abs(got.astype(np.float64) - want))))


def ort_session(path_or_bytes):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(path_or_bytes, providers=["CPUExecutionProvider"])


def compile_or_skip(path, backend, **kw):
    try:
        return kfuse.compile(path, backend=backend, **kw)
    except kfuse.Error as e:
        if e.status == kfuse.ERR_NO_DEVICE:
            pytest.skip("%s: %s" % (backend, e.message))
        raise


@pytest.mark.parametrize("backend", ["ref", "opencl"])
@pytest.mark.parametrize("model", ["bert*", "resnet50"])
def test_model_matches_onnxruntime(model, backend, rng, cache):
    path = model_path(model)
    sess = ort_session(path)
    feeds = random_inputs(sess, rng)
    want = sess.run(None, feeds)
    c = compile_or_skip(path, backend, cache_dir=cache)
    assert c.backend == backend
    assert c.output_names == [o.name for o in sess.get_outputs()]
    assert c.input_names == [i.name for i in sess.get_inputs()]
    for by in ("dict", "list"):
        got = c.run(feeds if by == "dict" else [feeds[n] for n in c.input_names])
        assert len(got) == len(want)
        for name, g, w in zip(c.output_names, got, want):
            assert_close(g, w, "%s %s output %s (inputs by %s)" % (os.path.basename(os.path.dirname(path)), backend,
                                                                  name, by))


def test_output_info_before_run(rng):
    path = model_path("bert*")
    c = kfuse.compile(path, backend="ref")
    for batch, seq in ((1, 4), (3, 9)):
        feeds = random_inputs(ort_session(path), rng, batch, seq)
        info = c.output_info(feeds)
        shapes_only = c.output_info([feeds[n].shape for n in c.input_names])
        outs = c.run(feeds)
        assert info == shapes_only
        assert [(o.dtype, o.shape) for o in outs] == info
    # declared inputs: symbolic dims read None
    name, dtype, shape = c.inputs[0]
    assert dtype == np.int64 and shape == (None, None)


def test_every_precision_name_compiles(rng):
    # each name maps to the library's number: the float model runs at each
    # (the int8 and fp8 modes find no QDQ here: fp32 and fp16) near its fp32 result
    path = os.path.join(ROOT, "bench", "models", "tiny_cnn.onnx")
    x = rng.uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32)
    want = kfuse.compile(path, backend="ref", dims={"N": 2}).run([x])[0]
    assert set(kfuse.PRECISIONS) == {"fp32", "tf32", "fp16", "bf16", "int8", "int8-fp16", "fp8"}
    for p in kfuse.PRECISIONS:
        got = kfuse.compile(path, backend="ref", dims={"N": 2}, precision=p).run([x])[0]
        assert got.dtype == want.dtype and got.shape == want.shape, p
        tol = 5e-2 if p == "bf16" else 1e-2
        assert np.allclose(got, want, atol=tol, rtol=tol), (p, float(np.abs(got - want).max()))
    with pytest.raises(kfuse.Error):
        kfuse.compile(path, backend="ref", precision="int4")


def test_compile_options_reach_the_library(rng, cache, tmp_path):
    path = os.path.join(ROOT, "bench", "models", "tiny_cnn.onnx")
    c = kfuse.compile(path, backend="ref", dims={"N": 4}, target="none", fusion=False, batching=False)
    assert c.input_info(0) == (np.float32, (4, 3, 8, 8))
    x = rng.uniform(-1, 1, (4, 3, 8, 8)).astype(np.float32)
    assert c.run([x])[0].shape == (4, 10)
    with pytest.raises(kfuse.Error) as e:
        c.run([x[:2]])
    assert e.value.status == kfuse.ERR_SHAPE and "'x'" in e.value.message
    with pytest.raises(kfuse.Error) as e:
        kfuse.compile(path, backend="ref", patterns=[str(tmp_path / "missing.kfp")])
    assert e.value.status == kfuse.ERR_IO and "missing.kfp" in e.value.message


def test_errors_are_exceptions_with_the_message(tmp_path):
    with pytest.raises(kfuse.Error) as e:
        kfuse.compile(b"not an onnx file", backend="ref")
    assert e.value.status == kfuse.ERR_BAD_MODEL and e.value.status_name == "bad model"
    assert "protobuf" in e.value.message and e.value.message in str(e.value)
    with pytest.raises(kfuse.Error) as e:
        kfuse.optimize(str(tmp_path / "nowhere.onnx"))
    assert e.value.status == kfuse.ERR_IO and "nowhere.onnx" in e.value.message
    with pytest.raises(kfuse.Error) as e:
        kfuse.compile(os.path.join(ROOT, "bench", "models", "tiny_cnn.onnx"), backend="tpu")
    assert e.value.status == kfuse.ERR_INVALID_ARG
    c = kfuse.compile(os.path.join(ROOT, "bench", "models", "tiny_cnn.onnx"), backend="ref")
    with pytest.raises(kfuse.Error) as e:  # int32 where float is declared
        c.run({"x": np.zeros((1, 3, 8, 8), np.int32)})
    assert e.value.status == kfuse.ERR_INVALID_ARG and "'x'" in e.value.message
    with pytest.raises(kfuse.Error) as e:
        c.run([])
    assert e.value.status == kfuse.ERR_INVALID_ARG
    with pytest.raises(kfuse.Error) as e:  # channels 4, the model takes 3
        c.run([np.ones((1, 4, 8, 8), np.float32)])
    assert e.value.status in (kfuse.ERR_SHAPE, kfuse.ERR_INVALID_ARG) and e.value.message
    c.close()
    with pytest.raises(kfuse.Error):
        c.run([np.ones((1, 3, 8, 8), np.float32)])


class DLPackOnly:
    """Host memory offered through DLPack alone (no NumPy type visible)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def addresses_read(stderr):
    return [int(m, 16) for m in re.findall(r"kfuse: api: kf_run input '[^']*' read at (0x[0-9a-f]+)", stderr)]


def test_inputs_are_read_in_place(capfd, monkeypatch, rng):
    path = os.path.join(ROOT, "bench", "models", "tiny_cnn.onnx")
    c = kfuse.compile(path, backend="ref")
    x = rng.uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32)
    want = c.run([x])[0]
    monkeypatch.setenv("KFUSE_TRACE", "api")
    capfd.readouterr()
    got = c.run([DLPackOnly(x)])[0]
    seen = addresses_read(capfd.readouterr().err)
    assert seen == [x.ctypes.data], "the library read %s, the array is at %#x" % ([hex(a) for a in seen], x.ctypes.data)
    np.testing.assert_array_equal(got, want)
    c.run([x])  # NumPy directly: in place too
    assert addresses_read(capfd.readouterr().err) == [x.ctypes.data]
    # a view at an offset: DLPack's byte_offset or data pointer still lands on it
    big = rng.uniform(-1, 1, (3, 3, 8, 8)).astype(np.float32)
    tail = big[1:]
    c.run([DLPackOnly(tail)])
    assert addresses_read(capfd.readouterr().err) == [tail.ctypes.data]
    with pytest.raises(kfuse.Error) as e:  # strided memory through DLPack is refused, not misread
        c.run([DLPackOnly(np.ones((2, 3, 8, 16), np.float32)[:, :, :, ::2])])
    assert "contiguous" in e.value.message


def device_buffers(stderr):
    return [int(m, 16) for m in re.findall(r"kfuse: api: kf_run_device \w+ '[^']*' buffer (0x[0-9a-f]+)", stderr)]


def test_device_tensors_run_in_place(capfd, monkeypatch, rng):
    """On OpenCL (CUDA alike, bench/gpu_check.sh runs it with torch): a
    device array is read in place, the outputs stay on the device, nothing
    is copied through the host or waited for inside the run."""
    path = os.path.join(ROOT, "bench", "models", "tiny_cnn.onnx")
    c = compile_or_skip(path, "opencl")
    x = rng.uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32)
    want = c.run([x])[0]
    xd = c.to_device(x)
    assert isinstance(xd, kfuse.DeviceArray) and xd.shape == x.shape
    np.testing.assert_array_equal(xd.numpy(), x)
    monkeypatch.setenv("KFUSE_TRACE", "api,host")
    capfd.readouterr()
    (yd,) = c.run([xd])
    err = capfd.readouterr().err
    assert isinstance(yd, kfuse.DeviceArray), "a run on kfuse device arrays gives kfuse device arrays"
    assert device_buffers(err) == [xd.handle, yd.handle], err
    assert "kfuse: host:" not in err, "the run copied or waited through the host:\n" + err
    monkeypatch.delenv("KFUSE_TRACE")
    np.testing.assert_array_equal(yd.numpy(), want)
    # bound outputs: written in place and returned as given
    out = c.to_device(np.zeros_like(want))
    got = c.run([xd], outputs=[out])
    assert got[0] is out
    np.testing.assert_array_equal(out.numpy(), want)
    # an output read back through DLPack by another run: here, as the input of a model that passes it on
    assert yd.__dlpack_device__() == (4, 0)
    # errors are exceptions naming what is wrong
    with pytest.raises(kfuse.Error) as e:
        c.run([c.to_device(x.astype(np.float64))])
    assert e.value.status == kfuse.ERR_INVALID_ARG and "input" in e.value.message
    with pytest.raises(kfuse.Error) as e:
        c.run([xd], outputs=[x])
    assert "not a DLPack tensor in device memory" in e.value.message
    with pytest.raises(kfuse.Error) as e:
        kfuse.compile(path, backend="ref").run([xd])
    assert e.value.status == kfuse.ERR_UNSUPPORTED
    c.sync()


def test_device_arrays_are_freed_after_their_dlpack_consumers():
    path = os.path.join(ROOT, "bench", "models", "tiny_cnn.onnx")
    c = compile_or_skip(path, "opencl")
    d = c.to_device(np.arange(6, dtype=np.float32))
    import kfuse._dlpack as dl
    before = len(dl._EXPORTS)
    cap = d.__dlpack__()
    assert len(dl._EXPORTS) == before + 1
    del cap  # never consumed: the capsule's destructor lets go
    assert len(dl._EXPORTS) == before
    v = dl.device_view(d, "d", None)  # consumed the way a run reads it
    assert v.data == d.handle and v.shape == (6,) and v.device == (4, 0)
    del v
    assert len(dl._EXPORTS) == before


def test_optimize_and_fuse_run_in_onnxruntime(rng):
    path = model_path("bert*")
    sess = ort_session(path)
    feeds = random_inputs(sess, rng)
    want = sess.run(None, feeds)
    small = kfuse.optimize(path)
    assert isinstance(small, bytes) and len(small) > 0
    fused, report = kfuse.fuse(path, target="h100", dims={"batch": 2, "seq": 6}, report=True)
    assert report["functions"] > 0 and report["target"] == "h100"
    for what, model in (("optimized", small), ("fused", fused)):
        got = ort_session(model).run(None, feeds)
        for o, g, w in zip(sess.get_outputs(), got, want):
            assert_close(g, w, "%s %s" % (what, o.name))


def test_console_script():
    if os.environ.get("KFUSE_LIBRARY"):
        pytest.skip("KFUSE_LIBRARY is set: the module is used from a build tree, not installed")
    exe = shutil.which("kfuse", path=os.path.dirname(sys.executable)) or shutil.which("kfuse")
    assert exe, "no kfuse console script beside %s" % sys.executable
    out = subprocess.run([exe, "info", os.path.join(ROOT, "bench", "models", "tiny_cnn.onnx")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "probs" in out.stdout
    out = subprocess.run([sys.executable, "-m", "kfuse", "nosuchverb"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
