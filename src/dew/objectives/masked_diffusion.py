"""Absorbing-state masked diffusion over token rows (MDLM, Sahoo et al. 2024)."""

import numbers
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from dew._integers import check_integer
from dew.artifacts import TokenRows
from dew.metrics import Metric
from dew.naming import Split
from dew.nn.backbones.bidirectional_transformer import BidirectionalTransformer
from dew.objectives.base import (
    Batch,
    Objective,
    check_batch_keys,
    check_token_batch,
    check_token_ids,
    combine,
    token_log_probs,
    trainable,
)
from dew.telemetry.records import SamplingProtocol

__all__ = ["MaskedDiffusionObjective", "ancestral_sample", "masked_diffusion_nelbo"]


def masked_diffusion_nelbo(
    logits: Float[Array, "rows seq vocab"],
    tokens: Int[Array, "rows seq"],
    masked: Bool[Array, "rows seq"],
    t: Float[Array, " rows"],
) -> Float[Array, " rows"]:
    """The continuous-time masked-diffusion NELBO of each row at its time `t`, per token.

    With the linear schedule `alpha_t = 1 - t`, the weight `-alpha'_t / (1 - alpha_t)`
    is `1 / t`, so row `r` scores

        (1 / t_r) * sum over masked positions i of -log p_theta(x_i | z_t) / seq

    where `logits` are the denoiser's outputs on the noisy row `z_t`, `tokens` the clean
    row `x` and `masked` where `z_t` holds the mask token. Positions that are not masked
    carry zero weight: the reverse process copies them.

    ```python
    >>> import jax.numpy as jnp
    >>> logits = jnp.zeros((1, 2, 4))
    >>> tokens = jnp.array([[1, 2]], jnp.int32)
    >>> masked = jnp.array([[True, False]])
    >>> value = masked_diffusion_nelbo(logits, tokens, masked, jnp.array([0.5]))
    >>> round(float(value[0]), 4)  # (1 / 0.5) * log(4) / 2
    1.3863

    ```
    """
    nll = -token_log_probs(logits, tokens)
    masked_nll = jnp.where(masked, nll, jnp.zeros_like(nll))
    return jnp.sum(masked_nll, axis=-1) / t.astype(jnp.float32) / tokens.shape[-1]


def ancestral_sample(
    denoiser: Callable[[Int[Array, " seq"]], Float[Array, "seq vocab"]],
    key: PRNGKeyArray,
    *,
    rows: int,
    seq_len: int,
    steps: int,
    mask_id: int,
) -> Int[Array, "rows seq_len"]:
    """Generate `rows` token rows by `steps` ancestral steps of the absorbing reverse process.

    Every row starts fully masked at `t = 1`. A step goes from `s` to `t < s` on the
    uniform grid `1, 1 - 1/steps, ..., 0`: each still-masked position is unmasked with
    probability `(s - t) / s` (the linear schedule's reverse transition), its token drawn
    from the denoiser's categorical at that position; unmasked tokens never change. The
    last step (`t = 0`) unmasks every remaining position, so the result holds no `mask_id`.
    `denoiser` maps one sequence (which may hold `mask_id`) to logits over real tokens.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> uniform = lambda tokens: jnp.zeros((tokens.shape[0], 4))
    >>> rows = ancestral_sample(uniform, jax.random.key(0), rows=2, seq_len=5, steps=3,
    ...                         mask_id=4)
    >>> rows.shape, bool((rows < 4).all())
    ((2, 5), True)

    ```
    """
    denoise = jax.vmap(denoiser)
    start = jnp.full((rows, seq_len), mask_id, jnp.int32)
    step_keys = jax.random.split(key, steps)

    def step(index, tokens):
        unmask_key, token_key = jax.random.split(step_keys[index])
        # From s = (steps - index) / steps to t = s - 1 / steps: (s - t) / s = 1 / (steps - index).
        probability = 1.0 / (steps - index).astype(jnp.float32)
        reveal = jax.random.uniform(unmask_key, tokens.shape) < probability
        reveal = jnp.logical_or(reveal, index == steps - 1)
        drawn = jax.random.categorical(token_key, denoise(tokens), axis=-1).astype(jnp.int32)
        return jnp.where(jnp.logical_and(tokens == mask_id, reveal), drawn, tokens)

    return jax.lax.fori_loop(0, steps, step, start)


