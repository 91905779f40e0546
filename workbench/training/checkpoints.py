"""Checkpoints of a training run with Orbax: saved as laid out, restored into any layout.

A checkpoint is ``runs/<name>/checkpoints/<step>/`` holding two Orbax items: ``state``, the whole
:class:`~workbench.training.modes.core.TrainState` (parameters, optimizer state, other) written shard by
shard, and ``meta``, JSON: the run's config, the step, the data position (batches consumed, seed) and the
state's signature (every leaf's path, shape and dtype). Saves are asynchronous (Orbax copies the arrays
off the devices, then writes in a thread) and atomic (a temporary folder renamed when complete: a kill
mid-save leaves the earlier checkpoints usable). A restore reads straight into the shardings of the
target's ``jax.ShapeDtypeStruct`` leaves, so a state saved under one mesh and mode loads into another.

Example:
    >>> placed = mode.place_state(state)  # a dp mode's state, laid out on its mesh
    >>> writer = CheckpointWriter("runs/my-run", keep=3)
    >>> writer.save(100, placed, checkpoint_meta(config, 100, placed)); writer.close()
    >>> target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
    ...                       state, mode.restore_shardings(state))
    >>> info = latest_checkpoint("runs/my-run"); restored = restore_state(info, target)
    >>> info.step, restored.params["hidden1"]["kernel"].sharding == placed.params["hidden1"]["kernel"].sharding
    (100, True)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
from pathlib import Path
from typing import Any

import jax

from ..errors import WorkbenchError
from ..layout.paths import leaves_with_paths

CHECKPOINTS_FOLDER = "checkpoints"
STATE_ITEM, META_ITEM = "state", "meta"
FORMAT = 1  # the meta item's layout; a reader refuses a newer one
# What Orbax writes into every checkpoint it completes (its rename makes the folder appear whole).
COMPLETE_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt")
LISTED_DIFFERENCES = 3  # how many differing leaves a refusal names


class CheckpointError(WorkbenchError):
    """A checkpoint that cannot be written, found, read or matched to the state it should restore."""


def checkpoints_folder(run_path: str | os.PathLike) -> Path:
    """Where a run's checkpoints live.

    Example:
        >>> checkpoints_folder("runs/mlp-dp").as_posix()
        'runs/mlp-dp/checkpoints'
    """
    return Path(run_path) / CHECKPOINTS_FOLDER


def state_signature(state: Any) -> dict[str, list]:
    """Every leaf of ``state`` as ``path -> [shape, dtype]``: what a checkpoint must match to restore.

    Example:
        >>> import numpy as np
        >>> state_signature({"w": np.zeros((2, 3), np.float32)})
        {'w': [[2, 3], 'float32']}
    """
    return {path: [list(leaf.shape), str(leaf.dtype)] for path, leaf in leaves_with_paths(state)}


def signature_differences(saved: dict[str, list], here: dict[str, list]) -> list[str]:
    """What differs between a saved signature and this state's, in words (empty: they match).

    Example:
        >>> signature_differences({"w": [[2], "float32"]}, {"w": [[3], "float32"], "b": [[3], "float32"]})
        ["'b' is not in the checkpoint", "'w' is [2] float32 there, [3] float32 here"]
    """
    differences = [f"{path!r} is not in the checkpoint" for path in here if path not in saved]
    differences += [f"{path!r} is in the checkpoint only" for path in saved if path not in here]
    differences += [
        f"{path!r} is {saved[path][0]} {saved[path][1]} there, {shape} {dtype} here"
        for path, (shape, dtype) in here.items() if path in saved and saved[path] != [shape, dtype]
    ]
    return differences


def checkpoint_meta(config: Any, step: int, state: Any) -> dict[str, Any]:
    """The JSON a checkpoint of ``state`` after ``step`` steps of a run with ``config`` carries.

    Example:
        >>> import numpy as np
        >>> from workbench.training.config import TrainConfig
        >>> meta = checkpoint_meta(TrainConfig(), 20, {"w": np.zeros(2, np.float32)})
        >>> meta["step"], meta["data_position"], meta["state"]
        (20, {'batches': 20, 'seed': 0}, {'w': [[2], 'float32']})
    """
    return {
        "format": FORMAT, "step": int(step), "config": config.to_json(),
        "data_position": {"batches": int(step), "seed": config.seed},  # one batch per step, in (seed, epoch) order
        "state": state_signature(state),
    }


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """One complete checkpoint on disk: its ``run_path``, ``step`` and ``meta`` (see :func:`checkpoint_meta`)."""

    run_path: Path
    step: int
    meta: dict[str, Any]

    @property
    def path(self) -> Path:
        return checkpoints_folder(self.run_path) / str(self.step)

    @property
    def config(self) -> dict[str, Any]:
        return self.meta["config"]


# What Orbax says (through absl's logger, as red stderr in a notebook cell and a red Log Console badge) every
# time the workbench opens checkpoints only to read them: it asked for that, so there is nothing to act on.
_READ_ONLY_NOTICES = ("CheckpointManagerOptions.read_only=True", "Given directory is read only")


class _ReadOnlyNotices(logging.Filter):
    """Drops Orbax's notices that a checkpoint folder opened to read is read-only; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_READ_ONLY_NOTICES)


