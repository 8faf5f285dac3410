"""`dew sample RUN`'s work: draw from a loaded generative run (`dew.load_run`), and the
record of how (the sampling protocol) that is written beside every sample file.

Three kinds of run generate: a causal LM (`LMObjective`, and DPO's and GRPO's policies), which
continues prompts (`dew.objectives.lm.generate`, one compiled prefill and a cached decode);
an image or video diffusion model (`DiffusionObjective`), which draws examples of the classes
asked for (`DiffusionObjective.sample`), shown as one labelled grid (`grid.png`, clips an
animated `grid.gif`, the layout of the previews); and masked diffusion
(`MaskedDiffusionObjective`), which generates whole rows from all-masked ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dew.artifacts import Clips, Images
from dew.config._load import LoadedRun, example_batch
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.diffusion import DiffusionObjective
from dew.objectives.lm import LMObjective
from dew.objectives.masked_diffusion import MaskedDiffusionObjective
from dew.objectives.sampling import generate

__all__ = [
    "DATA_PROMPTS",
    "Kind",
    "class_labels",
    "sample_images",
    "sample_masked",
    "sample_text",
    "sampler_kind",
    "text_prompts",
]

Kind = Literal["text", "images", "clips", "masked"]
DATA_PROMPTS = 4
"""How many of the run's data rows give prompts when none is given."""


def sampler_kind(loaded: LoadedRun) -> Kind:
    """What the loaded run generates: `"text"` (a causal LM), `"images"` or `"clips"`
    (diffusion) or `"masked"` (masked diffusion).

    **Raises:** `ValueError` naming the run and its objective where it generates nothing."""
    objective = loaded.objective
    if isinstance(objective, DiffusionObjective):
        return "images" if objective.field == "images" else "clips"
    if isinstance(objective, MaskedDiffusionObjective):
        return "masked"
    if isinstance(loaded.model, CausalTransformer):
        return "text"
    raise ValueError(
        f"the run at {loaded.folder} trains a {objective.name!r} objective, which generates "
        "nothing to sample: dew sample takes causal LM, diffusion and masked diffusion runs "
        "(dew predict scores new rows with a classifier)."
    )


# ----------------------------------------------------------------------------------- text


def text_prompts(loaded: LoadedRun, prompts: Sequence[str]) -> tuple[list[list[int]], list[str]]:
    """The token IDs of each prompt, and each prompt as shown.

    With a tokenizer (the run's data recorded one), a prompt is text, encoded by it; the
    empty prompt is the start of a document (the tokenizer's `eos_id`, which ends the one
    before). Without one, a prompt is token IDs separated by spaces. With no prompts, the
    opening `prompt_len` IDs of the first `DATA_PROMPTS` rows of the run's data (as its
    previews prompt).

    **Raises:** `ValueError` naming a prompt that is not IDs (a run without a tokenizer), an
    ID outside the vocabulary, or a run whose data gives no prompts."""
    vocab = loaded.model.vocab_size
    tokenizer = loaded.tokenizer
    if not prompts:
        return _data_prompts(loaded)
    encoded: list[list[int]] = []
    for text in prompts:
        if tokenizer is not None:
            ids = [int(token) for token in tokenizer.encode(text)] or [int(tokenizer.eos_id)]
        else:
            try:
                ids = [int(word) for word in text.split()]
            except ValueError:
                ids = []
            if not ids:
                raise ValueError(
                    f"--prompt {text!r}: the run at {loaded.folder} recorded no tokenizer, so a "
                    f"prompt is token IDs separated by spaces, each in [0, {vocab})."
                ) from None
        outside = [token for token in ids if not 0 <= token < vocab]
        if outside:
            raise ValueError(
                f"--prompt {text!r}: token ID {outside[0]} is outside the model's vocabulary "
                f"[0, {vocab})."
            )
        encoded.append(ids)
    return encoded, list(prompts)


