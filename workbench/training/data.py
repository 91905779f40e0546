"""Data sets for training, deterministic by seed, built from what ships with the installation.

* ``regression``: a synthetic linear teacher, ``y = x @ W + b + noise``.
* ``digits``: scikit-learn's 1,797 real 8x8 handwritten digits, flat ``(64,)`` or as images ``(8, 8, 1)``.
* ``text``: Python's own standard-library source as a byte-level language corpus (vocab 256).
* ``tokens``: uniformly random tokens, which no model can learn: the best loss is ``log(vocab_size)``.

:func:`load_dataset` returns a :class:`Dataset` of NumPy arrays. :meth:`Dataset.batches` yields global
batches whose order depends only on the seed and the epoch, never on the mesh, so every parallel mode
sees the same data. A final partial batch is padded to full size with ``mask`` 0, so a masked mean loss
is exact. :func:`sharded_batches` places each batch with :func:`~workbench.training.data_parallel.shard_batch`.

Adding a data set is one loader function and one entry in :data:`DATASETS`: the loader's keyword-only
parameters are the data set's options (names, defaults and types), which :func:`parse_data_options` reads.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib.util
import inspect
import itertools
import math
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import WorkbenchError, nearest_multiples
from .data_parallel import create_data_parallel_sharding, shard_batch

DATASET_KINDS = ("regression", "classification", "language")
SPLITS = ("train", "eval")
BYTE_VOCAB = 256  # the text corpus is read as bytes: every file decodes, and the vocab never changes
Batch = dict[str, np.ndarray]


def _check_int(what: str, value: Any, minimum: int, example: str) -> int:
    """``value`` as an int, or a WorkbenchError naming it, the bound and an example."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise WorkbenchError(f"{what} must be a whole number >= {minimum}, got {value!r}: use e.g. {example}")
    return int(value)


def _check_fraction(what: str, value: float) -> float:
    if not 0.0 < value < 1.0:
        raise WorkbenchError(f"{what} must be between 0 and 1 (exclusive), got {value!r}: use e.g. 0.2")
    return float(value)


def _padded_batch(x: np.ndarray, y: np.ndarray, rows: np.ndarray, global_batch_size: int, part: slice) -> Batch:
    """Rows ``part`` of the global batch of the examples at ``rows`` padded with zeros to
    ``global_batch_size``; ``mask`` marks real examples. Only the examples in ``part`` are read."""
    real = rows[part]  # the padding sits after the real rows, so the part's real rows come first
    size = len(range(global_batch_size)[part])
    padding = size - len(real)

    def pad(array: np.ndarray) -> np.ndarray:
        return np.concatenate([array, np.zeros((padding, *array.shape[1:]), array.dtype)]) if padding else array

    mask = np.concatenate([np.ones(len(real), np.float32), np.zeros(padding, np.float32)])
    return {"x": pad(x[real]), "y": pad(y[real]), "mask": mask}


def _batches_in_order(
    x: np.ndarray, y: np.ndarray, order: np.ndarray, global_batch_size: int, drop_remainder: bool, part: slice,
    first: int = 0,
) -> Iterator[Batch]:
    for start in range(first * global_batch_size, len(order), global_batch_size):
        rows = order[start : start + global_batch_size]
        if drop_remainder and len(rows) < global_batch_size:
            return
        yield _padded_batch(x, y, rows, global_batch_size, part)


