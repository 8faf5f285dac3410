"""Worker of tests/test_distributed_eval.py: every multi-process evaluation scenario in one
launch; each scenario's outcome on this rank goes into OUT/rank<R>.json (arrays into
OUT/rank<R>.npz).

The builders (objectives, shards, metrics) are importable without starting anything, so
the test computes its one-process references from the very same inputs.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dew import metrics
from dew.artifacts import Artifact, Images, TokenScores
from dew.metrics import Metric
from dew.metrics._fid import FID
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.base import Objective
from dew.objectives.lm import LMObjective
from dew.objectives.sampling import Samples

VOCAB, SEQ, ROWS = 8, 6, 4  # ROWS: a process's rows per batch


def lm_objective() -> LMObjective:
    model = CausalTransformer(
        vocab_size=VOCAB,
        emb_features=16,
        num_layers=1,
        num_heads=2,
        mlp_features=32,
        max_seq_len=16,
        key=jax.random.key(0),
    )
    return LMObjective(model, seq_len=SEQ, samples=Samples(num_samples=6, max_new_tokens=3))


def text_shard(rank: int, batches: int, *, rows: int = ROWS, seed: int = 0) -> list[dict]:
    """Process `rank`'s token batches (different rows on every process)."""
    rng = np.random.default_rng(100 * seed + rank)
    return [
        {"text": rng.integers(0, VOCAB, (rows, SEQ + 1), dtype=np.int32)} for _ in range(batches)
    ]


def labelled_shard(rank: int) -> list[dict]:
    """Process `rank`'s token batches, each row with a class label of its own."""
    return [
        batch | {"labels": np.arange(ROWS, dtype=np.int32) + 10 * rank + 100 * index}
        for index, batch in enumerate(text_shard(rank, 2))
    ]


def joined(shards: list[list[dict]], batches: int | None = None) -> list[dict]:
    """The global batches of `shards` as one process sees them: batch `i` of every shard,
    joined in process order (what `global_batch` places), for the first `batches`."""
    count = min(len(shard) for shard in shards) if batches is None else batches
    return [
        {name: np.concatenate([shard[i][name] for shard in shards]) for name in shards[0][i]}
        for i in range(count)
    ]


class CountingMeanLoss(Metric[TokenScores]):
    """A host metric: the weighted mean loss in NumPy, each update marked in a file of
    the process that ran it."""

    artifact_type: ClassVar[type[Artifact]] = TokenScores
    host: ClassVar[bool] = True
    marker: str = eqx.field(static=True, default="")
    name: str = eqx.field(static=True, default="host_mean_loss")

    def init(self):
        return np.zeros(2)

    def statistics(self, artifact: TokenScores):
        if self.marker:
            with open(f"{self.marker}{jax.process_index()}.txt", "a") as file:
                file.write(f"{type(artifact.losses).__name__} {len(artifact.losses)}\n")
        losses, weights = np.asarray(artifact.losses), np.asarray(artifact.weights)
        return np.array([np.sum(losses * weights), np.sum(weights)])

    def merge(self, accumulated, contribution):
        return accumulated + contribution

    def finalize(self, accumulated):
        return float(accumulated[0] / accumulated[1])


class Constant(Metric[TokenScores]):
    """A host metric finalizing to a fixed value (NaN and infinities cross processes)."""

    artifact_type: ClassVar[type[Artifact]] = TokenScores
    host: ClassVar[bool] = True
    value: float = eqx.field(static=True, default=0.0)
    fail: str = eqx.field(static=True, default="")
    name: str = eqx.field(static=True, default="constant")

    def init(self):
        if self.fail == "init":
            raise RuntimeError("the host metric's weights are missing")
        return np.zeros(())

    def statistics(self, artifact):
        if self.fail == "update":
            raise RuntimeError("the host metric's kernel crashed")
        return np.zeros(())

    def merge(self, accumulated, contribution):
        return accumulated

    def finalize(self, accumulated):
        if self.fail == "finalize":
            raise ValueError("constant cannot finalize this pass")
        return self.value


def features(images):
    """A cheap feature network for FID: each image's mean per channel and a few pixels."""
    flat = images.reshape(images.shape[0], -1)
    return jnp.concatenate([images.mean(axis=(1, 2)), flat[:, :5]], axis=1)


