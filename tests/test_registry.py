"""Registries, and the built-in datasets feeding their objectives."""

import itertools
import tracemalloc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _builders import TINY as SIZES
from _checks import rejects

from dew.config import DataConfig, ModelConfig, OptimConfig, RunConfig, TrainerConfig, override
from dew.data import Dataset, Partition
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.base import Objective
from dew.objectives.dpo import DPOObjective
from dew.objectives.grpo import GRPOObjective
from dew.objectives.lm import LMObjective
from dew.objectives.masked_diffusion import MaskedDiffusionObjective
from dew.registry import (
    NotRegisteredError,
    Registry,
    datasets,
    models,
    moving_shapes,
    objectives,
    optimizers,
    preference_pairs,
    prompts,
    shapes,
    token_windows,
)
from dew.steps import TrainState, train_step

# The Registry class.


def test_a_registry_registers_by_call_and_by_decorator():
    registry = Registry("widget")
    registry.register("one", len)

    @registry.register("two")
    def two(value):
        return 2 * value

    assert registry["one"] is len and registry["two"] is two
    assert "two" in registry and "three" not in registry
    assert registry.names() == ("one", "two") == tuple(registry)
    assert len(registry) == 2
    assert repr(registry) == "Registry('widget', names=['one', 'two'])"


def test_an_unknown_name_raises_a_key_error_listing_the_known_names():
    registry = Registry("widget")
    registry.register("bolt", len)
    registry.register("nut", len)
    with pytest.raises(KeyError):
        registry["screw"]
    with pytest.raises(
        NotRegisteredError,
        match=r"^no widget is registered as 'screw'; registered: 'bolt', 'nut'\.$",
    ):
        registry["screw"]


def test_registering_a_name_twice_raises_unless_replacing():
    registry = Registry("widget")
    registry.register("bolt", len)
    with pytest.raises(ValueError, match="a widget is already registered as 'bolt'; pass replace"):
        registry.register("bolt", abs)
    registry.register("bolt", abs, replace=True)
    assert registry["bolt"] is abs
    registry.unregister("bolt")
    assert "bolt" not in registry
    with pytest.raises(NotRegisteredError, match="no widget is registered as 'bolt'"):
        registry.unregister("bolt")


@pytest.mark.parametrize("name", ["", " bolt", "bolt\n", None])
def test_a_name_must_be_a_plain_non_empty_string(name):
    with rejects(ValueError, "a widget name must be a non-empty string", parameter="name"):
        Registry("widget").register(name, len)


def test_an_entry_must_be_callable():
    with pytest.raises(TypeError, match="a widget entry must be callable, got 3 of type int"):
        Registry("widget").register("three", 3)


def test_entries_must_take_the_arguments_dew_supplies():
    with pytest.raises(TypeError, match=r"model 'mlp' must take the keyword argument.*'key'"):
        models.register("mlp", lambda width: None)
    with pytest.raises(TypeError, match=r"optimizer 'mine' must take .*'learning_rate'"):
        optimizers.register("mine", lambda rate: optax.sgd(rate))
    with pytest.raises(TypeError, match=r"dataset 'mine' must take .*'batch_size', 'seed'"):
        datasets.register("mine", lambda *, seq_len: None)
    assert "mlp" not in models and "mine" not in optimizers and "mine" not in datasets


def test_the_built_in_names():
    assert {"causal_transformer", "bidirectional_transformer"} <= set(models)
    assert models["causal_transformer"] is CausalTransformer
    assert {"lm", "masked_diffusion", "dpo", "grpo"} <= set(objectives)
    assert {"adam", "adamw", "sgd", "lion", "adafactor"} <= set(optimizers)
    assert {"token_windows", "preference_pairs", "prompts"} <= set(datasets)


# datasets[name](**kwargs) names a dataset.


def test_indexing_datasets_returns_a_data_config():
    config = datasets["token_windows"](seq_len=8)
    assert config == DataConfig("token_windows", {"seq_len": 8})
    assert datasets.builder("token_windows") is token_windows