def _check_part(rows: slice | None, global_batch_size: int) -> slice:
    """``rows`` as a slice within one global batch (None: all of it), or a WorkbenchError naming it."""
    if rows is None:
        return slice(0, global_batch_size)
    if not (isinstance(rows, slice) and rows.step in (None, 1) and rows.start is not None and rows.stop is not None
            and 0 <= rows.start < rows.stop <= global_batch_size):
        raise WorkbenchError(
            f"rows={rows!r} is not a part of a global batch of {global_batch_size}: pass a slice such as "
            f"slice(0, {max(global_batch_size // 2, 1)}) (a process's rows, see ParallelMode.batch_share)"
        )
    return rows


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A data set held in memory: train and eval arrays, and what a model needs to know about them.

    Attributes:
        name: the registry name, e.g. ``"digits"``.
        kind: ``"regression"``, ``"classification"`` or ``"language"``.
        x_train, y_train, x_eval, y_eval: NumPy arrays, examples along the first dimension. Language
            data sets hold sequences: ``x`` of shape ``(N, seq_len)`` and ``y`` the next tokens.
        num_classes: the number of classes (classification), else None.
        vocab_size: the number of token ids (language), else None.
        irreducible_loss: the lowest expected loss any model can reach, when the data set knows it
            (random tokens: ``log(vocab_size)`` nats; regression: ``noise**2``, the mean squared error
            per output of the teacher itself), else None.
        description: where the data comes from and how it was split, in one line.

    Example:
        >>> ds = load_dataset("digits")
        >>> ds.num_train, ds.num_eval, ds.input_shape, ds.num_classes
        (1437, 360, (64,), 10)
    """

    name: str
    kind: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_eval: np.ndarray
    y_eval: np.ndarray
    num_classes: int | None = None
    vocab_size: int | None = None
    irreducible_loss: float | None = None
    description: str = ""

    def __post_init__(self):
        if self.kind not in DATASET_KINDS:
            raise WorkbenchError(f"data set kind {self.kind!r} is not one of {', '.join(DATASET_KINDS)}")
        for field in ("x_train", "y_train", "x_eval", "y_eval"):
            # One data set is shared by every mode and run: none of them may change the others' data.
            getattr(self, field).flags.writeable = False

    @property
    def num_train(self) -> int:
        return len(self.x_train)

    @property
    def num_eval(self) -> int:
        return len(self.x_eval)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one input example (without the batch dimension)."""
        return tuple(self.x_train.shape[1:])

    @property
    def target_shape(self) -> tuple[int, ...]:
        """The shape of one target (without the batch dimension)."""
        return tuple(self.y_train.shape[1:])

    def steps_per_epoch(self, global_batch_size: int, *, drop_remainder: bool = False) -> int:
        """Batches in one pass over the training split (a padded final batch counts as one).

        Example:
            >>> load_dataset("digits").steps_per_epoch(100)
            15
        """
        size = _check_batch_size(global_batch_size)
        return self.num_train // size if drop_remainder else -(-self.num_train // size)

    def batches(
        self, global_batch_size: int, *, seed: int, epochs: int | None = None, drop_remainder: bool = False,
        rows: slice | None = None, skip: int = 0,
    ) -> Iterator[Batch]:
        """Shuffled training batches ``{"x", "y", "mask"}`` of NumPy arrays, epoch after epoch.

        Each epoch visits every training example exactly once, in an order drawn from ``(seed, epoch)``
        alone: the same seed gives the same batches on any mesh and in any parallel mode. The last
        batch of an epoch is padded with zeros to ``global_batch_size`` and its ``mask`` (float32, one
        per example) is 0 on the padding, so ``sum(loss * mask) / sum(mask)`` is the exact mean.

        Args:
            global_batch_size: examples per batch over all devices, >= 1.
            seed: the shuffling seed, >= 0.
            epochs: passes over the data; None repeats forever.
            drop_remainder: drop each epoch's final partial batch instead of padding it.
            rows: only these rows of each global batch (one process's part when training across
                processes: it reads nothing else); None: the whole batch.
            skip: start after this many batches (a resumed run's data position): the epoch and the batch
                within it are computed, nothing before them is read.

        Raises:
            WorkbenchError: a bad batch size, seed or epoch count, or ``drop_remainder`` with a batch
                larger than the training split (no batch would ever come).

        Example:
            >>> batch = next(load_dataset("digits").batches(32, seed=0))
            >>> batch["x"].shape, batch["y"].dtype, float(batch["mask"].sum())
            ((32, 64), dtype('int32'), 32.0)
        """
        size = _check_batch_size(global_batch_size)
        part = _check_part(rows, size)
        seed = _check_int("seed", seed, 0, "seed=0")
        skip = _check_int("skip", skip, 0, "skip=0 (batches already trained on)")
        if epochs is not None:
            epochs = _check_int("epochs", epochs, 1, "epochs=1, or epochs=None to repeat forever")
        if drop_remainder and size > self.num_train:
            raise WorkbenchError(
                f"global batch size {size} is larger than the {self.num_train} training examples of "
                f"{self.name!r}, so drop_remainder=True leaves no batch: use at most {self.num_train}, "
                "or drop_remainder=False (the batch is padded and masked)"
            )

        per_epoch = self.steps_per_epoch(size, drop_remainder=drop_remainder)
        first_epoch, first_batch = divmod(skip, per_epoch)

        def generate() -> Iterator[Batch]:
            for epoch in itertools.count(first_epoch) if epochs is None else range(first_epoch, epochs):
                order = np.random.default_rng([seed, epoch]).permutation(self.num_train)
                first = first_batch if epoch == first_epoch else 0
                yield from _batches_in_order(self.x_train, self.y_train, order, size, drop_remainder, part, first)

        return generate()

    def eval_batches(self, global_batch_size: int, *, rows: slice | None = None) -> Iterator[Batch]:
        """The eval split once, in order, the last batch padded and masked (never dropped); ``rows`` as
        in :meth:`batches`.

        Example:
            >>> [float(batch["mask"].sum()) for batch in load_dataset("digits").eval_batches(256)]
            [256.0, 104.0]
        """
        size = _check_batch_size(global_batch_size)
        part = _check_part(rows, size)
        return _batches_in_order(self.x_eval, self.y_eval, np.arange(self.num_eval), size, False, part)

    def unigram_entropy(self) -> float:
        """Entropy in nats per token of the training targets' token frequencies.

        It is the loss of the best model that ignores context: a language model beats unigram
        statistics once its training loss falls below this.

        Example (the corpus is this Python's own standard library: 3.14 nats on 3.11, 3.16 on 3.13):
            >>> 3.0 < load_dataset("text").unigram_entropy() < 3.3
            True
        """
        if self.kind != "language" or self.vocab_size is None:  # a language data set has a vocabulary
            raise WorkbenchError(
                f"unigram_entropy is for language data sets (text, tokens); {self.name!r} is {self.kind}"
            )
        counts = np.bincount(self.y_train.ravel(), minlength=self.vocab_size)
        probabilities = counts[counts > 0] / counts.sum()
        return float(-(probabilities * np.log(probabilities)).sum())

    def __str__(self) -> str:
        size = {"classification": f", {self.num_classes} classes", "language": f", vocab {self.vocab_size}"}
        return (
            f"{self.name} ({self.kind}): {self.num_train} train / {self.num_eval} eval, "
            f"input {self.input_shape}{size.get(self.kind, '')}"
        )


