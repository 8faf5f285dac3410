"""Test-wide settings: strict JAX promotion rules, and shared helpers."""

import atexit
import os
import pathlib
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _shared_compilation_cache() -> None:
    """One persistent XLA compilation cache for the whole test run: pytest's process creates
    it (and removes it at exit), and its xdist workers and the `dew` subprocesses the CLI
    tests start inherit it through the environment. Many tests compile the same tiny
    models' steps; each compiles once a run. A cache dir set by the caller (`.ci/run`, one
    for its pytest runs) is the caller's to remove. Every compilation is kept, however
    quick: a `dew` subprocess otherwise recompiles the eager ops of a model's initialisation
    (test_cli.py, test_evaluation.py and test_objectives_grpo.py: 70 s against 76 s)."""
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="dew-tests-xla-cache-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder


_shared_compilation_cache()


def _quick_compilation() -> None:
    """XLA's CPU backend at LLVM optimisation level 0 for the test run (its xdist workers and
    `dew` subprocesses inherit it): the tests are compilation-bound (tiny models compiled once
    or a few times and run for a few steps), and level 0 compiles them faster than the code it
    gives runs slower (test_objectives_diffusion.py and test_backbones_vision.py: 146 s
    against 104 s). XLA's graph passes (fusion, layout) run as at the default level; the
    benchmarks, which measure speed, run at the default. A level the caller set in XLA_FLAGS is
    kept."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()


_quick_compilation()


def _one_blas_thread() -> None:
    """One OpenBLAS thread in each xdist worker and in the `dew` and multi-process workers the
    tests start (they inherit it; pytest's own process has loaded NumPy through its plugins
    before this runs, so `-n 0` keeps its threads). Two workers on CI's two cores each ran
    NumPy's LAPACK on two threads that spin while they wait: `FID.finalize`'s 2048-dim
    `eigh` took 6.9 s of CPU time (18.6 s of wall) on a loaded machine where one thread
    takes 1.6 s (4.4 s), the same arithmetic. A count the caller set is kept."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


_one_blas_thread()


def _private_token_cache() -> None:
    """`dew.data.text`'s default token cache (`~/.cache/dew/tokens`) in a temporary folder
    for the test run, so that no test or docs example writes to the user's home."""
    if "DEW_CACHE_DIR" in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="dew-tests-token-cache-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["DEW_CACHE_DIR"] = folder


_private_token_cache()

import jax  # noqa: E402 (after the environment it reads)
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

# derandomize: CI runs the same examples every time, so a failure reproduces exactly.
settings.register_profile(
    "dew",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("dew")


def registrations() -> dict:
    """Every registry's entries (and the entry-point plugins loaded), as a snapshot that
    `restore_registrations` puts back."""
    from dew import _plugins
    from dew._registry import models, objectives, optimizers
    from dew.config._data import datasets

    state = {
        registry: dict(registry._entries) for registry in (models, objectives, optimizers, datasets)
    }
    state[_plugins] = dict(_plugins._loaded)
    return state


def restore_registrations(state: dict) -> None:
    from dew import _plugins

    for owner, entries in state.items():
        target = owner._loaded if owner is _plugins else owner._entries
        target.clear()
        target.update(entries)


@pytest.fixture(autouse=True)
def _registries_as_they_were():
    """A test (or a docs example) that registers a name leaves no trace in the registries
    that a later test in the same worker sees: its error messages list the registered names."""
    state = registrations()
    yield
    restore_registrations(state)


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of this test session (`tests/_postgres.py`), stopped and removed
    after it; skipped only where no server is installed (`.ci/run` installs Debian's)."""
    from _postgres import PostgresServer, server_binaries

    binaries = server_binaries()
    if binaries is None:
        pytest.skip(
            "no PostgreSQL server installed (initdb, pg_ctl not found): apt-get install "
            "postgresql, as .ci/run does"
        )
    pytest.importorskip("psycopg", reason='the PostgreSQL driver: pip install "dew-ml[postgres]"')
    server = PostgresServer(binaries).start()
    yield server
    server.remove()


@pytest.fixture
def postgres_url(postgres, request):
    """A fresh database of the session's PostgreSQL server for one test: its SQLAlchemy URL,
    `postgresql+psycopg://dew@127.0.0.1:PORT/DATABASE`."""
    import hashlib

    name = "t" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:16]
    return postgres.create_database(name)


def _selects(config, marks):
    """Whether the `-m` expression selects a test with `marks` (True without one, or with
    one this cannot judge: pytest decides then)."""
    expression = config.getoption("markexpr")
    if not expression:
        return True
    from _pytest.mark.expression import Expression

    try:
        return Expression.compile(expression).evaluate(lambda name, **_: name in marks)
    except Exception:
        return True


def pytest_ignore_collect(collection_path, config):
    """Modules whose tests the `-m` expression leaves out are not even imported. Where it
    leaves the parity tests out, as the README's plain `pytest` does, `tests/parity` (whose
    modules import torch, torchmetrics and open_clip: 5-7 s in each xdist worker; every
    module there is marked `parity` as a whole). Where it leaves unmarked tests out, as
    `pytest -m "slow or parity"` does, every test module that does not mention either mark
    (most of them: 12 s of the run's collection in each worker)."""
    here = pathlib.Path(__file__).parent
    if collection_path == here / "parity":
        return None if _selects(config, {"parity"}) else True
    if (
        collection_path.parent == here
        and collection_path.name.startswith("test_")
        and collection_path.suffix == ".py"
        and not _selects(config, set())
    ):
        text = collection_path.read_text(encoding="utf-8")
        return None if "slow" in text or "parity" in text else True
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """After a test file's last test, JAX's compiled-call caches cleared and Python's garbage
    collected: a worker otherwise keeps every file's executables and traced functions, and
    grew to 4.6 GB over 24 files of the metrics, objectives and backbones tests (5.4 GB over
    half the suite), where clearing keeps it at 1.4 GB. The next file's compilations load
    from the persistent cache (`_shared_compilation_cache`), and those 24 files took 428 s of
    CPU against 570 s without clearing (a smaller heap for the collector to walk)."""
    yield
    if nextitem is None or nextitem.path != item.path:
        import gc

        jax.clear_caches()
        gc.collect()
