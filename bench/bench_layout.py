"""Layout engine at production scale: a transformer-sized tree on a 1,024-device abstract mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from timing import machine, median_seconds, record

import workbench as wb

RULES = [
    (r"embed", "model, data"),
    (r"attn/(q|k|v)/kernel", "data, model"),
    (r"attn/out/kernel", "model, data"),
    (r"mlp/up/kernel", "data, model"),
    (r"mlp/down/kernel", "model, data"),
    (r".*", ""),
]


def transformer_state(layers: int = 48, d_model: int = 4096, vocab: int = 65536) -> dict:
    """Abstract params of a ~10B-parameter decoder (ShapeDtypeStructs: nothing is allocated)."""
    def leaf(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16)

    blocks = {
        str(i): {
            "attn": {name: {"kernel": leaf(d_model, d_model)} for name in ("q", "k", "v", "out")},
            "mlp": {"up": {"kernel": leaf(d_model, 4 * d_model)}, "down": {"kernel": leaf(4 * d_model, d_model)}},
            "norm": {"scale": leaf(d_model)},
        }
        for i in range(layers)
    }
    return {"embed": leaf(vocab, d_model), "blocks": blocks, "head": leaf(d_model, vocab)}


def run() -> list[dict]:
    state = transformer_state()
    mesh = "data=64,model=16"
    table = wb.layout_tree(state, mesh, RULES)
    leaves = len(table.leaves)
    seconds = median_seconds(lambda: wb.layout_tree(state, mesh, RULES), repeats=5)
    big = wb.layout_array((65536, 4096), mesh, "model, data")
    per_device = median_seconds(lambda: wb.layout_array((65536, 4096), mesh, "model, data").devices, repeats=5)
    return [
        record(f"layout_tree {leaves} leaves on 1,024 devices", seconds, "s", ("<=", 0.5), note=machine()),
        record("per-device slices of one array, 1,024 devices", per_device, "s", ("<=", 0.1),
               note=f"{len(big.devices)} slices; {machine()}"),
    ]
