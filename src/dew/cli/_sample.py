"""`dew sample RUN`: draw from a trained generative run, with the sampling protocol recorded
beside every sample file (`dew._sample`)."""

import argparse
import hashlib
import json
import math
import pathlib
from typing import Any

from dew.cli._inputs import _say
from dew.cli._predict import run_arguments

__all__ = ["add_sample"]

_TEXT = ("prompt", "prompts", "max_tokens", "temperature", "top_k", "top_p")
_DIFFUSION = ("classes", "guidance", "solver")
_OPTION = {
    "prompt": "--prompt",
    "prompts": "--prompts",
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "classes": "--class",
    "guidance": "--guidance",
    "solver": "--solver",
    "steps": "--steps",
}
_TAKES = {
    "text": _TEXT,
    "images": (*_DIFFUSION, "steps"),
    "clips": (*_DIFFUSION, "steps"),
    "masked": ("steps",),
}
_WHAT = {
    "text": "a causal LM",
    "images": "an image diffusion",
    "clips": "a video diffusion",
    "masked": "a masked diffusion",
}
_ROWS = {"text": 1, "images": 4, "clips": 4, "masked": 4}
_SUFFIX = {"text": ".jsonl", "masked": ".jsonl", "images": ".png", "clips": ".gif"}


def add_sample(commands: Any) -> argparse.ArgumentParser:
    """Add `dew sample`'s parser to `commands`, and return it."""
    sample = commands.add_parser(
        "sample",
        help="draw from a trained LM or diffusion run",
        description="Load a generative run (dew.load_run) and draw from it. A causal LM "
        "continues each prompt (decoded with the run's tokenizer and printed, or written to "
        "--out FILE.jsonl); without a prompt it continues the openings of its data's first "
        "rows. A diffusion run draws --rows samples of each --class (every class when none is "
        "named) into one labelled grid, --out FILE.png (clips: an animated FILE.gif). A masked "
        "diffusion run generates whole rows. Beside every file it writes FILE.sampling.json: "
        "the run, checkpoint step and weights, the seed and the sampler's settings, and the "
        "conditioning, so that a score computed on the samples later can be compared. The same "
        "seed draws the same samples.",
    )
    run_arguments(sample)
    common = sample.add_argument_group("every run")
    common.add_argument("--seed", type=int, default=0, metavar="S", help="the draw (default 0)")
    common.add_argument(
        "--rows",
        type=int,
        metavar="N",
        help="samples per prompt (LM, default 1), per class (diffusion, default 4; an "
        "unconditional model: in all) or in all (masked diffusion, default 4)",
    )
    common.add_argument(
        "--out",
        metavar="FILE",
        help="where to write: FILE.jsonl for text (default: printed), FILE.png for images, "
        "FILE.gif for clips (needed for diffusion)",
    )
    text = sample.add_argument_group("causal LM runs")
    text.add_argument(
        "--prompt",
        action="append",
        metavar="TEXT",
        help="a prompt (repeatable): text where the run recorded a tokenizer, else token IDs "
        "separated by spaces; '' starts a new document",
    )
    text.add_argument(
        "--prompts",
        metavar="FILE",
        help="prompts from a file: one a line, or a .jsonl file of strings or "
        '{"prompt": ...} objects',
    )
    text.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="new tokens per sample, at most (default 64, or what fits after the prompt)",
    )
    text.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="softmax temperature; 0 is greedy (default 1)",
    )
    text.add_argument("--top-k", type=int, metavar="K", help="draw from the K likeliest tokens")
    text.add_argument("--top-p", type=float, metavar="P", help="draw from the nucleus of mass P")
    diffusion = sample.add_argument_group("diffusion runs")
    diffusion.add_argument(
        "--class",
        dest="classes",
        action="append",
        metavar="NAME_OR_INDEX",
        help="a class to draw (repeatable): a name the run's data recorded, or its index",
    )
    diffusion.add_argument(
        "--guidance", type=float, metavar="W", help="classifier-free guidance (default: the run's)"
    )
    diffusion.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="sampler steps (default: the run's; masked diffusion too)",
    )
    diffusion.add_argument(
        "--solver", choices=("euler", "heun"), help="the ODE solver (default: the run's)"
    )
    return sample


