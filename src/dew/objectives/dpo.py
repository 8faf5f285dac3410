"""Direct preference optimisation against a frozen reference model."""

import math
import numbers

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from dew._checks import MissingBatchKeyError, error_if
from dew._integers import check_integer
from dew.artifacts import TokenRows, TokenScores
from dew.metrics import Metric
from dew.naming import Split
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.base import (
    Batch,
    Objective,
    check_batch_keys,
    check_token_batch,
    combine,
    token_log_probs,
    trainable,
)
from dew.objectives.sampling import Samples as Samples
from dew.objectives.sampling import _sample_tokens

__all__ = ["DPOObjective"]  # `Samples`: its home is dew.objectives.sampling

_SIDES = ("chosen", "rejected")


class DPOObjective(Objective):
    """Direct preference optimisation (Rafailov et al., 2023) of a causal policy
    against a frozen reference model.

    **Arguments:**

    - `policy`: the model being trained; `init_params()` returns its trainable arrays.
    - `reference`: the frozen reference model. It is held in the objective, never in
      the params, and its log-probabilities are under `stop_gradient`.
    - `beta`: the strength of the implicit KL penalty, a finite real `> 0`.
    - `pad_id`: a token ID that never counts as a response target (`None`: none).
    - `samples`: how `preview` samples; `samples.prompt_len` must be `None`, since
      each preview prompt comes from the batch's prompt mask.

    **Batch:**

    - `"chosen"`, `"rejected"`: integer token IDs in `[0, vocab_size)`, both shaped
      `(rows, length)`: row `i` of each is the same prompt followed by the preferred
      and the dispreferred response (pad both sides to one `length`).
    - the prompt mask, boolean `(rows, length)`, true on prompt tokens: either one
      `"prompt_mask"` for both sides, or both `"chosen_prompt_mask"` and
      `"rejected_prompt_mask"` (never a mix).

    A position `t >= 1` is *counted* when its token is not a prompt token and not
    `pad_id`; `log pi(y|x)` sums `log p(token_t | tokens_<t)` over the counted
    positions of a row. Every row needs at least one counted position on each side.
    With `h = beta * ((log pi_w - log ref_w) - (log pi_l - log ref_l))` the loss is
    the row mean of `-log sigmoid(h)`, so it starts at `log 2` when the policy
    equals the reference.

    **Metrics:** `chosen_reward` and `rejected_reward` (row means of
    `beta * (log pi - log ref)`), `reward_margin` (their difference) and
    `reward_accuracy` (the fraction of rows whose chosen reward is strictly higher).

    `evaluate` returns the policy's teacher-forced `TokenScores` on the chosen rows
    (per-position NLL, weight 1 on counted positions), so perplexity and token
    accuracy read it. `preview` continues the first `samples.num_samples` chosen
    prompts (the leading run of prompt tokens of each row, at least one token)
    with the live policy params (no `ema_decay`: the reference is a frozen model, not
    an average of the policy), never the reference, and returns `TokenRows`
    whose mask marks the generated tokens. A continuation stops at
    `min(length + samples.max_new_tokens, max_seq_len)` tokens; positions after it
    hold `pad_id` (or 0).

    ```python
    >>> import jax, jax.numpy as jnp
    >>> model = CausalTransformer(vocab_size=4, emb_features=16, num_layers=1, num_heads=2,
    ...                           mlp_features=32, max_seq_len=8, key=jax.random.key(0))
    >>> objective = DPOObjective(model, model, beta=0.1)
    >>> batch = {"chosen": jnp.array([[1, 2, 3, 3]], jnp.int32),
    ...          "rejected": jnp.array([[1, 2, 0, 0]], jnp.int32),
    ...          "prompt_mask": jnp.array([[True, True, False, False]])}
    >>> loss, aux = objective.loss(objective.init_params(), batch, jax.random.key(0))
    >>> round(float(loss), 4), float(aux["reward_margin"])
    (0.6931, 0.0)

    ```
    """

    policy: CausalTransformer
    reference: CausalTransformer
    beta: float = eqx.field(static=True)
    pad_id: int | None = eqx.field(static=True, default=None)
    samples: Samples = eqx.field(static=True, default=Samples())
    name: str = eqx.field(static=True, default="dpo")

    def __check_init__(self) -> None:
        if (
            isinstance(self.beta, bool)
            or not isinstance(self.beta, numbers.Real)
            or not math.isfinite(self.beta)
            or self.beta <= 0
        ):
            raise ValueError(f"DPOObjective.beta must be a finite real > 0, got {self.beta!r}.")
        if self.reference.vocab_size != self.policy.vocab_size:
            raise ValueError(
                "DPOObjective needs a reference with the policy's vocabulary, got vocab_size "
                f"{self.reference.vocab_size} for the reference and {self.policy.vocab_size} "
                "for the policy."
            )
        check_integer("DPOObjective.pad_id", self.pad_id, minimum=0, optional=True)
        if self.pad_id is not None and self.pad_id >= self.policy.vocab_size:
            raise ValueError(
                f"DPOObjective.pad_id must be None or a token ID in "
                f"[0, {self.policy.vocab_size}), got {self.pad_id!r}."
            )
        if self.samples.prompt_len is not None:
            raise ValueError(
                "DPOObjective takes each preview prompt from the batch's prompt mask, so "
                f"Samples.prompt_len must be None, got {self.samples.prompt_len}."
            )

    @property
    def max_seq_len(self) -> int:
        """The longest row both the policy and the reference take."""
        return min(self.policy.max_seq_len, self.reference.max_seq_len)

    def init_params(self) -> PyTree:
        return trainable(self.policy)

    def _side(self, batch: Batch, side: str) -> tuple[Array, Array]:
        """One side's checked token IDs and prompt mask (a training batch holds both sides,
        a batch `evaluate` reads the chosen one at least)."""
        check_batch_keys(self, batch, Split.TRAIN if side == "rejected" else Split.VALIDATION)
        tokens = check_token_batch(
            "DPOObjective",
            side,
            batch[side],
            vocab_size=self.policy.vocab_size,
            min_length=2,
        )
        if tokens.shape[1] > self.max_seq_len:
            raise ValueError(
                f"DPOObjective: batch[{side!r}] holds rows of {tokens.shape[1]} tokens, longer "
                f"than max_seq_len {self.max_seq_len} of the policy and reference."
            )
        shared = "prompt_mask" in batch
        separate = [key for key in ("chosen_prompt_mask", "rejected_prompt_mask") if key in batch]
        if shared and separate:
            raise ValueError(
                "DPOObjective takes either batch['prompt_mask'] or both "
                "batch['chosen_prompt_mask'] and batch['rejected_prompt_mask'], got "
                f"{['prompt_mask', *separate]}."
            )
        if not shared and len(separate) != 2:
            raise MissingBatchKeyError(
                "DPOObjective needs a boolean prompt mask: batch['prompt_mask'] for both sides, "
                "or both batch['chosen_prompt_mask'] and batch['rejected_prompt_mask']; got keys "
                f"{sorted(batch)}."
            )
        field = "prompt_mask" if shared else f"{side}_prompt_mask"
        mask = batch[field]
        dtype = getattr(mask, "dtype", None)
        if dtype is None or dtype != jnp.bool_:
            raise ValueError(
                f"DPOObjective needs a boolean batch[{field!r}] (true on prompt tokens), got "
                f"dtype {dtype}; build it with a comparison or .astype(bool)."
            )
        if tuple(mask.shape) != tuple(tokens.shape):
            raise ValueError(
                f"DPOObjective needs batch[{field!r}] shaped like batch[{side!r}] "
                f"{tuple(tokens.shape)}, got {tuple(mask.shape)}."
            )
        return tokens.astype(jnp.int32), jnp.asarray(mask)

    def batch_keys(self, split: Split) -> dict[str, str | None]:
        """`chosen` and `rejected` for training; `chosen` alone for `evaluate`."""
        return dict.fromkeys(_SIDES if split is Split.TRAIN else _SIDES[:1])

    def check_batch(self, batch: Batch) -> None:
        if "rejected" in batch:
            self._pairs(batch)
        else:  # a batch only `evaluate` reads
            tokens, mask = self._side(batch, "chosen")
            self._counted(tokens, mask, "chosen")

    def _counted(self, tokens: Array, prompt_mask: Array, side: str) -> Float[Array, "rows t"]:
        """1.0 on counted target positions `1 .. length - 1`, else 0.0; every row
        needs one."""
        counted = ~prompt_mask[:, 1:]
        if self.pad_id is not None:
            counted = jnp.logical_and(counted, tokens[:, 1:] != self.pad_id)
        empty = ~jnp.any(counted, axis=1)
        message = (
            f"DPOObjective: a row of batch[{side!r}] has no counted response token (every "
            "position after the first is a prompt token or pad_id)."
        )
        counted = error_if(
            counted, empty, message, first=lambda row: f"{message[:-1]}: row {row[0]}."
        )
        return jnp.where(counted, 1.0, 0.0).astype(jnp.float32)

    def _pairs(self, batch: Batch) -> tuple[Array, Array]:
        """The chosen and rejected rows stacked on a leading side axis, with their
        counted-position weights: `(2, rows, length)` and `(2, rows, length - 1)`."""
        check_batch_keys(self, batch, Split.TRAIN)  # both sides named at once
        sides = [self._side(batch, side) for side in _SIDES]
        (chosen, _), (rejected, _) = sides
        if chosen.shape != rejected.shape:
            raise ValueError(
                "DPOObjective needs batch['chosen'] and batch['rejected'] of one shape "
                f"(pad both to one length), got {tuple(chosen.shape)} and "
                f"{tuple(rejected.shape)}."
            )
        weights = [
            self._counted(tokens, mask, side)
            for side, (tokens, mask) in zip(_SIDES, sides, strict=True)
        ]
        return jnp.stack([chosen, rejected]), jnp.stack(weights)

    @staticmethod
    def _log_probs(model: CausalTransformer, tokens: Int[Array, "rows length"]) -> Array:
        """log p(token_t | tokens_<t) for `t = 1 .. length - 1`."""
        logits = jax.vmap(model)(tokens[:, :-1])
        return token_log_probs(logits, tokens[:, 1:])

    def sequence_log_probs(
        self, params: PyTree, batch: Batch
    ) -> tuple[Float[Array, "2 rows"], Float[Array, "2 rows"]]:
        """Summed response log-probabilities under the policy (with gradient) and the
        reference (without), for the chosen (index 0) and rejected (index 1) rows."""
        tokens, weights = self._pairs(batch)
        sides, rows, length = tokens.shape
        flat = tokens.reshape(sides * rows, length)
        mask = weights.reshape(sides * rows, length - 1) != 0

        def summed(per_position: Array) -> Array:
            counted = jnp.where(mask, per_position, jnp.zeros_like(per_position))
            return jnp.sum(counted, axis=1).reshape(sides, rows)

        policy = summed(self._log_probs(combine(params, self.policy), flat))
        reference = jax.lax.stop_gradient(summed(self._log_probs(self.reference, flat)))
        return policy, reference

    def loss(
        self, params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        policy, reference = self.sequence_log_probs(params, batch)
        rewards = self.beta * (policy - reference)
        chosen, rejected = rewards[0], rewards[1]
        loss = -jnp.mean(jax.nn.log_sigmoid(chosen - rejected))
        return loss, {
            "reward_accuracy": jnp.mean(jnp.where(chosen > rejected, 1.0, 0.0)),
            "reward_margin": jnp.mean(chosen - rejected),
            "chosen_reward": jnp.mean(chosen),
            "rejected_reward": jnp.mean(rejected),
        }

    def evaluate(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> TokenScores:
        """The policy's teacher-forced scores on the chosen rows."""
        tokens, mask = self._side(batch, "chosen")
        weights = self._counted(tokens, mask, "chosen")
        logits = jax.vmap(combine(params, self.policy))(tokens[:, :-1])
        targets = tokens[:, 1:]
        losses = -token_log_probs(logits, targets)
        return TokenScores(losses, weights, jnp.argmax(logits, axis=-1) == targets)

    def default_metrics(self) -> tuple[Metric, ...]:
        """None: a preference run names the metrics it wants scored."""
        return ()

    def generate_preview(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> TokenRows:
        """Continue the first `samples.num_samples` chosen prompts with the live policy."""
        tokens, mask = self._side(batch, "chosen")
        tokens, mask = tokens[: self.samples.num_samples], mask[: self.samples.num_samples]
        prompt_lengths = jnp.sum(jnp.cumprod(mask.astype(jnp.int32), axis=1), axis=1)
        prompt_lengths = jnp.maximum(prompt_lengths, jnp.ones_like(prompt_lengths))
        rows, generated = _continue_each_prompt(
            combine(params, self.policy),
            tokens,
            prompt_lengths,
            key,
            max_new_tokens=self.samples.max_new_tokens,
            total=min(tokens.shape[1] + self.samples.max_new_tokens, self.max_seq_len),
            fill=0 if self.pad_id is None else self.pad_id,
            temperature=self.samples.temperature,
            top_k=self.samples.top_k,
            top_p=self.samples.top_p,
        )
        return TokenRows(rows, generated)


def _continue_each_prompt(
    model: CausalTransformer,
    tokens: Int[Array, "rows length"],
    prompt_lengths: Int[Array, " rows"],
    key: PRNGKeyArray,
    *,
    max_new_tokens: int,
    total: int,
    fill: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
) -> tuple[Int[Array, "rows total"], Bool[Array, "rows total"]]:
    """Continue row `i`'s first `prompt_lengths[i]` tokens by up to `max_new_tokens`
    sampled tokens in a buffer of `total` positions, and mark the generated ones: a row
    whose prompt leaves less room stops at the buffer's end.

    It samples as `dew.objectives.lm.generate` does, with the same keys, so a row
    continues exactly as `generate` (and `sample_continuations`) continues its prompt.
    """
    length = tokens.shape[1]
    starts = prompt_lengths.astype(jnp.int32)
    new, counts = _sample_tokens(
        model,
        tokens.astype(jnp.int32),
        starts,
        key,
        steps=max_new_tokens,
        capacity=total,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=None,
        fill=fill,
    )
    positions = jnp.arange(total)[None, :]
    offset = positions - starts[:, None]
    generated = jnp.logical_and(offset >= 0, offset < counts[:, None])
    continuation = jnp.take_along_axis(new, jnp.clip(offset, 0, max_new_tokens - 1), axis=1)
    prompt = jnp.pad(tokens.astype(jnp.int32), ((0, 0), (0, total - length)))
    filled = jnp.where(generated, continuation, jnp.full_like(continuation, fill))
    return jnp.where(offset < 0, prompt, filled), generated
