"""dew._domains: the keys of every purpose a run draws for, from one root key, never meet.

The tree is built with the functions the runners call (`Trainer` steps and evaluation events,
scoring batches, previews, `run_supervised` steps and validations, `run_stages`' stages, a
recipe's model, objective and run keys) and, below the keys handed to an objective, the
derivations the built-in objectives make (splits, and `DiffusionObjective`'s folds of its
preview domain and `Sampling.seed_domain`). Every counter (step, epoch, batch index, stage
index) ranges over small values and over every domain constant's value and its neighbours,
where a counter folded beside a domain would meet it.
"""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew import Trainer, _domains, metrics
from dew._domains import (
    PREVIEW_DOMAIN,
    derive,
    evaluation_key,
    model_key,
    objective_key,
    preview_key,
    run_key,
    scoring_key,
    stage_key,
    supervised_step_key,
    supervised_validation_key,
    train_step_key,
)
from dew.data import Dataset
from dew.events import TrackerEventSink
from dew.objectives.supervised import SupervisedObjective
from dew.supervised import (
    Batch,
    HeldOutValidation,
    create_optimizer,
    initialize_training_state,
    run_supervised,
)
from dew.tracking import InMemoryTracker

DOMAINS = {name: value for name, value in vars(_domains).items() if name.endswith("_DOMAIN")}
COUNTERS = sorted(
    set(range(4)) | {value + offset for value in DOMAINS.values() for offset in (-1, 0, 1)} - {-1}
)
SPLITS = 4  # an objective's splits of its key: split(key, n)[i] for i < SPLITS, twice over


def test_the_domains_are_distinct():
    assert len(set(DOMAINS.values())) == len(DOMAINS), DOMAINS


def test_the_counters_hold_every_domain_value():
    assert set(DOMAINS.values()) <= set(COUNTERS)
    assert 0x7A1 in COUNTERS and 0x9EE in COUNTERS  # the meeting this test was written for


CHUNK = 1 << 15