def test_dataset_arguments_are_checked_against_the_builder():
    with pytest.raises(TypeError, match="dataset 'token_windows' does not take 'seq_lenn'; its"):
        datasets["token_windows"](seq_lenn=8)
    with pytest.raises(TypeError, match="dataset 'token_windows' needs 'seq_len'; its parameters"):
        datasets["token_windows"]()
    with pytest.raises(ValueError, match=r"DataConfig\.kwargs may not set 'batch_size': it comes"):
        datasets["token_windows"](seq_len=8, batch_size=4)
    with pytest.raises(NotRegisteredError, match="no dataset is registered as 'token'"):
        datasets["token"]


# token_windows.


def batches(data, partition=None, count=3):
    return list(itertools.islice(data.train(partition or Partition()), count))


def test_token_windows_cuts_int32_windows_of_seq_len_plus_one():
    data = token_windows(seq_len=8, batch_size=4, seed=0)
    assert isinstance(data, Dataset) and data.batch == 4
    batch = next(data.train(Partition()))
    assert set(batch) == {"text"}
    assert batch["text"].shape == (4, 9) and batch["text"].dtype == np.int32
    assert batch["text"].min() >= 0 and batch["text"].max() < 16
    windows = (32768 - 1) // 8
    assert data.records == windows - int(np.ceil(0.1 * windows))


def test_token_windows_is_reproducible_and_each_call_restarts_the_order():
    first = token_windows(seq_len=8, batch_size=4, seed=3)
    again = token_windows(seq_len=8, batch_size=4, seed=3)
    other = token_windows(seq_len=8, batch_size=4, seed=4)
    for a, b in zip(batches(first), batches(first), strict=True):
        np.testing.assert_array_equal(a["text"], b["text"])
    for a, b in zip(batches(first), batches(again), strict=True):
        np.testing.assert_array_equal(a["text"], b["text"])
    assert not np.array_equal(batches(first)[0]["text"], batches(other)[0]["text"])


@pytest.fixture
def counting_file(tmp_path):
    """A token file whose window `i` starts with token `4 * i`, so rows name themselves."""
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(401, dtype=np.int64))
    return path


