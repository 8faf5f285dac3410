"""Built-in run configurations: `tiny_lm` (what `dew train` trains with no file),
`tiny_diffusion`, `tiny_video_diffusion`, `tiny_jepa` and `tiny_classifier`, each by name
(`builtin(name)`, `dew train --config NAME`)."""

from dew.config._config import RunConfig
from dew.config._data import DataConfig
from dew.config._sections import ModelConfig, ObjectiveConfig, OptimConfig, TrainerConfig

__all__ = [
    "BUILTIN_CONFIGS",
    "builtin",
    "tiny_classifier",
    "tiny_diffusion",
    "tiny_jepa",
    "tiny_lm",
    "tiny_video_diffusion",
]


def tiny_lm() -> RunConfig:
    """A small causal LM on `token_windows`' synthetic Markov chain (16 token IDs, 32
    predicted positions), trained for 300 steps with a cosine-decayed AdamW, evaluated
    every 100 and checkpointed every 100, as the run `quickstart` under `runs/`. About
    15 seconds on 2 CPU cores; it ends near the chain's entropy rate (perplexity about 6.3).

    ```python
    >>> config = tiny_lm()
    >>> config.trainer.name, config.model.name, config.data.kwargs["seq_len"]
    ('quickstart', 'causal_transformer', 32)

    ```
    """
    return RunConfig(
        model=ModelConfig(
            "causal_transformer",
            {
                "vocab_size": 16,
                "emb_features": 64,
                "num_layers": 2,
                "num_heads": 4,
                "mlp_features": 128,
                "max_seq_len": 40,
            },
        ),
        # 8191 windows, 2% held out: 300 steps of 32 rows see each training window about once.
        data=DataConfig(
            "token_windows",
            {"seq_len": 32, "vocab_size": 16, "num_tokens": 262144, "val_fraction": 0.02},
        ),
        optim=OptimConfig(optimizer="adamw", learning_rate=3e-3, schedule="cosine"),
        trainer=TrainerConfig(
            name="quickstart",
            checkpoint_dir="runs",
            steps=300,
            batch_size=32,
            log_every=50,
            eval_every=100,
            checkpoint_every=100,
            seed=0,
        ),
        objective=ObjectiveConfig("lm"),
    )


def tiny_diffusion() -> RunConfig:
    """A class-conditional `DiT` (width 96, depth 2, 8x8 patches: 4 tokens an image, 410k
    parameters) that predicts the clean image (`prediction="data"`), trained by rectified
    flow on `shapes` (16x16 squares, discs and bars, labelled by kind) for 4500 steps of 32
    images with a cosine-decayed Adam (2e-3), keeping EMA weights (decay 0.99), as the run
    `tiny-diffusion` under `runs/`. Every 1500 steps it checkpoints and previews four samples
    generated with the EMA weights (20 Euler steps, classifier-free guidance 2.5,
    conditioned on the first validation rows' labels) as one labelled grid, the samples
    enlarged to 64 pixels above the real rows that conditioned them, each captioned with its
    kind: `previews/diffusion/validation/samples/<step>/grid.png` in the run folder.

    Its validation metrics are the shape scores (`dew.metrics.shape_scores`: one sample per
    held-out row, conditioned on its label): `class_accuracy`, the share of samples a small
    shapes classifier (trained on the first use and cached) names the kind they were asked
    for, and the samples' foreground fraction, colour spread and number of pieces beside the
    real rows'; and FID (`dew.metrics.fid()`, the 64 held-out rows against as many samples)
    when pytorch-fid's weights are at `dew.nn.inception.default_weights_path()`, without
    which `dew train` and `dew eval` print `fid skipped: no weights at <path> (...)` and go
    on. FID over 64 rows is not FID-50k: it compares checkpoints of this run, nothing else.

    Measured without FID weights, with `dew train --config tiny_diffusion` on 2 CPU cores
    (decision 0042): 68 s of wall time (88 s of CPU) on otherwise idle cores, where the
    1500-step configuration it replaced took 41 s (59 s) back to back; the first run on a
    machine takes 11 s more, to train the shapes classifier it then keeps. The loss
    falls from about 0.9 (a fresh DiT predicts zeros) to 0.18 at step 100 and 0.061 at step
    4500; `class_accuracy` is 0.67, 0.86 and 0.95 at steps 1500, 3000 and 4500 (chance is
    1/3; the configuration it replaced scored 0.31), one piece an image (1.23 on average; 3.86
    before) of about the data's area (0.20 of the image where the real rows cover 0.14: the
    edges are soft, which is also the colour spread of 0.20).

    ```python
    >>> config = tiny_diffusion()
    >>> config.model.name, config.data.name, config.objective.name, config.trainer.preview
    ('dit', 'shapes', 'diffusion', True)

    ```
    """
    return _diffusion_run(
        "tiny-diffusion", "shapes", frames=None, batch_size=32, steps=4500, every=1500
    )


