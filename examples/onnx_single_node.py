"""Run a one-node ONNX model (``pkg.nxrt::Attention``) through attnrt's executor.

The model is built with ``onnx.helper`` and serialised, as an exporter would; the node is
read back with :meth:`attnrt.Node.from_onnx`, claimed by the op's factory, planned, run,
captured into a CUDA graph and replayed; the result is checked against the float64
reference. Needs ``onnx``; without a GPU it stops after the claim (which needs none).

    python examples/onnx_single_node.py
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import attnrt
from attnrt.ops import reference
from attnrt.ops.attention import AttentionFactory
from attnrt.runtime.executor import Executor

B, H, HKV, SQ, SK, D = 2, 8, 2, 7, 45, 64


def build_model() -> bytes:
    """A model whose graph is one GQA causal Attention node (as bytes, like a file)."""
    node = helper.make_node("Attention", ["q", "k", "v"], ["o"], domain="pkg.nxrt",
                            num_heads=H, kv_num_heads=HKV, causal=1)
    f16 = TensorProto.FLOAT16
    graph = helper.make_graph(
        [node], "single_attention",
        [helper.make_tensor_value_info("q", f16, [B, H, SQ, D]),
         helper.make_tensor_value_info("k", f16, [B, HKV, SK, D]),
         helper.make_tensor_value_info("v", f16, [B, HKV, SK, D])],
        [helper.make_tensor_value_info("o", f16, [B, H, SQ, D])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("pkg.nxrt", 1)])
    return model.SerializeToString()


def shapes_of(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    vis = list(graph.input) + list(graph.output)
    return {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in vis}


def main() -> None:
    model = onnx.load_from_string(build_model())
    (proto,) = model.graph.node
    node = attnrt.Node.from_onnx(proto)
    shapes = shapes_of(model.graph)
    print("node:", node)

    rng = np.random.default_rng(0)
    host = {n: rng.standard_normal(shapes[n]).astype(np.float16) for n in node.inputs if n}
    reason = AttentionFactory(None).unsupported_reason(
        node, [shapes[n] for n in node.inputs], [attnrt.DataType.FLOAT16] * 3)
    print("claimed by AttentionFactory" if reason is None else f"declined: {reason}")
    if (missing := attnrt.gpu_missing_reason()) is not None:
        print(f"no GPU ({missing}); stopping after the claim")
        return

    want = reference.attention(node, [host[n] for n in node.inputs], out_dtype=np.float64)
    with attnrt.CudaRuntime(0) as rt:
        ex = Executor(rt)
        arrays = {n: attnrt.DeviceArray.from_numpy(rt, a) for n, a in host.items()}
        out = attnrt.DeviceArray(rt, shapes["o"], attnrt.DataType.FLOAT16)
        try:
            for n, a in arrays.items():
                ex.bind(n, a.view())
            ex.bind("o", out.mut())
            ex.add(node, AttentionFactory(rt))
            ex.plan()
            ex.run()
            eager = out.numpy()
            ex.capture()  # a warm-up run, then the step as one CUDA graph
            out.fill_bytes(0xFF)  # poison: the replay must rewrite every element
            ex.replay()
            replayed = out.numpy()
        finally:
            ex.close()
            for a in [*arrays.values(), out]:
                a.free()
    err = np.linalg.norm(eager - want) / np.linalg.norm(want)
    print(f"relative error vs float64 reference: {err:.2e}")
    assert err < 2e-3 and np.array_equal(eager, replayed), "mismatch"
    print("replay matches eager bit for bit; node round trip:", attnrt.Node.from_onnx(node.to_onnx()) == node)


if __name__ == "__main__":
    main()