def _check_batch_size(global_batch_size: int) -> int:
    return _check_int("global batch size", global_batch_size, 1, "32 (a multiple of the data-axis size)")


# --- the data sets -----------------------------------------------------------------------------


def _load_regression(
    seed: int, *, num_train: int = 1024, num_eval: int = 256, in_features: int = 8, out_features: int = 1,
    noise: float = 0.1,
) -> Dataset:
    if noise < 0:
        raise WorkbenchError(f"regression option noise must be >= 0, got {noise!r}: use e.g. noise=0.1")
    rng = np.random.default_rng(seed)
    # Weights scaled by 1/sqrt(in_features) keep the targets near unit variance at any width.
    weight = rng.normal(size=(in_features, out_features)) / math.sqrt(in_features)
    bias = rng.normal(size=out_features)
    x = rng.normal(size=(num_train + num_eval, in_features))
    y = x @ weight + bias + noise * rng.normal(size=(num_train + num_eval, out_features))
    x, y = x.astype(np.float32), y.astype(np.float32)
    return Dataset(
        "regression", "regression", x[:num_train], y[:num_train], x[num_train:], y[num_train:],
        irreducible_loss=noise**2,
        description=f"y = x @ W + b + {noise} * N(0, 1), x ~ N(0, 1) of {in_features} features, seed {seed}",
    )


