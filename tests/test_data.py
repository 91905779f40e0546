"""Data sets: the same seed gives the same batches, every example once per epoch with the padding
masked, real offline data (digits, the standard library's source), and batches placed on 8 devices."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from workbench.training.data import (
    DATASETS,
    Dataset,
    dataset_options,
    load_dataset,
    parse_data_options,
    sharded_batches,
    standard_library_corpus,
    stratified_split,
)
from workbench.errors import MeshError, WorkbenchError
from workbench.layout.mesh import build_mesh

DEVICES = 8
# Small sizes keep the per-data-set tests fast; the dedicated tests below use the defaults.
SMALL_OPTIONS = {
    "regression": {"num_train": 100, "num_eval": 20},
    "digits": {},
    "text": {"corpus_bytes": 50_000},
    "tokens": {"num_train": 100, "num_eval": 10},
}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


@pytest.fixture(scope="module")
def text():
    return load_dataset("text")


@pytest.fixture(scope="module")
def mesh():
    return build_mesh(f"data={DEVICES}")


def indexed_dataset(num_train: int) -> Dataset:
    """Each input is its own index, so a test can read off which examples a batch holds."""
    index = np.arange(num_train, dtype=np.float32)[:, None]
    return Dataset("indexed", "regression", index, index.copy(), index[:1].copy(), index[:1].copy())


def rows_in(batch) -> list[int]:
    return batch["x"][batch["mask"] == 1, 0].astype(int).tolist()


def assert_same_batches(first, second):
    first, second = list(first), list(second)
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        assert a.keys() == b.keys() == {"x", "y", "mask"}
        for key in a:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))


# --- determinism -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DATASETS)
def test_same_seed_gives_the_same_batches_in_the_same_order(name):
    first = load_dataset(name, seed=3, **SMALL_OPTIONS[name])
    second = load_dataset(name, seed=3, **SMALL_OPTIONS[name])
    assert_same_batches(first.batches(16, seed=5, epochs=2), second.batches(16, seed=5, epochs=2))
    assert_same_batches(first.eval_batches(16), second.eval_batches(16))


@pytest.mark.parametrize("name", DATASETS)
def test_different_shuffling_seeds_give_different_batches(name):
    dataset = load_dataset(name, **SMALL_OPTIONS[name])
    first = next(dataset.batches(16, seed=0))
    second = next(dataset.batches(16, seed=1))
    assert not np.array_equal(first["x"], second["x"])


@pytest.mark.parametrize("name", ["regression", "digits", "tokens"])
def test_the_data_set_seed_changes_the_data_or_its_split(name):
    first = load_dataset(name, seed=0, **SMALL_OPTIONS[name])
    second = load_dataset(name, seed=1, **SMALL_OPTIONS[name])
    assert not np.array_equal(first.x_eval, second.x_eval)


def test_each_epoch_has_its_own_order_drawn_from_seed_and_epoch_alone():
    dataset = indexed_dataset(50)
    two_epochs = [rows_in(batch) for batch in dataset.batches(10, seed=7, epochs=2)]
    epoch_1, epoch_2 = sum(two_epochs[:5], []), sum(two_epochs[5:], [])
    assert sorted(epoch_1) == sorted(epoch_2) == list(range(50))
    assert epoch_1 != epoch_2
    again = [rows_in(batch) for batch in dataset.batches(10, seed=7, epochs=2)]
    assert again == two_epochs
    # Repeating forever gives the same epochs: the order does not depend on how many were asked for.
    forever = [rows_in(batch) for batch in itertools.islice(dataset.batches(10, seed=7), 10)]
    assert forever == two_epochs


@settings(max_examples=60, deadline=None)
@given(
    num_train=st.integers(1, 60),
    global_batch_size=st.integers(1, 25),
    seed=st.integers(0, 2**31),
    drop_remainder=st.booleans(),
)
def test_every_example_once_per_epoch_and_padding_masked(num_train, global_batch_size, seed, drop_remainder):
    if drop_remainder and global_batch_size > num_train:
        global_batch_size = num_train
    dataset = indexed_dataset(num_train)
    steps = dataset.steps_per_epoch(global_batch_size, drop_remainder=drop_remainder)
    batches = list(dataset.batches(global_batch_size, seed=seed, epochs=2, drop_remainder=drop_remainder))
    assert len(batches) == 2 * steps
    remainder = num_train % global_batch_size
    for epoch in (batches[:steps], batches[steps:]):
        for batch in epoch:
            assert batch["x"].shape == batch["y"].shape == (global_batch_size, 1)
            assert batch["mask"].shape == (global_batch_size,) and batch["mask"].dtype == np.float32
            real = int(batch["mask"].sum())
            assert batch["mask"].tolist() == [1.0] * real + [0.0] * (global_batch_size - real)
            assert not batch["x"][real:].any() and not batch["y"][real:].any()  # padding is zeros
            np.testing.assert_array_equal(batch["x"], batch["y"])  # inputs stay paired with targets
        seen = sum((rows_in(batch) for batch in epoch), [])
        assert len(seen) == len(set(seen))
        if drop_remainder:
            assert len(seen) == num_train - remainder
            assert epoch[-1]["mask"].sum() == global_batch_size
        else:
            assert sorted(seen) == list(range(num_train))
            assert epoch[-1]["mask"].sum() == (remainder or global_batch_size)


def test_eval_batches_are_the_eval_split_in_order_with_the_tail_padded(digits):
    batches = list(digits.eval_batches(64))
    assert [float(batch["mask"].sum()) for batch in batches] == [64.0] * 5 + [40.0]
    real_x = np.concatenate([batch["x"][batch["mask"] == 1] for batch in batches])
    real_y = np.concatenate([batch["y"][batch["mask"] == 1] for batch in batches])
    np.testing.assert_array_equal(real_x, digits.x_eval)
    np.testing.assert_array_equal(real_y, digits.y_eval)


# --- the data sets -----------------------------------------------------------------------------


def test_regression_is_a_linear_teacher_with_the_stated_noise():
    dataset = load_dataset("regression", in_features=5, out_features=2, noise=0.3)
    assert (dataset.num_train, dataset.num_eval, dataset.input_shape, dataset.target_shape) == (1024, 256, (5,), (2,))
    assert dataset.x_train.dtype == dataset.y_train.dtype == np.float32
    with_bias = np.c_[dataset.x_train, np.ones(dataset.num_train)]
    fit, *_ = np.linalg.lstsq(with_bias, dataset.y_train, rcond=None)
    eval_mse = np.mean((np.c_[dataset.x_eval, np.ones(dataset.num_eval)] @ fit - dataset.y_eval) ** 2)
    assert dataset.irreducible_loss == pytest.approx(0.09)
    assert 0.8 * dataset.irreducible_loss < eval_mse < 1.2 * dataset.irreducible_loss


def test_digits_split_sizes_value_ranges_and_labels(digits):
    assert (digits.num_train, digits.num_eval) == (1437, 360)
    assert digits.kind == "classification" and digits.num_classes == 10
    assert digits.input_shape == (64,) and digits.target_shape == ()
    for x, y in ((digits.x_train, digits.y_train), (digits.x_eval, digits.y_eval)):
        assert x.dtype == np.float32 and y.dtype == np.int32
        assert x.min() == 0.0 and x.max() == 1.0
        assert set(np.unique(y)) == set(range(10))  # stratified: every digit in both splits
    assert str(digits) == "digits (classification): 1437 train / 360 eval, input (64,), 10 classes"


def test_digits_image_view_holds_the_same_examples_as_the_flat_view(digits):
    images = load_dataset("digits", image=True)
    assert images.input_shape == (8, 8, 1)
    np.testing.assert_array_equal(images.x_train.reshape(-1, 64), digits.x_train)
    np.testing.assert_array_equal(images.y_eval, digits.y_eval)
    assert next(images.batches(32, seed=0))["x"].shape == (32, 8, 8, 1)


def test_digits_are_scikit_learns_digits_without_importing_scikit_learn(digits):
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    reference = load_digits()
    every_x = np.concatenate([digits.x_train, digits.x_eval])
    every_y = np.concatenate([digits.y_train, digits.y_eval])
    order, reference_order = np.lexsort(every_x.T), np.lexsort(reference.data.T)
    np.testing.assert_array_equal(every_x[order] * 16, reference.data[reference_order])
    np.testing.assert_array_equal(every_y[order], reference.target[reference_order])
    # Importing scikit-learn costs a fresh process 1.5 s before its first step: it must not happen.
    code = "import sys, workbench; workbench.load_dataset('digits'); print('sklearn' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 5), min_size=2, max_size=300),
    fraction=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**16),
)
def test_stratified_split_partitions_and_keeps_each_labels_share(labels, fraction, seed):
    labels = np.array(labels)
    train, held_out = stratified_split(labels, fraction, seed)
    assert sorted(np.concatenate([train, held_out]).tolist()) == list(range(len(labels)))  # a partition
    assert len(held_out) == math.ceil(fraction * len(labels))
    for label in np.unique(labels):  # each label's share is its proportional share, rounded either way
        ideal = np.sum(labels == label) * len(held_out) / len(labels)
        assert math.floor(ideal) <= np.sum(labels[held_out] == label) <= math.ceil(ideal)
    again = stratified_split(labels, fraction, seed)
    assert np.array_equal(again[0], train) and np.array_equal(again[1], held_out)  # seeded


def test_text_is_the_standard_library_source_as_bytes(text):
    corpus, files = standard_library_corpus(dataset_options("text")["corpus_bytes"])
    assert len(corpus) > 100_000 and files > 10
    assert text.kind == "language" and text.vocab_size == 256 and text.input_shape == (64,)
    assert text.num_train * 64 > 1_000_000
    assert b"def " in bytes(text.x_train[:100].ravel().astype(np.uint8))
    # Train is the head of the corpus, eval its tail: no sequence of held-out code was trained on.
    split = round(len(corpus) * 0.9)
    head = np.frombuffer(corpus, np.uint8)
    np.testing.assert_array_equal(text.x_train.ravel(), head[: text.num_train * 64])
    np.testing.assert_array_equal(text.x_eval.ravel(), head[split : split + text.num_eval * 64])


def test_text_targets_are_the_inputs_shifted_by_one(text):
    np.testing.assert_array_equal(text.x_train[:, 1:], text.y_train[:, :-1])
    np.testing.assert_array_equal(text.y_train[:-1, -1], text.x_train[1:, 0])  # windows are contiguous
    np.testing.assert_array_equal(text.x_eval[:, 1:], text.y_eval[:, :-1])


def test_text_unigram_entropy_is_well_below_a_uniform_byte(text):
    entropy = text.unigram_entropy()
    # Measured 3.14 nats on Python 3.11's standard library; source code is far from uniform (5.55).
    assert 2.5 < entropy < 4.0
    assert entropy < math.log(text.vocab_size) - 1.5


def test_text_sequence_length_is_an_option(text):
    longer = load_dataset("text", **parse_data_options("text", "seq_len=128, corpus_bytes=200000"))
    assert longer.input_shape == longer.target_shape == (128,)
    np.testing.assert_array_equal(longer.x_train[0], text.x_train[:2].ravel())


def test_random_tokens_cannot_beat_log_vocab():
    tokens = load_dataset("tokens", vocab_size=17)
    assert tokens.irreducible_loss == pytest.approx(math.log(17))
    assert tokens.unigram_entropy() == pytest.approx(math.log(17), abs=0.01)
    assert tokens.x_train.min() == 0 and tokens.x_train.max() == 16
    assert (tokens.num_train, tokens.num_eval, tokens.input_shape) == (2048, 256, (64,))
    np.testing.assert_array_equal(tokens.x_train[:, 1:], tokens.y_train[:, :-1])


def test_data_cannot_be_changed_under_other_users(digits):
    with pytest.raises(ValueError, match="read-only"):
        digits.x_train[0, 0] = 5.0


# --- sharded batches ---------------------------------------------------------------------------


@pytest.mark.parametrize("image", [False, True])
def test_sharded_batches_split_the_leading_dimension_over_all_8_devices(mesh, image):
    dataset = load_dataset("digits", image=image)
    placed = next(sharded_batches(dataset, 64, mesh, seed=0))
    plain = next(dataset.batches(64, seed=0))
    for key, value in placed.items():
        rank = plain[key].ndim
        assert value.sharding.spec == P("data", *[None] * (rank - 1))
        assert len(value.sharding.device_set) == DEVICES
        assert {shard.data.shape for shard in value.addressable_shards} == {(8, *plain[key].shape[1:])}
        np.testing.assert_array_equal(np.asarray(value), plain[key])  # the mesh does not change the data


def test_sharded_eval_batches_keep_the_padding_mask(mesh, text):
    batches = list(sharded_batches(text, 256, mesh, split="eval"))
    assert len(batches) == -(-text.num_eval // 256)
    last = batches[-1]
    assert float(last["mask"].sum()) == text.num_eval % 256
    assert last["x"].dtype == np.int32 and last["x"].addressable_shards[0].data.shape == (32, 64)


def test_sharded_batches_on_a_two_axis_mesh_replicate_over_the_other_axis():
    placed = next(sharded_batches(indexed_dataset(40), 16, "data=4,model=2", seed=0))
    x = placed["x"]
    assert x.sharding.spec == P("data", None) and len(x.sharding.device_set) == DEVICES
    assert {shard.data.shape for shard in x.addressable_shards} == {(4, 1)}
    quarters = {shard.index[0].start for shard in x.addressable_shards}
    assert quarters == {0, 4, 8, 12}  # each quarter of the batch on the 2 devices of the model axis


# --- bad inputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "32", None])
def test_batch_size_must_be_a_whole_number_at_least_1(digits, mesh, bad):
    calls = [
        lambda: digits.batches(bad, seed=0),
        lambda: digits.eval_batches(bad),
        lambda: digits.steps_per_epoch(bad),
        lambda: sharded_batches(digits, bad, mesh, seed=0),
    ]
    for call in calls:  # raised at the call, not at the first next()
        with pytest.raises(WorkbenchError, match=rf"global batch size must be a whole number >= 1, got {bad!r}: use"):
            call()


@pytest.mark.parametrize("size, nearest", [(30, "use 24 or 32"), (3, "use 8 "), (100, "use 96 or 104")])
def test_global_batch_not_divisible_by_the_data_axis_is_refused_before_iterating(digits, mesh, size, nearest):
    with pytest.raises(WorkbenchError, match=f"global batch size {size} is not divisible by the 8 devices") as error:
        sharded_batches(digits, size, mesh, seed=0)
    assert nearest in str(error.value) and "a multiple of 8" in str(error.value)


def test_unknown_data_axis_and_split(digits, mesh):
    with pytest.raises(MeshError, match="no axis 'batch'"):
        sharded_batches(digits, 64, mesh, data_axis="batch", seed=0)
    with pytest.raises(WorkbenchError, match="split 'test' is not one of train, eval"):
        sharded_batches(digits, 64, mesh, split="test")


def test_bad_shuffling_arguments(digits):
    with pytest.raises(WorkbenchError, match="seed must be a whole number >= 0, got -1"):
        digits.batches(32, seed=-1)
    with pytest.raises(WorkbenchError, match="epochs must be a whole number >= 1, got 0"):
        digits.batches(32, seed=0, epochs=0)
    with pytest.raises(WorkbenchError, match="2000 is larger than the 1437 training examples.*use at most 1437"):
        digits.batches(2000, seed=0, drop_remainder=True)
    assert float(next(digits.batches(2000, seed=0))["mask"].sum()) == 1437  # padded, not refused


def test_unknown_data_set_and_options_are_named_with_the_valid_ones():
    with pytest.raises(WorkbenchError, match="unknown data set 'mnist': choose one of regression, digits, text"):
        load_dataset("mnist")
    with pytest.raises(WorkbenchError, match="no option 'seqlen': its options are seq_len=64, corpus_bytes="):
        load_dataset("text", seqlen=64)
    with pytest.raises(WorkbenchError, match="option 'seq_len' of data set 'text' must be int, got '64'.*parse_data"):
        load_dataset("text", seq_len="64")
    with pytest.raises(WorkbenchError, match="option 'seq_len' of data set 'text' must be a whole number >= 1, got 0"):
        load_dataset("text", seq_len=0)
    with pytest.raises(WorkbenchError, match="eval_fraction must be between 0 and 1.*got 1.5"):
        load_dataset("digits", eval_fraction=1.5)
    with pytest.raises(WorkbenchError, match="noise must be >= 0, got -1"):
        load_dataset("regression", noise=-1)
    with pytest.raises(WorkbenchError, match="seq_len 600 leaves 2 train and 0 eval sequences: use a shorter seq_len"):
        load_dataset("text", corpus_bytes=2000, seq_len=600)


def test_parse_data_options_reads_typed_values_and_never_evaluates():
    assert parse_data_options("text", "") == {}
    assert parse_data_options("text", " seq_len = 32 ,eval_fraction=.05") == {"seq_len": 32, "eval_fraction": 0.05}
    assert parse_data_options("digits", "image=true") == {"image": True}
    assert parse_data_options("regression", "noise=1e-2") == {"noise": 0.01}
    with pytest.raises(WorkbenchError, match="'seq_len' is not key=value"):
        parse_data_options("text", "seq_len")
    with pytest.raises(WorkbenchError, match="must be int, got 'abc'"):
        parse_data_options("text", "seq_len=abc")
    with pytest.raises(WorkbenchError, match=r"must be int, got \"__import__\('os'\).getpid\(\)\""):
        parse_data_options("text", "seq_len=__import__('os').getpid()")
    with pytest.raises(WorkbenchError, match="no option 'vocab': its options are seq_len=64"):
        parse_data_options("text", "vocab=10")
    with pytest.raises(WorkbenchError, match="must be bool, got 'maybe'"):
        parse_data_options("digits", "image=maybe")


def test_unigram_entropy_is_for_language_data_sets(digits):
    with pytest.raises(WorkbenchError, match="unigram_entropy is for language data sets.*'digits' is classification"):
        digits.unigram_entropy()


def test_eval_split_refuses_training_options():
    dataset = load_dataset("regression", seed=0)
    with pytest.raises(WorkbenchError, match=r"split='eval' takes no batch options, got epochs, seed"):
        sharded_batches(dataset, 8, build_mesh("data=8"), split="eval", seed=1, epochs=2)
