"""Group relative policy optimisation with sampled completions and a frozen reference."""

import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from dew._checks import MissingBatchKeyError, check_ids
from dew._integers import check_integer
from dew.artifacts import TokenRows
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
from dew.objectives.sampling import sample_continuations

# `Samples`: its home is dew.objectives.sampling
__all__ = ["GRPOObjective", "GRPOTerms", "group_advantages", "grpo_loss_terms"]

RewardFn = Callable[[Int[Array, "rows prompt"], Int[Array, "rows group new"]], Array]

ADVANTAGE_EPSILON = 1e-6


def group_advantages(rewards: Float[Array, "rows group"]) -> Float[Array, "rows group"]:
    """Each reward relative to its group: `(r - mean) / (std + 1e-6)` along the group
    axis, with the population standard deviation (`ddof=0`). A group of equal
    rewards gets exactly zero advantages: the rewards are centred on the group's first
    one before the mean is taken, so a float32 mean an ulp off (which `1e-6` would
    amplify into a push on every completion) cannot arise.

    ```python
    >>> import jax.numpy as jnp
    >>> group_advantages(jnp.array([[0.0, 1.0], [2.0, 2.0]])).round(3).tolist()
    [[-1.0, 1.0], [0.0, 0.0]]

    ```
    """
    rewards = rewards.astype(jnp.float32)
    # Equal rewards shift to exact zeros, so their mean, centred values and std are
    # exactly zero; unequal ones lose no accuracy (the shifted values are smaller).
    shifted = rewards - rewards[:, :1]
    centred = shifted - jnp.mean(shifted, axis=1, keepdims=True)
    std = jnp.sqrt(jnp.mean(jnp.square(centred), axis=1, keepdims=True))
    return centred / (std + ADVANTAGE_EPSILON)


class GRPOTerms(NamedTuple):
    """The per-token terms of the GRPO objective, `(rows, group, new)` each, and the loss.

    - `loss`: `-mean(surrogate - kl_beta * kl)` over every completion token.
    - `surrogate`: `min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`.
    - `kl`: the k3 estimate of KL(policy || reference),
      `exp(ref - logp) - (ref - logp) - 1`, non-negative.
    - `clipped`: where the clipped branch is taken and stops the gradient:
      `ratio < 1 - eps` with `A < 0`, or `ratio > 1 + eps` with `A > 0`.
    """

    loss: Float[Array, ""]
    surrogate: Float[Array, "rows group new"]
    kl: Float[Array, "rows group new"]
    clipped: Bool[Array, "rows group new"]


def grpo_loss_terms(
    log_probs: Float[Array, "rows group new"],
    old_log_probs: Float[Array, "rows group new"],
    ref_log_probs: Float[Array, "rows group new"],
    advantages: Float[Array, "rows group"],
    clip_epsilon: float | Float[Array, ""],
    kl_beta: float | Float[Array, ""],
) -> GRPOTerms:
    """The clipped surrogate and k3 KL penalty of GRPO (Shao et al., 2024), token by token.

    `log_probs` are the policy's (differentiate through them); `old_log_probs` those
    of the policy that sampled the completions and `ref_log_probs` the reference's,
    both treated as constants. Every token of a completion shares its completion's
    advantage, and the loss averages over all completion tokens.

    ```python
    >>> import jax.numpy as jnp
    >>> old = jnp.zeros((1, 2, 1))
    >>> new = jnp.log(jnp.full((1, 2, 1), 1.5))  # a ratio of 1.5 for both completions
    >>> terms = grpo_loss_terms(new, old, new, jnp.array([[1.0, -1.0]]), 0.2, 0.04)
    >>> [round(float(x), 3) for x in terms.surrogate.ravel()], terms.clipped.ravel().tolist()
    ([1.2, -1.5], [True, False])
    >>> round(float(terms.loss), 3)
    0.15

    ```
    """
    shape = log_probs.shape
    for name, value in (("old_log_probs", old_log_probs), ("ref_log_probs", ref_log_probs)):
        if value.shape != shape:
            raise ValueError(
                f"grpo_loss_terms needs {name} shaped like log_probs {tuple(shape)}, "
                f"got {tuple(value.shape)}."
            )
    if advantages.shape != shape[:2]:
        raise ValueError(
            f"grpo_loss_terms needs advantages shaped (rows, group) = {tuple(shape[:2])}, "
            f"got {tuple(advantages.shape)}."
        )
    old_log_probs = jax.lax.stop_gradient(old_log_probs)
    ref_log_probs = jax.lax.stop_gradient(ref_log_probs)
    advantage = jax.lax.stop_gradient(advantages)[:, :, None]
    ratio = jnp.exp(log_probs - old_log_probs)
    bounded = jnp.clip(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon)
    surrogate = jnp.minimum(ratio * advantage, bounded * advantage)
    log_ratio = ref_log_probs - log_probs
    kl = jnp.exp(log_ratio) - log_ratio - 1.0
    loss = -jnp.mean(surrogate - kl_beta * kl)
    low = jnp.logical_and(ratio < 1.0 - clip_epsilon, advantage < 0)
    high = jnp.logical_and(ratio > 1.0 + clip_epsilon, advantage > 0)
    return GRPOTerms(loss, surrogate, kl, jnp.logical_or(low, high))


