"""An Optuna study's RDB storage as a sweep opens and uses it: the study created once even when
several workers start together on a fresh storage, and a storage that cannot be opened or is
lost mid-sweep as one error naming its URL (decision 0053)."""

from __future__ import annotations

import contextlib
import itertools
import random
import time
from collections.abc import Iterator
from typing import Any

STORAGE_URLS = (
    "sqlite:///PATH, postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE "
    '(pip install "dew-ml[postgres]") or mysql+pymysql://USER:PASSWORD@HOST/DATABASE'
)
"""The storage URLs a sweep takes, for error messages."""
_ATTEMPTS = 8
"""How often opening a fresh storage is tried while other workers create it too."""
_DRIVERS = frozenset({"sqlalchemy", "psycopg", "psycopg2", "sqlite3", "pymysql", "MySQLdb"})
_RACES = ("already exists", "database is locked", "duplicate key")


class StorageError(ConnectionError, ValueError):
    """An Optuna storage that cannot be opened (a bad URL, a missing driver, a database that
    does not answer) or that was lost mid-sweep: one line for the user, naming the URL. A
    `ValueError` too, so every process of a multi-process run reports it the same way."""


def shown_url(storage: Any) -> str:
    """The storage as an error names it: a URL with its password hidden."""
    if not isinstance(storage, str):
        return type(storage).__name__
    try:
        from sqlalchemy.engine import make_url

        return make_url(storage).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: shown as given
        return storage


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _a_race(error: BaseException) -> bool:
    """Whether `error` is another worker creating the same storage or study at this moment
    (optuna#1092, #4621): a unique key or a table that already exists, a locked SQLite file."""
    for link in _chain(error):
        name = type(link).__name__
        if name in ("IntegrityError", "DuplicatedStudyError", "UniqueViolation"):
            return True
        if any(race in str(link).lower() for race in _RACES):
            return True
    return False


def _driver_text(error: BaseException) -> str:
    """The database driver's own first line, without SQLAlchemy's background link."""
    for link in _chain(error):
        original = getattr(link, "orig", None)
        if original is not None:
            error = original
            break
    else:  # Optuna's StorageInternalError says nothing itself: its cause does
        error = next((link for link in _chain(error) if link.__cause__ is None), error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else type(error).__name__
    return text.removeprefix("connection failed: ")


def _translated(
    error: BaseException, storage: Any, *, opening: bool, creating: bool
) -> BaseException | None:
    """`error` as a `StorageError`, when it is the storage's (its URL, driver or database);
    None for any other error. A plain `ValueError` is the storage's only while `creating`
    (Optuna refusing the URL: `redis://`), never dew's own checks of the study."""
    url = shown_url(storage)
    names = {type(link).__name__ for link in _chain(error)}
    modules = {type(link).__module__.split(".")[0] for link in _chain(error)}
    if names & {"ArgumentError", "NoSuchModuleError"} or (
        creating and isinstance(error, ImportError)
    ):
        missing = isinstance(error, ImportError) or "ModuleNotFoundError" in names
        what = "a database driver that is not installed" if missing else "a URL it can read"
        return StorageError(
            f"Optuna storage {url!r} needs {what} ({_driver_text(error)}); give a storage URL: "
            f"{STORAGE_URLS}."
        )
    if creating and isinstance(error, ValueError) and not modules & _DRIVERS:
        return StorageError(
            f"Optuna cannot open storage {url!r} ({_driver_text(error)}); give a storage "
            f"URL: {STORAGE_URLS}."
        )
    if modules & _DRIVERS or "StorageInternalError" in names:
        if opening:
            return StorageError(
                f"Optuna storage {url!r} cannot be reached: {_driver_text(error)}. Nothing was "
                "trained; run the sweep again once the database answers."
            )
        return StorageError(
            f"Optuna storage {url!r} was lost mid-sweep: {_driver_text(error)}. The ledger "
            "keeps every finished trial and the study is told them on the next run: run the "
            "sweep again once the database answers."
        )
    return None


@contextlib.contextmanager
def storage_errors(
    storage: Any, *, opening: bool = False, creating: bool = False
) -> Iterator[None]:
    """Raise a storage's failure inside the block as one `StorageError` naming its URL."""
    try:
        yield
    except StorageError:
        raise
    except Exception as error:
        if storage is None:  # an in-memory study: nothing of the user's to name
            raise
        translated = _translated(error, storage, opening=opening, creating=creating)
        if translated is None:
            raise
        raise translated from error


def open_study(optuna: Any, search: Any, pruner: Any = None) -> Any:
    """`optuna.create_study(..., load_if_exists=True)` for `search`'s storage and study
    name, tried again while another worker creates the same fresh storage or study (the
    tables, Optuna's version row, the study's row: optuna#1092, #4621), so workers started
    together all open the one study; any other failure of the storage is a `StorageError`.
    `pruner` is the study's (an `optuna.pruners` pruner; `None`: Optuna's default)."""
    for attempt in itertools.count(1):
        try:
            return optuna.create_study(
                storage=search.storage,
                study_name=search.study_name,
                sampler=search.sampler,
                direction=search.direction,
                pruner=pruner,
                load_if_exists=True,
            )
        except Exception as error:
            if search.storage is None or attempt == _ATTEMPTS or not _a_race(error):
                with storage_errors(search.storage, opening=True, creating=True):
                    raise
        time.sleep(random.uniform(0.02, 0.1) * attempt)
    raise AssertionError("unreachable")  # pragma: no cover
