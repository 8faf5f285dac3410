"""dew._checks: the integer check, host-or-traced array checks and the failure translator."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _builders import tiny_lm_objective
from hypothesis import given
from hypothesis import strategies as st

from dew._checks import batch_error, check_ids, error_if, explain_failure, failed_check
from dew._integers import NotAnIntegerError, check_integer

OBJECTIVE = tiny_lm_objective()


@pytest.mark.parametrize(
    "value", [3, np.int64(3), np.int32(3), np.uint8(3), jnp.int32(3), np.array(3, np.int16)]
)
def test_python_numpy_and_jax_integers_are_integers_alike(value):
    checked = check_integer("steps", value, minimum=1)
    assert checked == 3 and type(checked) is int


@pytest.mark.parametrize(
    "value", [True, np.bool_(True), 3.0, np.float64(3.0), "3", None, [3], np.array([3])]
)
def test_everything_else_is_refused_with_one_message_form(value):
    with pytest.raises(NotAnIntegerError) as caught:
        check_integer("steps", value, minimum=1)
    assert str(caught.value) == f"steps must be an integer >= 1, got {value!r}."
    # A wrong type is both kinds of error, so either `except` clause catches it.
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)


@given(st.integers(-(2**70), 2**70), st.integers(-5, 5), st.integers(-5, 5))
def test_the_range_is_inclusive_and_the_message_names_it(value, low, high):
    if low <= value <= high:
        assert check_integer("n", value, minimum=low, maximum=high) == value
        return
    with pytest.raises(ValueError, match=r"^n must be") as caught:
        check_integer("n", value, minimum=low, maximum=high)
    assert not isinstance(caught.value, TypeError)  # an integer out of range
    assert str(caught.value) == f"n must be an integer between {low} and {high}, got {value!r}."


def test_optional_integers_take_none_and_say_so():
    assert check_integer("top_k", None, minimum=1, optional=True) is None
    with pytest.raises(ValueError, match=r"^top_k must be None or an integer >= 1, got 0\.$"):
        check_integer("top_k", 0, minimum=1, optional=True)
    with pytest.raises(ValueError, match=r"^n must be an integer <= 2, got 3\.$"):
        check_integer("n", 3, maximum=2)
    with pytest.raises(ValueError, match=r"^n must be an integer, got 'x'\.$"):
        check_integer("n", "x")


def test_a_host_check_names_the_first_bad_value_and_where_it_is():
    values = np.array([[0, 1], [2, 9]])
    with pytest.raises(ValueError, match="token ID 9") as caught:
        check_ids(values, 4, subject="x", noun="token ID", size_name="vocab_size", axes=("a", "b"))
    assert str(caught.value) == (
        "x holds token ID 9 at a 1, b 1; valid IDs are 0 to 3 (vocab_size=4)."
    )
    assert check_ids(values, 10, subject="x", noun="label", size_name="n", axes="ab") is values


def test_a_traced_check_raises_when_the_compiled_call_runs():
    @jax.jit
    def checked(values):
        return check_ids(values, 4, subject="x", noun="label", size_name="n", axes=("row",))

    assert checked(jnp.array([0, 3])).tolist() == [0, 3]
    # Equinox's error, wrapped by JAX's runtime error (a ValueError or RuntimeError).
    with pytest.raises((RuntimeError, ValueError), match=r"x holds labels outside \[0, 4\)"):
        jax.block_until_ready(checked(jnp.array([0, -1])))


def test_error_if_without_a_locator_raises_its_message():
    assert error_if(1, np.zeros(3, bool), "never") == 1
    with pytest.raises(ValueError, match=r"^always$"):
        error_if(1, np.array([False, True]), "always")


def _bad_batch():
    text = np.zeros((2, 9), np.int32)
    text[1, 4] = 5
    return {"text": text}


def test_a_failed_compiled_call_becomes_the_host_check():
    loss = jax.jit(OBJECTIVE.loss)
    with (
        pytest.raises(ValueError, match="token ID 5") as caught,
        explain_failure(OBJECTIVE, _bad_batch()),
    ):
        jax.block_until_ready(loss(OBJECTIVE.init_params(), _bad_batch(), jax.random.key(0)))
    assert str(caught.value) == (
        "LMObjective: batch['text'] holds token ID 5 at row 1, position 4; "
        "valid IDs are 0 to 3 (vocab_size=4)."
    )
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_failure_the_checks_do_not_explain_propagates_unchanged():
    error = RuntimeError("a real bug")
    clean = {"text": np.zeros((2, 9), np.int32)}
    with pytest.raises(RuntimeError) as caught, explain_failure(OBJECTIVE, [clean, clean]):
        raise error
    assert caught.value is error


def test_batch_error_reads_the_batches_only_on_failure_and_finds_the_first_bad_one():
    clean = {"text": np.zeros((2, 9), np.int32)}
    assert batch_error(OBJECTIVE, [clean, clean]) is None
    assert "token ID 5" in str(batch_error(OBJECTIVE, [clean, _bad_batch(), clean]))
    missing = batch_error(OBJECTIVE, [{"tokens": clean["text"]}])  # a missing key explains too
    assert str(missing) == "LMObjective reads batch key 'text', but the batch has 'tokens'."
    with explain_failure(OBJECTIVE, _bad_batch()):  # nothing raised: nothing checked
        pass


def _failure_at_fetch(message):
    """The error a compiled `eqx.error_if` check raises wherever its output is fetched."""
    failing = jax.jit(lambda x: eqx.error_if(x, x > 0, message))
    try:
        jax.device_get(failing(jnp.ones(())) + 1)
    except Exception as error:
        return error
    raise AssertionError("the check did not fire")


def test_failed_check_reads_the_traced_message_from_the_runtime_error():
    message = "Thing: batch['x'] holds values outside [0, 1] (or NaN); values must lie in [0, 1]."
    error = _failure_at_fetch(message)
    assert "Equinox" in str(error)  # the raw text is JAX's and Equinox's
    assert str(failed_check(error)) == message
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = error
    assert str(failed_check(wrapped)) == message  # found along the cause chain
    assert failed_check(RuntimeError("a real bug")) is None


def test_explain_failure_falls_back_on_the_traced_message_when_the_batches_pass():
    clean = {"text": np.zeros((2, 9), np.int32)}
    error = _failure_at_fetch("LMObjective: something traced went wrong.")
    with (
        pytest.raises(ValueError, match=r"^LMObjective: something traced") as caught,
        explain_failure(OBJECTIVE, clean),
    ):
        raise error
    assert caught.value.__suppress_context__


def test_a_check_that_fires_after_dispatch_is_raised_once_not_again_at_exit():
    # JAX keeps a failed call's runtime token, which every later `jax.effects_barrier()`
    # and JAX's own exit handler raise again (under jax.distributed the exit handler then
    # skips the distributed shutdown, and every process aborts): once dew has raised its
    # ValueError, that failure is settled.
    message = "the late value is positive."
    check = jax.jit(lambda x: eqx.error_if(x, x > 0, message))
    # Compiled ahead, its first call (the one whose token JAX keeps) is dispatched at once.
    check.lower(jax.ShapeDtypeStruct((), jnp.float32)).compile()
    late = jax.jit(lambda a: jax.lax.fori_loop(0, 60, lambda _, b: b @ a, a).sum() + 1.0)
    start = jnp.ones((600, 600)) / 600
    jax.block_until_ready(late(start))  # compiled and run: its next call is dispatched async
    clean = {"text": np.zeros((2, 9), np.int32)}
    with pytest.raises(ValueError, match=message), explain_failure(OBJECTIVE, clean):
        jax.device_get(check(late(start)))  # the check fires after the call returned
    jax.effects_barrier()  # nothing left to raise