def _data_prompts(loaded: LoadedRun) -> tuple[list[list[int]], list[str]]:
    objective = loaded.objective
    if not isinstance(objective, LMObjective):
        raise ValueError(
            f"the run at {loaded.folder} ({objective.name!r}) gives no prompts of its own: "
            "pass --prompt TEXT or --prompts FILE."
        )
    _, batch = example_batch(loaded)
    rows = np.asarray(batch["text"])[:DATA_PROMPTS, : objective.prompt_len]
    ids = [[int(token) for token in row] for row in rows]
    return ids, [_shown(loaded, row) for row in ids]


def _shown(loaded: LoadedRun, ids: Sequence[int]) -> str:
    """Token IDs as text: decoded by the run's tokenizer, else the IDs."""
    if loaded.tokenizer is None:
        return " ".join(str(token) for token in ids)
    return loaded.tokenizer.decode(list(ids))


def sample_text(
    loaded: LoadedRun,
    prompts: Sequence[Sequence[int]],
    shown: Sequence[str],
    *,
    max_new_tokens: int | None,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
    rows: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`rows` continuations of each prompt, and the sampling protocol.

    Sample `j` of prompt `i` is row `i * rows + j` of one `generate` call, drawing from
    `jax.random.split(jax.random.key(seed), prompts * rows)` (a row's tokens depend on its
    prompt and its key alone). A row stops at the tokenizer's `eos_id` (none without a
    tokenizer). `max_new_tokens=None` is 64, or what fits the model's `max_seq_len` after
    the longest prompt."""
    model = loaded.model
    width = max(len(ids) for ids in prompts)
    room = model.max_seq_len - width
    if max_new_tokens is None:
        max_new_tokens = max(1, min(64, room))
    if max_new_tokens > room:
        raise ValueError(
            f"--max-tokens {max_new_tokens}: the longest prompt's {width} tokens leave room for "
            f"at most {max(room, 0)} new ones in the model's max_seq_len of {model.max_seq_len} "
            "(its learned positions end there)."
        )
    eos_id = None if loaded.tokenizer is None else int(loaded.tokenizer.eos_id)
    repeated = [list(ids) for ids in prompts for _ in range(rows)]
    generation = generate(
        model,
        repeated,
        max_new_tokens=max_new_tokens,
        key=jax.random.key(seed),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=eos_id,
    )
    tokens = np.asarray(generation.tokens)
    lengths = np.asarray(generation.lengths)
    samples = []
    for index, ids in enumerate(repeated):
        new = [int(token) for token in tokens[index, : lengths[index]]]
        stopped = eos_id is not None and bool(new) and new[-1] == eos_id
        sample: dict[str, Any] = {
            "prompt": shown[index // rows],
            "sample": index % rows,
            "text": _shown(loaded, new),
            "prompt_tokens": ids,
            "tokens": new,
            "stopped": stopped,
        }
        samples.append(sample)
    protocol = _protocol(
        loaded,
        "text",
        seed=seed,
        solver="autoregressive (key/value cache)",
        max_new_tokens=max_new_tokens,
        temperature=float(temperature),
        top_k=top_k,
        top_p=None if top_p is None else float(top_p),
        eos_id=eos_id,
        conditioning="prompts",
        prompts=list(shown),
        prompt_tokens=[list(ids) for ids in prompts],
        samples_per_prompt=rows,
        generated_rows=len(repeated),
    )
    return samples, protocol


# ------------------------------------------------------------------------------ diffusion


def class_labels(loaded: LoadedRun, asked: Sequence[str]) -> list[int]:
    """The label of each `--class` (a class name the run's data recorded, or its index);
    every class in order when none is asked; none for an unconditional model.

    **Raises:** `ValueError` naming a class the model does not have, and any class asked of an
    unconditional model."""
    objective = loaded.objective
    assert isinstance(objective, DiffusionObjective)
    count = objective.model.num_classes
    if count is None:
        if asked:
            raise ValueError(
                f"--class {asked[0]!r}: the run at {loaded.folder} trains an unconditional "
                "model; it draws no class on request (leave --class out)."
            )
        return []
    if not asked:
        return list(range(count))
    names = loaded.classes or ()
    labels = []
    for text in asked:
        if text in names:
            labels.append(names.index(text))
            continue
        if text.strip().lstrip("-").isdigit() and 0 <= int(text) < count:
            labels.append(int(text))
            continue
        allowed = (
            f"one of {', '.join(repr(name) for name in names)} or an index in [0, {count})"
            if names
            else f"an index in [0, {count}) (the run's data named no classes)"
        )
        raise ValueError(f"--class {text!r}: the model has no such class; a class is {allowed}.")
    return labels


def _sampler(objective: DiffusionObjective, **changes: Any) -> DiffusionObjective:
    settings = {name: value for name, value in changes.items() if value is not None}
    sampling = dataclasses.replace(objective.sampling, **settings)
    return dataclasses.replace(objective, sampling=sampling)


def sample_images(
    loaded: LoadedRun,
    labels: Sequence[int],
    *,
    rows: int,
    seed: int,
    guidance: float | None,
    steps: int | None,
    solver: str | None,
) -> tuple[Images | Clips, dict[str, Any]]:
    """`rows` samples of each label (or `rows` unconditional ones when `labels` is empty),
    label by label, and the sampling protocol. The sampler is the run's (`Sampling`), with
    `guidance`, `steps` and `solver` replaced where given; the noise is drawn from
    `jax.random.key(seed)` folded with its `seed_domain`, as an evaluation event draws it."""
    objective = loaded.objective
    assert isinstance(objective, DiffusionObjective)
    objective = _sampler(objective, guidance=guidance, steps=steps, solver=solver)
    drawn = None if not labels else jnp.asarray(np.repeat(np.asarray(labels), rows), jnp.int32)
    generated = _compiled_sample(
        objective, loaded.params, drawn, jax.random.key(seed), rows=rows if drawn is None else None
    )
    artifact = (Images if objective.field == "images" else Clips)(generated, None, labels=drawn)
    record = objective.sampling_record(len(generated), event_key=None).to_dict()
    for name in ("type", "real_rows", "event_key", "features", "conditioning_sha256"):
        record.pop(name, None)
    if drawn is not None:
        values = np.asarray(drawn, "<i8")
        record["conditioning_sha256"] = hashlib.sha256(values.tobytes()).hexdigest()
        names = loaded.classes or ()
        record["labels"] = [int(label) for label in values]
        record["classes"] = [names[label] if label < len(names) else None for label in values]
    return artifact, _protocol(loaded, _kind(objective), seed=seed, **record)


def _kind(objective: DiffusionObjective) -> Kind:
    return "images" if objective.field == "images" else "clips"


_compiled_sample = eqx.filter_jit(DiffusionObjective.sample)


# ------------------------------------------------------------------------ masked diffusion


def sample_masked(
    loaded: LoadedRun, *, rows: int, seed: int, steps: int | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`rows` rows generated from all-masked ones (`MaskedDiffusionObjective.sample`, with
    `steps` ancestral steps where given), drawn from `jax.random.key(seed)`, and the sampling
    protocol."""
    objective = loaded.objective
    assert isinstance(objective, MaskedDiffusionObjective)
    if steps is not None:
        objective = dataclasses.replace(objective, sampling_steps=steps)
    tokens = np.asarray(
        eqx.filter_jit(type(objective).sample)(objective, loaded.params, rows, jax.random.key(seed))
    )
    samples = [
        {"sample": index, "text": _shown(loaded, row), "tokens": row}
        for index, row in enumerate(tokens.tolist())
    ]
    record = objective.sampling_record(rows, event_key=None).to_dict()
    for name in ("type", "real_rows", "event_key", "features", "conditioning_sha256"):
        record.pop(name, None)
    return samples, _protocol(loaded, "masked", seed=seed, **record)


# ------------------------------------------------------------------------------- protocol


def _protocol(loaded: LoadedRun, kind: Kind, **fields: Any) -> dict[str, Any]:
    """The record of a sampling: the run, checkpoint and weights, then how it sampled."""
    return {
        "kind": kind,
        "run": os.fspath(loaded.folder.resolve()),
        "checkpoint_step": loaded.step,
        "weights": loaded.weights,
        "objective": loaded.objective.name,
        **fields,
    }