def first_tokens(batches):
    return [int(row[0]) // 4 for batch in batches for row in batch["text"]]


def test_token_windows_reads_a_npy_file(counting_file):
    data = token_windows(
        seq_len=4, path=str(counting_file), vocab_size=401, val_fraction=0.2, batch_size=5, seed=0
    )
    assert data.records == 80
    batch = next(data.train(Partition()))
    np.testing.assert_array_equal(batch["text"][:, 1:] - batch["text"][:, :1], [[1, 2, 3, 4]] * 5)
    epoch = first_tokens(batches(data, count=16))
    assert sorted(epoch) == list(range(80))
    assert epoch != sorted(epoch)
    val = list(data.val(Partition()))
    assert [len(batch["text"]) for batch in val] == [5, 5, 5, 5]
    assert first_tokens(val) == list(range(80, 100))


def test_partitions_take_disjoint_rows(counting_file):
    data = token_windows(
        seq_len=4, path=counting_file, vocab_size=401, val_fraction=0.2, batch_size=8, seed=1
    )
    shares = [first_tokens(batches(data, Partition(index, 2), count=5)) for index in range(2)]
    assert set(shares[0]).isdisjoint(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(80))
    val = [first_tokens(data.val(Partition(index, 3))) for index in range(3)]
    assert sorted(val[0] + val[1] + val[2]) == list(range(80, 100))
    assert val[0] == list(range(80, 100, 3))


def test_the_last_validation_batch_keeps_its_remainder_and_no_fraction_means_no_val(
    counting_file,
):
    data = token_windows(
        seq_len=4, path=counting_file, vocab_size=401, val_fraction=0.1, batch_size=3, seed=0
    )
    assert [len(batch["text"]) for batch in data.val(Partition())] == [3, 3, 3, 1]
    assert token_windows(seq_len=4, val_fraction=0, batch_size=3, seed=0).val is None


def test_a_partition_smaller_than_a_batch_wraps_into_the_next_epoch(counting_file):
    data = token_windows(
        seq_len=100, path=counting_file, vocab_size=401, val_fraction=0, batch_size=3, seed=0
    )
    rows = first_tokens(batches(data, count=4))
    assert len(rows) == 12 and set(rows) == {0, 25, 50, 75}


def test_bad_token_files_raise_naming_the_file(tmp_path):
    path = tmp_path / "tokens.npy"
    np.save(path, np.array([0, 1, 20, 3]))
    with pytest.raises(ValueError, match="holds token ID 20 at position 2; valid IDs are 0 to 15"):
        token_windows(seq_len=2, path=path, batch_size=1, seed=0)
    np.save(path, np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match=r"must hold a 1-D array of integer token IDs, got shape"):
        token_windows(seq_len=2, path=path, batch_size=1, seed=0)
    np.save(path, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"integer token IDs, got shape \(4,\) and dtype float32"):
        token_windows(seq_len=2, path=path, batch_size=1, seed=0)
    with pytest.raises(FileNotFoundError, match=r"token_windows: no file at .*, expected a token"):
        token_windows(seq_len=2, path=tmp_path / "missing.npy", batch_size=1, seed=0)
    np.save(path, np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="num_tokens sets the length of the synthetic stream"):
        token_windows(seq_len=2, path=path, num_tokens=10, batch_size=1, seed=0)
    with pytest.raises(ValueError, match=r"4 token\(s\) hold no window of seq_len \+ 1 = 9 tokens"):
        token_windows(seq_len=8, path=path, batch_size=1, seed=0)
    with pytest.raises(ValueError, match="leave no training row after holding out"):
        token_windows(seq_len=2, path=path, val_fraction=0.9, batch_size=1, seed=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 0}, "token_windows: seq_len must be an integer >= 1, got 0."),
        ({"seq_len": 4, "val_fraction": 1.0}, r"val_fraction must be a number in \[0, 1\)"),
        ({"seq_len": 4, "batch_size": 0}, "token_windows: batch_size must be an integer >= 1"),
    ],
)
def test_bad_token_windows_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        token_windows(**{"batch_size": 2, "seed": 0, **kwargs})


def _peak_bytes(call):
    """What `call()` allocates at its peak (NumPy reports its buffers to tracemalloc), and
    its result or the exception it raised."""
    tracemalloc.start()
    try:
        outcome = call()
    except ValueError as error:
        outcome = error
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, outcome


@pytest.mark.parametrize(
    ("builder", "kwargs", "message"),
    [
        (
            token_windows,
            {"seq_len": 8, "num_tokens": 10**12},
            "token_windows: a synthetic stream of num_tokens=1000000000000 over vocab_size=16 "
            "would take about 11,757.9 GiB to generate, past the 1.0 GiB a synthetic dataset may "
            "take (num_tokens up to 85,042,944 at vocab_size=16; for more data give a token "
            "file, path=..., which is memory-mapped): synthetic data is generated whole in memory.",
        ),
        (
            token_windows,
            {"seq_len": 8, "num_tokens": 1024, "vocab_size": 10**6},
            "(a synthetic vocab_size up to 6,688;",
        ),
        (preference_pairs, {"num_pairs": 10**12}, "num_pairs=1000000000000 of 8 tokens would"),
        (prompts, {"num_prompts": 10**12}, "(num_prompts up to 16,777,216 of 4 tokens)"),
        (shapes, {"rows": 10**12}, "shapes: rows=1000000000000 would take about 238,418.6 GiB"),
        (moving_shapes, {"rows": 10**12}, "moving_shapes: rows=1000000000000 would take"),
    ],
)
def test_a_synthetic_dataset_past_its_memory_limit_is_refused_before_allocating(
    builder, kwargs, message
):
    peak, outcome = _peak_bytes(lambda: builder(**kwargs, batch_size=2, seed=0))
    assert isinstance(outcome, ValueError) and message in str(outcome)
    assert peak < 2**20


