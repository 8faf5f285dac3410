"""Assertions shared by the tests."""

import contextlib
import re

import jaxtyping
import pytest


@contextlib.contextmanager
def rejects(error: type[Exception], match: str, *, parameter: str):
    """Expect dew's own `error` matching `match`, or, where the test session's
    runtime type checker (jaxtyping + beartype) rejects the argument first, its
    `TypeCheckError` naming `parameter`. Either way the bad input must not pass."""
    with pytest.raises((error, jaxtyping.TypeCheckError)) as caught:
        yield
    if isinstance(caught.value, jaxtyping.TypeCheckError):
        assert f"parameter '{parameter}'" in str(caught.value), str(caught.value)
    else:
        assert re.search(match, str(caught.value)), str(caught.value)