class ImagesObjective(Objective):
    """Scores a batch of images as generated rows, with `batch['reference']` as the real
    ones; previews its scoring artifact."""

    name: str = "images"
    scale: jax.Array = eqx.field(default_factory=lambda: jnp.asarray(0.5))
    fail_preview_on: int = eqx.field(static=True, default=-1)

    def init_params(self):
        return {"shift": jnp.asarray(0.1)}

    def loss(self, params, batch, key):
        return jnp.zeros(()), {}

    def evaluate(self, params, batch, key):
        generated = jnp.clip(batch["images"] * self.scale + params["shift"], 0.0, 1.0)
        reference = batch.get("reference")
        return Images(generated, None if reference is None else jnp.asarray(reference))

    def batch_keys(self, split):
        return {"images": None}

    def check_batch(self, batch):
        if np.ndim(batch["images"]) != 4:
            raise ValueError(f"images must have 4 axes, got {np.shape(batch['images'])}.")

    def generate_preview(self, params, batch, key):
        if jax.process_index() == self.fail_preview_on:
            raise ValueError(f"no preview on process {jax.process_index()}")
        return None

    def default_metrics(self):
        return ()


def image_shard(rank: int, batches: int, *, reference: bool = True) -> list[dict]:
    rng = np.random.default_rng(7 + rank)
    shard = []
    for _ in range(batches):
        batch = {"images": rng.uniform(0, 1, (3, 8, 8, 3)).astype(np.float32)}
        if reference:
            batch["reference"] = rng.uniform(0, 1, (3, 8, 8, 3)).astype(np.float32)
        shard.append(batch)
    return shard


def builtin_previews() -> dict[str, tuple[Objective, object, object]]:
    """name -> (objective, params, shard of a rank): built-in objectives whose previews
    the launch runs over both processes' first batches (two rows a process). The LM's
    (whose sampler GRPO shares) runs beside them, and `ImagesObjective` stands for the
    base preview of the scoring artifact (JEPA's, the supervised objective's)."""
    from dew.nn.backbones.bidirectional_transformer import BidirectionalTransformer
    from dew.nn.backbones.dit import DiT
    from dew.objectives.diffusion import DiffusionObjective, Sampling
    from dew.objectives.dpo import DPOObjective
    from dew.objectives.masked_diffusion import MaskedDiffusionObjective

    causal = lm_objective().model
    greedy = Samples(temperature=0.0, num_samples=3, max_new_tokens=2)

    def images(rank):
        rng = np.random.default_rng(20 + rank)
        return {
            "images": rng.uniform(0, 1, (2, 16, 16, 3)).astype(np.float32),
            "labels": np.array([rank, 2], np.int32),
        }

    def tokens(rank, length, low=0):
        return np.random.default_rng(30 + rank).integers(low, VOCAB, (2, length), dtype=np.int32)

    def pairs(rank):
        return {
            "chosen": tokens(rank, 6, low=1),
            "rejected": tokens(rank + 5, 6, low=1),
            "prompt_mask": np.broadcast_to(np.arange(6) < 2 + rank, (2, 6)).copy(),
        }

    bidirectional = BidirectionalTransformer(
        vocab_size=VOCAB,
        emb_features=16,
        num_layers=1,
        num_heads=2,
        mlp_features=32,
        max_seq_len=8,
        key=jax.random.key(1),
    )
    objectives = {
        "diffusion": (
            DiffusionObjective(
                DiT(16, 4, 3, width=32, depth=1, heads=2, num_classes=3, key=jax.random.key(2)),
                sampling=Sampling(steps=2),
            ),
            images,
        ),
        "masked_diffusion": (
            MaskedDiffusionObjective(bidirectional, seq_len=SEQ, sampling_steps=2, preview_count=3),
            lambda rank: {"text": tokens(rank, SEQ)},
        ),
        "dpo": (DPOObjective(causal, causal, beta=0.5, pad_id=0, samples=greedy), pairs),
    }
    return {
        name: (objective, objective.init_params(), shard)
        for name, (objective, shard) in objectives.items()
    }


class LargestLoss(Metric[TokenScores]):
    """A device metric that declares no `split_invariant` (its statistics are a max): a
    pass of it keeps one replicated accumulator."""

    artifact_type: ClassVar[type[Artifact]] = TokenScores
    name: str = eqx.field(static=True, default="largest_loss")

    def init(self):
        return jnp.full((), -jnp.inf)

    def statistics(self, artifact: TokenScores):
        return jnp.max(jnp.where(artifact.weights > 0, artifact.losses, -jnp.inf))

    def merge(self, accumulated, contribution):
        return jnp.maximum(accumulated, contribution)

    def finalize(self, accumulated):
        return accumulated


def collectives(objective, params, metric_list, batch, key) -> dict:
    """The accumulators a pass of `metric_list` keeps (0: one, replicated) and the
    collectives in its compiled call per batch, read from the compiled HLO."""
    from dew._pass._processes import _GlobalReducer
    from dew._processes import global_batch
    from dew.metrics import MetricSet

    reducer = _GlobalReducer(objective, params, MetricSet(metric_list), key)
    variant = reducer.plan.global_variant(False)
    arguments = (
        reducer.accumulator,
        global_batch(batch),
        0,
        reducer.key,
        reducer.params,
        reducer.objective_leaves,
        reducer.metric_leaves,
    )
    text = variant.lower(*arguments).compile().as_text()
    kinds = ("all-gather", "all-reduce", "collective-permute", "all-to-all")
    return {
        "devices": reducer.plan.devices,
        **{kind: text.count(f" {kind}(") + text.count(f" {kind}-start(") for kind in kinds},
    }