def _manager(run_path: Path, keep: int | None = None, *, read_only: bool = False):
    import orbax.checkpoint as ocp

    _quiet_read_only_notices()

    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=not read_only, read_only=read_only, enable_async_checkpointing=not read_only,
        cleanup_tmp_directories=not read_only,  # a save cut short by a kill leaves a temporary folder: drop it
    )
    return ocp.CheckpointManager(checkpoints_folder(run_path).absolute(), options=options,
                                 item_names=(STATE_ITEM, META_ITEM))


@functools.cache
def _quiet_read_only_notices() -> None:
    logging.getLogger("absl").addFilter(_ReadOnlyNotices())  # once: the filter stays for the process


class CheckpointWriter:
    """Saves a run's checkpoints asynchronously into ``<run_path>/checkpoints/``, keeping the last ``keep``.

    Every process of a run across processes makes one and calls :meth:`save` with the same step (Orbax
    saves collectively; process 0 writes the JSON item). :meth:`close` waits for the last save.

    Example:
        >>> placed = mode.place_state(state)
        >>> writer = CheckpointWriter("runs/my-other-run", keep=3)
        >>> # returns before the disk is written:
        >>> writer.save(10, placed, checkpoint_meta(config, 10, placed))
        >>> writer.close()
        >>> checkpoint_steps("runs/my-other-run")
        [10]
    """

    def __init__(self, run_path: str | os.PathLike, keep: int):
        self.run_path = Path(run_path)
        self._manager = _manager(self.run_path, keep)
        self.saved: list[int] = []

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Start saving ``state`` (placed arrays; a step may donate them as soon as this returns)."""
        import orbax.checkpoint as ocp

        args = ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardSave(state), META_ITEM: ocp.args.JsonSave(meta)})
        try:  # Orbax's save waits for the previous one anyway: waiting here names the save that failed
            self._manager.wait_until_finished()
        except Exception as error:  # e.g. the disk filled up while the previous save wrote
            raise self._failed(self.saved.pop() if self.saved else None, error) from error
        try:
            self._manager.save(step, args=args)
        except Exception as error:
            raise self._failed(step, error) from error
        self.saved.append(step)

    def close(self) -> None:
        """Wait for the last save to be on disk, then release the writer."""
        try:
            self._manager.wait_until_finished()
        except Exception as error:
            raise self._failed(self.saved[-1] if self.saved else None, error) from error
        finally:
            self._manager.close()

    def _failed(self, step: int | None, error: Exception) -> CheckpointError:
        kept = checkpoint_steps(self.run_path)
        earlier = (f"the checkpoints of steps {kept} are intact" if kept else "no earlier checkpoint was complete") + \
            " and the run's metrics are kept"
        folder = str(checkpoints_folder(self.run_path) / str(step))
        return CheckpointError(f"the checkpoint of step {step} ({folder!r}) "
                               f"could not be written ({_cause(error)}); {earlier}: free "
                               "disk space and resume from the latest (workbench train --resume <run>)")


def _cause(error: BaseException) -> str:
    """Why a save failed, in one short phrase: the operating system's error where there is one (Orbax raises
    tensorstore's errors as ValueError with the code in the text)."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return f"the disk refused a write: [Errno {seen.errno}] {os.strerror(seen.errno)}"
        seen = seen.__cause__ or seen.__context__
    code = re.search(r"os_error_code='(\d+)'", str(error))
    if code:
        return f"the disk refused a write: [Errno {code[1]}] {os.strerror(int(code[1]))}"
    return f"{type(error).__name__}: {str(error)[:200]}"


