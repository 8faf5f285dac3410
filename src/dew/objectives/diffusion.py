"""Image and video diffusion by rectified flow (flow matching) with a DiT that predicts the
velocity or the clean example."""

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

from dew._domains import PREVIEW_DOMAIN, derive
from dew._integers import check_integer
from dew._shape_drawing import SHAPE_KINDS
from dew.artifacts import Clips, Images
from dew.metrics import Metric, fid, shape_scores
from dew.naming import Split
from dew.nn.backbones.dit import DiT
from dew.nn.inception import missing_weights
from dew.objectives._images import checked_labels, checked_pixels
from dew.objectives.base import Batch, Objective, check_batch_keys, combine, trainable
from dew.telemetry.records import SamplingProtocol

__all__ = [
    "DATA_PREDICTION_FLOOR",
    "PREDICTIONS",
    "SOLVERS",
    "DiffusionObjective",
    "Sampling",
    "sample_flow",
]

SOLVERS = ("euler", "heun")
PREDICTIONS = ("velocity", "data")
DATA_PREDICTION_FLOOR = 0.05
"""The least `1 - t` a data prediction's velocity `(x1_hat - x) / (1 - t)` divides by."""
PREVIEW_ROWS = 4
Velocity = Callable[
    [Float[Array, " rows *example"], Float[Array, ""]], Float[Array, " rows *example"]
]


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How a `DiffusionObjective` generates: its sampling protocol.

    - `solver`: `"euler"` (first order, one velocity call a step) or `"heun"` (second
      order, two calls a step; the last step's corrector reads the velocity at `t = 1`).
    - `steps`: the number of uniform time steps from noise (`t = 0`) to data (`t = 1`).
    - `guidance`: the classifier-free guidance scale `w`, a finite number `>= 0`:
      `v = v_null + w * (v_cond - v_null)`; `1` is the plain conditional velocity (one
      model call), `0` the unconditional one. An unconditional model ignores it.
    - `seed_domain`: an integer in `[0, 2**32)` folded into every key a generation draws
      its noise from, so two protocols with different `seed_domain`s draw different
      samples from the same event.
    """

    solver: str = "euler"
    steps: int = 20
    guidance: float = 1.0
    seed_domain: int = 0

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise ValueError(f"Sampling.solver must be one of {SOLVERS}, got {self.solver!r}.")
        check_integer("Sampling.steps", self.steps, minimum=1)
        check_integer("Sampling.seed_domain", self.seed_domain, minimum=0, maximum=2**32 - 1)
        guidance = self.guidance
        if (
            isinstance(guidance, bool)
            or not isinstance(guidance, numbers.Real)
            or not math.isfinite(guidance)
            or guidance < 0
        ):
            raise ValueError(f"Sampling.guidance must be a finite number >= 0, got {guidance!r}.")


def sample_flow(
    velocity: Velocity,
    noise: Float[Array, " rows *example"],
    *,
    solver: str = "euler",
    steps: int,
) -> Float[Array, " rows *example"]:
    """Integrate the flow ODE `dx/dt = velocity(x, t)` from `noise` at `t = 0` to `t = 1`
    in `steps` uniform steps of `dt = 1 / steps`.

    `"euler"`: `x <- x + dt * v(x, t)`. `"heun"`: the explicit trapezoidal rule,
    `x' = x + dt * v(x, t)`, then `x <- x + dt / 2 * (v(x, t) + v(x', t + dt))`.
    `velocity` reads a batch of rows and one scalar time.

    ```python
    >>> import jax.numpy as jnp
    >>> drift = lambda x, t: jnp.ones_like(x)  # the straight path x0 -> x0 + 1
    >>> sample_flow(drift, jnp.zeros((2, 3)), steps=4).tolist()
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]

    ```
    """
    if solver not in SOLVERS:
        raise ValueError(f"sample_flow's solver must be one of {SOLVERS}, got {solver!r}.")
    check_integer("sample_flow's steps", steps, minimum=1)
    dt = 1.0 / steps

    def euler(index: Int[Array, ""], x: Array) -> Array:
        t = index.astype(jnp.float32) * dt
        return x + dt * velocity(x, t)

    def heun(index: Int[Array, ""], x: Array) -> Array:
        t = index.astype(jnp.float32) * dt
        slope = velocity(x, t)
        predicted = x + dt * slope
        return x + 0.5 * dt * (slope + velocity(predicted, t + dt))

    body = euler if solver == "euler" else heun
    return jax.lax.fori_loop(0, steps, body, jnp.asarray(noise, jnp.float32))


class DiffusionObjective(Objective):
    """Rectified flow (flow matching) over images or clips with a `DiT` model.

    The batch holds float images `(rows, H, W, C)` under `"images"` (a `DiT` without
    `frames`) or clips `(rows, frames, H, W, C)` under `"clips"` (with `frames`), values
    in `[0, 1]`, and optionally integer class `"labels"` `(rows,)` in
    `[0, num_classes)` for a class-conditional `DiT`.

    Convention: data `x1 = 2 * image - 1` (in `[-1, 1]`), noise `x0 ~ N(0, I)`, time
    `t ~ U(0, 1)` drawn per row, the straight path `x_t = (1 - t) * x0 + t * x1` and its
    velocity `x1 - x0`. `t = 0` is noise and `t = 1` data. What the model predicts at
    `(x_t, t)` is `prediction`:

    - `"velocity"` (the default): the velocity `x1 - x0`; the loss is its mean squared
      error over every value of the batch, and the sampler integrates it as it is.
    - `"data"`: the clean example `x1` itself; the loss is the mean squared error of that
      prediction `x1_hat` (the velocity loss weighted by `(1 - t)^2`), and the sampler
      integrates the velocity it implies, `(x1_hat - x_t) / max(1 - t,
      DATA_PREDICTION_FLOOR)`, so an Euler step that ends at `t = 1` lands on the last
      `x1_hat`. A clean example lies near a few directions of its space where the noise
      fills every one: a small model predicts it far better than the noise in a velocity
      (Li and He, 2025, "Back to Basics: Let Denoising Generative Models Denoise"), and
      its samples come out whole rather than as speckled fragments (decision 0042).
      Guidance mixes the conditional and null predictions as it mixes velocities.

    Each
    row's label is replaced by the null label with probability `label_dropout`, so one
    model learns the conditional and the unconditional velocity (classifier-free
    guidance); a conditional model given no labels trains and generates unconditionally.
    No auxiliary metrics.

    `evaluate` generates one image (or clip) per row of the batch, conditioned on that
    row's label, by integrating the velocity from noise with `sampling` (`sample_flow`,
    classifier-free guidance at `sampling.guidance`); it returns
    `Images(generated, reference=batch rows, labels=their labels)` (or `Clips`; no labels
    for an unconditional model), generated values mapped back
    by `(x + 1) / 2` and clipped to `[0, 1]`. Its noise comes from the scoring key folded
    with `sampling.seed_domain`, so the same event gives the same samples. `preview` draws
    at most four samples (the first rows' labels) from the key folded with the preview
    domain first, so display samples never share a draw with scored ones.

    Weights: with `ema_decay`, the `Trainer` keeps an exponential moving average of the
    params (`ema_decay * ema + (1 - ema_decay) * params` after every step) and both
    `evaluate` and `preview` generate with those EMA weights; without it, with the live
    params.

    Scores: `default_metrics()` gives FID where its weights are installed, and with
    `shape_scores=True` (a class-conditional model of dew's shapes: `shapes` images or
    `moving_shapes` clips) `dew.metrics.shape_scores`: the share of samples a shapes
    classifier finds the conditioned kind in, and their foreground statistics beside the
    real rows'. The artifact `evaluate` returns carries the conditioning labels.

    ```python
    >>> import equinox as eqx, jax, jax.numpy as jnp
    >>> model = DiT(16, 4, 3, width=32, depth=1, heads=2, num_classes=3, key=jax.random.key(0))
    >>> objective = DiffusionObjective(model, sampling=Sampling(steps=4))
    >>> batch = {"images": jnp.full((2, 16, 16, 3), 0.5), "labels": jnp.array([0, 2])}
    >>> params = objective.init_params()
    >>> loss, aux = eqx.filter_jit(objective.loss)(params, batch, jax.random.key(0))
    >>> bool(jnp.isfinite(loss)), aux
    (True, {})
    >>> eqx.filter_jit(objective.evaluate)(params, batch, jax.random.key(1)).generated.shape
    (2, 16, 16, 3)

    ```
    """

    model: DiT
    sampling: Sampling = eqx.field(static=True, default=Sampling())
    label_dropout: float = eqx.field(static=True, default=0.1)
    ema_decay: float | None = eqx.field(static=True, default=None)
    shape_scores: bool = eqx.field(static=True, default=False)
    prediction: str = eqx.field(static=True, default="velocity")
    name: str = eqx.field(static=True, default="diffusion")

    def __check_init__(self) -> None:
        if not isinstance(self.model, DiT):
            raise ValueError(
                f"DiffusionObjective needs a DiT velocity model, got {type(self.model).__name__}."
            )
        if not isinstance(self.sampling, Sampling):
            raise ValueError(
                "DiffusionObjective.sampling must be a dew.objectives.diffusion.Sampling, got "
                f"{type(self.sampling).__name__}."
            )
        dropout = self.label_dropout
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, numbers.Real)
            or not 0 <= dropout <= 1
        ):
            raise ValueError(
                f"DiffusionObjective.label_dropout must be a number in [0, 1], got {dropout!r}."
            )
        decay = self.ema_decay
        if decay is not None and (
            isinstance(decay, bool) or not isinstance(decay, numbers.Real) or not 0 <= decay < 1
        ):
            raise ValueError(
                f"DiffusionObjective.ema_decay must be None or a number in [0, 1), got {decay!r}."
            )
        if self.prediction not in PREDICTIONS:
            raise ValueError(
                f"DiffusionObjective.prediction must be one of {PREDICTIONS}, got "
                f"{self.prediction!r}."
            )
        if not isinstance(self.shape_scores, bool):
            raise ValueError(
                f"DiffusionObjective.shape_scores must be True or False, got {self.shape_scores!r}."
            )
        model = self.model
        if self.shape_scores and (model.num_classes != len(SHAPE_KINDS) or model.channels != 3):
            raise ValueError(
                "DiffusionObjective.shape_scores scores samples of the shape kinds "
                f"({', '.join(SHAPE_KINDS)}): it needs a class-conditional RGB DiT with "
                f"num_classes={len(SHAPE_KINDS)} and channels=3, got num_classes="
                f"{model.num_classes} and channels={model.channels}."
            )

    @property
    def field(self) -> str:
        """The batch field this objective reads: `"images"`, or `"clips"` for a clip model."""
        return "images" if self.model.frames is None else "clips"

    @property
    def conditional(self) -> bool:
        """Whether the model takes class labels."""
        return self.model.num_classes is not None

    def init_params(self) -> PyTree:
        return trainable(self.model)

    def _data(self, batch: Batch) -> Array:
        check_batch_keys(self, batch, Split.TRAIN)
        return checked_pixels("DiffusionObjective", batch, self.field, self.model.input_shape)

    def _labels(self, batch: Batch, rows: int) -> Array | None:
        """The batch's labels, checked; `None` when it has none."""
        if "labels" not in batch:
            return None
        if not self.conditional:
            raise ValueError(
                "DiffusionObjective got batch['labels'], but its DiT has no classes "
                "(num_classes=None); drop the labels or build the DiT with num_classes."
            )
        return checked_labels(
            "DiffusionObjective", batch["labels"], rows, self.model.num_classes, "num_classes"
        )

    def _checked(self, batch: Batch) -> tuple[Array, Array | None]:
        data = self._data(batch)
        return data, self._labels(batch, data.shape[0])

    def batch_keys(self, split: Split) -> dict[str, str | None]:
        frames = "its DiT has no frames" if self.model.frames is None else "its DiT has frames"
        return {self.field: frames}

    def check_batch(self, batch: Batch) -> None:
        self._checked(batch)

    def drop_labels(self, labels: Int[Array, " rows"], key: PRNGKeyArray) -> Int[Array, " rows"]:
        """`labels` with each replaced by the null label with probability `label_dropout`."""
        dropped = jax.random.uniform(key, labels.shape) < self.label_dropout
        return jnp.where(dropped, jnp.full_like(labels, self.model.null_label), labels)

    def _predict(
        self,
        model: DiT,
        x: Float[Array, " rows *example"],
        t: Float[Array, " rows"],
        labels: Int[Array, " rows"] | None,
    ) -> Float[Array, " rows *example"]:
        if labels is None:
            return jax.vmap(lambda x, t: model(x, t))(x, t)
        return jax.vmap(model)(x, t, labels)

    def loss(
        self, params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        data, labels = self._checked(batch)
        noise_key, time_key, label_key = jax.random.split(key, 3)
        x1 = 2.0 * data - 1.0
        x0 = jax.random.normal(noise_key, x1.shape)
        t = jax.random.uniform(time_key, (x1.shape[0],))
        tb = t.reshape((-1,) + (1,) * (x1.ndim - 1))
        xt = (1.0 - tb) * x0 + tb * x1
        if labels is not None:
            labels = self.drop_labels(labels, label_key)
        predicted = self._predict(combine(params, self.model), xt, t, labels)
        target = x1 - x0 if self.prediction == "velocity" else x1
        return jnp.mean((predicted - target) ** 2), {}

    def sample(
        self,
        params: PyTree,
        labels: Int[Array, " rows"] | None,
        key: PRNGKeyArray,
        *,
        rows: int | None = None,
    ) -> Float[Array, " rows *example"]:
        """Generate one example per label (or `rows` unconditional ones when `labels` is
        `None`), values in `[0, 1]`, with `sampling`'s protocol; the noise is drawn from
        `key` folded with `sampling.seed_domain`."""
        if labels is not None:
            rows = labels.shape[0]
        if rows is None:
            raise ValueError("DiffusionObjective.sample needs labels or a number of rows.")
        model = combine(params, self.model)
        key = derive(key, self.sampling.seed_domain)
        noise = jax.random.normal(key, (rows, *self.model.input_shape))
        guidance = self.sampling.guidance

        null = jnp.full((rows,), model.null_label, jnp.int32) if self.conditional else None

        def predicted(x: Array, t: Array) -> Array:
            times = jnp.full((rows,), t, jnp.float32)
            if labels is None:
                return self._predict(model, x, times, null)
            conditioned = self._predict(model, x, times, labels)
            if guidance == 1:
                return conditioned
            unconditioned = self._predict(model, x, times, null)
            return unconditioned + guidance * (conditioned - unconditioned)

        def velocity(x: Array, t: Array) -> Array:
            if self.prediction == "velocity":
                return predicted(x, t)
            return (predicted(x, t) - x) / jnp.maximum(1.0 - t, DATA_PREDICTION_FLOOR)

        x = sample_flow(velocity, noise, solver=self.sampling.solver, steps=self.sampling.steps)
        return jnp.clip((x + 1.0) / 2.0, 0.0, 1.0)

    def _artifact(self, generated: Array, reference: Array, labels: Array | None) -> Images | Clips:
        if self.field == "images":
            return Images(generated, reference, labels=labels)
        return Clips(generated, reference, labels=labels)

    def evaluate(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> Images | Clips:
        """One generated example per batch row, conditioned on its label (the artifact's
        `labels`); the rows as references."""
        data, labels = self._checked(batch)
        return self._artifact(self.sample(params, labels, key, rows=data.shape[0]), data, labels)

    def sampling_record(
        self, real_rows: int, *, event_key: str | None, batch: Batch | None = None
    ) -> SamplingProtocol:
        """The sampling protocol of a generation from `real_rows` real rows (one sample
        each) under `event_key` (`dew.objectives.base.ReportsSampling`): conditioned on
        class labels when the model has classes and `batch` (if given) holds labels."""
        labelled = self.conditional and (batch is None or "labels" in batch)
        return SamplingProtocol(
            objective=self.name,
            solver=self.sampling.solver,
            steps=self.sampling.steps,
            guidance=float(self.sampling.guidance),
            seed_domain=self.sampling.seed_domain,
            conditioning="class_labels" if labelled else "unconditional",
            generated_rows=real_rows,
            real_rows=real_rows,
            event_key=event_key,
        )

    def conditioning_values(self, batch: Batch) -> Any:
        """The labels `evaluate` conditions each row's sample on: `batch["labels"]` for a
        class-conditional model, else `None` (`dew.objectives.base.ReportsSampling`)."""
        if not self.conditional or "labels" not in batch:
            return None
        return batch["labels"]

    def default_metrics(self) -> tuple[Metric, ...]:
        """`fid()` for an image model when pytorch-fid's weights are at
        `dew.nn.inception.default_weights_path()` (loaded here, once per call: ask once and
        keep the metrics; otherwise the reason is in `skipped_metrics()`), and with
        `shape_scores` the seven `dew.metrics.shape_scores` of the samples (their kind by the
        shapes classifier, trained once and cached, and their foreground statistics beside
        the real rows'), per frame for clips.

        Clips get no FID: it is defined for images (FVD is not built in). Paired metrics
        (PSNR, SSIM) mean nothing for unpaired generation, and no CLIP score: the built-in
        datasets (`shapes`, `moving_shapes`) hold class labels, not prompts.
        """
        metrics: tuple[Metric, ...] = ()
        if self.field == "images" and not self.skipped_metrics():
            metrics = (fid(),)
        if self.shape_scores:
            clips = self.field == "clips"
            metrics += shape_scores(image_size=self.model.image_size, clips=clips)
        return metrics

    def skipped_metrics(self) -> dict[str, str]:
        """`{"fid": "no weights at <path> (...)"}` for an image model without FID weights
        at the default place; `{}` otherwise (clips get no FID to skip)."""
        missing = missing_weights() if self.field == "images" else None
        return {} if missing is None else {"fid": missing}

    def generate_preview(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> Images | Clips:
        """At most four samples, conditioned on the first rows' labels, drawn from `key`
        folded with the preview domain; the same rows as references."""
        data, labels = self._checked(batch)
        rows = min(PREVIEW_ROWS, data.shape[0])
        labels = None if labels is None else labels[:rows]
        preview_key = derive(key, PREVIEW_DOMAIN)
        # Compiled once per objective structure: the Trainer previews outside any jit, where
        # the sampler's loop would otherwise be traced and compiled again at every event.
        generated = _compiled_sample(self, params, labels, preview_key, rows=rows)
        return self._artifact(generated, data[:rows], labels)


_compiled_sample = eqx.filter_jit(DiffusionObjective.sample)
