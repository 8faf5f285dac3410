"""The policies `Trainer.fit`'s loop asks at each step, one concept a module (decision 0066).

In the order the loop asks them: the training window's reports (`_train_window`), the
non-finite guard (`_nonfinite_guard`), early stopping (`dew._loop._stopping`, shared with
`run_supervised`), evaluation with its final evaluation (`_evaluation`), checkpoints with the
save on Ctrl-C (`_checkpointing`), then the user's callbacks. The profile window
(`dew.training._profile_window`) brackets the compiled calls themselves; the console and the
lifecycle records are the loop's own (`dew._loop`).
"""
