"""I-JEPA: block masks, the no-leak context encoder, the EMA target, learning, checks."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _checks import rejects
from hypothesis import given, settings
from hypothesis import strategies as st

import dew
from dew.artifacts import Representations
from dew.config import ObjectiveConfig
from dew.data import Partition
from dew.nn.backbones.vit import ViT
from dew.objectives.base import ReadsEMAParams
from dew.objectives.jepa import BlockMasks, JEPAObjective, normalised_tokens
from dew.registry import models, objectives, shapes
from dew.steps import TrainState, ema_update, train_step


def vit(width=32, *, key=0):
    return ViT(16, 4, 3, width=width, depth=1, heads=2, key=jax.random.key(key))


def jepa(*, predictor_width=16, ema_decay=0.9, **kwargs):
    return JEPAObjective(
        vit(),
        vit(predictor_width, key=1),
        ema_decay=ema_decay,
        key=jax.random.key(2),
        **kwargs,
    )


def images(rows=4, key=3):
    return jax.random.uniform(jax.random.key(key), (rows, 16, 16, 3))


# -- masks ----------------------------------------------------------------------------------


@settings(deadline=None, max_examples=15)
@given(
    rows=st.integers(2, 6),
    columns=st.integers(2, 6),
    height=st.integers(1, 3),
    width=st.integers(1, 3),
    targets=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.slow  # about 6 s; CI runs it with the slow tests
def test_block_masks_are_unions_of_whole_blocks_that_leave_context(
    rows, columns, height, width, targets, seed
):
    masks = BlockMasks(targets=targets, height=height, width=width)
    grid = (rows, columns)
    if height > rows or width > columns or targets * height * width >= rows * columns:
        with pytest.raises(ValueError, match=r"BlockMasks"):
            masks.check_grid(grid)
        return
    masks.check_grid(grid)
    target = np.asarray(masks.sample(jax.random.key(seed), grid)).reshape(grid)
    assert height * width <= target.sum() <= targets * height * width
    assert not target.all()  # some context is always left
    # Every target patch lies in a height x width block wholly inside the target.
    for y, x in zip(*np.nonzero(target), strict=True):
        assert any(
            target[top : top + height, left : left + width].all()
            for top in range(max(0, y - height + 1), min(y, rows - height) + 1)
            for left in range(max(0, x - width + 1), min(x, columns - width) + 1)
        )


def test_one_block_is_exactly_one_rectangle_and_the_draw_follows_the_key():
    masks = BlockMasks(targets=1, height=2, width=3)
    target = np.asarray(masks.sample(jax.random.key(0), (4, 5))).reshape(4, 5)
    ys, xs = np.nonzero(target)
    assert target.sum() == 6 and np.ptp(ys) == 1 and np.ptp(xs) == 2
    again = np.asarray(masks.sample(jax.random.key(0), (4, 5))).reshape(4, 5)
    np.testing.assert_array_equal(target, again)
    draws = {masks.sample(jax.random.key(k), (4, 5)).tobytes() for k in range(20)}
    assert len(draws) > 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"targets": 0}, r"BlockMasks.targets must be an integer >= 1, got 0"),
        ({"height": 2.0}, r"BlockMasks.height must be an integer >= 1, got 2.0"),
        ({"width": True}, r"BlockMasks.width must be an integer >= 1, got True"),
    ],
)
def test_bad_block_masks_are_refused(kwargs, match):
    with rejects(ValueError, match, parameter=next(iter(kwargs))):
        BlockMasks(**kwargs)


def test_normalised_tokens_match_a_numpy_layer_norm():
    features = np.random.default_rng(0).normal(2.0, 3.0, (5, 7)).astype(np.float32)
    want = (features - features.mean(-1, keepdims=True)) / np.sqrt(
        features.var(-1, keepdims=True) + 1e-6
    )
    np.testing.assert_allclose(normalised_tokens(jnp.asarray(features)), want, rtol=1e-5)


# -- the context encoder never sees the targets ----------------------------------------------


def test_the_context_output_has_exactly_zero_gradient_on_target_pixels():
    objective = jepa()
    encoder = objective.encoder
    target = BlockMasks().sample(jax.random.key(4), encoder.grid)
    context = ~target
    image = images(1)[0]

    @jax.jit
    @jax.grad
    def context_output(image):
        return jnp.sum(jnp.sin(encoder(image, context)))

    gradient = np.asarray(context_output(image))
    pixels = np.asarray(target).reshape(4, 4).repeat(4, 0).repeat(4, 1)  # patch -> pixels
    assert np.all(gradient[pixels] == 0.0)
    assert np.any(gradient[~pixels] != 0.0)  # the context pixels do reach it
    # And the same through the whole loss, for the online networks' input: the predictor
    # reads target pixels only through the stop-gradient target encoder.
    params = objective.init_params()
    online = eqx.combine(params, objective.networks)

    @jax.jit
    @jax.grad
    def prediction(image):
        return jnp.sum(online.predict(online.encoder(image, context), context) ** 2)

    gradient = np.asarray(prediction(image))
    assert np.all(gradient[pixels] == 0.0) and np.any(gradient[~pixels] != 0.0)


# -- the loss and its EMA target -------------------------------------------------------------


def numpy_loss(objective, params, ema_params, batch, key):
    """The loss recomputed outside the objective from its parts: masks, encoders, predictor."""
    online = eqx.combine(params, objective.networks)
    target_encoder = eqx.combine(ema_params, objective.networks).encoder

    @jax.jit
    def parts(image, image_key):  # the networks' outputs; the loss is formed in NumPy
        target = objective.masks.sample(image_key, online.encoder.grid)
        predicted = online.predict(online.encoder(image, ~target), ~target)
        return target, predicted, target_encoder(image)

    errors = []
    for image, image_key in zip(
        batch["images"], jax.random.split(key, batch["images"].shape[0]), strict=True
    ):
        target, predicted, features = (np.asarray(part) for part in parts(image, image_key))
        features = features.astype(np.float64)
        wanted = (features - features.mean(-1, keepdims=True)) / np.sqrt(
            features.var(-1, keepdims=True) + 1e-6
        )
        chosen = np.asarray(target)
        errors.append(np.mean((predicted[chosen] - wanted[chosen]) ** 2))
    return float(np.mean(errors))


@pytest.mark.slow
def test_the_loss_is_the_mse_on_target_tokens_against_the_normalised_ema_target():
    objective = jepa()
    params = objective.init_params()
    ema = jax.tree.map(lambda leaf: leaf + 0.05, params)
    batch = {"images": images()}
    key = jax.random.key(7)
    loss, aux = objective.ema_loss(params, ema, batch, key)
    assert float(loss) == pytest.approx(numpy_loss(objective, params, ema, batch, key), rel=1e-4)
    pooled = np.asarray(
        jax.vmap(lambda image: eqx.combine(ema, objective.networks).encoder(image).mean(0))(
            batch["images"]
        )
    )
    assert float(aux["target_feature_std"]) == pytest.approx(pooled.std(0).mean(), rel=1e-4)
    # `loss` is the live encoder as its own target.
    assert float(objective.loss(params, batch, key)[0]) == pytest.approx(
        numpy_loss(objective, params, params, batch, key), rel=1e-4
    )


@pytest.mark.slow
def test_train_step_differentiates_the_ema_loss_and_the_target_gets_no_gradient():
    objective = jepa(ema_decay=0.5)
    assert isinstance(objective, ReadsEMAParams)
    optimizer = optax.sgd(1.0)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0), ema=True)
    state = eqx.tree_at(
        lambda s: s.ema_params, state, jax.tree.map(lambda x: x + 0.05, state.ema_params)
    )
    batch, key = {"images": images()}, jax.random.key(8)

    def ema_loss(params):
        return objective.ema_loss(params, state.ema_params, batch, key)[0]

    expected = jax.jit(jax.grad(ema_loss))(state.params)
    live = jax.jit(jax.grad(lambda params: objective.loss(params, batch, key)[0]))(state.params)
    step = eqx.filter_jit(train_step)
    stepped, outputs = step(objective, optimizer, state, batch, key, ema_decay=0.5)
    for before, after, gradient in zip(
        jax.tree.leaves(state.params),
        jax.tree.leaves(stepped.params),
        jax.tree.leaves(expected),
        strict=True,
    ):
        np.testing.assert_allclose(before - after, gradient, rtol=1e-4, atol=1e-7)
    assert float(outputs["loss"]) == pytest.approx(float(jax.jit(ema_loss)(state.params)), rel=1e-5)
    pairs = zip(jax.tree.leaves(expected), jax.tree.leaves(live), strict=True)
    differs = [not np.allclose(a, b) for a, b in pairs]
    assert any(differs)  # it really read the EMA target, not the live encoder
    # The EMA moves by the formula, from the updated params.
    want = ema_update(state.ema_params, stepped.params, 0.5)
    for got, wanted in zip(jax.tree.leaves(stepped.ema_params), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(got, wanted, rtol=1e-6)


def test_a_step_without_the_ema_is_refused_for_an_objective_with_a_decay():
    objective = jepa()
    state = TrainState.create(objective, optax.sgd(0.1), key=jax.random.key(0), ema=True)
    with pytest.raises(ValueError, match=r"JEPAObjective trains against its EMA params"):
        train_step(objective, optax.sgd(0.1), state, {"images": images()}, jax.random.key(0))


@pytest.mark.slow  # about 7 s; CI runs it with the slow tests
def test_the_trainer_keeps_the_target_encoder_as_the_ema_by_the_formula():
    decay = 0.8
    objective = jepa(ema_decay=decay)
    data = shapes(rows=64, batch_size=8, seed=0, val_fraction=0)
    trainer = dew.Trainer(objective, optax.adam(1e-2), jax.random.key(0))
    state, expected = None, objective.init_params()
    for step in range(1, 3):
        state = trainer.fit(data, steps=step, log_every=1, progress=False, state=state)
        expected = ema_update(expected, state.params, decay)
    for got, want in zip(jax.tree.leaves(state.ema_params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


# -- evaluation ------------------------------------------------------------------------------


def test_evaluate_returns_mean_pooled_features_with_the_labels_and_previews_them():
    objective = jepa(probe_classes=3)
    params = objective.init_params()
    batch = {"images": images(), "labels": jnp.array([0, 2, 1, 0], jnp.int32)}
    evaluate = eqx.filter_jit(objective.evaluate)  # eagerly, each operation compiles alone
    artifact = evaluate(params, batch, jax.random.key(0))
    assert isinstance(artifact, Representations)
    encoder = eqx.filter_jit(objective.encoder)
    want = np.stack([np.asarray(encoder(image)).mean(0) for image in batch["images"]])
    np.testing.assert_allclose(artifact.features, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(artifact.labels, batch["labels"])
    assert evaluate(params, {"images": images()}, jax.random.key(0)).labels is None
    # The base preview is the scoring artifact itself: no second encoder pass.
    assert objective.preview(params, batch, jax.random.key(1), scored=artifact) is artifact
    assert [m.name for m in objective.default_metrics()] == [
        "batch_linear_probe_accuracy",
        "batch_knn_probe_accuracy",
    ]
    assert jepa().default_metrics() == ()


def numpy_probes(train, train_labels, test, test_labels, classes=3, k=5):
    """Reference probes in NumPy: a ridge classifier on one-hot labels, and a k-NN vote."""
    design = np.column_stack([train, np.ones(len(train))])
    weights = np.linalg.solve(
        design.T @ design + 1e-3 * np.eye(design.shape[1]),
        design.T @ np.eye(classes)[train_labels],
    )
    linear = np.mean(
        np.argmax(np.column_stack([test, np.ones(len(test))]) @ weights, 1) == test_labels
    )
    distances = ((test[:, None] - train[None]) ** 2).sum(-1)
    nearest = train_labels[np.argsort(distances, axis=1)[:, :k]]
    votes = np.stack([np.bincount(row, minlength=classes) for row in nearest])
    return float(linear), float(np.mean(np.argmax(votes, 1) == test_labels))


@pytest.mark.slow
def test_jepa_learns_without_collapse_and_its_probes_beat_chance():
    """The research note's CI size: width 32, depth 1, 200 steps of 32 shapes (~5 s)."""
    objective = JEPAObjective(
        vit(32), vit(32, key=1), ema_decay=0.99, probe_classes=3, key=jax.random.key(2)
    )
    data = shapes(rows=2048, batch_size=32, seed=0, val_fraction=0.125)
    trainer = dew.Trainer(objective, optax.adamw(1e-3), jax.random.key(0))
    state = trainer.fit(data, steps=200, log_every=10, progress=False)
    loss = [value for _, value in state.metric_history["jepa/train/loss"]]
    spread = [value for _, value in state.metric_history["jepa/train/target_feature_std"]]
    assert loss[-1] < 0.4 * loss[0]
    assert min(spread) > 0.03  # the target features keep their batch spread: no collapse
    # Probes on the trained target encoder's features of held-out shapes (3 kinds).
    validation = list(data.val(Partition.current()))
    features = np.concatenate(
        [objective.representations(state.ema_params, batch["images"]) for batch in validation]
    )
    labels = np.concatenate([batch["labels"] for batch in validation])
    half = len(labels) // 2
    linear, knn = numpy_probes(features[:half], labels[:half], features[half:], labels[half:])
    chance = np.bincount(labels[half:]).max() / (len(labels) - half)
    # Over trainer keys 0 to 4, with the masks' keys before and after issue 24, the linear
    # probe scored 0.430 to 0.461 against chance 0.383 (its 128 test rows: 0.008 a row) and
    # the k-NN probe 0.578 to 0.625.
    assert linear > chance + 0.04 and knn > chance + 0.02