def _step_folders(run_path: Path) -> dict[int, Path]:
    folder = checkpoints_folder(run_path)
    if not folder.is_dir():
        return {}
    return {int(p.name): p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()}


def _is_complete(folder: Path) -> bool:
    return all((folder / marker).exists() for marker in COMPLETE_MARKERS) and all(
        (folder / item).is_dir() for item in (STATE_ITEM, META_ITEM))


def checkpoint_steps(run_path: str | os.PathLike) -> list[int]:
    """The steps of the complete checkpoints of a run, oldest first (interrupted saves are not listed).

    Example:
        >>> checkpoint_steps("runs/mlp-dp")  # a run of 20 steps with checkpoint_every=10
        [10, 20]
    """
    return sorted(step for step, folder in _step_folders(Path(run_path)).items() if _is_complete(folder))


def latest_checkpoint(run_path: str | os.PathLike) -> CheckpointInfo:
    """The newest complete checkpoint of the run in ``run_path``, with its metadata read.

    Raises:
        CheckpointError: no such folder, no checkpoint in it, or a newest one that is incomplete or unreadable.

    Example:
        >>> latest_checkpoint("runs/mlp-dp").step
        20
    """
    run_path = Path(run_path)
    if not run_path.is_dir():
        raise CheckpointError(f"no run folder {str(run_path)!r}: pass a run's folder, e.g. runs/<name> "
                              "('workbench runs' lists them)")
    folders = _step_folders(run_path)
    complete = checkpoint_steps(run_path)
    if not complete:
        partial = f" ({len(folders)} incomplete)" if folders else ""
        raise CheckpointError(f"run {run_path.name!r} has no complete checkpoint in "
                              f"{str(checkpoints_folder(run_path))!r}"
                              f"{partial}: train with checkpoint_every=K (--checkpoint-every K) to resume it later")
    newest = max(folders)
    if newest not in complete:
        raise CheckpointError(
            f"checkpoint {str(folders[newest])!r} is incomplete (no {' or '.join(COMPLETE_MARKERS)}: its save was cut "
            f"short or it was copied in part): delete that folder to resume from step {complete[-1]}")
    return CheckpointInfo(run_path, newest, read_meta(run_path, newest))


def read_meta(run_path: str | os.PathLike, step: int) -> dict[str, Any]:
    """The JSON item of the checkpoint of ``step`` (see :func:`checkpoint_meta`)."""
    import orbax.checkpoint as ocp

    run_path = Path(run_path)
    manager = _manager(run_path, read_only=True)
    try:
        meta = manager.restore(step, args=ocp.args.Composite(**{META_ITEM: ocp.args.JsonRestore()}))[META_ITEM]
    except Exception as error:  # Orbax raises many kinds; the message says which checkpoint
        raise _unreadable(run_path, step, error) from error
    finally:
        manager.close()
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "state" not in meta:
        raise CheckpointError(f"checkpoint {str(checkpoints_folder(run_path) / str(step))!r} was not written by this "
                              f"workbench (its {META_ITEM} item holds no format {FORMAT} record): resume another run")
    return meta


def _unreadable(run_path: Path, step: int, error: Exception) -> CheckpointError:
    earlier = [s for s in checkpoint_steps(run_path) if s < step]
    fix = f"delete it to resume from step {earlier[-1]}" if earlier else "it is the run's only checkpoint"
    return CheckpointError(f"checkpoint {str(checkpoints_folder(run_path) / str(step))!r} cannot be read "
                           f"({type(error).__name__}: {str(error)[:200]}): {fix}")


