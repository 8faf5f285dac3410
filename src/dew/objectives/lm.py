"""Next-token language modelling with teacher forcing."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

from dew._integers import check_integer
from dew.artifacts import TokenRows, TokenScores
from dew.metrics import Metric, perplexity, token_accuracy
from dew.naming import Split
from dew.nn.backbones.causal_transformer import CausalTransformer
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
from dew.objectives.sampling import Generation as Generation
from dew.objectives.sampling import Samples as Samples
from dew.objectives.sampling import generate as generate

# `Samples`, `Generation` and `generate` stay importable from here (their home is
# `dew.objectives.sampling`), as the guides import them.
__all__ = ["LMObjective"]


class LMObjective(Objective):
    """Teacher-forced next-token prediction over rows of `seq_len + 1` token IDs.

    The model reads the first `seq_len` IDs of a row and predicts the last
    `seq_len`. The batch holds the rows under `"text"` (integer IDs in
    `[0, vocab_size)`), and optionally per-ID `"weights"` of the same shape; a
    target is ignored where its weight is zero or where it equals `pad_id`.
    `evaluate` returns teacher-forced `TokenScores`; `preview` samples
    continuations of prompt rows (`TokenRows`) as `samples` configures. Both read the
    live params (the objective declares no `ema_decay`).

    ```python
    >>> import equinox as eqx, jax, jax.numpy as jnp
    >>> model = CausalTransformer(vocab_size=4, emb_features=16, num_layers=1, num_heads=2,
    ...                           mlp_features=32, max_seq_len=16, key=jax.random.key(0))
    >>> objective = LMObjective(model, seq_len=8)
    >>> batch = {"text": jnp.tile(jnp.arange(9, dtype=jnp.int32) % 4, (2, 1))}
    >>> params = objective.init_params()
    >>> loss, aux = eqx.filter_jit(objective.loss)(params, batch, jax.random.key(0))
    >>> bool(jnp.isclose(loss, jnp.log(4.0), atol=0.3))
    True

    ```
    """

    model: CausalTransformer
    seq_len: int = eqx.field(static=True)
    samples: Samples = eqx.field(static=True, default=Samples())
    pad_id: int | None = eqx.field(static=True, default=None)
    name: str = eqx.field(static=True, default="lm")

    def __check_init__(self) -> None:
        check_integer("LMObjective.seq_len", self.seq_len, minimum=1)
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"LMObjective.seq_len must be between 1 and the model's max_seq_len "
                f"({self.model.max_seq_len}), got {self.seq_len}."
            )
        if self.prompt_len >= self.model.max_seq_len:
            raise ValueError(
                f"LMObjective previews need prompt_len < max_seq_len to leave room for a "
                f"continuation, got prompt_len {self.prompt_len} and max_seq_len "
                f"{self.model.max_seq_len}."
            )
        check_integer("LMObjective.pad_id", self.pad_id, minimum=0, optional=True)
        if self.pad_id is not None and not 0 <= self.pad_id < self.model.vocab_size:
            raise ValueError(
                f"LMObjective.pad_id must be a token ID in [0, {self.model.vocab_size}), "
                f"got {self.pad_id}."
            )

    @property
    def new_tokens(self) -> int:
        """How many tokens a preview generates: `samples.max_new_tokens`, capped so the
        prompt and its continuation fit the model's `max_seq_len`."""
        return min(self.samples.max_new_tokens, self.model.max_seq_len - self.prompt_len)

    @property
    def prompt_len(self) -> int:
        """How many leading IDs of a row a preview uses as its prompt."""
        if self.samples.prompt_len is None:
            return max(1, self.seq_len // 2)
        return min(self.samples.prompt_len, self.seq_len + 1)

    def init_params(self) -> PyTree:
        return trainable(self.model)

    def _tokens(self, batch: Batch) -> jax.Array:
        tokens = check_token_batch(*self._text(batch), **self._token_limits())
        return tokens[:, : self.seq_len + 1]

    def _text(self, batch: Batch) -> tuple[str, str, Any]:
        check_batch_keys(self, batch, Split.TRAIN)
        return "LMObjective", "text", batch["text"]

    def _token_limits(self) -> dict[str, int]:
        return {"vocab_size": self.model.vocab_size, "min_length": self.seq_len + 1}

    def batch_keys(self, split: Split) -> dict[str, str | None]:
        return {"text": None}

    def check_batch(self, batch: Batch) -> None:
        # In NumPy for a host batch: nothing copied to a device before its compiled call.
        check_token_ids(*self._text(batch), **self._token_limits())

    def scores(self, params: PyTree, batch: Batch) -> TokenScores:
        """Per-position losses, target weights and argmax correctness of one batch."""
        tokens = self._tokens(batch)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        # The whole batch in one call: the model's rows in one matrix (decision 0058).
        logits = combine(params, self.model)(inputs)
        losses = -token_log_probs(logits, targets)
        correct = jnp.argmax(logits, axis=-1) == targets
        return TokenScores(losses, self._weights(batch, targets), correct)

    def _weights(self, batch: Batch, targets: jax.Array) -> jax.Array:
        """Each target's weight: its `"weights"` entry (else 1), zero where it is `pad_id`."""
        if "weights" in batch:
            weights = jnp.asarray(batch["weights"], jnp.float32)[:, 1 : self.seq_len + 1]
        else:
            weights = jnp.ones(targets.shape, jnp.float32)
        if self.pad_id is not None:
            weights = jnp.where(targets == self.pad_id, jnp.zeros_like(weights), weights)
        return weights

    def batch_tokens(self, batch: Batch) -> int:
        """The positions the model reads in `batch` (`CountsTokens`): `seq_len` a row,
        padding included, whatever the row's length past `seq_len + 1`."""
        return int(np.shape(batch["text"])[0]) * self.seq_len

    def loss_weight(self, batch: Batch) -> Float[Array, ""]:
        """The batch's total target weight, the loss's denominator (`WeighsLoss`): a
        micro-batch with more targets weighs more in an accumulated step."""
        targets = jnp.asarray(batch["text"])[:, 1 : self.seq_len + 1]
        return jnp.sum(self._weights(batch, targets))

    def loss(
        self, params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        scores = self.scores(params, batch)
        total = jnp.sum(scores.weights)
        safe = jnp.maximum(total, jnp.ones_like(total))
        loss = jnp.sum(jnp.where(scores.weights != 0, scores.losses * scores.weights, 0.0)) / safe
        # `scores` always sets `correct` (an optional field of TokenScores in general).
        hits = jnp.where(scores.correct, scores.weights, 0.0)  # pyright: ignore[reportArgumentType]
        accuracy = jnp.sum(hits) / safe
        return loss, {"token_accuracy": accuracy}

    def evaluate(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> TokenScores:
        return self.scores(params, batch)

    def default_metrics(self) -> tuple[Metric, ...]:
        """Perplexity and token accuracy of the held-out text."""
        return (perplexity(), token_accuracy())

    def generate_preview(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> TokenRows:
        """Continue the first `samples.num_samples` rows' prompts by sampling."""
        tokens = self._tokens(batch)
        prompts = tokens[: self.samples.num_samples, : self.prompt_len]
        continuations = generate(
            combine(params, self.model),
            prompts,
            max_new_tokens=self.new_tokens,
            key=key,
            temperature=self.samples.temperature,
            top_k=self.samples.top_k,
            top_p=self.samples.top_p,
        )
        rows = jnp.concatenate([prompts.astype(jnp.int32), continuations.tokens], axis=1)
        generated = jnp.arange(rows.shape[1]) >= self.prompt_len
        return TokenRows(rows, jnp.broadcast_to(generated, rows.shape))