@pytest.mark.parametrize(
    ("vocab_size", "num_tokens"), [(16, 2**18), (300, 40_000), (2, 5_000), (1000, 3_000)]
)
def test_the_synthetic_streams_memory_estimate_bounds_what_it_takes(vocab_size, num_tokens):
    from dew._datasets import _markov_stream, _stream_bytes

    peak, stream = _peak_bytes(lambda: _markov_stream.__wrapped__(vocab_size, num_tokens))
    assert stream.shape == (num_tokens,)
    assert peak <= _stream_bytes(vocab_size, num_tokens)


@pytest.mark.parametrize(
    ("builder", "kwargs", "rows"),
    [
        (preference_pairs, {"num_pairs": 20_000, "prompt_len": 3, "response_len": 9}, 20_000),
        (prompts, {"num_prompts": 20_000, "prompt_len": 7}, 20_000),
        (shapes, {"rows": 20_000}, 20_000),
        (moving_shapes, {"rows": 20_000, "image_size": 32, "frames": 9}, 20_000),
    ],
)
def test_the_synthetic_pools_memory_estimates_bound_what_they_take(builder, kwargs, rows):
    peak, outcome = _peak_bytes(lambda: builder(**kwargs, batch_size=2, seed=0))
    assert not isinstance(outcome, ValueError)
    limit = {
        preference_pairs: 32 * (kwargs.get("prompt_len", 4) + kwargs.get("response_len", 4)),
        prompts: 16 * kwargs.get("prompt_len", 4),
    }.get(builder, 256)
    assert peak <= rows * limit


def test_too_many_partitions_for_the_training_rows_raise(counting_file):
    data = token_windows(
        seq_len=100, path=counting_file, vocab_size=401, val_fraction=0, batch_size=1, seed=0
    )
    message = r"^token_windows: a global batch of 6 rows \(6 process\(es\) x 1\) is more than the"
    with pytest.raises(ValueError, match=message + r" 4 training row\(s\)"):
        data.train(Partition(5, 6))


def test_preference_pairs_and_prompts_batches():
    pairs = next(
        preference_pairs(prompt_len=3, response_len=2, batch_size=4, seed=0).train(Partition())
    )
    assert set(pairs) == {"chosen", "rejected", "prompt_mask"}
    assert pairs["chosen"].shape == pairs["rejected"].shape == pairs["prompt_mask"].shape == (4, 5)
    assert pairs["chosen"].dtype == np.int32 and pairs["prompt_mask"].dtype == np.bool_
    np.testing.assert_array_equal(pairs["chosen"][:, :3], pairs["rejected"][:, :3])
    assert (pairs["chosen"][:, 3:] != pairs["rejected"][:, 3:]).all()
    np.testing.assert_array_equal(pairs["chosen"][:, 3], (pairs["chosen"][:, 2] + 1) % 16)
    rows = next(prompts(prompt_len=3, batch_size=4, seed=0).train(Partition()))
    assert set(rows) == {"prompts"}
    assert rows["prompts"].shape == (4, 3) and rows["prompts"].dtype == np.int32
    assert len(list(prompts(num_prompts=20, batch_size=4, seed=0).val(Partition()))) == 1


# Each built-in dataset feeds its objective for one training step.


@pytest.fixture(scope="module")
def causal():
    """One small causal transformer, built through its config, shared by the tests."""
    return ModelConfig("causal_transformer", SIZES).build(key=jax.random.key(0))


def one_step(objective, batch, optimizer=None):
    optimizer = optimizer or optax.adam(1e-2)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0))
    step = jax.jit(lambda state, batch, key: train_step(objective, optimizer, state, batch, key))
    state, metrics = step(state, batch, jax.random.key(1))
    assert int(state.step) == 1
    assert bool(jnp.isfinite(metrics["loss"]))
    return state, metrics


def test_token_windows_feed_the_lm_objective(causal):
    model = causal
    objective = objectives["lm"](model, seq_len=8)
    assert isinstance(objective, LMObjective)
    data = DataConfig("token_windows", {"seq_len": 8}).build(batch_size=4, seed=0)
    _, metrics = one_step(objective, next(data.train(Partition())))
    assert "token_accuracy" in metrics


