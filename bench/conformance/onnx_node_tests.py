"""Writes the installed onnx wheel's backend node test cases
(onnx.backend.test.case.node.collect_testcases) as test folders the way
`python -m onnx.backend.test.cmd_tools generate-data` writes model cases:
OUT/<case>/model.onnx and OUT/<case>/test_data_set_N/{input,output}_M.pb.
`kfuse conform OUT` then runs the current release's tests beside Debian's.

    python3 bench/conformance/onnx_node_tests.py OUT [OP_TYPE ...]

With op types, only the cases whose graph holds one of them are written.
Values that are not tensors (sequences, optionals) are skipped with a line
naming the case.
"""
import os
import shutil
import sys

import numpy as np
import onnx
import onnx.backend.test.case.node as node
from onnx import TensorProto, numpy_helper


def as_tensor(v, name):
    if isinstance(v, TensorProto):
        return v
    if isinstance(v, np.ndarray) or np.isscalar(v):
        return numpy_helper.from_array(np.asarray(v), name)
    return None


def main(out, ops):
    written = skipped = 0
    for case in node.collect_testcases(None):
        if ops and not ({n.op_type for n in case.model.graph.node} & ops):
            continue
        d = os.path.join(out, case.name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        ok = True
        for i, (ins, outs) in enumerate(case.data_sets):
            ds = os.path.join(d, f"test_data_set_{i}")
            os.makedirs(ds)
            for kind, vals, infos in (("input", ins, case.model.graph.input), ("output", outs, case.model.graph.output)):
                for j, v in enumerate(vals):
                    t = as_tensor(v, infos[j].name if j < len(infos) else f"{kind}_{j}")
                    if t is None:
                        ok = False
                        break
                    with open(os.path.join(ds, f"{kind}_{j}.pb"), "wb") as f:
                        f.write(t.SerializeToString())
        if not ok:
            shutil.rmtree(d)
            skipped += 1
            print(f"skipped {case.name}: a value that is not a tensor")
            continue
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        written += 1
    print(f"onnx {onnx.__version__}: {written} node test folders in {out}, {skipped} skipped")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], set(sys.argv[2:]))