def _load_digits(seed: int, *, eval_fraction: float = 0.2, image: bool = False) -> Dataset:
    _check_fraction("digits option eval_fraction", eval_fraction)
    pixels, labels = _digits_arrays()
    pixels = (pixels / 16.0).astype(np.float32)  # pixel values are 0..16
    x = pixels.reshape(-1, 8, 8, 1) if image else pixels
    train, held_out = stratified_split(labels, eval_fraction, seed)
    return Dataset(
        "digits", "classification", x[train], labels[train], x[held_out], labels[held_out], num_classes=10,
        description=f"scikit-learn's digits, pixels scaled to [0, 1], stratified {eval_fraction:.0%} "
        f"held out with seed {seed}",
    )


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 8x8 digits (pixels 0..16, flat) and their labels, read from scikit-learn's data file.

    Read directly rather than through ``sklearn.datasets.load_digits``: importing scikit-learn (and
    the SciPy it pulls in) took 1.5 s of the 2.7 s a fresh process needed to reach its first training
    step with a warm compilation cache. The file is the one ``load_digits`` reads (same values).
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    folder = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
    path = os.path.join(folder, "datasets", "data", "digits.csv.gz") if folder else None
    if path is None or not os.path.exists(path):
        raise WorkbenchError(
            "the digits data set ships with scikit-learn, which is not installed here: "
            "pip install scikit-learn (or run 'make install')"
        )
    with gzip.open(path) as source:
        table = np.loadtxt(source, delimiter=",", dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(np.int32)


def stratified_split(labels: np.ndarray, eval_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, held_out)`` holding every label in the same proportions, shuffled with ``seed``.

    ``ceil(eval_fraction * n)`` examples are held out, as scikit-learn's ``train_test_split`` does;
    each label gets its proportional share, and the examples left over by rounding down go to the
    labels with the largest remainders.

    Example:
        >>> train, held_out = stratified_split(np.array([0, 0, 0, 0, 1, 1, 1, 1]), 0.25, seed=0)
        >>> sorted(np.array([0, 0, 0, 0, 1, 1, 1, 1])[held_out].tolist())
        [0, 1]
    """
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    held_out_total = math.ceil(eval_fraction * len(labels))
    ideal = counts * held_out_total / len(labels)
    shares = np.floor(ideal).astype(int)
    for i in np.argsort(-(ideal - shares), kind="stable")[: held_out_total - shares.sum()]:
        shares[i] += 1
    train, held_out = [], []
    for label, share in zip(classes, shares, strict=True):
        members = rng.permutation(np.flatnonzero(labels == label))
        held_out.append(members[:share])
        train.append(members[share:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(held_out))


@functools.lru_cache(maxsize=4)
def standard_library_corpus(corpus_bytes: int) -> tuple[bytes, int]:
    """The first ``corpus_bytes`` bytes of the standard library's top-level ``*.py`` files, and how many
    files were read, in sorted file-name order. The same Python version always gives the same bytes.

    Example:
        >>> corpus, files = standard_library_corpus(100_000)
        >>> len(corpus)
        100000
    """
    folder = os.path.dirname(os.__file__)
    chunks, total, files = [], 0, 0
    for name in sorted(os.listdir(folder)):
        if total >= corpus_bytes:
            break
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as source:
                chunks.append(source.read(corpus_bytes - total))
            total, files = total + len(chunks[-1]), files + 1
    return b"".join(chunks), files


def _next_token_windows(tokens: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows of ``seq_len`` tokens and, as targets, the same windows shifted by one."""
    count = (len(tokens) - 1) // seq_len
    return tokens[: count * seq_len].reshape(count, seq_len), tokens[1 : count * seq_len + 1].reshape(count, seq_len)


def _language_dataset(name: str, train: np.ndarray, held_out: np.ndarray, seq_len: int, **fields) -> Dataset:
    x_train, y_train = _next_token_windows(train, seq_len)
    x_eval, y_eval = _next_token_windows(held_out, seq_len)
    if not len(x_train) or not len(x_eval):
        raise WorkbenchError(
            f"{name}: seq_len {seq_len} leaves {len(x_train)} train and {len(x_eval)} eval sequences: "
            f"use a shorter seq_len (at most {min(len(train), len(held_out)) - 1}) or more data"
        )
    return Dataset(name, "language", x_train, y_train, x_eval, y_eval, **fields)


def _load_text(
    seed: int, *, seq_len: int = 64, corpus_bytes: int = 2_000_000, eval_fraction: float = 0.1
) -> Dataset:
    del seed  # the corpus and its split are fixed; batches(seed=...) shuffles
    _check_fraction("text option eval_fraction", eval_fraction)
    corpus, files = standard_library_corpus(corpus_bytes)
    tokens = np.frombuffer(corpus, np.uint8).astype(np.int32)
    split = round(len(tokens) * (1 - eval_fraction))  # the tail is held out: unseen code, not shuffled lines
    return _language_dataset(
        "text", tokens[:split], tokens[split:], seq_len, vocab_size=BYTE_VOCAB,
        description=f"{len(corpus):,} bytes of {files} standard-library files in {os.path.dirname(os.__file__)}, "
        f"byte tokens, last {eval_fraction:.0%} held out",
    )


def _load_tokens(
    seed: int, *, vocab_size: int = 64, seq_len: int = 64, num_train: int = 2048, num_eval: int = 256
) -> Dataset:
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, vocab_size, size=(num_train + num_eval) * seq_len + 2, dtype=np.int32)
    split = num_train * seq_len + 1  # one extra token: the last train window's last target
    return _language_dataset(
        "tokens", stream[:split], stream[split:], seq_len, vocab_size=vocab_size,
        irreducible_loss=math.log(vocab_size),
        description=f"uniformly random tokens in 0..{vocab_size - 1}, seed {seed}: unlearnable by design",
    )