def test_token_windows_feed_the_masked_diffusion_objective():
    model = ModelConfig("bidirectional_transformer", SIZES).build(key=jax.random.key(0))
    objective = objectives["masked_diffusion"](model, seq_len=8, sampling_steps=2)
    assert isinstance(objective, MaskedDiffusionObjective)
    data = DataConfig("token_windows", {"seq_len": 8}).build(batch_size=4, seed=0)
    assert "masked_fraction" in one_step(objective, next(data.train(Partition())))[1]


def test_preference_pairs_feed_the_dpo_objective(causal):
    model = causal
    objective = objectives["dpo"](model, beta=0.1)
    assert isinstance(objective, DPOObjective) and objective.reference is model
    data = DataConfig("preference_pairs", {}).build(batch_size=4, seed=0)
    _, metrics = one_step(objective, next(data.train(Partition())))
    assert float(metrics["loss"]) == pytest.approx(np.log(2.0), abs=1e-4)


def test_prompts_feed_the_grpo_objective(causal):
    model = causal

    def reward(prompts, completions):
        return jnp.mean(jnp.where(completions == 3, 1.0, 0.0), axis=-1)

    objective = objectives["grpo"](model, reward_fn=reward, group_size=2, max_new_tokens=2)
    assert isinstance(objective, GRPOObjective)
    data = DataConfig("prompts", {"prompt_len": 3}).build(batch_size=2, seed=0)
    assert "reward_mean" in one_step(objective, next(data.train(Partition())))[1]


# Users register their own pieces by name.


class TinyLM(eqx.Module):
    """A user's model: a causal transformer of one width."""

    inner: CausalTransformer

    def __init__(self, width: int = 16, *, key):
        self.inner = CausalTransformer(8, width, 1, 2, 2 * width, 16, key=key)


def constant_rows(*, rows: int = 4, batch_size: int, seed: int) -> Dataset:
    batch = {"text": (np.arange(batch_size * 9).reshape(batch_size, 9) % 8).astype(np.int32)}
    return Dataset(train=lambda partition: itertools.repeat(batch), batch=batch_size)


def scaled_sgd(learning_rate, *, scale: float = 1.0):
    return optax.chain(optax.scale(scale), optax.sgd(learning_rate))


@pytest.fixture
def user_entries():
    models.register("tiny_lm", TinyLM)
    datasets.register("constant_rows", constant_rows)
    optimizers.register("scaled_sgd", scaled_sgd)
    objectives.register(
        "tiny_lm_objective", lambda model, **kwargs: LMObjective(model.inner, **kwargs)
    )
    yield
    models.unregister("tiny_lm")
    datasets.unregister("constant_rows")
    optimizers.unregister("scaled_sgd")
    objectives.unregister("tiny_lm_objective")


def test_a_run_config_builds_from_user_registered_entries(user_entries):
    config = RunConfig(
        model=ModelConfig("tiny_lm", {"width": 8}),
        data=datasets["constant_rows"](rows=2),
        optim=OptimConfig("scaled_sgd", learning_rate=0.1, kwargs={"scale": 0.5}),
        trainer=TrainerConfig(name="mine", steps=3, batch_size=2),
    )
    assert RunConfig.from_toml(config.to_toml()) == config
    model = config.model.build(key=jax.random.key(0))
    assert isinstance(model, TinyLM)
    objective = objectives["tiny_lm_objective"](model, seq_len=8)
    assert isinstance(objective, Objective)
    data = config.data.build(batch_size=config.trainer.batch_size, seed=config.trainer.seed)
    optimizer = config.optim.build(config.trainer.steps)
    one_step(objective, next(data.train(Partition())), optimizer)
    wider = override(config, {"model.kwargs.width": 16, "optim.kwargs.scale": 2.0})
    assert wider.model.build(key=jax.random.key(0)).inner.stack.head.weight.shape == (8, 16)
    with pytest.raises(KeyError, match=r"nearest declared paths: 'model\.kwargs\.width'"):
        override(config, {"model.kwargs.widht": 16})