class MaskedDiffusionObjective(Objective):
    """Absorbing-state masked diffusion (MDLM) with the linear schedule `alpha_t = 1 - t`.

    The batch holds integer token rows under `"text"` (IDs in `[0, vocab_size)`, at least
    `seq_len` per row; the first `seq_len` are used). Training draws one time per row,
    `t ~ U(time_epsilon, 1)` (low-discrepancy: the rows' times are evenly spaced from one
    uniform offset), replaces each token by the model's mask ID independently with
    probability `t`, and has the bidirectional `model` predict the clean tokens. The loss
    is the continuous-time NELBO per token, averaged over rows:

        E_t[ (1 / t) * sum over masked positions i of -log p_theta(x_i | z_t) ] / seq_len

    (the weight `-alpha'_t / (1 - alpha_t)` is `1 / t`; see `masked_diffusion_nelbo`).
    Unmasked positions are copied by the reverse process and contribute nothing, and the
    model's outputs cover only real tokens, so the mask token gets zero probability.
    Auxiliary metric: `masked_fraction`, the fraction of positions masked in the batch.

    `evaluate` generates one batch's worth of `TokenRows` (as many rows as the batch, of
    `seq_len` tokens) with `sampling_steps` ancestral steps from all-masked rows
    (`ancestral_sample`), for custom text metrics. These are samples: not teacher-forced
    perplexity and not a held-out NELBO. `preview` draws `preview_count` rows the same way.
    Both generate with the live params (the objective declares no `ema_decay`). The
    `Trainer` reports how, as a `SamplingProtocol` (`sampling_record`): the `"ancestral"`
    solver, `sampling_steps` steps, no guidance, no seed domain (the scoring keys
    themselves), unconditional.

    ```python
    >>> import equinox as eqx, jax, jax.numpy as jnp
    >>> model = BidirectionalTransformer(vocab_size=4, emb_features=16, num_layers=1,
    ...                                  num_heads=2, mlp_features=32, max_seq_len=8,
    ...                                  key=jax.random.key(0))
    >>> objective = MaskedDiffusionObjective(model, seq_len=8, sampling_steps=4)
    >>> batch = {"text": jnp.tile(jnp.arange(8, dtype=jnp.int32) % 4, (4, 1))}
    >>> params = objective.init_params()
    >>> loss, aux = eqx.filter_jit(objective.loss)(params, batch, jax.random.key(0))
    >>> sorted(aux), bool(jnp.isfinite(loss))
    (['masked_fraction'], True)
    >>> evaluate = eqx.filter_jit(objective.evaluate)
    >>> evaluate(params, batch, jax.random.key(1)).tokens.shape
    (4, 8)

    ```
    """

    model: BidirectionalTransformer
    seq_len: int = eqx.field(static=True)
    sampling_steps: int = eqx.field(static=True, default=16)
    preview_count: int = eqx.field(static=True, default=4)
    time_epsilon: float = eqx.field(static=True, default=1e-3)
    name: str = eqx.field(static=True, default="masked_diffusion")

    def __check_init__(self) -> None:
        if not isinstance(self.model, BidirectionalTransformer):
            raise ValueError(
                "MaskedDiffusionObjective needs a BidirectionalTransformer denoiser (non-causal, "
                f"with a mask token), got {type(self.model).__name__}."
            )
        check_integer("MaskedDiffusionObjective.seq_len", self.seq_len, minimum=1)
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(
                "MaskedDiffusionObjective.seq_len must be between 1 and the model's max_seq_len "
                f"({self.model.max_seq_len}), got {self.seq_len}."
            )
        check_integer("MaskedDiffusionObjective.sampling_steps", self.sampling_steps, minimum=1)
        check_integer("MaskedDiffusionObjective.preview_count", self.preview_count, minimum=1)
        epsilon = self.time_epsilon
        if (
            isinstance(epsilon, bool)
            or not isinstance(epsilon, numbers.Real)
            or not 0 < epsilon < 1
        ):
            raise ValueError(
                "MaskedDiffusionObjective.time_epsilon must be a number strictly between 0 and 1, "
                f"got {epsilon!r}."
            )

    @property
    def mask_id(self) -> int:
        """The absorbing mask token's ID, the model's `vocab_size`."""
        return self.model.mask_id

    def init_params(self) -> PyTree:
        return trainable(self.model)

    def _tokens(self, batch: Batch) -> Array:
        tokens = check_token_batch(*self._text(batch), **self._token_limits())
        return tokens[:, : self.seq_len].astype(jnp.int32)

    def batch_tokens(self, batch: Batch) -> int:
        """The positions the model reads in `batch` (`CountsTokens`): `seq_len` a row."""
        return int(np.shape(batch["text"])[0]) * self.seq_len

    def _text(self, batch: Batch) -> tuple[str, str, Any]:
        check_batch_keys(self, batch, Split.TRAIN)
        return "MaskedDiffusionObjective", "text", batch["text"]

    def _token_limits(self) -> dict[str, int]:
        return {"vocab_size": self.model.vocab_size, "min_length": self.seq_len}

    def batch_keys(self, split: Split) -> dict[str, str | None]:
        return {"text": None}

    def check_batch(self, batch: Batch) -> None:
        # In NumPy for a host batch: nothing copied to a device before its compiled call.
        check_token_ids(*self._text(batch), **self._token_limits())

    def corrupt(
        self, tokens: Int[Array, "rows seq"], key: PRNGKeyArray
    ) -> tuple[Int[Array, "rows seq"], Bool[Array, "rows seq"], Float[Array, " rows"]]:
        """The forward process: `(noisy, masked, t)` for clean `tokens`.

        One time per row in `[time_epsilon, 1)`, evenly spaced from one uniform offset
        (low-discrepancy); each position masked independently with probability `t`.
        """
        rows = tokens.shape[0]
        time_key, mask_key = jax.random.split(key)
        offset = jax.random.uniform(time_key, ())
        spread = (offset + jnp.arange(rows, dtype=jnp.float32) / rows) % 1.0
        t = self.time_epsilon + (1.0 - self.time_epsilon) * spread
        masked = jax.random.uniform(mask_key, tokens.shape) < t[:, None]
        noisy = jnp.where(masked, jnp.full_like(tokens, self.mask_id), tokens)
        return noisy, masked, t

    def loss(
        self, params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        tokens = self._tokens(batch)
        noisy, masked, t = self.corrupt(tokens, key)
        logits = jax.vmap(combine(params, self.model))(noisy)
        nelbo = masked_diffusion_nelbo(logits, tokens, masked, t)
        return jnp.mean(nelbo), {"masked_fraction": jnp.mean(masked.astype(jnp.float32))}

    def sample(self, params: PyTree, rows: int, key: PRNGKeyArray) -> Int[Array, "rows seq_len"]:
        """`rows` generated rows of `seq_len` tokens (`ancestral_sample`)."""
        return ancestral_sample(
            combine(params, self.model),
            key,
            rows=rows,
            seq_len=self.seq_len,
            steps=self.sampling_steps,
            mask_id=self.mask_id,
        )

    def evaluate(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> TokenRows:
        """Generated rows, as many as the batch holds; every token is generated."""
        rows = self.sample(params, self._tokens(batch).shape[0], key)
        return TokenRows(rows, jnp.ones(rows.shape, jnp.bool_))

    def default_metrics(self) -> tuple[Metric, ...]:
        """None: no built-in metric reads generated `TokenRows`."""
        return ()

    def sampling_record(
        self, real_rows: int, *, event_key: str | None, batch: Batch | None = None
    ) -> SamplingProtocol:
        """The sampling protocol of a generation of one row for each of `real_rows` rows
        under `event_key` (`dew.objectives.base.ReportsSampling`): unconditional
        ancestral sampling, with no guidance and no seed domain."""
        return SamplingProtocol(
            objective=self.name,
            solver="ancestral",
            steps=self.sampling_steps,
            guidance=None,
            seed_domain=None,
            conditioning="unconditional",
            generated_rows=real_rows,
            real_rows=real_rows,
            event_key=event_key,
        )

    def conditioning_values(self, batch: Batch) -> None:
        """`None`: the rows are generated from all-masked rows, conditioned on nothing."""
        return None

    def generate_preview(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> TokenRows:
        """`preview_count` generated rows; the batch's contents are not used."""
        rows = self.sample(params, self.preview_count, key)
        return TokenRows(rows, jnp.ones(rows.shape, jnp.bool_))