def _batched(fn, data: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """`vmap(fn)(keys, counters)` over keys' raw data `(n, 2)` and counters `(n,)`, in
    chunks of one padded size (the derivations compile once, not once per group's size);
    the raw data of what `fn` returns."""
    size = data.shape[0]
    padded = -(-size // CHUNK) * CHUNK
    data = np.concatenate([data, np.repeat(data[:1], padded - size, axis=0)])
    counters = np.concatenate([counters, np.zeros(padded - size, np.uint32)])
    chunks = [
        jax.random.key_data(
            jax.vmap(fn)(
                jax.random.wrap_key_data(jnp.asarray(data[i : i + CHUNK])),
                jnp.asarray(counters[i : i + CHUNK]),
            )
        )
        for i in range(0, padded, CHUNK)
    ]
    return np.concatenate([np.asarray(chunk) for chunk in chunks])[:size]


class Node:
    """A group of keys of one purpose, as raw key data of shape `axes' lengths + (2,)`,
    each axis named with the value at each position (a step, a batch index, a split)."""

    def __init__(self, tree: "Tree", label: str, data: np.ndarray, axes: tuple = ()):
        self.label, self.data, self.axes = label, data, axes
        self.shape = data.shape[:-1]
        self.tree = tree
        tree.nodes.append(self)

    def _flat(self) -> np.ndarray:
        return self.data.reshape(-1, 2)

    def over(self, label: str, fn, axis: str, counters: list[int]) -> "Node":
        """`fn(key, counter)` for every key and counter: a new last axis."""
        flat = self._flat()
        every = np.tile(np.asarray(counters, np.uint32), flat.shape[0])
        data = _batched(fn, np.repeat(flat, len(counters), axis=0), every)
        shaped = data.reshape(*self.shape, len(counters), 2)
        return Node(self.tree, f"{self.label}/{label}", shaped, (*self.axes, (axis, counters)))

    def each(self, label: str, fn) -> "Node":
        """`fn(key)` for every key."""
        flat = self._flat()
        data = _batched(lambda key, _: fn(key), flat, np.zeros(flat.shape[0], np.uint32))
        return Node(self.tree, f"{self.label}/{label}", data.reshape(self.data.shape), self.axes)

    def split(self) -> "Node":
        """`jax.random.split(key, SPLITS)` of every key: a new last axis."""
        flat = self._flat()
        split = lambda key, _: jax.random.split(key, SPLITS)  # noqa: E731
        data = _batched(split, flat, np.zeros(flat.shape[0], np.uint32))
        axes = (*self.axes, ("split", list(range(SPLITS))))
        shaped = data.reshape(*self.shape, SPLITS, 2)
        return Node(self.tree, f"{self.label}/split", shaped, axes)

    def name(self, flat_index: int) -> str:
        index = np.unravel_index(flat_index, self.shape) if self.axes else ()
        where = ", ".join(
            f"{axis}={values[i]}" for (axis, values), i in zip(self.axes, index, strict=True)
        )
        return f"{self.label}[{where}]"


class Tree:
    """The nodes of a derivation tree, and where two of their keys are equal."""

    def __init__(self, root: jax.Array):
        self.nodes: list[Node] = []
        self.root = Node(self, "root", np.asarray(jax.random.key_data(root)))

    def __len__(self) -> int:
        return sum(node.data.size // 2 for node in self.nodes)

    def meetings(self) -> list[str]:
        """Up to five sets of equal keys, each key named by its node and axes."""
        groups = [node.data.reshape(-1, 2) for node in self.nodes]
        data = np.ascontiguousarray(np.concatenate(groups), np.uint32)
        words = data.view(np.uint64).ravel()  # a key's two uint32 words as one number
        _, first, counts = np.unique(words, return_index=True, return_counts=True)
        starts = np.cumsum([0, *(len(group) for group in groups)])
        found = []
        for position in first[counts > 1][:5]:
            names = []
            for row in np.flatnonzero(words == words[position]):
                node = int(np.searchsorted(starts, row, side="right")) - 1
                names.append(self.nodes[node].name(int(row - starts[node])))
            found.append(" = ".join(names))
        return found


def _handed(node: Node, seed_domains: list[int] | None) -> None:
    """What objectives derive from the keys handed to them: splits (every objective's loss,
    the language samplers, masked diffusion's steps, JEPA's masks), or for a diffusion
    `evaluate` / `generate_preview` the fold of `Sampling.seed_domain`, for each of
    `seed_domains` (two protocols with different seed domains draw apart too)."""
    if seed_domains is not None:
        for seed_domain in seed_domains:
            node.each(f"seed_domain={seed_domain}", lambda key, d=seed_domain: derive(key, d))
    else:
        node.split().split()


def _evaluation(event: Node, counters: list[int], diffusion: list[int] | None) -> None:
    """An evaluation event's keys: the scoring batches and the preview, each handed on."""
    _handed(event.over("scoring", scoring_key, "batch", counters), diffusion)
    preview = event.each("preview", preview_key)
    if diffusion is None:
        _handed(preview, None)
    else:  # DiffusionObjective.generate_preview: its preview domain, then the seed domain
        _handed(preview.each("preview_domain", lambda k: derive(k, PREVIEW_DOMAIN)), diffusion)


def _supervised(state: Node, counters: list[int]) -> None:
    """`run_supervised`'s keys from state keys: its steps and its epochs' validations."""
    _handed(state.over("supervised_step", supervised_step_key, "step", counters), None)
    validation = state.over("validation", supervised_validation_key, "epoch", counters)
    _handed(validation.over("scoring", scoring_key, "batch", counters), None)


def derivation_tree(
    root: jax.Array, counters: list[int], diffusion: list[int] | None = None
) -> Tree:
    """Every key one root key gives when it seeds a recipe and is also the key of a
    `Trainer`, of a `run_supervised` state, of `run_stages` and of `evaluate` (the same key
    reaching every runner: their domains still keep them apart). `diffusion`: the
    objective is a `DiffusionObjective`, with these `Sampling.seed_domain`s (else its
    `evaluate` and `generate_preview` split their keys, as every loss does)."""
    tree = Tree(root)
    tree.root.each("model", model_key)
    tree.root.each("objective", objective_key)
    # a Trainer with the recipe's run key, and one given the root key itself
    for trainer in (tree.root.each("run", run_key), tree.root):
        _handed(trainer.over("train_step", train_step_key, "step", counters), None)
        _evaluation(trainer.over("event", evaluation_key, "step", counters), counters, diffusion)
    _evaluation(tree.root, counters, diffusion)  # evaluate(key=root): the root as event key
    _supervised(tree.root, counters)  # run_supervised with the root as its state key
    _supervised(tree.root.over("stage", stage_key, "index", counters), counters)
    return tree


@pytest.mark.parametrize("diffusion", [None, [0, *sorted(set(DOMAINS.values()) - {0})]])
def test_no_two_purposes_keys_meet(diffusion):
    tree = derivation_tree(jax.random.key(0), COUNTERS, diffusion)
    meetings = tree.meetings()
    assert not meetings, "keys of two purposes meet:\n" + "\n".join(meetings)
    assert len(tree) > 100_000


def test_the_meeting_that_was_is_gone():
    """Before the rule, the event key at step 1953 (TRAIN_STEP_DOMAIN) was the training
    stream, so its preview key was the key of training step 2542 (PREVIEW_DOMAIN)."""
    run = run_key(jax.random.key(0))
    preview = preview_key(evaluation_key(run, _domains.TRAIN_STEP_DOMAIN))
    step = train_step_key(run, _domains.PREVIEW_DOMAIN)
    assert not np.array_equal(jax.random.key_data(preview), jax.random.key_data(step))


COUNTER = st.one_of(st.sampled_from(sorted(DOMAINS.values())), st.integers(0, 2**32 - 1))


@pytest.mark.slow  # about 10 s; CI runs it with the slow tests
@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    counters=st.lists(COUNTER, min_size=6, max_size=6, unique=True),
    diffusion=st.one_of(st.none(), st.lists(COUNTER, min_size=2, max_size=2, unique=True)),
)
def test_no_keys_meet_for_any_seed_counters_and_seed_domains(seed, counters, diffusion):
    meetings = derivation_tree(jax.random.key(seed), counters, diffusion).meetings()
    assert not meetings, "keys of two purposes meet:\n" + "\n".join(meetings)


def test_derive_folds_the_domain_then_the_counters_in_order():
    key = jax.random.key(3)
    by_hand = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, 7), 2), 5)
    assert np.array_equal(jax.random.key_data(derive(key, 7, 2, 5)), jax.random.key_data(by_hand))
    assert not np.array_equal(
        jax.random.key_data(derive(key, 7, 5, 2)), jax.random.key_data(by_hand)
    )


