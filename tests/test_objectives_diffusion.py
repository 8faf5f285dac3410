"""Rectified-flow diffusion over images and clips: sampler, loss, checks, keys, learning, EMA."""

import hashlib
import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _checks import rejects

import dew
from dew import metrics
from dew._domains import evaluation_key, preview_key
from dew.artifacts import Clips, Images
from dew.data import Dataset, Partition
from dew.metrics._fid import FID
from dew.nn.backbones.dit import DiT
from dew.objectives.diffusion import DiffusionObjective, Sampling, sample_flow
from dew.registry import moving_shapes, objectives, shapes
from dew.steps import TrainState, ema_update
from dew.telemetry.records import SamplingProtocol
from dew.tracking import InMemoryTracker, LocalTracker, read_journal
from dew.training._evaluation_event import key_text

MU, S = 0.7, 0.3


def gaussian_velocity(x, t):
    """The exact flow-matching velocity for x0 ~ N(0, I), x1 ~ N(MU, S^2 I)."""
    return MU + (t * S**2 - (1 - t)) / ((1 - t) ** 2 + t**2 * S**2) * (x - t * MU)


def flow_error(solver: str, steps: int) -> float:
    noise = jax.random.normal(jax.random.key(0), (64, 256))
    x = sample_flow(gaussian_velocity, noise, solver=solver, steps=steps)
    return float(jnp.max(jnp.abs(x - (MU + S * noise))))


def dit(*, num_classes=3, frames=None, width=32, key=0):
    return DiT(
        16,
        4,
        3,
        width=width,
        depth=1,
        heads=2,
        frames=frames,
        num_classes=num_classes,
        key=jax.random.key(key),
    )