DATASETS: dict[str, Callable[..., Dataset]] = {
    "regression": _load_regression,
    "digits": _load_digits,
    "text": _load_text,
    "tokens": _load_tokens,
}


# --- options and loading -----------------------------------------------------------------------


def _loader(name: str) -> Callable[..., Dataset]:
    if name not in DATASETS:
        raise WorkbenchError(f"unknown data set {name!r}: choose one of {', '.join(DATASETS)}")
    return DATASETS[name]


def dataset_options(name: str) -> dict[str, Any]:
    """A data set's options and their defaults.

    Example:
        >>> dataset_options("text")
        {'seq_len': 64, 'corpus_bytes': 2000000, 'eval_fraction': 0.1}
    """
    parameters = inspect.signature(_loader(name)).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


# What each option type accepts: NumPy scalars count, and an int is a fine float (noise=0).
_ACCEPTED_TYPES = {bool: bool, int: (int, np.integer), float: (float, int, np.integer, np.floating), str: str}


def _check_option(name: str, key: str, value: Any, defaults: dict[str, Any]) -> Any:
    """``value`` as the type of the option's default (whole-number options are >= 1), else WorkbenchError."""
    if key not in defaults:
        valid = ", ".join(f"{k}={v!r}" for k, v in defaults.items())
        raise WorkbenchError(f"data set {name!r} has no option {key!r}: its options are {valid}")
    expected = type(defaults[key])
    if isinstance(value, bool) != (expected is bool) or not isinstance(value, _ACCEPTED_TYPES[expected]):
        raise WorkbenchError(
            f"option {key!r} of data set {name!r} must be {expected.__name__}, got {value!r}: "
            f"e.g. {key}={defaults[key]!r} (parse_data_options reads text such as '{key}={defaults[key]}')"
        )
    if expected is int:  # every whole-number option is a size or a count
        return _check_int(f"option {key!r} of data set {name!r}", value, 1, f"{key}={defaults[key]}")
    return expected(value)


