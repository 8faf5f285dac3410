"""The training window's reductions (`Trainer.fit(train_reduction=...)`,
`trainer.train_reduction`), apart from the window itself (`dew.training._window`, which
imports JAX), so a configuration checks the value without JAX (decision 0047)."""

__all__ = ["TRAIN_REDUCTIONS"]

TRAIN_REDUCTIONS: tuple[str, ...] = ("mean", "last")
"""`"mean"`: each training metric a log step reports is its mean over the window;
`"last"`: the log step's own value."""