def tiny_video_diffusion() -> RunConfig:
    """`tiny_diffusion` on clips: a class-conditional `DiT` over 4 frames (16 tokens, the same
    code path, with a learned time position embedding) trained on `moving_shapes` (one shape
    moving at a constant velocity) for 2000 steps of 16 clips, as the run
    `tiny-video-diffusion` under `runs/`; every 500 steps it checkpoints and previews one
    animated grid, 4 frames of every clip in step beside the real clips
    (`.../samples/<step>/grid.gif`). Its validation metrics are the shape scores of every frame
    (no FID: it is defined for images). Measured with `dew train --config tiny_video_diffusion`
    on 2 otherwise idle CPU cores: 70 s of wall time (101 s of CPU), where the 1000-step
    configuration it replaced (4x4 patches, velocity prediction) took 48 s (77 s) back to back;
    the loss falling from about 0.9 to 0.18 at step 100 and 0.065 at step 2000,
    `class_accuracy` 0.74 at step 2000 (0.44 before), 1.37 pieces a frame (4.15 before).

    ```python
    >>> config = tiny_video_diffusion()
    >>> config.model.kwargs["frames"], config.data.name, config.trainer.batch_size
    (4, 'moving_shapes', 16)

    ```
    """
    return _diffusion_run(
        "tiny-video-diffusion", "moving_shapes", frames=4, batch_size=16, steps=2000, every=500
    )


def _diffusion_run(
    name: str, dataset: str, *, frames: int | None, batch_size: int, steps: int, every: int
) -> RunConfig:
    model = {
        "image_size": 16,
        # 8x8 patches: 4 tokens an image, each predicting its 192 clean values (data
        # prediction); 4x4 patches gave 16 tokens that each drew a fragment (decision 0042).
        "patch_size": 8,
        "channels": 3,
        "width": 96,
        "depth": 2,
        "heads": 4,
        "num_classes": 3,  # SHAPE_KINDS: square, disc, bar
    }
    if frames is not None:
        model["frames"] = frames
    return RunConfig(
        model=ModelConfig("dit", model),
        # 1024 rows, 64 held out: the preview reads the first validation batch.
        data=DataConfig(dataset, {"rows": 1024, "val_fraction": 0.0625}),
        optim=OptimConfig(optimizer="adam", learning_rate=2e-3, schedule="cosine"),
        trainer=TrainerConfig(
            name=name,
            checkpoint_dir="runs",
            steps=steps,
            batch_size=batch_size,
            log_every=100,
            eval_every=every,
            checkpoint_every=every,
            seed=0,
            preview=True,
        ),
        objective=ObjectiveConfig(
            "diffusion",
            {
                "sampling": {"solver": "euler", "steps": 20, "guidance": 2.5},
                "label_dropout": 0.1,
                "ema_decay": 0.99,
                "prediction": "data",
                "shape_scores": True,
            },
        ),
    )


