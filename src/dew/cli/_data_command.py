"""`dew data inspect CONFIG_OR_RUN`: the data a run trains on; `dew data tokenizer FILES`: a
BPE tokenizer trained on your files (`dew.data.tokenizers.train_tokenizer`)."""

import argparse
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from dew.cli._inputs import _configure

__all__ = ["_data"]


def _data(args: argparse.Namespace) -> int:
    if args.data_action == "tokenizer":
        return _tokenizer(args)
    return _inspect(args)


def _captions(arrays: Mapping[str, Any], classes: Sequence[str] | None, count: int) -> list[str]:
    """Each image's caption: its class name, else its label, else its row in the batch."""
    from dew.cli._inspect import label_field

    label = label_field(arrays)
    if label is None:
        return [f"row {row}" for row in range(count)]
    values = [int(value) for value in arrays[label]]
    if classes:
        return [classes[value] if 0 <= value < len(classes) else str(value) for value in values]
    return [str(value) for value in values]


def _inspect(args: argparse.Namespace) -> int:
    """Build the data `args.config` names, as `dew train` would (a text source's token cache
    in the run folder, `<checkpoint_dir>/<name>/data-cache`, which the run then reuses), and
    print its summary or its JSON; a batch of images is also written as a contact sheet."""
    from dew._run_folder import RunFolder, run_folder
    from dew.cli._contact_sheet import contact_sheet
    from dew.cli._inspect import batch_view, image_fields, summary, summary_lines

    config = _configure(args)
    name = config.trainer.name
    data = config.data.build(
        batch_size=config.trainer.batch_size,
        seed=config.trainer.seed,
        cache_dir=None if name is None else RunFolder(run_folder(config, name)[1]).data_cache,
    )
    view = batch_view(data, args.split, args.step, config.data.name)
    classes = getattr(data, "classes", None)
    found = summary(data, view, source=config.data.name, shown_rows=args.rows, classes=classes)
    images = image_fields(view.arrays)
    if args.out is not None and not images:
        raise ValueError(
            f"--out writes a contact sheet of images, but the dataset {config.data.name!r} "
            f"has no image field (its batch holds {', '.join(view.arrays) or 'nothing'})."
        )
    if images:
        split = "val" if args.split == "val" else "train"
        out = args.out or f"{config.data.name}-{split}-step{args.step}.png"
        array = view.arrays[images[0]]
        captions = _captions(view.arrays, classes, len(array))
        path, values = contact_sheet(array, captions, out)
        found["batch"]["contact_sheet"] = {
            "path": os.fspath(path),
            "field": images[0],
            "values": values,
        }
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        for line in summary_lines(found):
            print(line)
    return 0


def _tokenizer(args: argparse.Namespace) -> int:
    """Train a byte-level BPE `tokenizer.json` on `args.files` and say how to train on it."""
    from dew.data.tokenizers import END_OF_TEXT, train_tokenizer

    out = pathlib.Path(args.out)
    if out.exists() and not out.is_dir() and not args.force:
        raise FileExistsError(f"{args.out!r} exists; pass --force to replace it.")
    trained = train_tokenizer(
        args.files,
        args.vocab_size,
        out,
        field=args.field,
        min_frequency=args.min_frequency,
        overwrite=args.force,
    )
    print(
        f"wrote {args.out}: vocab_size {trained.vocab_size:,}, end of document "
        f"{END_OF_TEXT!r} (ID {trained.eos_id})"
    )
    if trained.vocab_size < args.vocab_size:
        print(
            f"  the vocabulary stops below the {args.vocab_size:,} asked for: the corpus has "
            f"no more pairs that occur {args.min_frequency} times or more to merge"
        )
    print(
        f"  train on it: [data.kwargs] tokenizer = {json.dumps(os.fspath(out))} and "
        f"[model.kwargs] vocab_size = {trained.vocab_size} or more"
    )
    return 0
