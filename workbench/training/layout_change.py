"""A checkpoint's layout before and after a restore: each leaf's spec and per-device shard shape as the
saving mode laid it out, and as the resuming mode lays it out (plain records, then a text view).

Example:
    >>> config = TrainConfig(mode="dp-tp", mesh="data=4,model=2")
    >>> change = checkpoint_layout_change(latest_checkpoint("runs/mlp-fsdp"), config)
    >>> print(layout_change_text(change, only_moved=True))
    fsdp on data=8 -> dp-tp on data=4,model=2 (15 of 20 leaves move)
    * params/hidden1/bias                        [128]  P(data) [16] -> P(model) [64]
    * params/hidden1/kernel                      [64, 128]  P(None, data) [64, 16] -> P(None, model) [64, 64]
    ...
"""

from __future__ import annotations

import dataclasses

from ..layout.specs import format_spec
from .checkpoints import CheckpointError, CheckpointInfo
from .config import TrainConfig
from .step import build_step


@dataclasses.dataclass(frozen=True)
class LeafChange:
    """One leaf of the state: its global shape, and its spec and per-device shard shape before and after."""

    path: str
    shape: tuple[int, ...]
    spec_before: str
    shard_before: tuple[int, ...]
    spec_after: str
    shard_after: tuple[int, ...]

    @property
    def moved(self) -> bool:
        return (self.spec_before, self.shard_before) != (self.spec_after, self.shard_after)


@dataclasses.dataclass(frozen=True)
class LayoutChange:
    """The state's layout under the checkpoint's mode and mesh (``before``) and under the new ones (``after``)."""

    before: str
    after: str
    leaves: tuple[LeafChange, ...]

    def leaf(self, path: str) -> LeafChange:
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        raise KeyError(f"no leaf {path!r} in the state: its leaves are e.g. {[leaf.path for leaf in self.leaves[:3]]}")


def _state_layout(config: TrainConfig):
    built = build_step(config)  # the model and mode only: nothing compiles
    return built.mode.state_layout(built.state)


def checkpoint_layout_change(info: CheckpointInfo, config: TrainConfig) -> LayoutChange:
    """The layout of ``info``'s state as its run laid it out, and as ``config``'s mode and mesh lay it out.

    Raises:
        CheckpointError: a checkpoint of your own model (its layout needs the module: see the run's Inspect).

    Example:
        >>> config = TrainConfig(mode="dp-tp", mesh="data=4,model=2")
        >>> change = checkpoint_layout_change(latest_checkpoint("runs/mlp-fsdp"), config)
        >>> change.leaf("params/hidden1/kernel").shard_after
        (64, 64)
    """
    saved = TrainConfig.from_json(info.config)
    if str(saved.model).startswith("custom:"):
        raise CheckpointError(f"run {info.run_path.name!r} trained your own model: its layout needs the module")
    after_config = TrainConfig.from_json({**info.config, "mode": config.mode, "mesh": config.mesh})
    before, after = _state_layout(saved), _state_layout(after_config)
    leaves = tuple(
        LeafChange(old.path, tuple(old.layout.shape), format_spec(old.layout.spec), tuple(old.layout.shard_shape),
                   format_spec(new.layout.spec), tuple(new.layout.shard_shape))
        for old, new in zip(before.leaves, after.leaves, strict=False))
    return LayoutChange(f"{saved.mode} on {saved.mesh}", f"{config.mode} on {config.mesh}", leaves)


def _spec(text: str) -> str:
    return text if text.startswith("P(") else f"P({text})"


def layout_change_text(change: LayoutChange, *, only_moved: bool = False) -> str:
    """One line per leaf: path, global shape, spec and shard shape before -> after (``*``: the shard moved).

    Example:
        >>> leaf = LeafChange("w", (8, 4), "P('data', None)", (1, 4), "P(None, 'model')", (8, 2))
        >>> print(layout_change_text(LayoutChange("fsdp on data=8", "dp-tp on data=4,model=2", (leaf,))))
        fsdp on data=8 -> dp-tp on data=4,model=2 (1 of 1 leaves move)
        * w  [8, 4]  P('data', None) [1, 4] -> P(None, 'model') [8, 2]
    """
    leaves = [leaf for leaf in change.leaves if leaf.moved or not only_moved]
    moved = sum(leaf.moved for leaf in change.leaves)
    width = max((len(leaf.path) for leaf in leaves), default=0)
    lines = [f"{change.before} -> {change.after} ({moved} of {len(change.leaves)} leaves move)"]
    for leaf in leaves:
        lines.append(f"{'*' if leaf.moved else ' '} {leaf.path:<{width}}  {list(leaf.shape)}  "
                     f"{_spec(leaf.spec_before)} "
                     f"{list(leaf.shard_before)} -> {_spec(leaf.spec_after)} {list(leaf.shard_after)}")
    return "\n".join(lines)


__all__ = ["LayoutChange", "LeafChange", "checkpoint_layout_change", "layout_change_text"]