def tiny_jepa() -> RunConfig:
    """I-JEPA on `shapes`: a `ViT` encoder (width 64, depth 2, 4x4 patches) learns to
    predict, from the context patches, its EMA target encoder's (decay 0.99) per-token
    normalised features of two random 2x2-patch target blocks, through a width-32, depth-1
    predictor; 600 steps of 64 images with a cosine-decayed Adam (1e-3), as the run
    `tiny-jepa` under `runs/`. Every 200 steps it checkpoints and scores the target (EMA)
    encoder's mean-pooled features with the batch linear and kNN probes of the shape kind
    (`val/batch_linear_probe_accuracy`, `val/batch_knn_probe_accuracy`: fitted on half of
    each validation batch, tested on the other half; chance is 1/3), and previews those
    features as the `histogram.json` of their per-dimension spread under the run folder's
    `previews/jepa/validation/samples/<step>/`; `dew eval` rescores the last checkpoint's EMA
    encoder.

    Measured with `dew train --config tiny_jepa` on 2 CPU cores: 26 s wall, the loss
    falling from 1.08 at step 1 to 0.013 at step 600 (target feature std 0.14 -> 0.047),
    probes 0.50 (linear) and 0.42 (kNN) at step 600: above chance, but no better than
    after a single step (0.48 and 0.48), since even barely trained features separate the
    shape kinds this well.

    ```python
    >>> config = tiny_jepa()
    >>> config.model.name, config.objective.name, config.objective.kwargs["probe_classes"]
    ('vit', 'jepa', 3)

    ```
    """
    return RunConfig(
        model=ModelConfig(
            "vit",
            {"image_size": 16, "patch_size": 4, "channels": 3, "width": 64, "depth": 2, "heads": 4},
        ),
        # 1024 images, 128 held out: two validation batches of 64, each probe fitting on 32.
        data=DataConfig("shapes", {"rows": 1024, "val_fraction": 0.125}),
        optim=OptimConfig(optimizer="adam", learning_rate=1e-3, schedule="cosine"),
        trainer=TrainerConfig(
            name="tiny-jepa",
            checkpoint_dir="runs",
            steps=600,
            batch_size=64,
            log_every=50,
            eval_every=200,
            checkpoint_every=200,
            seed=0,
            preview=True,
        ),
        objective=ObjectiveConfig(
            "jepa",
            {
                "predictor": {"width": 32, "depth": 1, "heads": 2},
                "ema_decay": 0.99,
                "masks": {"targets": 2, "height": 2, "width": 2},
                "probe_classes": 3,  # SHAPE_KINDS: square, disc, bar
            },
        ),
    )


def tiny_classifier() -> RunConfig:
    """A shape-kind classifier on `shapes`: a `ViT` encoder (width 32, depth 1, 4x4 patches)
    whose mean-pooled tokens a linear head maps to the 3 kinds' logits, trained by cross
    entropy (`ClassifierObjective`) for 150 steps of 64 images with a cosine-decayed Adam
    (3e-3), as the run `tiny-classifier` under `runs/`. Every 50 steps it scores the 128
    held-out images with `accuracy`, `cross_entropy`, `f1` (macro) and
    `expected_calibration_error`; every 150 it checkpoints.

    ```python
    >>> config = tiny_classifier()
    >>> config.model.name, config.objective.name, config.objective.kwargs["classes"]
    ('vit', 'classifier', 3)

    ```
    """
    return RunConfig(
        model=ModelConfig(
            "vit",
            {"image_size": 16, "patch_size": 4, "channels": 3, "width": 32, "depth": 1, "heads": 2},
        ),
        data=DataConfig("shapes", {"rows": 1024, "val_fraction": 0.125}),
        optim=OptimConfig(optimizer="adam", learning_rate=3e-3, schedule="cosine"),
        trainer=TrainerConfig(
            name="tiny-classifier",
            checkpoint_dir="runs",
            steps=150,
            batch_size=64,
            log_every=25,
            eval_every=50,
            checkpoint_every=150,
            seed=0,
        ),
        objective=ObjectiveConfig(
            "classifier",
            {"classes": 3, "inputs": "images"},  # SHAPE_KINDS: square, disc, bar
        ),
    )


_BUILDERS = {
    "tiny_lm": tiny_lm,
    "tiny_diffusion": tiny_diffusion,
    "tiny_video_diffusion": tiny_video_diffusion,
    "tiny_jepa": tiny_jepa,
    "tiny_classifier": tiny_classifier,
}

BUILTIN_CONFIGS: tuple[str, ...] = tuple(_BUILDERS)
"""The names of dew's built-in run configurations, as `builtin` and `dew train --config`
take them."""


def builtin(name: str) -> RunConfig:
    """The built-in run configuration named `name` (one of `BUILTIN_CONFIGS`).

    ```python
    >>> builtin("tiny_diffusion") == tiny_diffusion()
    True
    >>> builtin("tiny")
    Traceback (most recent call last):
    ...
    ValueError: no built-in run configuration is named 'tiny'; the built-in ones are
    'tiny_lm', 'tiny_diffusion', 'tiny_video_diffusion', 'tiny_jepa', 'tiny_classifier'.

    ```
    """
    if not isinstance(name, str) or name not in _BUILDERS:
        known = ", ".join(repr(known) for known in BUILTIN_CONFIGS)
        raise ValueError(
            f"no built-in run configuration is named {name!r}; the built-in ones are {known}."
        )
    return _BUILDERS[name]()
