"""A plan's arithmetic: a step's FLOPs per device, the activations and parameter copies it keeps beside the
training state, and whether its compute hides the gradient sync. What it assumes: docs/design/production-planning.md.

Example:
    >>> from workbench.training.models import abstract_model
    >>> model = abstract_model("transformer", n_layers=2)
    >>> activation_bytes(model, examples=8, seq_len=128, split=1, compute_bytes=2) > 0
    True
"""

from __future__ import annotations

import weakref
from typing import Any

from ..formatting import format_bytes
from ..layout.tree_layout import TreeLayout
from ..layout.mesh import DATA_AXIS
from ..layout.specs import entry_axes, spec_entries
from ..training.modes.base import MODEL_SPLIT_PLACEMENTS
from ..training.layer_stack import is_layer_stack
from ..training.models import abstract_batch, model_config
from ..training.modes.param_gathering import (
    first_layer_reads_parameters,
    layer_bytes,
    layer_call_order,
    layer_paths,
    module_at,
    owning_layer,
)
from .cost_model import ComputeBoundTest, Hardware, compute_bound_test
from .planned_model import PlannedModel

GRADIENT_BYTES = 4  # float32: gradients arrive in the master weights' dtype under bf16 compute too
COMPUTE_BYTES = {"fp32": 4, "bf16": 2}


def flops_per_device(planned: PlannedModel, n_params: int, seq_len: int | None, tokens: int, model_size: int,
                     notes: list[str], remat: str = "none") -> float:
    """FLOPs of one step on one device: the transformer's own count, else 6 per parameter per example/token.
    ``remat``: the policy's recomputation (:func:`remat_flops_per_device`), in every mode."""
    if planned.transformer_estimates:
        abstract = planned.abstract
        head = 2 * abstract.d_model * abstract.vocab  # the output head is replicated by the tp rules
        forward = (abstract.flops_per_token(seq_len) - head) / model_size + head
        # backward = 2 forwards (6N)
        return 3.0 * forward * tokens + remat_flops_per_device(abstract, seq_len, tokens, model_size, remat)
    if model_size > 1:
        notes.append(f"compute assumes every parameter of {planned.name!r} splits {model_size} ways: an approximation")
    return 6.0 * n_params * tokens / model_size


def remat_flops_per_device(model: Any, seq_len: int | None, tokens: int, split: int, remat: str) -> float:
    """FLOPs the remat policy ``remat`` (:mod:`~workbench.training.remat`) computes again in one step on one device.

    ``block`` runs every block's forward pass again: all of :meth:`~workbench.training.models.TransformerLM.
    flops_per_token` but the head's and the down projection's (whose output the backward pass does not read, so
    the compiler drops it). ``dots`` keeps the matmuls against weights and recomputes the attention's
    two einsums (``4 seq_len d`` per token and layer), whose batch dimensions its policy does not save; the
    norms, softmax and GELU it also recomputes are not counted (as in the forward count).

    Example:
        >>> from workbench.training.models import abstract_model
        >>> model = abstract_model("transformer", n_layers=1, vocab=8, d_model=4, n_heads=1)
        >>> remat_flops_per_device(model, 2, tokens=1, split=1, remat="dots")
        32.0
        >>> remat_flops_per_device(model, 2, tokens=1, split=1, remat="block")
        288.0
    """
    if remat == "none" or seq_len is None:
        return 0.0
    d = model.d_model
    attention = 4 * model.n_layers * seq_len * d
    if remat == "dots":
        return float(attention * tokens / split)
    head, down = 2 * d * model.vocab, 2 * model.n_layers * d * model.d_ff
    return float((model.flops_per_token(seq_len) - head - down) * tokens / split)


