"""Small runs of the built-in configurations, trained for the tests that load, predict from and
export a run (test_load_run.py, test_predict.py, test_export.py): each a few steps of a
narrower model than the built-in one, checkpointed at steps 1 and 2."""

import pathlib

from dew.config import builtin, override

_TRAINER = {"trainer.steps": 2, "trainer.batch_size": 8, "trainer.checkpoint_every": 1}
_SIZES = {
    "tiny_classifier": {"model.kwargs.width": 16, "model.kwargs.heads": 2, "data.kwargs.rows": 48},
    "tiny_diffusion": {
        "model.kwargs.width": 16,
        "model.kwargs.depth": 1,
        "model.kwargs.heads": 2,
        "data.kwargs.rows": 48,
        "trainer.preview": False,
    },
    "tiny_lm": {"model.kwargs.emb_features": 16, "model.kwargs.mlp_features": 32},
}


def trained(name: str, root: pathlib.Path):
    """The built-in configuration `name`, narrowed and trained for 2 steps under `root`: its
    run folder and the final `TrainState` the fit returned."""
    config = override(
        builtin(name), {**_SIZES[name], **_TRAINER, "trainer.checkpoint_dir": str(root)}
    )
    state = config.train(progress=False)
    return root / config.trainer.name, state