# --- the runners draw with the tree's keys ------------------------------------------------

ROWS = np.ones((4, 1), np.float32)


def _uniform_loss(model, inputs, targets, sample_weight, key, training):
    """One uniform draw from the key it is given, per row, plus the model's (zero-weighted)
    output so there is something to differentiate."""
    return jax.random.uniform(key, (inputs.shape[0],)) + 0.0 * jax.vmap(model)(inputs)[:, 0]


def _uniform(key) -> float:
    """The batch's loss: the mean of its rows' draws."""
    return float(np.mean(jax.random.uniform(key, (len(ROWS),))))


def test_the_trainer_draws_its_steps_and_events_from_the_tree():
    batch = {"inputs": ROWS, "targets": ROWS}
    data = Dataset(
        train=lambda partition: itertools.repeat(batch),
        val=lambda partition: iter([batch]),
        records=len(ROWS),
        batch=len(ROWS),
    )
    objective = SupervisedObjective(eqx.nn.Linear(1, 1, key=jax.random.key(0)), _uniform_loss)
    key = jax.random.key(5)
    tracker = InMemoryTracker()
    Trainer(objective, optax.sgd(0.0), key=key).fit(
        data,
        3,
        log_every=1,
        eval_every=1,
        metrics=[metrics.loss()],
        tracker=tracker,
        progress=False,
    )
    trained = tracker.scalars["supervised/train/loss"]
    validated = tracker.scalars["supervised/validation/loss"]
    assert [step for step, _ in trained] == [1, 2, 3]
    for (step, value), (event_step, scored) in zip(trained, validated, strict=True):
        assert value == pytest.approx(_uniform(train_step_key(key, step - 1)), rel=1e-6)
        event = evaluation_key(key, event_step)
        assert scored == pytest.approx(_uniform(scoring_key(event, 0)), rel=1e-6)


def test_run_supervised_draws_its_steps_and_validations_from_the_tree():
    model = eqx.nn.Linear(1, 1, key=jax.random.key(0))
    optimizer = create_optimizer(model, optax.sgd(0.0))
    key = jax.random.key(6)
    loader = lambda split, epoch: iter([Batch(ROWS, ROWS)])  # noqa: E731
    tracker = InMemoryTracker()
    run_supervised(
        model=model,
        optimizer=optimizer,
        train_loader=loader,
        loss=_uniform_loss,
        state=initialize_training_state(model, optimizer, key),
        epochs=2,
        validation=HeldOutValidation(model, loader, _uniform_loss),
        event_sinks=[TrackerEventSink(tracker)],
    )
    trained = tracker.scalars["supervised/train/loss"]
    validated = tracker.scalars["supervised/validation/loss"]
    assert [epoch for epoch, _ in trained] == [epoch for epoch, _ in validated] == [0, 1]
    for epoch, value in trained:  # one batch an epoch: step `epoch` trains epoch `epoch`
        assert value == pytest.approx(_uniform(supervised_step_key(key, epoch)), rel=1e-6)
    for epoch, value in validated:
        validation = supervised_validation_key(key, epoch)
        assert value == pytest.approx(_uniform(scoring_key(validation, 0)), rel=1e-6)
