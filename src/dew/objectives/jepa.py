"""I-JEPA: predict an EMA target encoder's features of masked image blocks from the rest."""

import dataclasses
import numbers

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, PRNGKeyArray, PyTree

from dew._integers import check_integer
from dew.artifacts import Representations
from dew.metrics import Metric, knn_probe, linear_probe
from dew.naming import Split
from dew.nn.backbones.vit import ViT
from dew.objectives._images import checked_labels, checked_pixels
from dew.objectives.base import Batch, Objective, check_batch_keys, combine, trainable

__all__ = ["BlockMasks", "JEPANetworks", "JEPAObjective", "normalised_tokens"]


@dataclasses.dataclass(frozen=True)
class BlockMasks:
    """How `JEPAObjective` splits each image's patch grid into targets and context.

    - `targets`: the number of target blocks per image.
    - `height`, `width`: each block's size in patches; its top-left patch is uniform over
      the positions where the block fits, drawn per image and per block, so blocks may
      overlap. Every patch outside the blocks is context.

    The masks are boolean `(patches,)` arrays (fixed shapes whatever the draw), row by
    row over the grid, as `ViT` reads them.

    ```python
    >>> import jax
    >>> masks = BlockMasks(targets=1, height=2, width=2)
    >>> target = masks.sample(jax.random.key(0), (4, 4))
    >>> target.shape, int(target.sum())
    ((16,), 4)

    ```
    """

    targets: int = 2
    height: int = 2
    width: int = 2

    def __post_init__(self) -> None:
        for name in ("targets", "height", "width"):
            check_integer(f"BlockMasks.{name}", getattr(self, name), minimum=1)

    def check_grid(self, grid: tuple[int, int]) -> None:
        """Raise unless the blocks fit `grid` (rows, columns of patches) and can never
        cover all of it (some context is always left)."""
        rows, columns = grid
        if self.height > rows or self.width > columns:
            raise ValueError(
                f"BlockMasks blocks of {self.height}x{self.width} patches do not fit the "
                f"encoder's {rows}x{columns} patch grid."
            )
        if self.targets * self.height * self.width >= rows * columns:
            raise ValueError(
                f"BlockMasks(targets={self.targets}, height={self.height}, width={self.width}) "
                f"could cover all {rows * columns} patches of the {rows}x{columns} grid, leaving "
                "no context; use fewer or smaller blocks."
            )

    def sample(self, key: PRNGKeyArray, grid: tuple[int, int]) -> Bool[Array, " patches"]:
        """One image's target mask: true on the patches of its `targets` blocks."""
        rows, columns = grid
        y, x = jnp.meshgrid(jnp.arange(rows), jnp.arange(columns), indexing="ij")
        # one key a block, drawing its top row and left column together
        corners = jax.vmap(
            lambda k: jax.random.randint(
                k, (2,), 0, jnp.array([rows - self.height + 1, columns - self.width + 1])
            )
        )(jax.random.split(key, self.targets))
        top, left = corners[:, 0], corners[:, 1]
        inside = (
            (y[None] >= top[:, None, None])
            & (y[None] < top[:, None, None] + self.height)
            & (x[None] >= left[:, None, None])
            & (x[None] < left[:, None, None] + self.width)
        )
        return inside.any(axis=0).reshape(rows * columns)


def normalised_tokens(
    features: Float[Array, "*tokens width"], eps: float = 1e-6
) -> Float[Array, "*tokens width"]:
    """Each token's features standardised over its own feature axis (a layer norm without
    scale or shift), as I-JEPA normalises its targets."""
    mean = features.mean(axis=-1, keepdims=True)
    variance = features.var(axis=-1, keepdims=True)
    return (features - mean) * jax.lax.rsqrt(variance + eps)


class JEPANetworks(eqx.Module):
    """What a `JEPAObjective` trains: the context encoder, the predictor, the learned mask
    token (in the predictor's width) and, where the widths differ, the linear maps from
    the encoder's width into the predictor's and back."""

    encoder: ViT
    predictor: ViT
    mask_token: Float[Array, " predictor_width"]
    into_predictor: eqx.nn.Linear | None
    out_of_predictor: eqx.nn.Linear | None

    def predict(
        self, context_features: Float[Array, "patches width"], context: Bool[Array, " patches"]
    ) -> Float[Array, "patches width"]:
        """The predictor's features at every patch (read at the target slots) from the
        context encoder's output: context tokens mapped into the predictor's width, the
        mask token elsewhere, each with the predictor's position embedding."""
        tokens = context_features
        if self.into_predictor is not None:
            tokens = jax.vmap(self.into_predictor)(tokens)
        tokens = jnp.where(context[:, None], tokens, self.mask_token)
        predicted = self.predictor.encode_tokens(tokens + self.predictor.position_embedding)
        if self.out_of_predictor is not None:
            predicted = jax.vmap(self.out_of_predictor)(predicted)
        return predicted