def _sample(args: argparse.Namespace) -> int:
    from dew._integers import check_integer
    from dew._sample import sampler_kind
    from dew.config import load_run

    check_integer("--seed", args.seed, minimum=0, maximum=2**32 - 1)
    check_integer("--rows", args.rows, minimum=1, optional=True)
    check_integer("--max-tokens", args.max_tokens, minimum=1, optional=True)
    check_integer("--top-k", args.top_k, minimum=1, optional=True)
    check_integer("--steps", args.steps, minimum=1, optional=True)
    _check_number("--temperature", args.temperature, "a finite number >= 0", lambda x: x >= 0)
    _check_number("--top-p", args.top_p, "a number in (0, 1]", lambda x: 0 < x <= 1)
    _check_number("--guidance", args.guidance, "a finite number >= 0", lambda x: x >= 0)
    out = None if args.out is None else pathlib.Path(args.out)
    if out is not None and not out.parent.is_dir():
        raise FileNotFoundError(
            f"--out {args.out!r}: no folder {str(out.parent)!r} to write it in."
        )
    prompts = list(args.prompt or []) + _prompts_file(args.prompts)
    loaded = load_run(args.run_dir, step=args.step, weights=args.weights)
    kind = sampler_kind(loaded)
    for name, flag in _OPTION.items():
        if getattr(args, name) is not None and name not in _TAKES[kind]:
            takes = ", ".join(_OPTION[taken] for taken in _TAKES[kind])
            raise ValueError(
                f"{flag}: {loaded.folder} is {_WHAT[kind]} run, which takes {takes} "
                "(and --seed, --rows, --out)."
            )
    if out is not None and out.suffix != _SUFFIX[kind]:
        raise ValueError(
            f"--out {args.out!r}: {_WHAT[kind]} run's samples are written as FILE{_SUFFIX[kind]}."
        )
    rows = _ROWS[kind] if args.rows is None else args.rows
    if kind == "text":
        return _text(args, loaded, prompts, rows, out)
    if kind == "masked":
        from dew._sample import sample_masked

        samples, protocol = sample_masked(loaded, rows=rows, seed=args.seed, steps=args.steps)
        return _written_rows(loaded, samples, protocol, out)
    if out is None:  # images or clips
        raise ValueError(
            f"{_WHAT[kind]} run's samples are a labelled grid: pass --out FILE{_SUFFIX[kind]}."
        )
    return _grid(args, loaded, rows, out)


def _check_number(flag: str, value: float | None, allowed: str, holds: Any) -> None:
    if value is not None and not (math.isfinite(value) and holds(value)):
        raise ValueError(f"{flag} must be {allowed}, got {value!r}.")


def _prompts_file(path: str | None) -> list[str]:
    """The prompts in `path`: one a line (blank lines skipped), or a JSON Lines file of
    strings or `{"prompt": ...}` objects."""
    if path is None:
        return []
    file = pathlib.Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--prompts {path!r}: no such file.")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ValueError(f"--prompts {path!r}: not UTF-8 text ({error.reason}).") from None
    if file.suffix != ".jsonl":
        found = [line for line in lines if line.strip()]
    else:
        found = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"--prompts {path!r}, line {number}: not JSON ({error.msg})."
                ) from None
            if isinstance(value, dict):
                value = value.get("prompt")
            if not isinstance(value, str):
                raise ValueError(
                    f"--prompts {path!r}, line {number}: a line is a string or an object "
                    'with a "prompt" string.'
                )
            found.append(value)
    if not found:
        raise ValueError(f"--prompts {path!r} holds no prompt.")
    return found


def _text(args: argparse.Namespace, loaded: Any, prompts: list[str], rows: int, out: Any) -> int:
    from dew._sample import sample_text, text_prompts

    ids, shown = text_prompts(loaded, prompts)
    samples, protocol = sample_text(
        loaded,
        ids,
        shown,
        max_new_tokens=args.max_tokens,
        temperature=1.0 if args.temperature is None else args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        rows=rows,
    )
    return _written_rows(loaded, samples, protocol, out)


def _written_rows(loaded: Any, samples: list[dict], protocol: dict, out: Any) -> int:
    """Text samples printed (each under a line naming it), or written as JSON Lines with
    their protocol beside."""
    if out is None:
        for number, sample in enumerate(samples, 1):
            if loaded.tokenizer is None:
                opening = sample.get("prompt")
                joined = sample["text"] if opening is None else f"{opening} | {sample['text']}"
                print(joined)
                continue
            print(f"--- sample {number} of {len(samples)} ---")
            print(sample.get("prompt", "") + sample["text"])
        return 0
    content = "".join(json.dumps(sample, ensure_ascii=False) + "\n" for sample in samples)
    _write(out, content.encode("utf-8"), protocol)
    _said(loaded, f"{len(samples)} samples", out)
    return 0


def _grid(args: argparse.Namespace, loaded: Any, rows: int, out: pathlib.Path) -> int:
    from dew._sample import class_labels, sample_images
    from dew.tracking._preview import Animation, Picture, Preview, render_preview

    labels = class_labels(loaded, args.classes or [])
    artifact, protocol = sample_images(
        loaded,
        labels,
        rows=rows,
        seed=args.seed,
        guidance=args.guidance,
        steps=args.steps,
        solver=args.solver,
    )
    (piece,) = render_preview(Preview(artifact, classes=loaded.classes))
    if not isinstance(piece, Animation | Picture):  # a grid of images or clips, always
        raise TypeError(f"sampled images rendered as {type(piece).__name__}, not a grid.")
    _write(out, piece.gif if isinstance(piece, Animation) else piece.png, protocol)
    _said(loaded, f"a grid of {len(artifact.generated)} samples", out)
    return 0


def _record_path(out: pathlib.Path) -> pathlib.Path:
    return out.with_name(f"{out.stem}.sampling.json")


def _write(out: pathlib.Path, content: bytes, protocol: dict[str, Any]) -> None:
    """`content` to `out`, then the sampling record naming it (with its SHA-256) beside it;
    each whole or not at all."""
    from dew._json import write_atomic

    write_atomic(out, content)
    record = {**protocol, "file": out.name, "sha256": hashlib.sha256(content).hexdigest()}
    write_atomic(_record_path(out), json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def _said(loaded: Any, what: str, out: pathlib.Path) -> None:
    weights = "EMA" if loaded.weights == "ema" else "live"
    _say(
        f"wrote {what} to {out} (how they were drawn: {_record_path(out)}): {loaded.folder}, "
        f"step {loaded.step}, {weights} weights"
    )
