"""Compile several steps deviceless with XLA:GPU in one child process, for tests/test_gpu_memory_model.py.

The test process never loads the CUDA plugin (it stays out of every process but a GPU compile), so the
steps are compiled here: registered models through the verification child's own ``compile_request``, and
:class:`OwnResidualMLP`, a user's module, the way ``build_abstract_step`` builds any custom model. Reads a
JSON list of requests on stdin; prints one JSON list of ``CompiledStep.to_json()`` results.
"""

from __future__ import annotations

import json
import sys

import jax
import optax
from flax import nnx


class OwnResidualMLP(nnx.Module):
    """A user's model: a residual feed-forward block (layer norm, GELU) over 512 features, 10 classes."""

    def __init__(self, rngs):
        self.embed = nnx.Linear(64, 512, rngs=rngs)
        self.norm = nnx.LayerNorm(512, rngs=rngs)
        self.up = nnx.Linear(512, 2048, rngs=rngs)
        self.down = nnx.Linear(2048, 512, rngs=rngs)
        self.head = nnx.Linear(512, 10, rngs=rngs)

    def __call__(self, x):
        h = self.embed(x)
        h = h + self.down(jax.nn.gelu(self.up(self.norm(h))))
        return self.head(h)


def own_loss(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {}


OWN_EXAMPLE = {"x": jax.ShapeDtypeStruct((1, 64), "float32"), "y": jax.ShapeDtypeStruct((1,), "int32")}


def _compile_own(request: dict) -> dict:
    from workbench.analysis.compile_child import _gpu_devices
    from workbench.analysis.compile_target import parse_target
    from workbench.analysis.compiled_step import read_compiled_step
    from workbench.training.config import TrainConfig
    from workbench.training.step import CustomModel, build_abstract_step

    config = TrainConfig.from_json(request["config"])
    target = parse_target(request["target"])
    custom = CustomModel(OwnResidualMLP(nnx.Rngs(0)), own_loss, batches=())
    step = build_abstract_step(config, custom=custom, example_batch=OWN_EXAMPLE,
                               devices=_gpu_devices(target, config.mesh_shape))
    return read_compiled_step(step.compile(), step.mode.mesh, step.layers, target=str(target)).to_json()


def main() -> None:
    from workbench.analysis.compile_child import compile_request

    results = []
    for request in json.loads(sys.stdin.read()):
        if request["config"]["model"].startswith("custom:"):
            results.append(_compile_own(request))
        else:
            results.append(compile_request(request, lambda **message: None))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
