"""Recreate examples/tiny.apr: a two-layer MLP in aprender's layout, deterministic bytes."""

import os

import numpy as np

import aprfast

HERE = os.path.dirname(os.path.abspath(__file__))


def tiny_model():
    rng = np.random.default_rng(20261121)
    return {
        "encoder.weight": rng.standard_normal((16, 8), dtype=np.float32),
        "encoder.bias": np.zeros(16, np.float32),
        "head.weight": rng.standard_normal((4, 16), dtype=np.float32).astype(np.float16),
        "head.bias": np.zeros(4, np.float16),
        "step": np.array(1000, np.int64),
    }


METADATA = {
    "model_type": "mlp",
    "name": "tiny",
    "description": "A two-layer MLP shipped as aprfast's sample model",
    "version": "1.0.0",
    "created_at": "1700000000",
    "param_count": 16 * 8 + 16 + 4 * 16 + 4 + 1,
    "architecture": "mlp",
    "hidden_size": 16,
    "num_layers": 2,
}

if __name__ == "__main__":
    aprfast.save_file(tiny_model(), os.path.join(HERE, "tiny.apr"), METADATA, layout="aprender")
