"""The precision policies' names (`Trainer(precision=...)`, `trainer.precision`), apart from
the policies themselves (`dew._precision`, which imports JAX), so a configuration checks the
value without JAX (decision 0047)."""

__all__ = ["PRECISIONS", "check_precision"]

PRECISIONS: tuple[str, ...] = ("float32", "bfloat16", "mixed_bfloat16")
"""The precision policies a `Trainer`, a step, an evaluation and a configuration take
(decision 0078): `"float32"`; `"mixed_bfloat16"`, bfloat16 compute with the delicate parts
in float32; `"bfloat16"`, bfloat16 compute throughout the built-in layers. Params and
optimizer state are float32 under each."""


def check_precision(precision: object, name: str = "precision") -> str:
    """`precision` when it names a policy of `PRECISIONS`; else a `ValueError` naming the
    value and the policies (`name`: the knob, as the user wrote it).

    ```python
    >>> try:
    ...     check_precision("float8", "trainer.precision")
    ... except ValueError as error:
    ...     print(error)
    trainer.precision must be one of 'float32', 'bfloat16', 'mixed_bfloat16', got 'float8'.

    ```
    """
    if not isinstance(precision, str) or precision not in PRECISIONS:
        allowed = ", ".join(repr(policy) for policy in PRECISIONS)
        raise ValueError(f"{name} must be one of {allowed}, got {precision!r}.")
    return str.__str__(precision)