def perturbed(params, key=1):
    """`params` with every all-zero array (adaLN-zero gates, the zeroed head) drawn
    small and random, so time, labels and inputs all reach the output."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(key), len(leaves))
    leaves = [
        0.1 * jax.random.normal(k, leaf.shape) if not np.any(np.asarray(leaf)) else leaf
        for k, leaf in zip(keys, leaves, strict=True)
    ]
    return jax.tree.unflatten(treedef, leaves)


def image_batch(rows=4, value=0.5):
    return {
        "images": np.full((rows, 16, 16, 3), value, np.float32),
        "labels": np.arange(rows, dtype=np.int32) % 3,
    }


# -- the sampling protocol --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"solver": "rk4"}, r"solver must be one of \('euler', 'heun'\), got 'rk4'"),
        ({"steps": 0}, r"Sampling.steps must be an integer >= 1, got 0"),
        ({"steps": 2.0}, r"Sampling.steps must be an integer >= 1, got 2.0"),
        ({"guidance": -1.0}, r"guidance must be a finite number >= 0, got -1.0"),
        ({"guidance": float("nan")}, r"guidance must be a finite number >= 0, got nan"),
        ({"seed_domain": -1}, r"seed_domain must be an integer between 0 and 4294967295"),
    ],
)
def test_sampling_rejects_bad_settings(kwargs, match):
    with rejects(ValueError, match, parameter=next(iter(kwargs))):
        Sampling(**kwargs)


def test_objective_rejects_bad_settings():
    with pytest.raises(ValueError, match=r"label_dropout must be a number in \[0, 1\], got 1.5"):
        DiffusionObjective(dit(), label_dropout=1.5)
    with pytest.raises(ValueError, match=r"ema_decay must be None or a number in \[0, 1\)"):
        DiffusionObjective(dit(), ema_decay=1.0)
    with pytest.raises(ValueError, match=r"prediction must be one of \('velocity', 'data'\)"):
        DiffusionObjective(dit(), prediction="noise")
    with rejects(ValueError, "shape_scores must be True or False, got 1", parameter="shape_scores"):
        DiffusionObjective(dit(), shape_scores=1)
    with pytest.raises(ValueError, match="needs a class-conditional RGB DiT with num_classes=3"):
        DiffusionObjective(dit(num_classes=5), shape_scores=True)


# -- the sampler, without training --------------------------------------------------------


def test_euler_matches_the_exact_gaussian_flow_at_first_order():
    errors = [flow_error("euler", steps) for steps in (10, 50, 200)]
    # The research note's measured errors: 0.21, 0.045, 0.011.
    assert errors[0] == pytest.approx(0.21, rel=0.15)
    assert errors[1] == pytest.approx(0.045, rel=0.15)
    assert errors[2] == pytest.approx(0.011, rel=0.15)
    # First order: 5x and 4x more steps cut the error about 5x and 4x.
    assert 3.5 < errors[0] / errors[1] < 6.5
    assert 3.0 < errors[1] / errors[2] < 5.0


def test_heun_converges_at_second_order():
    euler = flow_error("euler", 20)
    errors = [flow_error("heun", steps) for steps in (10, 20, 40)]
    assert errors[1] < euler / 10
    # Second order: doubling the steps cuts the error about 4x.
    assert errors[0] / errors[1] > 3.0
    assert errors[1] / errors[2] > 3.0


def test_sample_flow_rejects_an_unknown_solver():
    with pytest.raises(ValueError, match="solver must be one of"):
        sample_flow(gaussian_velocity, jnp.zeros((1, 2)), solver="rk4", steps=2)


# -- the loss ---------------------------------------------------------------------------


def test_loss_matches_a_numpy_recomputation():
    model = dit()
    objective = DiffusionObjective(model, label_dropout=0.5)
    params = perturbed(objective.init_params())
    batch = {
        "images": np.random.default_rng(0).uniform(size=(6, 16, 16, 3)).astype(np.float32),
        "labels": np.array([0, 1, 2, 0, 1, 2], np.int32),
    }
    key = jax.random.key(3)
    # Compiled, as training runs it (one compilation, not one per eager op).
    loss, aux = eqx.filter_jit(objective.loss)(params, batch, key)
    assert aux == {}

    noise_key, time_key, label_key = jax.random.split(key, 3)
    x1 = 2.0 * batch["images"].astype(np.float64) - 1.0
    x0 = np.asarray(jax.random.normal(noise_key, x1.shape), np.float64)
    t = np.asarray(jax.random.uniform(time_key, (6,)), np.float64)
    dropped = np.asarray(jax.random.uniform(label_key, (6,))) < 0.5
    labels = np.where(dropped, model.null_label, batch["labels"])
    xt = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * x1
    live = eqx.filter_jit(
        eqx.combine(params, eqx.filter(model, eqx.is_inexact_array, inverse=True))
    )
    velocity = np.stack(
        [
            np.asarray(
                live(jnp.asarray(xt[i], jnp.float32), jnp.float32(t[i]), jnp.int32(labels[i]))
            )
            for i in range(6)
        ]
    )
    expected = np.mean((velocity - (x1 - x0)) ** 2)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    # The dropout mattered: with every label kept the loss differs.
    kept = eqx.filter_jit(DiffusionObjective(model, label_dropout=0.0).loss)(params, batch, key)[0]
    assert 0 < dropped.sum() < 6 and float(kept) != pytest.approx(float(loss), rel=1e-6)


def test_data_prediction_loss_is_the_mean_squared_error_of_the_clean_example():
    # A fresh DiT predicts exactly zero (adaLN-zero, a zeroed head): whatever the noise and
    # the times, its data-prediction loss is the mean of x1^2, and its velocity loss differs.
    batch = {
        "images": np.random.default_rng(1).uniform(size=(5, 16, 16, 3)).astype(np.float32),
        "labels": np.array([0, 1, 2, 0, 1], np.int32),
    }
    objective = DiffusionObjective(dit(), prediction="data")
    loss, _ = objective.loss(objective.init_params(), batch, jax.random.key(4))
    x1 = 2.0 * batch["images"].astype(np.float64) - 1.0
    assert float(loss) == pytest.approx(np.mean(x1**2), rel=1e-6)
    # The velocity loss of the same zeros is that of x1 - x0, the noise drawn from the key.
    x0 = np.asarray(jax.random.normal(jax.random.split(jax.random.key(4), 3)[0], x1.shape))
    velocity = DiffusionObjective(dit())
    velocity_loss = velocity.loss(velocity.init_params(), batch, jax.random.key(4))[0]
    assert float(velocity_loss) == pytest.approx(np.mean((x1 - x0) ** 2), rel=1e-5)


def constant_predictor(value: float, prediction: str) -> DiffusionObjective:
    """An objective whose DiT predicts `value` everywhere (its zeroed head's bias)."""
    model = dit()
    model = eqx.tree_at(lambda m: m.head.bias, model, jnp.full_like(model.head.bias, value))
    return DiffusionObjective(model, sampling=Sampling(steps=20), prediction=prediction)


def test_a_data_prediction_is_where_euler_lands():
    # A model that predicts the clean example c = 0.2 (pixel value 0.6) everywhere: every
    # Euler step moves toward c, and the last one, from t = 0.95, lands on it; the same
    # model read as a velocity only shifts the noise by c.
    batch = image_batch(rows=3)
    data = constant_predictor(0.2, "data")
    generated = data.evaluate(data.init_params(), batch, jax.random.key(0)).generated
    np.testing.assert_allclose(np.asarray(generated), 0.6, atol=1e-5)
    velocity = constant_predictor(0.2, "velocity")
    shifted = velocity.evaluate(velocity.init_params(), batch, jax.random.key(0)).generated
    assert float(np.std(np.asarray(shifted))) > 0.2


def test_label_dropout_rate():
    labels = jnp.zeros((20000,), jnp.int32)
    for rate in (0.0, 0.1, 0.3, 1.0):
        objective = DiffusionObjective(dit(), label_dropout=rate)
        dropped = objective.drop_labels(labels, jax.random.key(0)) == objective.model.null_label
        assert float(jnp.mean(dropped)) == pytest.approx(rate, abs=0.01)
        assert set(np.unique(objective.drop_labels(labels, jax.random.key(1)))) <= {0, 3}


# -- bad batches --------------------------------------------------------------------------

BAD_BATCHES = [
    (
        {"images": np.full((2, 16, 16, 3), 1.5, np.float32)},
        r"batch\['images'\] holds value 1.5 at row 0, y 0, x 0, channel 0; values must lie "
        r"in \[0, 1\]",
    ),
    (
        {
            "images": np.pad(
                np.zeros((2, 16, 16, 2), np.float32),
                ((0, 0),) * 3 + ((0, 1),),
                constant_values=-0.25,
            )
        },
        r"holds value -0.25 at row 0, y 0, x 0, channel 2",
    ),
    (
        {"images": np.zeros((2, 16, 16), np.float32)},
        r"shaped \(rows, height, width, channels\) = \(rows, 16, 16, 3\) for its model, got "
        r"shape \(2, 16, 16\)",
    ),
    (
        {"images": np.zeros((2, 8, 8, 3), np.float32)},
        r"got shape \(2, 8, 8, 3\)",
    ),
    (
        {"images": np.zeros((2, 16, 16, 3), np.uint8)},
        r"needs float values in \[0, 1\] in batch\['images'\], got dtype uint8",
    ),
    (
        {"images": np.zeros((2, 16, 16, 3), np.float32), "labels": np.array([0, 3], np.int32)},
        r"batch\['labels'\] holds label 3 at row 1; valid labels are 0 to 2 \(num_classes=3\)",
    ),
    (
        {"images": np.zeros((2, 16, 16, 3), np.float32), "labels": np.array([-1, 0], np.int32)},
        r"holds label -1 at row 0",
    ),
    (
        {"images": np.zeros((2, 16, 16, 3), np.float32), "labels": np.ones((2,), np.float32)},
        r"needs integer class labels in batch\['labels'\], got dtype float32",
    ),
    (
        {"images": np.zeros((2, 16, 16, 3), np.float32), "labels": np.zeros((3,), np.int32)},
        r"one label per row in batch\['labels'\], shaped \(2,\), got shape \(3,\)",
    ),
]


@pytest.mark.parametrize(("batch", "match"), BAD_BATCHES)
def test_bad_batches_raise_on_the_host(batch, match):
    objective = DiffusionObjective(dit())
    with pytest.raises(ValueError, match=match):
        objective.check_batch(batch)
    with pytest.raises(ValueError, match=match):
        objective.loss(objective.init_params(), batch, jax.random.key(0))
    with pytest.raises(ValueError, match=match):
        dew.evaluate(
            objective,
            objective.init_params(),
            [batch],
            metrics=[metrics.mse()],
            key=jax.random.key(0),
        )


def test_an_unconditional_models_samples_carry_no_labels():
    objective = DiffusionObjective(dit(num_classes=None), sampling=Sampling(steps=1))
    batch = {"images": image_batch(rows=2)["images"]}
    key = jax.random.key(0)
    assert objective.evaluate(objective.init_params(), batch, key).labels is None
    assert objective.preview(objective.init_params(), batch, key).labels is None


def test_labels_for_an_unconditional_model_raise():
    objective = DiffusionObjective(dit(num_classes=None))
    with pytest.raises(ValueError, match=r"got batch\['labels'\], but its DiT has no classes"):
        objective.check_batch(image_batch())


def test_a_clip_model_needs_clips():
    objective = DiffusionObjective(dit(num_classes=None, frames=4))
    with pytest.raises(KeyError, match=r"reads batch key 'clips' \(its DiT has frames\), but the"):
        objective.check_batch({"images": np.zeros((2, 16, 16, 3), np.float32)})
    with pytest.raises(ValueError, match=r"\(rows, frames, height, width, channels\)"):
        objective.check_batch({"clips": np.zeros((2, 16, 16, 3), np.float32)})


@pytest.mark.parametrize("index", [0, 1, 5])
def test_bad_values_under_jit_reach_the_user_as_value_errors(index):
    """Batches of JAX arrays are checked inside the compiled pass; its failure is translated
    back into the host check's ValueError, with no JAX traceback text."""
    batch, match = BAD_BATCHES[index]
    objective = DiffusionObjective(dit())
    device_batch = {name: jnp.asarray(value) for name, value in batch.items()}
    with pytest.raises(ValueError, match=match) as caught:
        dew.evaluate(
            objective,
            objective.init_params(),
            [device_batch],
            metrics=[metrics.mse()],
            key=jax.random.key(0),
        )
    assert "Equinox" not in str(caught.value) and "jax" not in str(caught.value).lower()


def test_bad_values_in_training_reach_the_user_as_value_errors():
    objective = DiffusionObjective(dit())
    bad = {name: jnp.asarray(value) for name, value in BAD_BATCHES[0][0].items()}
    data = Dataset(train=lambda partition: itertools.repeat(bad))
    trainer = dew.Trainer(objective, optax.adam(1e-3), jax.random.key(0))
    with pytest.raises(ValueError, match=BAD_BATCHES[0][1]):
        trainer.fit(data, steps=2, log_every=1, progress=False)


# -- keys and reproducibility -------------------------------------------------------------


def test_same_key_same_samples_and_the_preview_draws_apart():
    objective = DiffusionObjective(dit(), sampling=Sampling(steps=4, guidance=2.0))
    params = perturbed(objective.init_params())
    batch = image_batch(rows=6)
    key = jax.random.key(7)
    first = objective.evaluate(params, batch, key)
    assert isinstance(first, Images) and first.generated.shape == (6, 16, 16, 3)
    assert float(first.generated.min()) >= 0 and float(first.generated.max()) <= 1
    np.testing.assert_array_equal(first.reference, batch["images"])
    np.testing.assert_array_equal(first.generated, objective.evaluate(params, batch, key).generated)
    other = objective.evaluate(params, batch, jax.random.key(8)).generated
    assert not np.array_equal(first.generated, other)
    # A different seed domain draws different samples from the same key.
    reseeded = DiffusionObjective(
        objective.model, sampling=Sampling(steps=4, guidance=2.0, seed_domain=1)
    )
    assert not np.array_equal(first.generated, reseeded.evaluate(params, batch, key).generated)

    preview = objective.preview(params, batch, key)
    assert isinstance(preview, Images) and preview.generated.shape == (4, 16, 16, 3)
    np.testing.assert_array_equal(preview.reference, batch["images"][:4])
    # Each sample carries the label it was conditioned on, for a preview to name.
    np.testing.assert_array_equal(first.labels, batch["labels"])
    np.testing.assert_array_equal(preview.labels, batch["labels"][:4])
    np.testing.assert_array_equal(
        preview.generated, objective.preview(params, batch, key).generated
    )
    # The preview never shares the scored samples' draw, even from the same key.
    assert not np.allclose(preview.generated, first.generated[:4])
    small = objective.preview(params, image_batch(rows=2), key)
    assert small.generated.shape == (2, 16, 16, 3)


def test_guidance_mixes_the_conditional_and_null_velocities():
    model = dit()
    params = perturbed(DiffusionObjective(model).init_params())
    batch = image_batch(rows=3)
    key = jax.random.key(2)

    def generated(guidance):
        objective = DiffusionObjective(model, sampling=Sampling(steps=1, guidance=guidance))
        return np.asarray(objective.evaluate(params, batch, key).generated)

    # One Euler step from the same noise is linear in the velocity: x = x0 + v(x0, 0), so
    # where no clip bites, the sample at w lies on the line through w = 0 and w = 1.
    zero, one, two = generated(0.0), generated(1.0), generated(2.0)
    inside = (zero > 0) & (zero < 1) & (one > 0) & (one < 1) & (two > 0) & (two < 1)
    assert inside.mean() > 0.2
    np.testing.assert_allclose(two[inside], (2 * one - zero)[inside], atol=1e-5)
    assert not np.allclose(zero, one)


def test_the_registry_builds_it():
    objective = objectives["diffusion"](dit(), sampling=Sampling(steps=2))
    assert isinstance(objective, DiffusionObjective) and objective.name == "diffusion"
    assert objective.default_metrics() == ()
    # A JSON configuration writes the protocol as a mapping.
    built = objectives["diffusion"](dit(), sampling={"solver": "heun", "steps": 3}, ema_decay=0.9)
    assert built.sampling == Sampling(solver="heun", steps=3) and built.ema_decay == 0.9
    with pytest.raises(ValueError, match="solver must be one of"):
        objectives["diffusion"](dit(), sampling={"solver": "rk4"})


# -- learning -----------------------------------------------------------------------------


def fit(objective, data, steps, *, learning_rate=1e-3, **kwargs):
    trainer = dew.Trainer(objective, optax.adam(learning_rate), jax.random.key(0))
    return trainer.fit(data, steps=steps, log_every=10, progress=False, **kwargs)


@pytest.mark.slow  # about 12 s: 300 steps; CI runs it with the slow tests
def test_loss_falls_on_shapes():
    """The research note's CI size: width 32, depth 1, batch 32, 300 steps."""
    data = shapes(batch_size=32, seed=0)
    objective = DiffusionObjective(dit(), sampling=Sampling(steps=8))
    start = objective.loss(
        objective.init_params(), next(data.train(Partition())), jax.random.key(0)
    )[0]
    state = fit(objective, data, 300)
    losses = [value for _, value in state.metric_history["diffusion/train/loss"]]
    assert float(start) > 1.5
    assert np.mean(losses[-5:]) < 0.6 * float(start)


def constant_colour(colour, rows=32):
    images = np.broadcast_to(np.asarray(colour, np.float32), (rows, 16, 16, 3)).copy()
    batch = {"images": images}
    return Dataset(
        train=lambda partition: itertools.repeat(batch),
        val=lambda partition: iter([batch]),
        batch=rows,
    )


@pytest.mark.slow  # about 12 s: 300 steps at width 64; CI runs it with the slow tests
def test_samples_of_a_constant_colour_land_near_it():
    """Width 64 (more than a patch's 48 values, so the velocity c - x0 is representable):
    300 steps bring the samples' mean within 0.03 of the colour."""
    colour = (0.8, 0.3, 0.1)
    objective = DiffusionObjective(
        dit(num_classes=None, width=64), sampling=Sampling(solver="heun", steps=10)
    )
    data = constant_colour(colour)
    state = fit(objective, data, 300, learning_rate=3e-3)
    samples = objective.evaluate(state.params, next(data.val(None)), jax.random.key(5)).generated
    np.testing.assert_allclose(np.mean(samples, axis=(0, 1, 2)), colour, atol=0.03)
    assert float(np.mean(np.abs(np.asarray(samples) - np.asarray(colour)))) < 0.08


@pytest.mark.slow  # about 5 s; CI runs it with the slow tests
def test_clips_go_through_the_same_code_path():
    data = moving_shapes(batch_size=8, seed=0)
    objective = DiffusionObjective(dit(frames=4), sampling=Sampling(steps=2))
    batch = next(data.train(Partition()))
    state = fit(objective, data, 20)
    assert np.isfinite(state.metric_history["diffusion/train/loss"][-1][1])
    clips = objective.evaluate(state.params, batch, jax.random.key(0))
    assert isinstance(clips, Clips) and clips.generated.shape == (8, 4, 16, 16, 3)
    np.testing.assert_array_equal(clips.reference, batch["clips"])
    preview = objective.preview(state.params, batch, jax.random.key(0))
    assert isinstance(preview, Clips) and preview.generated.shape == (4, 4, 16, 16, 3)
    np.testing.assert_array_equal(preview.labels, batch["labels"][:4])


@pytest.mark.slow  # about 20 s: two fits with previews; CI runs it with the slow tests
def test_a_tracker_and_previews_change_no_draw():
    objective = DiffusionObjective(dit(), sampling=Sampling(steps=2), ema_decay=0.5)
    data = constant_colour((0.8, 0.3, 0.1), rows=4)

    def run(**kwargs):
        trainer = dew.Trainer(objective, optax.adam(1e-2), jax.random.key(0))
        return trainer.fit(
            data,
            steps=4,
            log_every=2,
            eval_every=2,
            metrics=[metrics.mse()],
            progress=False,
            **kwargs,
        )

    alone = run()
    tracker = InMemoryTracker()
    watched = run(tracker=tracker, preview=True)
    assert [step for step, _ in tracker.artifacts["diffusion/validation/samples"]] == [2, 4]
    for got, want in zip(
        jax.tree.leaves((watched.params, watched.ema_params)),
        jax.tree.leaves((alone.params, alone.ema_params)),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)
    tag = "diffusion/validation/mse"
    assert watched.metric_history[tag] == alone.metric_history[tag]
    # Without preview=True a tracker gets no samples.
    quiet = InMemoryTracker()
    run(tracker=quiet)
    assert "diffusion/validation/samples" not in quiet.artifacts


# -- EMA ----------------------------------------------------------------------------------


@pytest.mark.slow  # about 7 s; CI runs it with the slow tests
def test_the_trainer_keeps_ema_params_by_the_formula():
    decay = 0.9
    objective = DiffusionObjective(dit(), sampling=Sampling(steps=2), ema_decay=decay)
    data = constant_colour((0.5, 0.5, 0.5), rows=4)
    trainer = dew.Trainer(objective, optax.adam(1e-2), jax.random.key(0))
    state = None
    expected = objective.init_params()
    for step in range(1, 4):
        state = trainer.fit(data, steps=step, log_every=1, progress=False, state=state)
        expected = ema_update(expected, state.params, decay)
        for got, want in zip(
            jax.tree.leaves(state.ema_params), jax.tree.leaves(expected), strict=True
        ):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    pairs = zip(jax.tree.leaves(state.params), jax.tree.leaves(state.ema_params), strict=True)
    assert any(not np.allclose(live, average) for live, average in pairs)
    # Without a decay the state carries no EMA.
    plain = dew.Trainer(DiffusionObjective(dit()), optax.adam(1e-2), jax.random.key(0))
    assert plain.fit(data, steps=1, log_every=1, progress=False).ema_params is None


@pytest.mark.slow  # about 20 s: fused, unfused and resumed fits
def test_ema_is_the_same_fused_and_across_a_resume(tmp_path):
    objective = DiffusionObjective(dit(), sampling=Sampling(steps=2), ema_decay=0.8)
    data = constant_colour((0.5, 0.5, 0.5), rows=4)

    def run(steps, **kwargs):
        trainer = dew.Trainer(objective, optax.adam(1e-2), jax.random.key(0), **kwargs)
        return trainer.fit(data, steps=steps, log_every=2, progress=False)

    reference = run(4)
    fused = dew.Trainer(objective, optax.adam(1e-2), jax.random.key(0)).fit(
        data, steps=4, log_every=2, progress=False, steps_per_call=2
    )
    run(2, checkpoint_dir=tmp_path / "checkpoints")
    resumed = run(4, checkpoint_dir=tmp_path / "checkpoints")
    for state in (fused, resumed):
        for got, want in zip(
            jax.tree.leaves(state.ema_params), jax.tree.leaves(reference.ema_params), strict=True
        ):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_state_without_ema_params_is_refused():
    objective = DiffusionObjective(dit(), ema_decay=0.9)
    data = constant_colour((0.5, 0.5, 0.5), rows=4)
    state = TrainState.create(objective, optax.adam(1e-2), key=jax.random.key(0))
    trainer = dew.Trainer(objective, optax.adam(1e-2), jax.random.key(0))
    with pytest.raises(ValueError, match=r"ema_decay=0.9\), but the state has none"):
        trainer.fit(data, steps=1, log_every=1, progress=False, state=state)


@pytest.mark.slow  # about 5 s; CI runs it with the slow tests
def test_validation_generates_with_the_ema_params():
    objective = DiffusionObjective(dit(), sampling=Sampling(steps=2), ema_decay=0.5)
    data = constant_colour((0.8, 0.3, 0.1), rows=4)
    tracker = InMemoryTracker()
    trainer = dew.Trainer(objective, optax.adam(1e-2), jax.random.key(0))
    state = trainer.fit(
        data,
        steps=5,
        log_every=5,
        eval_every=5,
        metrics=[metrics.mse()],
        tracker=tracker,
        preview=True,
        progress=False,
    )
    batch = next(data.val(None))
    event_key = evaluation_key(jax.random.key(0), 5)
    scored = state.metric_history["diffusion/validation/mse"][-1][1]

    def mse(params):
        return dew.evaluate(
            objective, params, [batch], metrics=[metrics.mse()], key=event_key
        ).scores["mse"]

    assert scored == mse(state.ema_params)
    assert scored != mse(state.params)
    _, shown = tracker.artifacts["diffusion/validation/samples"][0]
    shown = shown.artifact  # the fit logs a dew.tracking.Preview: the artifact and its names
    key = preview_key(event_key)
    expected = objective.preview(state.ema_params, batch, key).generated
    np.testing.assert_array_equal(shown.generated, expected)
    live = objective.preview(state.params, batch, key).generated
    assert not np.array_equal(shown.generated, live)


# -- the sampling-protocol record ---------------------------------------------------------


def _mean_colour(images):
    """A stand-in feature network for FID: each image's mean colour."""
    return jnp.mean(images, axis=(1, 2))


@pytest.mark.slow  # about 5 s; CI runs it with the slow tests
def test_a_fit_journals_its_sampling_protocol(tmp_path):
    objective = DiffusionObjective(dit(), sampling=Sampling(solver="heun", steps=3, guidance=1.5))
    images = np.random.default_rng(0).random((5, 16, 16, 3), dtype=np.float32)
    labelled = {"images": images, "labels": np.array([2, 0, 1, 1, 0], np.int32)}
    second = {"images": images[:3], "labels": np.array([1, 2, 2], np.int32)}
    data = Dataset(
        train=lambda partition: itertools.repeat(labelled),
        val=lambda partition: iter([labelled, second]),
    )
    weights = tmp_path / "mean_colour.bin"
    weights.write_bytes(b"the stand-in's weights")
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    definition = metrics.FeatureDefinition("mean colour", "none", digest)
    fid = FID(network=_mean_colour, definition=definition)
    folder = tmp_path / "tracking"
    with LocalTracker(folder) as tracker:
        trainer = dew.Trainer(objective, optax.adam(1e-3), jax.random.key(0))
        trainer.fit(
            data,
            steps=4,
            log_every=2,
            eval_every=2,
            metrics=[metrics.mse(), fid],
            tracker=tracker,
            progress=False,
        )
    found = [
        (step, record)
        for name, step, record in read_journal(folder).records
        if name == "sampling_protocol"
    ]
    assert [step for step, _ in found] == [0, 2, 4]
    common = {
        "objective": "diffusion",
        "solver": "heun",
        "steps": 3,
        "guidance": 1.5,
        "seed_domain": 0,
        "conditioning": "class_labels",
        # the feature definition of the score that reads the samples through a network
        "features": {
            "fid": {
                "network": "mean colour",
                "preprocessing": "none",
                "weights_sha256": digest,
                "reference": "pooled",
            }
        },
    }
    assert found[0][1] == SamplingProtocol(**common)
    # every generated row's label, in pass order, as little-endian int64
    labels = np.concatenate([labelled["labels"], second["labels"]]).astype("<i8")
    conditioned = hashlib.sha256(labels.tobytes()).hexdigest()
    for step, record in found[1:]:
        event_key = key_text(evaluation_key(jax.random.key(0), step))
        assert record == SamplingProtocol(
            **common,
            generated_rows=8,
            real_rows=8,
            event_key=event_key,
            conditioning_sha256=conditioned,
        )


def test_no_evaluation_reports_only_the_fit_protocol():
    objective = DiffusionObjective(dit(num_classes=None), sampling=Sampling(steps=2))
    tracker = InMemoryTracker()
    trainer = dew.Trainer(objective, optax.adam(1e-3), jax.random.key(0))
    trainer.fit(
        constant_colour((0.5, 0.5, 0.5), rows=4),
        steps=2,
        log_every=1,
        tracker=tracker,
        progress=False,
    )
    ((step, record),) = tracker.artifacts["sampling_protocol"]
    assert step == 0 and record.conditioning == "unconditional"
    assert (record.generated_rows, record.real_rows) == (0, 0)
    assert record.conditioning_sha256 is None and record.features == {}