def lm_metrics() -> list[Metric]:
    return [metrics.perplexity(), metrics.token_accuracy(), metrics.mean_loss()]


def _main() -> None:
    from _multiprocess import start

    rank, _count, out, _ = start()

    from dew import evaluate
    from dew._pass import preview_on_process_zero, run_pass
    from dew.metrics import MetricSet

    results: dict = {}
    arrays: dict[str, np.ndarray] = {}
    key = jax.random.key(3)

    seconds: dict[str, float] = {}  # each scenario's time, in the order of rank<R>.json's

    def outcome(function):
        started = time.perf_counter()
        try:
            return {"value": function()}
        except Exception as error:
            return {"error": type(error).__name__, "message": str(error)}
        finally:
            seconds[f"scenario {len(seconds)}"] = round(time.perf_counter() - started, 2)

    def summary(evaluation):
        return {
            "scores": evaluation.scores,
            "coordinated_batches": evaluation.coordinated_batches,
            "records": evaluation.records,
            "uneven_shards": evaluation.uneven_shards,
        }

    lm = lm_objective()
    params = lm.init_params()

    def lm_evaluate(shard, extra=()):
        return summary(evaluate(lm, params, shard, metrics=[*lm_metrics(), *extra], key=key))

    # Device metrics over both processes' shards (a split callable of the Partition).
    results["even"] = outcome(
        lambda: lm_evaluate(lambda partition: iter(text_shard(partition.index, 2)))
    )
    # Device metrics that all declare split_invariant accumulate on each device, with no
    # collective per batch (decision 0089); with one that does not, one accumulator.
    results["collectives"] = outcome(
        lambda: collectives(lm, params, lm_metrics(), text_shard(rank, 1)[0], key)
    )
    results["collectives_mixed"] = outcome(
        lambda: collectives(lm, params, [*lm_metrics(), LargestLoss()], text_shard(rank, 1)[0], key)
    )
    results["mixed"] = outcome(lambda: lm_evaluate(text_shard(rank, 3, seed=3), (LargestLoss(),)))
    # Uneven shards: process 0 has a third batch, which never enters the metrics.
    results["uneven"] = outcome(lambda: lm_evaluate(text_shard(rank, 3 if rank == 0 else 2)))
    # Past the first block of batches each process reads ahead and agrees on at once (8):
    # both shards exactly one block; one block and one more batch on process 1; 12 and 10.
    for name, counts in (("block", (8, 8)), ("block_and_one", (8, 9)), ("long", (12, 10))):
        results[f"uneven_{name}"] = outcome(
            lambda counts=counts: lm_evaluate(text_shard(rank, counts[rank], seed=1))
        )
    # A bad batch (index 9), batches of another row count (index 8), a loader failing after
    # 9 batches: on process 1 alone, in the second block.
    late_bad = text_shard(rank, 11)
    if rank == 1:
        late_bad[9]["text"][0, 1] = VOCAB + 2
    results["bad_batch_late"] = outcome(lambda: lm_evaluate(late_bad))
    late_layout = text_shard(rank, 10)
    if rank == 1:
        late_layout[8] = text_shard(rank, 1, rows=2 * ROWS)[0]
    results["layout_late"] = outcome(lambda: lm_evaluate(late_layout))

    def failing_after_nine():
        yield from text_shard(rank, 9)
        if rank == 1:
            raise ValueError("the loader lost its file after 9 batches")
        yield from text_shard(rank, 2, seed=2)

    results["read_fails_late"] = outcome(lambda: lm_evaluate(failing_after_nine()))
    # Scalar metadata adds no rows.
    results["metadata"] = outcome(
        lambda: lm_evaluate([batch | {"epoch": np.int32(5)} for batch in text_shard(rank, 2)])
    )
    # One shard empty: an empty coordinated pass.
    results["empty"] = outcome(lambda: lm_evaluate(text_shard(rank, 1 if rank == 0 else 0)))
    # The identity of the conditioning data: the global batches' labels, on every process.
    results["conditioning"] = outcome(
        lambda: (
            run_pass(
                lm,
                params,
                labelled_shard(rank),
                MetricSet(lm_metrics()),
                key,
                conditioning=lambda batch: batch["labels"],
            ).conditioning_sha256
        )
    )
    # Host metrics on process zero only, their values (NaN, infinities) on every process.
    marker = str(out / "host_updates_rank")
    results["host"] = outcome(
        lambda: lm_evaluate(
            text_shard(rank, 2),
            (
                CountingMeanLoss(marker=marker),
                Constant(float("nan"), name="nan"),
                Constant(float("inf"), name="inf"),
                Constant(float("-inf"), name="minus_inf"),
            ),
        )
    )
    # A bad batch on process 1 only (a token ID outside the vocabulary).
    bad = text_shard(rank, 2)
    if rank == 1:
        bad[1]["text"][2, 3] = VOCAB + 1
    results["bad_batch"] = outcome(lambda: lm_evaluate(bad))

    # A shard that fails to open on process 1 (the Partition's callable raises).
    def shard_failing_on_one(partition):
        if partition.index == 1:
            raise ValueError("shard 1 of the validation split is missing")
        return iter(text_shard(partition.index, 2))

    results["shard_fails_to_open"] = outcome(lambda: lm_evaluate(shard_failing_on_one))
    # Batches of another row count on process 1.
    results["layout"] = outcome(lambda: lm_evaluate(text_shard(rank, 1, rows=2 + 2 * rank)))
    # No counted target anywhere (every target is the pad ID).
    padded = LMObjective(lm.model, seq_len=SEQ, pad_id=0)
    zeros = [{"text": np.zeros((ROWS, SEQ + 1), np.int32)}]
    results["no_target"] = outcome(
        lambda: summary(evaluate(padded, params, zeros, metrics=[metrics.perplexity()], key=key))
    )
    # Host metrics failing on process zero: in an update, in finalize.
    for where in ("init", "update", "finalize"):
        results[f"host_fails_{where}"] = outcome(
            lambda where=where: lm_evaluate(text_shard(rank, 1), (Constant(fail=where),))
        )
    # FID's moments over both processes' images (a cheap feature network).
    images = ImagesObjective()
    results["fid"] = outcome(
        lambda: summary(
            evaluate(
                images,
                images.init_params(),
                image_shard(rank, 2),
                metrics=[FID(features), metrics.psnr()],
                key=key,
            )
        )
    )
    # FID with no reference images: process zero's host metric fails, both raise.
    results["fid_no_reference"] = outcome(
        lambda: summary(
            evaluate(
                images,
                images.init_params(),
                image_shard(rank, 1, reference=False),
                metrics=[FID(features)],
                key=key,
            )
        )
    )

    # Previews through the trainer's function: the LM's generated rows, the base
    # preview's scoring artifact, and a preview failing on process 1.
    def preview(objective, objective_params, shard, metric_list):
        result = run_pass(
            objective,
            objective_params,
            shard,
            MetricSet(metric_list),
            key,
            keep_first_artifact=True,
        )
        preview_key = jax.random.fold_in(key, 11)
        artifact = preview_on_process_zero(
            objective, objective_params, result.first_batch, preview_key, result.first_artifact
        )
        return None if artifact is None else jax.tree.map(np.asarray, artifact)

    def lm_preview():
        artifact = preview(lm, params, text_shard(rank, 2), [metrics.perplexity()])
        if artifact is not None:
            arrays["preview_tokens"] = artifact.tokens
            arrays["preview_mask"] = artifact.mask
        return artifact is not None

    results["lm_preview"] = outcome(lm_preview)
    # Only process zero asks for the first artifact (its tracker previews): both keep it.
    results["keep_on_zero_only"] = outcome(
        lambda: (
            run_pass(
                lm,
                params,
                text_shard(rank, 1),
                MetricSet([metrics.perplexity()]),
                key,
                keep_first_artifact=rank == 0,
            ).first_artifact.losses.shape
        )
    )

    def images_preview():
        artifact = preview(images, images.init_params(), image_shard(rank, 1), [])
        if artifact is not None:
            arrays["preview_generated"] = artifact.generated
        return artifact is not None

    results["images_preview"] = outcome(images_preview)
    for name, (objective, objective_params, shard) in builtin_previews().items():

        def builtin(name=name, objective=objective, objective_params=objective_params, shard=shard):
            artifact = preview(objective, objective_params, [shard(rank)], [])
            if artifact is not None:
                for field, value in vars(artifact).items():
                    if isinstance(value, np.ndarray):
                        arrays[f"{name}.{field}"] = value
            return artifact is not None

        results[f"preview_{name}"] = outcome(builtin)
    failing = ImagesObjective(fail_preview_on=1)
    results["preview_fails"] = outcome(
        lambda: preview(failing, failing.init_params(), image_shard(rank, 1), [metrics.psnr()])
    )
    results["after_failures"] = outcome(
        lambda: lm_evaluate(lambda partition: iter(text_shard(partition.index, 2)))
    )

    (out / f"rank{rank}.json").write_text(json.dumps(results))
    (out / f"seconds{rank}.json").write_text(json.dumps(seconds))
    np.savez(out / f"rank{rank}.npz", **arrays)


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    _main()