def _parse_value(text: str, default: Any) -> Any:
    """Text read as the type of ``default``; the text itself if it does not fit (the check reports it)."""
    if isinstance(default, bool):
        return {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}.get(text.lower(), text)
    if isinstance(default, int) and re.fullmatch(r"[+-]?\d[\d_]*", text):
        return int(text)
    if isinstance(default, float) and re.fullmatch(r"[+-]?(\d[\d_]*\.?\d*|\.\d+)(e[+-]?\d+)?", text, re.I):
        return float(text)
    return text


def parse_data_options(name: str, text: str) -> dict[str, Any]:
    """Read options such as ``"seq_len=64, corpus_bytes=500000"`` for data set ``name`` (never eval'd).

    Values take the type of the option's default (int, float, bool as true/false, or text).

    Raises:
        WorkbenchError: an unknown data set or option (the valid ones are listed), a part that is not
            ``key=value``, or a value of the wrong type.

    Example:
        >>> parse_data_options("text", "seq_len=128, eval_fraction=0.05")
        {'seq_len': 128, 'eval_fraction': 0.05}
    """
    defaults = dataset_options(name)
    options = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, equals, raw = (s.strip() for s in part.partition("="))
        if not equals or not key:
            raise WorkbenchError(f"data option {part!r} is not key=value: write e.g. '{next(iter(defaults))}=...'")
        options[key] = _check_option(name, key, _parse_value(raw, defaults.get(key)), defaults)
    return options


def load_dataset(name: str, seed: int = 0, **options: Any) -> Dataset:
    """Build a registered data set; the same name, seed and options always give the same arrays.

    Args:
        name: one of :data:`DATASETS` (``regression``, ``digits``, ``text``, ``tokens``).
        seed: seeds the synthetic data and the held-out split (the text corpus is fixed).
        **options: the data set's options, see :func:`dataset_options`.

    Example:
        >>> str(load_dataset("digits", image=True))
        'digits (classification): 1437 train / 360 eval, input (8, 8, 1), 10 classes'
    """
    defaults = dataset_options(name)
    checked = {key: _check_option(name, key, value, defaults) for key, value in options.items()}
    return _loader(name)(_check_int("seed", seed, 0, "seed=0"), **checked)


def sharded_batches(
    dataset: Dataset, global_batch_size: int, mesh: Any, data_axis: str = "data", *, split: str = "train",
    **batch_options: Any,
) -> Iterator[Any]:
    """Batches of ``dataset`` placed on ``mesh`` with the leading dimension split over ``data_axis``.

    The batches are exactly those of :meth:`Dataset.batches` (``split="train"``; pass ``seed=``,
    ``epochs=``, ``drop_remainder=``) or :meth:`Dataset.eval_batches` (``split="eval"``), placed with
    :func:`~workbench.training.data_parallel.shard_batch`. Everything is checked before the first batch.

    Raises:
        WorkbenchError: a bad batch size or split, or a global batch the data axis does not divide
            (the message names both numbers and the nearest sizes that work).
        MeshError: the mesh has no axis ``data_axis``.

    Example:
        >>> batches = sharded_batches(load_dataset("digits"), 64, "data=8", seed=0)
        >>> next(batches)["x"].sharding.spec
        P('data', None)
    """
    size = _check_batch_size(global_batch_size)
    if split not in SPLITS:
        raise WorkbenchError(f"split {split!r} is not one of {', '.join(SPLITS)}: use 'train' or 'eval'")
    if split == "eval" and batch_options:
        # The eval split is read once, in order: shuffling options would silently mean nothing.
        raise WorkbenchError(
            f"split='eval' takes no batch options, got {', '.join(sorted(batch_options))}: "
            "drop them (eval batches are read once, in order, padded)"
        )
    sharding = create_data_parallel_sharding(mesh, data_axis)
    parts = sharding.mesh.shape[data_axis]
    if size % parts:
        nearest = nearest_multiples(size, parts)
        raise WorkbenchError(
            f"global batch size {size} is not divisible by the {parts} devices of mesh axis {data_axis!r}: "
            f"use {nearest} (a multiple of {parts})"
        )
    load = dataset.batches if split == "train" else dataset.eval_batches
    batches = load(size, **batch_options)
    return (shard_batch(batch, sharding) for batch in batches)