def activation_all_reduces(model: Any, remat: str = "none", reassociates: bool = True) -> int:
    """How many times one microbatch of a tensor-parallel transformer step all-reduces a block's (B, T, d_model)
    activations over 'model', counted as the compiler emits them.

    Per block: 2 in the forward pass (after the attention's output projection and the feed-forward's down
    projection), and in the backward pass the input gradients of the column-parallel layers: the feed-forward's
    up projection, and q, k and v, which a compiler that reassociates all-reduces (``reassociates``: XLA:GPU,
    libtpu) adds before it sends once, and XLA:CPU sends as three. Remat ``block`` recomputes the forward pass in
    the backward, and with it the attention's all-reduce, whose sum the second LayerNorm's gradient reads (the
    feed-forward's is read by nothing the backward needs, and the compiler drops it); ``dots`` saves the
    projections' outputs and recomputes none (measured on 2 and 24 blocks, every tensor-parallel mode, XLA:CPU,
    XLA:GPU and libtpu).

    Example:
        >>> from workbench.training.models import abstract_model
        >>> model = abstract_model("transformer", n_layers=2)
        >>> activation_all_reduces(model), activation_all_reduces(model, "block", reassociates=False)
        (8, 14)
    """
    backward = 2 if reassociates else 4
    recomputed = 1 if remat == "block" else 0
    return model.n_layers * (2 + backward + recomputed)


def activation_bytes(model: Any, examples: int, seq_len: int, split: int, compute_bytes: int,
                     remat: str = "none") -> int:
    """Activations a transformer keeps for the backward pass on one device.

    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), eq. 2:
    ``s b h (10 + 24/t + 5 a s / (h t))`` bytes per layer for 16-bit activations and tensor parallelism
    ``t`` (without sequence parallelism), scaled here to the compute dtype, plus the logits held in the
    compute dtype and as float32 for the loss. Their constants include dropout masks this model does not
    have, so this errs high: a rough figure. The remat policy ``remat`` keeps less: ``block`` each layer's
    input ``s b h``, plus one layer's activations, recomputed, at a time; ``dots`` each block's input
    and its kept matmul outputs (q, k and v, the attention's output projection, the up projection: ``s b
    (2 h + 3 h / t + d_ff / t)``), plus one layer's activations, recomputed, at a time.
    The loss computes the logits ``loss_tile`` words of the vocabulary at a time
    (:meth:`~workbench.training.lm_head.OutputHead.cross_entropy_sums`), so one tile's logits are held.
    """
    s, b, h, a = seq_len, examples, model.d_model, model.n_heads
    per_layer = s * b * h * (10 + 24 / split + 5 * a * s / (h * split)) * compute_bytes / 2
    logits = s * b * min(model.vocab, model.loss_tile) * (compute_bytes + 4)
    if remat == "block":
        return int(model.n_layers * s * b * h * compute_bytes + per_layer + logits)
    if remat == "dots":
        kept = s * b * (2 * h + (3 * h + model.d_ff) / split) * compute_bytes
        return int(model.n_layers * kept + per_layer + logits)
    return int(model.n_layers * per_layer + logits)


