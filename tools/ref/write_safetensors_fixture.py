#!/usr/bin/env python3
"""Writes safetensors fixtures with the Python `safetensors` package, so the C++ reader is
checked against files written by the real library (tests/io/safetensors_test.cpp asserts the
values listed here).

    pip install safetensors numpy
    python3 tools/ref/write_safetensors_fixture.py   # from the repository root

Outputs (small, committed):
  tests/fixtures/safetensors/reference.safetensors
      __metadata__ = {"format": "pt", "producer": "write_safetensors_fixture.py"}
      "weight_f32"  F32  [2, 3]  0.5, -1.25, 3.0, 0.001 (as float32), -0.0, 1e30 (as float32)
      "bias_f64"    F64  [3]     0.1, -2.5, 1e100
      "norm_bf16"   BF16 [5]     1.0, -2.0, 0.15625, 2^-130 (subnormal), 3.3895313892515355e38 (max)
      "embed_f16"   F16  [2, 2]  1.0, -0.5, 65504.0 (max), 2^-24 (smallest subnormal)
      "scalar"      F32  []      7.0
      "empty"       F32  [0, 4]  (no elements)
  tests/fixtures/safetensors/sharded/  (Hugging Face sharded layout, index written as transformers does)
      model-00001-of-00002.safetensors: "a" F32 [2] = 1.0, 2.0
      model-00002-of-00002.safetensors: "b" F64 [1, 2] = 3.0, 4.0
      model.safetensors.index.json: {"metadata": {"total_size": 24}, "weight_map": {"a": shard 1, "b": shard 2}}
"""
import json
import os

import numpy as np
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "safetensors")


def bf16_bits(values):
    """bfloat16 bit patterns of float32 values that bfloat16 represents exactly."""
    as_f32 = np.array(values, dtype=np.float32)
    bits = as_f32.view(np.uint32)
    assert np.all(bits & 0xFFFF == 0), "value not exactly representable in bfloat16"
    return (bits >> 16).astype(np.uint16)


def main():
    os.makedirs(os.path.join(OUT, "sharded"), exist_ok=True)

    tensors = {
        "weight_f32": np.array([[0.5, -1.25, 3.0], [0.001, -0.0, 1e30]], dtype=np.float32),
        "bias_f64": np.array([0.1, -2.5, 1e100], dtype=np.float64),
        "embed_f16": np.array([[1.0, -0.5], [65504.0, 2.0**-24]], dtype=np.float16),
        "scalar": np.array(7.0, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    # numpy has no bfloat16: hand the raw bits to the library as a BF16 tensor.
    norm = bf16_bits([1.0, -2.0, 0.15625, 2.0**-130, 3.3895313892515355e38])
    specs = {
        name: TensorSpec(dtype=array.dtype.name, shape=array.shape, data_ptr=array.ctypes.data, data_len=array.nbytes)
        for name, array in tensors.items()
    }
    specs["norm_bf16"] = TensorSpec(dtype="bfloat16", shape=(5,), data_ptr=norm.ctypes.data, data_len=norm.nbytes)
    metadata = {"format": "pt", "producer": "write_safetensors_fixture.py"}
    serialize_file(specs, os.path.join(OUT, "reference.safetensors"), metadata=metadata)

    shards = {
        "model-00001-of-00002.safetensors": {"a": np.array([1.0, 2.0], dtype=np.float32)},
        "model-00002-of-00002.safetensors": {"b": np.array([[3.0, 4.0]], dtype=np.float64)},
    }
    weight_map = {}
    total_size = 0
    for file, shard in shards.items():
        save_file(shard, os.path.join(OUT, "sharded", file), metadata={"format": "pt"})
        for name, array in shard.items():
            weight_map[name] = file
            total_size += array.nbytes
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(OUT, "sharded", "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