# -- bad input -------------------------------------------------------------------------------

BAD_BATCHES = [
    ({"images": np.full((2, 16, 16, 3), 1.5, np.float32)}, r"holds value 1.5 at row 0"),
    ({"images": np.zeros((2, 16, 16, 3), np.uint8)}, r"float values in \[0, 1\].*uint8"),
    ({"images": np.zeros((2, 8, 8, 3), np.float32)}, r"\(rows, 16, 16, 3\).*\(2, 8, 8, 3\)"),
    (
        {"images": np.zeros((2, 16, 16, 3), np.float32), "labels": np.array([0, 3], np.int32)},
        r"holds label 3 at row 1; valid labels are 0 to 2 \(probe_classes=3\)",
    ),
    (
        {"images": np.zeros((2, 16, 16, 3), np.float32), "labels": np.zeros(2, np.float32)},
        r"integer class labels.*float32",
    ),
]


@pytest.mark.parametrize(("batch", "match"), BAD_BATCHES)
def test_bad_batches_are_refused_before_any_compute(batch, match):
    objective = jepa(probe_classes=3)
    with pytest.raises(ValueError, match=match):
        objective.check_batch(batch)
    with pytest.raises(ValueError, match=match):
        objective.evaluate(objective.init_params(), batch, jax.random.key(0))
    if "labels" not in batch:  # the loss reads no labels
        with pytest.raises(ValueError, match=match):
            objective.loss(objective.init_params(), batch, jax.random.key(0))