class JEPAObjective(Objective):
    """I-JEPA: from the context patches of an image, predict a target encoder's features
    of its masked target blocks.

    **Arguments:**

    - `encoder`: a `ViT`, the context encoder trained by gradient; the target encoder is
      its exponential moving average.
    - `predictor`: a `ViT` on the same patch grid (its width, depth and heads are its
      own; its patch embedding stays unused: it reads tokens, see `ViT.encode_tokens`).
    - `ema_decay`: the target encoder's decay, a number in `[0, 1)`: the `Trainer` keeps
      `state.ema_params` (`dew.steps.ema_update` after every step) and the loss reads
      the target encoder from them (`ema_loss`). `None` makes the live encoder its own
      stop-gradient target.
    - `masks`: the `BlockMasks` drawn per image.
    - `probe_classes`: the number of classes of the batch labels; with it,
      `default_metrics()` are the batch linear and kNN probes (`dew.metrics.linear_probe`,
      `knn_probe`) and labels are checked to lie in `[0, probe_classes)`.
    - `key`: initialises the maps between the encoder's and the predictor's widths;
      needed only when those differ.

    The batch holds float images `(rows, H, W, C)` in `[0, 1]` under `"images"`, of the
    encoder's shape, and optionally integer class `"labels"` `(rows,)`.

    Loss, per image: target blocks drawn by `masks`, every other patch context. The
    context encoder sees only the context (target pixels are dropped and target tokens
    masked out of attention, so its output has exactly zero gradient with respect to
    target pixels); the predictor maps its output, plus the mask token at the target
    slots, to features there. The target is the target encoder's features of the full
    image, each token normalised (`normalised_tokens`), under stop-gradient; the loss
    is their mean squared error over the target tokens' features, averaged over rows.
    Auxiliary metric `target_feature_std`: the batch standard deviation of the mean-pooled
    target features, averaged over features (a collapse drives it to zero).

    `evaluate` returns `Representations(features, labels)`: each image's mean-pooled
    features from the encoder in `params` (the `Trainer` passes the EMA params, so the
    target encoder), with the batch's labels. There is no objective-specific preview: the
    base preview reuses the first scoring artifacts (a representation histogram, with no
    second encoder pass).

    ```python
    >>> import equinox as eqx, jax, jax.numpy as jnp
    >>> encoder = ViT(16, 4, 3, width=32, depth=1, heads=2, key=jax.random.key(0))
    >>> predictor = ViT(16, 4, 3, width=16, depth=1, heads=2, key=jax.random.key(1))
    >>> objective = JEPAObjective(encoder, predictor, key=jax.random.key(2))
    >>> params = objective.init_params()
    >>> batch = {"images": jax.random.uniform(jax.random.key(3), (4, 16, 16, 3))}
    >>> ema_loss = eqx.filter_jit(objective.ema_loss)
    >>> loss, aux = ema_loss(params, params, batch, jax.random.key(4))
    >>> bool(jnp.isfinite(loss)), sorted(aux)
    (True, ['target_feature_std'])
    >>> evaluate = eqx.filter_jit(objective.evaluate)
    >>> evaluate(params, batch, jax.random.key(5)).features.shape
    (4, 32)

    ```
    """

    networks: JEPANetworks
    ema_decay: float | None = eqx.field(static=True)
    masks: BlockMasks = eqx.field(static=True)
    probe_classes: int | None = eqx.field(static=True)
    name: str = eqx.field(static=True)

    def __init__(
        self,
        encoder: ViT,
        predictor: ViT,
        *,
        ema_decay: float | None = 0.996,
        masks: BlockMasks = BlockMasks(),
        probe_classes: int | None = None,
        key: PRNGKeyArray | None = None,
        name: str = "jepa",
    ):
        for role, model in (("encoder", encoder), ("predictor", predictor)):
            if not isinstance(model, ViT):
                raise ValueError(
                    f"JEPAObjective's {role} must be a dew ViT, got {type(model).__name__}."
                )
        if predictor.grid != encoder.grid:
            raise ValueError(
                f"JEPAObjective's predictor must work on the encoder's {encoder.grid} patch "
                f"grid, got {predictor.grid}."
            )
        if not isinstance(masks, BlockMasks):
            raise ValueError(
                "JEPAObjective.masks must be a dew.objectives.jepa.BlockMasks, got "
                f"{type(masks).__name__}."
            )
        masks.check_grid(encoder.grid)
        if ema_decay is not None and (
            isinstance(ema_decay, bool)
            or not isinstance(ema_decay, numbers.Real)
            or not 0 <= ema_decay < 1
        ):
            raise ValueError(
                f"JEPAObjective.ema_decay must be None or a number in [0, 1), got {ema_decay!r}."
            )
        probe_classes = check_integer(
            "JEPAObjective.probe_classes", probe_classes, minimum=2, optional=True
        )
        into = out = None
        if predictor.width != encoder.width:
            if key is None:
                raise ValueError(
                    f"JEPAObjective needs key= to initialise the maps between the encoder's "
                    f"width {encoder.width} and the predictor's width {predictor.width}."
                )
            into_key, out_key = jax.random.split(key)
            into = eqx.nn.Linear(encoder.width, predictor.width, key=into_key)
            out = eqx.nn.Linear(predictor.width, encoder.width, key=out_key)
        mask_token = jnp.zeros((predictor.width,), jnp.float32)
        self.networks = JEPANetworks(encoder, predictor, mask_token, into, out)
        self.ema_decay = None if ema_decay is None else float(ema_decay)
        self.masks = masks
        self.probe_classes = probe_classes
        self.name = name

    @property
    def encoder(self) -> ViT:
        """The context encoder (at its initial weights; trained ones are in `params`)."""
        return self.networks.encoder

    def init_params(self) -> PyTree:
        return trainable(self.networks)

    def _images(self, batch: Batch) -> Array:
        encoder = self.networks.encoder
        shape = (encoder.image_size, encoder.image_size, encoder.channels)
        check_batch_keys(self, batch, Split.TRAIN)
        return checked_pixels("JEPAObjective", batch, "images", shape)

    def _labels(self, batch: Batch, rows: int) -> Array | None:
        if "labels" not in batch:
            return None
        return checked_labels(
            "JEPAObjective", batch["labels"], rows, self.probe_classes, "probe_classes"
        )

    def batch_keys(self, split: Split) -> dict[str, str | None]:
        return {"images": None}

    def check_batch(self, batch: Batch) -> None:
        self._labels(batch, self._images(batch).shape[0])

    def ema_loss(
        self, params: PyTree, ema_params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        """The loss of the networks in `params` against the target encoder in `ema_params`
        (`dew.objectives.base.ReadsEMAParams`: `dew.steps.train_step` calls this with the
        state's EMA params when the objective has an `ema_decay`)."""
        images = self._images(batch)
        online = combine(params, self.networks)
        target_encoder = combine(jax.lax.stop_gradient(ema_params), self.networks).encoder
        grid = online.encoder.grid

        def one(image: Array, image_key: PRNGKeyArray) -> tuple[Array, Array]:
            target = self.masks.sample(image_key, grid)
            context = ~target
            predicted = online.predict(online.encoder(image, context), context)
            features = target_encoder(image)
            wanted = normalised_tokens(features)
            squared = jnp.where(target[:, None], (predicted - wanted) ** 2, 0.0)
            error = squared.sum() / (target.sum(dtype=jnp.float32) * wanted.shape[-1])
            return error, features.mean(axis=0)

        errors, pooled = jax.vmap(one)(images, jax.random.split(key, images.shape[0]))
        return errors.mean(), {"target_feature_std": pooled.std(axis=0).mean()}

    def loss(
        self, params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        """`ema_loss(params, params, batch, key)`: the live encoder as its own
        stop-gradient target (what a decay of zero gives)."""
        return self.ema_loss(params, params, batch, key)

    def representations(
        self, params: PyTree, images: Float[Array | np.ndarray, "rows height width channels"]
    ) -> Float[Array, "rows features"]:
        """Each image's mean-pooled features from the encoder in `params`."""
        encoder = combine(params, self.networks).encoder
        return jax.vmap(lambda image: encoder(image).mean(axis=0))(images)

    def evaluate(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> Representations:
        """Mean-pooled encoder features of every row, with the batch's labels."""
        del key
        images = self._images(batch)
        labels = self._labels(batch, images.shape[0])
        return Representations(self.representations(params, images), labels)

    def default_metrics(self) -> tuple[Metric, ...]:
        """The batch linear and kNN probes over `probe_classes` classes; none without it."""
        if self.probe_classes is None:
            return ()
        return (linear_probe(self.probe_classes), knn_probe(self.probe_classes))

    def generate_preview(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> None:
        """None: the preview is the first scoring artifact (a representation histogram)."""
        return None