def validate_matches(info: CheckpointInfo, target: Any, what: str = "this run's model and optimizer") -> None:
    """CheckpointError naming the first leaves that differ, unless ``target`` has the saved state's
    structure, shapes and dtypes.

    Example:
        >>> validate_matches(latest_checkpoint("runs/mlp-dp"), state)  # the same model and optimizer: no error
        >>> validate_matches(latest_checkpoint("runs/mlp-dp"), {"w": jax.ShapeDtypeStruct((2,), "float32")})
        Traceback (most recent call last):
        ...
        workbench.training.checkpoints.CheckpointError: checkpoint 'runs/mlp-dp/checkpoints/20' holds another state ...
    """
    differences = signature_differences(info.meta["state"], state_signature(target))
    if differences:
        saved = info.config
        shown = "; ".join(differences[:LISTED_DIFFERENCES])
        more = f" (and {len(differences) - LISTED_DIFFERENCES} more)" if len(differences) > LISTED_DIFFERENCES else ""
        raise CheckpointError(
            f"checkpoint {str(info.path)!r} holds another state than {what} (saved: model {saved.get('model')!r}, "
            f"optimizer {saved.get('optimizer')!r}): {shown}{more}. Resume with the run's own model and optimizer")


# What a resumed run cannot change: the data's order and the state's meaning depend on them (the learning
# rate is part of the optimizer state, so the saved one would win).
FIXED_ON_RESUME = ("model", "data", "model_options", "data_options", "optimizer", "lr", "batch", "seed",
                   "drop_remainder")


def validate_resumable(info: CheckpointInfo, config: Any) -> None:
    """CheckpointError unless a run with ``config`` (a TrainConfig) can continue from ``info``: the same
    model, data and optimizer settings (:data:`FIXED_ON_RESUME`), and more steps than were done.

    Example:
        >>> validate_resumable(latest_checkpoint("runs/mlp-dp"), TrainConfig(model="cnn"))
        Traceback (most recent call last):
        ...
        workbench.training.checkpoints.CheckpointError: run 'mlp-dp' was saved with model='mlp', not 'cnn': ...
    """
    saved = info.config
    for field in FIXED_ON_RESUME:
        value = config.to_json()[field]
        if field in saved and value != saved[field]:
            raise CheckpointError(f"run {info.run_path.name!r} was saved with {field}={saved[field]!r}, not {value!r}: "
                                  f"a resumed run keeps its {', '.join(FIXED_ON_RESUME)}; drop that change")
    if config.steps <= info.step:
        raise CheckpointError(f"run {info.run_path.name!r} is already at step {info.step} of steps={config.steps}: "
                              f"resume it with more steps, e.g. steps={info.step + config.steps}")


def restore_state(info: CheckpointInfo, target: Any) -> Any:
    """The saved state read straight into ``target``'s layout: ``target`` is the state's tree with
    ``jax.ShapeDtypeStruct`` leaves carrying the shardings to restore into (any mesh).

    Raises:
        CheckpointError: the target's structure, shapes or dtypes differ from the saved state's, or the
            checkpoint cannot be read (e.g. a truncated file).

    Example:
        >>> target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        ...                       state, mode.restore_shardings(state))  # where a dp mode computes on it
        >>> restored = restore_state(latest_checkpoint("runs/mlp-fsdp"), target)  # saved by an fsdp run
        >>> restored.params["hidden1"]["kernel"].sharding.is_fully_replicated  # as dp lays it out
        True
    """
    import orbax.checkpoint as ocp

    validate_matches(info, target)
    manager = _manager(info.run_path, read_only=True)
    try:
        restored = manager.restore(info.step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardRestore(target)}))
    except Exception as error:
        raise _unreadable(info.run_path, info.step, error) from error
    finally:
        manager.close()
    return jax.tree.unflatten(jax.tree.structure(target), jax.tree.leaves(restored[STATE_ITEM]))


__all__ = [
    "CHECKPOINTS_FOLDER", "CheckpointError", "CheckpointInfo", "CheckpointWriter", "FIXED_ON_RESUME",
    "validate_matches", "validate_resumable", "checkpoint_meta",
    "checkpoint_steps", "checkpoints_folder", "latest_checkpoint", "read_meta", "restore_state",
    "signature_differences",
    "state_signature",
]