@pytest.mark.parametrize("index", [0, 3])
def test_bad_values_under_jit_reach_the_user_as_value_errors(index):
    batch, match = BAD_BATCHES[index]
    objective = jepa(probe_classes=3)
    device_batch = {name: jnp.asarray(value) for name, value in batch.items()}
    with pytest.raises(ValueError, match=match) as caught:
        dew.evaluate(
            objective,
            objective.init_params(),
            [device_batch],
            metrics=objective.default_metrics(),
            key=jax.random.key(0),
        )
    assert "Equinox" not in str(caught.value) and "jax" not in str(caught.value).lower()


def test_bad_construction_is_refused_naming_the_value():
    encoder, predictor = vit(), vit(16, key=1)
    with rejects(ValueError, r"encoder must be a dew ViT, got Linear", parameter="encoder"):
        JEPAObjective(eqx.nn.Linear(2, 2, key=jax.random.key(0)), predictor)
    other_grid = ViT(16, 8, 3, width=16, depth=1, heads=2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"encoder's \(4, 4\) patch grid, got \(2, 2\)"):
        JEPAObjective(encoder, other_grid, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"needs key= .* width 32 and the predictor's width 16"):
        JEPAObjective(encoder, predictor)
    with pytest.raises(ValueError, match=r"ema_decay must be None or a number in .*, got 1.0"):
        JEPAObjective(encoder, vit(32), ema_decay=1.0)
    with pytest.raises(ValueError, match=r"probe_classes must be None or an integer >= 2, got 1"):
        JEPAObjective(encoder, vit(32), probe_classes=1)
    with pytest.raises(ValueError, match=r"leaving no context"):
        JEPAObjective(encoder, vit(32), masks=BlockMasks(targets=4, height=2, width=2))
    with rejects(ValueError, r"masks must be a .*BlockMasks, got dict", parameter="masks"):
        JEPAObjective(encoder, vit(32), masks={"targets": 1})
    # Equal widths need no maps and no key.
    assert JEPAObjective(encoder, vit(32)).networks.into_predictor is None


# -- the registry and run configurations ----------------------------------------------------


def test_the_registered_builder_takes_mappings_from_a_configuration():
    encoder = models["vit"](
        image_size=16, patch_size=4, channels=3, width=32, depth=1, heads=2, key=jax.random.key(0)
    )
    objective = objectives["jepa"](
        encoder,
        key=jax.random.key(1),
        predictor={"width": 16, "heads": 4},
        masks={"targets": 1, "height": 3, "width": 2},
        probe_classes=3,
        ema_decay=0.99,
    )
    assert objective.masks == BlockMasks(targets=1, height=3, width=2)
    assert (objective.networks.predictor.width, objective.networks.predictor.heads) == (16, 4)
    assert objective.ema_decay == 0.99 and objective.probe_classes == 3
    with pytest.raises(ValueError, match=r"predictor's width, depth and heads, got \['size'\]"):
        objectives["jepa"](encoder, key=jax.random.key(1), predictor={"size": 3})
    with pytest.raises(ValueError, match=r"objective's key comes from trainer.seed"):
        ObjectiveConfig("jepa", {"key": 3})