def _real(value: object, *, allow_zero: bool) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, numbers.Real)
        and math.isfinite(value)
        and (float(value) >= 0 if allow_zero else float(value) > 0)
    )


class GRPOObjective(Objective):
    """Group relative policy optimisation of a causal policy with a frozen reference.

    **Arguments:**

    - `policy`: the model being trained; `init_params()` returns its trainable arrays.
    - `reference`: the frozen reference of the KL penalty, held in the objective
      (never in the params) and read under `stop_gradient`.
    - `reward_fn`: `reward_fn(prompts, completions) -> rewards`, a pure JAX function of
      `prompts` `(rows, prompt_len)` and `completions` `(rows, group, new)` (integer
      token IDs) returning `(rows, group)` real rewards. It runs inside the jitted
      loss, on token IDs, so no gradient flows through it.
    - `group_size`: completions sampled per prompt, `>= 2`.
    - `max_new_tokens`: tokens per sampled completion.
    - `clip_epsilon`: the ratio clip range `> 0`; `kl_beta`: the KL weight `>= 0`.
    - `temperature`: the sampling temperature `> 0`. Log-probabilities of the policy,
      the sampling policy and the reference are taken at the same temperature
      (`logits / temperature`), so the ratio compares the sampling distributions.
    - `samples`: how `preview` samples (`samples.prompt_len` must be `None`).

    **Batch:** `"prompts"`, integer token IDs `(rows, prompt_len)` in
    `[0, vocab_size)`; every ID is context (no padding). `loss` then samples
    `group_size` completions per prompt from the policy at `stop_gradient(params)`,
    scores them with `reward_fn` and takes one on-policy step (the ratio is 1, the
    gradient is the policy gradient). To take several steps on one sample batch, add
    the output of `rollout` to the batch: `"completions"` `(rows, group, new)` with
    `"old_log_probs"` `(rows, group, new)` (both or neither) and optionally
    `"rewards"` `(rows, group)` (else `reward_fn` scores the completions); the key is
    then unused and the clipping acts.

    The loss is `grpo_loss_terms` of the policy's completion log-probs with the
    advantages of `group_advantages(rewards)`. **Metrics:** `reward_mean` (over all
    completions), `reward_std` (the mean over prompts of each group's population
    standard deviation: zero means no learning signal), `kl` (the mean k3 estimate
    per token) and `clip_fraction` (the fraction of tokens on the clipped branch).

    `evaluate` samples one completion per prompt from the policy with the training
    rollouts' `max_new_tokens` and `temperature`, deterministically from `key`, and
    returns them as `TokenRows` (prompt then completion, the mask true on the
    completion) for a custom metric to score, e.g. with the reward. `preview` does
    the same for the first `samples.num_samples` prompts with the `samples`
    settings, always from the live params (no `ema_decay`), never the reference; it generates
    `samples.max_new_tokens` tokens, or fewer where the prompt leaves less room
    within `max_seq_len`.

    ```python
    >>> import equinox as eqx, jax, jax.numpy as jnp
    >>> model = CausalTransformer(vocab_size=4, emb_features=16, num_layers=1, num_heads=2,
    ...                           mlp_features=32, max_seq_len=8, key=jax.random.key(0))
    >>> def reward(prompts, completions):
    ...     return jnp.mean(jnp.where(completions == 3, 1.0, 0.0), axis=-1)
    >>> objective = GRPOObjective(model, model, reward, group_size=4, max_new_tokens=3)
    >>> batch = {"prompts": jnp.array([[1, 2], [2, 1]], jnp.int32)}
    >>> params = objective.init_params()
    >>> loss, aux = eqx.filter_jit(objective.loss)(params, batch, jax.random.key(0))
    >>> sorted(aux)
    ['clip_fraction', 'kl', 'reward_mean', 'reward_std']

    ```
    """

    policy: CausalTransformer
    reference: CausalTransformer
    reward_fn: RewardFn = eqx.field(static=True)
    group_size: int = eqx.field(static=True)
    max_new_tokens: int = eqx.field(static=True)
    clip_epsilon: float = eqx.field(static=True, default=0.2)
    kl_beta: float = eqx.field(static=True, default=0.04)
    temperature: float = eqx.field(static=True, default=1.0)
    samples: Samples = eqx.field(static=True, default=Samples())
    name: str = eqx.field(static=True, default="grpo")

    def __check_init__(self) -> None:
        if not callable(self.reward_fn):
            raise ValueError(
                f"GRPOObjective.reward_fn must be a function (prompts, completions) -> rewards, "
                f"got {self.reward_fn!r}."
            )
        check_integer("GRPOObjective.group_size", self.group_size, minimum=2)
        check_integer("GRPOObjective.max_new_tokens", self.max_new_tokens, minimum=1)
        if not _real(self.clip_epsilon, allow_zero=False):
            raise ValueError(
                f"GRPOObjective.clip_epsilon must be a finite real > 0, got {self.clip_epsilon!r}."
            )
        if not _real(self.kl_beta, allow_zero=True):
            raise ValueError(
                f"GRPOObjective.kl_beta must be a finite real >= 0, got {self.kl_beta!r}."
            )
        if not _real(self.temperature, allow_zero=False):
            raise ValueError(
                "GRPOObjective.temperature must be a finite real > 0 (the policy's "
                f"log-probabilities are taken at it), got {self.temperature!r}."
            )
        if self.reference.vocab_size != self.policy.vocab_size:
            raise ValueError(
                "GRPOObjective needs a reference with the policy's vocabulary, got vocab_size "
                f"{self.reference.vocab_size} for the reference and {self.policy.vocab_size} "
                "for the policy."
            )
        if self.max_new_tokens + 1 > self.max_seq_len:
            raise ValueError(
                f"GRPOObjective.max_new_tokens ({self.max_new_tokens}) leaves no room for a "
                f"prompt within max_seq_len {self.max_seq_len}."
            )
        if self.samples.prompt_len is not None:
            raise ValueError(
                "GRPOObjective previews continue whole batch['prompts'] rows, so "
                f"Samples.prompt_len must be None, got {self.samples.prompt_len}."
            )

    @property
    def max_seq_len(self) -> int:
        """The longest prompt-plus-completion both the policy and the reference take."""
        return min(self.policy.max_seq_len, self.reference.max_seq_len)

    def init_params(self) -> PyTree:
        return trainable(self.policy)

    def _prompts(self, batch: Batch, new_tokens: int, setting: str) -> Array:
        check_batch_keys(self, batch, Split.TRAIN)
        prompts = check_token_batch(
            "GRPOObjective",
            "prompts",
            batch["prompts"],
            vocab_size=self.policy.vocab_size,
            min_length=1,
        )
        if prompts.shape[1] + new_tokens > self.max_seq_len:
            raise ValueError(
                f"GRPOObjective: prompts of {prompts.shape[1]} tokens plus {setting} "
                f"({new_tokens}) exceed max_seq_len {self.max_seq_len}; shorten the prompts or "
                f"lower {setting}."
            )
        return prompts.astype(jnp.int32)

    def _completion_log_probs(
        self, model: CausalTransformer, prompts: Array, completions: Array
    ) -> Float[Array, "rows group new"]:
        """log p(completion token | everything before it) at the sampling temperature."""
        rows, group, new = completions.shape
        prompt_len = prompts.shape[1]
        sequences = jnp.concatenate(
            [jnp.repeat(prompts, group, axis=0), completions.reshape(rows * group, new)], axis=1
        )
        logits = jax.vmap(model)(sequences[:, :-1]) / self.temperature
        log_probs = token_log_probs(logits, sequences[:, 1:])[:, prompt_len - 1 :]
        return log_probs.reshape(rows, group, new)

    def _rewards(self, prompts: Array, completions: Array) -> Float[Array, "rows group"]:
        rewards = self.reward_fn(prompts, completions)
        return self._check_rewards(rewards, "reward_fn returned", completions.shape[:2])

    @staticmethod
    def _check_rewards(rewards: Any, source: str, shape: tuple[int, ...]) -> Array:
        dtype = getattr(rewards, "dtype", None)
        if dtype is None or not (
            jnp.issubdtype(dtype, jnp.floating)
            or jnp.issubdtype(dtype, jnp.integer)
            or dtype == jnp.bool_
        ):
            raise ValueError(
                f"GRPOObjective: {source} {type(rewards).__name__} of dtype {dtype}; rewards must "
                f"be a real array shaped (rows, group) = {tuple(shape)}."
            )
        if tuple(rewards.shape) != tuple(shape):
            raise ValueError(
                f"GRPOObjective: {source} rewards shaped {tuple(rewards.shape)}; rewards must be "
                f"shaped (rows, group) = {tuple(shape)}."
            )
        return jnp.asarray(rewards).astype(jnp.float32)

    def _sample(self, params: PyTree, prompts: Array, key: PRNGKeyArray) -> Array:
        """`group_size` completions per prompt from the policy, `(rows, group, new)`."""
        model = combine(jax.lax.stop_gradient(params), self.policy)
        rows, prompt_len = prompts.shape
        sequences = sample_continuations(
            model,
            jnp.repeat(prompts, self.group_size, axis=0),
            key,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
        )
        return sequences[:, prompt_len:].reshape(rows, self.group_size, self.max_new_tokens)

    def rollout(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> dict[str, Array]:
        """Sample a batch to take several steps on: `batch` with `"completions"`,
        `"old_log_probs"` (of the sampling params) and `"rewards"` added. `loss` on
        it starts from the same completions `loss` on `batch` and `key` samples."""
        prompts = self._prompts(batch, self.max_new_tokens, "max_new_tokens")
        completions = self._sample(params, prompts, key)
        model = combine(jax.lax.stop_gradient(params), self.policy)
        return {
            **batch,
            "prompts": prompts,
            "completions": completions,
            "old_log_probs": self._completion_log_probs(model, prompts, completions),
            "rewards": self._rewards(prompts, completions),
        }

    def _precomputed(self, batch: Batch) -> tuple[Array, Array, Array, Array]:
        present = [key for key in ("completions", "old_log_probs") if key in batch]
        if len(present) != 2:
            raise MissingBatchKeyError(
                "GRPOObjective takes precomputed samples as both batch['completions'] and "
                f"batch['old_log_probs'] (see GRPOObjective.rollout), got only {present}."
            )
        completions = batch["completions"]
        dtype = getattr(completions, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.integer) or completions.ndim != 3:
            raise ValueError(
                "GRPOObjective needs integer token IDs shaped (rows, group, new) in "
                f"batch['completions'], got {type(completions).__name__} of dtype {dtype} and "
                f"shape {tuple(getattr(completions, 'shape', ()))}."
            )
        rows, group, new = completions.shape
        prompts = self._prompts(batch, new, "the completions' length")
        if rows != prompts.shape[0] or group != self.group_size:
            raise ValueError(
                f"GRPOObjective needs batch['completions'] shaped (rows, group_size, new) = "
                f"({prompts.shape[0]}, {self.group_size}, new), got {tuple(completions.shape)}."
            )
        completions = self._check_completion_ids(completions)
        old = batch["old_log_probs"]
        dtype = getattr(old, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(
                "GRPOObjective needs floating log-probabilities in batch['old_log_probs'], got "
                f"dtype {dtype}."
            )
        if tuple(old.shape) != tuple(completions.shape):
            raise ValueError(
                "GRPOObjective needs batch['old_log_probs'] shaped like batch['completions'] "
                f"{tuple(completions.shape)}, got {tuple(old.shape)}."
            )
        if "rewards" in batch:
            rewards = self._check_rewards(batch["rewards"], "batch['rewards'] holds", (rows, group))
        else:
            rewards = self._rewards(prompts, completions)
        return prompts, completions, jnp.asarray(old).astype(jnp.float32), rewards

    def _check_completion_ids(self, completions: Array) -> Array:
        checked = check_ids(
            completions,
            self.policy.vocab_size,
            subject="GRPOObjective: batch['completions']",
            noun="token ID",
            size_name="vocab_size",
            axes=("row", "group member", "position"),
        )
        return jnp.asarray(checked).astype(jnp.int32)

    def batch_keys(self, split: Split) -> dict[str, str | None]:
        return {"prompts": None}

    def check_batch(self, batch: Batch) -> None:
        if "completions" in batch or "old_log_probs" in batch:
            self._precomputed(batch)
        else:
            self._prompts(batch, self.max_new_tokens, "max_new_tokens")

    def loss(
        self, params: PyTree, batch: Batch, key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        if "completions" in batch or "old_log_probs" in batch:
            prompts, completions, old_log_probs, rewards = self._precomputed(batch)
            log_probs = self._completion_log_probs(
                combine(params, self.policy), prompts, completions
            )
        else:
            prompts = self._prompts(batch, self.max_new_tokens, "max_new_tokens")
            completions = self._sample(params, prompts, key)
            rewards = self._rewards(prompts, completions)
            log_probs = self._completion_log_probs(
                combine(params, self.policy), prompts, completions
            )
            old_log_probs = jax.lax.stop_gradient(log_probs)
        ref_log_probs = jax.lax.stop_gradient(
            self._completion_log_probs(self.reference, prompts, completions)
        )
        terms = grpo_loss_terms(
            log_probs,
            old_log_probs,
            ref_log_probs,
            group_advantages(rewards),
            self.clip_epsilon,
            self.kl_beta,
        )
        return terms.loss, {
            "reward_mean": jnp.mean(rewards),
            "reward_std": jnp.mean(jnp.std(rewards, axis=1)),
            "kl": jnp.mean(terms.kl),
            "clip_fraction": jnp.mean(jnp.where(terms.clipped, 1.0, 0.0)),
        }

    def _continue(
        self,
        params: PyTree,
        prompts: Array,
        key: PRNGKeyArray,
        *,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
    ) -> TokenRows:
        rows = sample_continuations(
            combine(params, self.policy),
            prompts,
            key,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )
        generated = jnp.arange(rows.shape[1]) >= prompts.shape[1]
        return TokenRows(rows, jnp.broadcast_to(generated, rows.shape))

    def evaluate(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> TokenRows:
        """One completion per prompt, sampled as training samples them."""
        prompts = self._prompts(batch, self.max_new_tokens, "max_new_tokens")
        return self._continue(
            params,
            prompts,
            key,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=None,
            top_p=None,
        )

    def default_metrics(self) -> tuple[Metric, ...]:
        """None: no built-in metric reads generated `TokenRows`."""
        return ()

    def generate_preview(self, params: PyTree, batch: Batch, key: PRNGKeyArray) -> TokenRows:
        """Continue the first `samples.num_samples` prompts with the live policy."""
        prompts = self._prompts(batch, self.max_new_tokens, "max_new_tokens")
        return self._continue(
            params,
            prompts[: self.samples.num_samples],
            key,
            max_new_tokens=min(self.samples.max_new_tokens, self.max_seq_len - prompts.shape[1]),
            temperature=self.samples.temperature,
            top_k=self.samples.top_k,
            top_p=self.samples.top_p,
        )