def transient_params_bytes(declared, params_layout: TreeLayout, precision: str, notes: list[str],
                           model: Any = None, gathers_bf16: bool = True) -> int:
    """Parameters a step holds beside the state, as the mode declares it gathers them
    (``parameter_gathering``), and/or the bf16 compute copy. ``gathers_bf16``: whether a per-layer gathering mode
    gathers bf16 shards in a bf16 step (not on XLA:CPU, which widens them: it gathers float32 and casts after)."""
    bf16 = precision == "bf16"
    if declared.parameter_gathering == "whole-tree":
        full_params = params_layout.total_bytes
        notes.append(f"{declared.name} gathers the whole parameter tree for the step; fsdp gathers one layer at a time")
        return full_params + (full_params // 2 if bf16 else 0)
    if declared.parameter_gathering == "per-layer":
        layers, whole = _layers_of(model)
        sizes = {layer: int(size * share) for layer, (size, share) in
                 _layer_shares(dict(whole), params_layout, layers).items()}
        own = sizes.pop(None, 0)
        largest, path = max(((size, path) for path, size in sizes.items()), default=(0, None))
        if path is not None:
            held = "gathered over 'data'" if declared.state_placement in MODEL_SPLIT_PLACEMENTS else "whole"
            notes.append(f"{declared.name} holds one layer's parameters and gradients {held} at a time: the largest "
                         f"layer, {path!r}, is {format_bytes(largest)}")
        if own:
            notes.append(f"{format_bytes(own)} of parameters belong to no layer of the model and are gathered for "
                         "the whole step")
        gathered = largest + own
        # Its gradients, whole, and the gathered layer: in bf16 steps its bf16 copy too, and the float32 one it was
        # cast from unless the shards were cast before they were gathered.
        copies = gathered if not bf16 else gathered // 2 + (0 if gathers_bf16 else gathered)
        return gathered + copies
    return params_layout.bytes_per_device // 2 if bf16 else 0


# A model's layers and their bytes, per model object: the recommender plans one (cached) abstract model in every
# layout, and walking a 1.3B model's graph took 0.4 s a plan, 43% of the formulas pass. Weak keys: a model that
# goes away takes its entry with it.
_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _layers_of(model: Any) -> tuple[list[str], dict[str | None, int]]:
    """(:func:`~..training.modes.param_gathering.layer_paths`, :func:`...layer_bytes`) of ``model``, once per object."""
    try:
        return _LAYERS[model]
    except (KeyError, TypeError):  # TypeError: an object that cannot be weakly referenced
        found = (layer_paths(model), layer_bytes(model))
    try:
        _LAYERS[model] = found
    except TypeError:
        pass
    return found


def not_regathered_bytes(declared: type, planned: PlannedModel, params_layout: TreeLayout, seq_len: int | None,
                         loss: Any, example_batch: Any, remat: str, notes: list[str]) -> int:
    """Per-device bytes, split over 'data', of the layers a per-layer gathering mode does not gather again for the
    backward pass: the last layer the forward pass calls (it keeps its gathered parameters:
    :func:`~..training.modes.param_gathering.layer_call_order`) and the first, if its backward pass reads none of
    its parameters (:func:`~..training.modes.param_gathering.first_layer_reads_parameters`: an embedding lookup;
    its inputs are the batch's when the model owns no parameter of its own), and the parameters the model owns
    itself, which are gathered once for the whole step. 0 for other modes; a layer of a
    scanned stack is gathered again (one iteration cannot keep its own), and so is a block the gathering recomputes
    (remat ``block``). Where the calls cannot be traced (your model without an ``example_batch``) the backward
    pass's gathers are priced for every layer, an upper bound.

    Example:
        >>> from flax import nnx
        >>> from workbench.layout.tree_layout import layout_tree
        >>> from workbench.training.modes import mode_class
        >>> from .planned_model import resolve_planned_model
        >>> planned = resolve_planned_model("mlp", {}, None, [])
        >>> layout = layout_tree(nnx.state(planned.abstract, nnx.Param), "data=8", "shard")
        >>> not_regathered_bytes(mode_class("fsdp"), planned, layout, None, None, None, "none", [])  # both layers'
        4800
    """
    if declared.parameter_gathering != "per-layer":
        return 0
    model = planned.abstract
    calls = _traced_layer_calls(planned, seq_len, loss, example_batch)
    if calls is None:
        notes.append(f"the order in which your {planned.name} calls its layers is not traced without example_batch: "
                     "the backward pass's gathers are priced for every layer (the last layer called gathers once)")
        return 0
    order, first_reads = calls
    layers, sizes = _layers_of(model)
    why = {}
    if order:
        first, last = order[0], order[-1]
        recomputed = remat == "block" and getattr(module_at(model, first), "remat", None) is not None
        if not is_layer_stack(module_at(model, last)):
            why[last] = "the last one called, which keeps the parameters its forward pass gathered"
        if (first != last and not first_reads and not sizes.get(None)
                and not is_layer_stack(module_at(model, first)) and not recomputed):
            why[first] = "the first, whose backward pass reads none of its parameters"
    if why:
        notes.append(f"{declared.name} gathers every layer again for the backward pass but "
                     + " and ".join(f"{path!r}, {reason}" for path, reason in why.items()))
    once = {*why, None}  # None: the parameters the model owns itself, gathered once for the whole step
    return sum(leaf.layout.bytes_per_device for leaf in params_layout.leaves
               if owning_layer(leaf.path, layers) in once
               and any(DATA_AXIS in entry_axes(e) for e in spec_entries(leaf.layout.spec)))


def _traced_layer_calls(planned: PlannedModel, seq_len: int | None, loss: Any,
                        example_batch: Any) -> tuple[list[str], bool] | None:
    """(the model's layers in the order its loss calls them, whether the first one's backward pass reads its
    parameters), traced once per model object; None where they cannot be traced (your model, no example batch)."""
    model = planned.abstract
    if model in _CALL_ORDERS:
        return _CALL_ORDERS[model]
    if planned.model_class is not None:  # a registered model
        loss, batch = planned.model_class.loss, abstract_batch(model_config(planned.name, **planned.options), 1,
                                                               seq_len)
    elif example_batch is not None:
        loss, batch = loss or type(model).loss, example_batch
    else:
        return None
    order = layer_call_order(model, loss, batch)
    _CALL_ORDERS[model] = found = (order, bool(order) and first_layer_reads_parameters(model, loss, batch))
    return found


_CALL_ORDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _layer_shares(sizes: dict[str | None, int], params_layout: TreeLayout,
                  layers: list[str]) -> dict[str | None, tuple[int, float]]:
    """Each layer's whole bytes beside the share of them one device holds once the layer is gathered over
    'data': 1 for ``fsdp``; for ``fsdp-tp`` the leaves split over 'model' stay split (1/model of them)."""
    held: dict[str | None, list[int]] = {}
    data_size = params_layout.mesh.axes.get(DATA_AXIS, 1)
    for leaf in params_layout.leaves:
        layout = leaf.layout
        over_data = any(DATA_AXIS in entry_axes(e) for e in spec_entries(layout.spec))
        gathered = layout.bytes_per_device * (data_size if over_data else 1)
        totals = held.setdefault(owning_layer(leaf.path, layers), [0, 0])
        totals[0] += gathered
        totals[1] += layout.total_bytes
    return {layer: (size, held[layer][0] / held[layer][1] if held.get(layer, [0, 0])[1] else 1.0)
            for layer, size in sizes.items()}


def tensor_parallel_notes(planned: PlannedModel, tensor_parallel: bool, model_size: int) -> list[str]:
    """What the plan leaves out or warns about when layers split over 'model'."""
    if not tensor_parallel or model_size == 1:
        return []
    if not planned.transformer_estimates:
        return [f"the activation all-reduces after {planned.name!r}'s row-parallel layers are not estimated "
                "(only the transformer's are)"]
    heads = planned.abstract.n_heads
    if heads % model_size:
        return [f"n_heads={heads} does not divide by model={model_size}: devices would split heads; choose n_heads "
                "divisible by the model axis"]
    return []


def bound_by_compute(declared, sync_bytes: int, data_size: int, flops: float, tokens: int, seq_len: int | None,
                     hw: Hardware, utilisation: float, notes: list[str],
                     bytes_per_param: int = GRADIENT_BYTES) -> ComputeBoundTest | None:
    """Whether the gradient sync hides behind the step's compute (None where nothing syncs over 'data').
    ``bytes_per_param``: a gradient's bytes on the wire (2 where the compiler sums bf16 gradients)."""
    if sync_bytes and data_size > 1:
        synced_params = sync_bytes / bytes_per_param
        return compute_bound_test(
            tokens, hw, bytes_per_param=bytes_per_param, flops_per_param_per_token=flops / tokens / synced_params,
            group_size=data_size, utilisation=utilisation, unit="tokens" if seq_len else "examples",
        )
    if not declared.one_device:
        notes.append("no gradient synchronisation over 'data': the compute-bound test does not apply (tp's "
                     "activation all-reduces grow with the batch as its compute does)")
    return None


def assumption_note(precision: str, utilisation: float) -> str:
    """The note every plan ends with: what its compute and collective times assume."""
    slower = ""
    if precision == "fp32":
        slower = " (fp32 matmuls run slower: TF32 at half rate on H100, several bf16 passes on TPU)"
    return (f"compute assumes the chip's bf16 peak at {utilisation:.0%} utilisation{slower}; collectives use one "
            "ring per mesh axis, and nothing overlaps")


__all__ = [
    "COMPUTE_BYTES", "GRADIENT_BYTES", "activation_all_reduces", "activation_bytes", "assumption_note",
    "bound_by_compute", "flops_per_device", "not_regathered_bytes", "remat_flops_per_device", "tensor_parallel_notes",
    "transient_params_bytes",
]
