"""Worker of tests/test_distributed_core.py: every scenario of the process primitives in
one launch; each scenario's outcome on this rank goes into OUT/rank<R>.json."""

import json

from _multiprocess import start

rank, count, out, args = start()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import dew._host as transfer  # noqa: E402
import dew.artifacts as artifacts  # noqa: E402
from dew import distributed  # noqa: E402
from dew.artifacts import Images, TokenScores, agree_process_phase, collective_host  # noqa: E402

results: dict = {"process_index": jax.process_index(), "process_count": jax.process_count()}


def outcome(function):
    """What a scenario did here: its value, or its error's type and message."""
    try:
        return {"value": function()}
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error)}


results["agree_ok"] = outcome(lambda: agree_process_phase("all fine", True))
results["agree_value_error"] = outcome(
    lambda: agree_process_phase(
        "checking a batch",
        ValueError("token id 7 is outside the vocabulary") if rank == 1 else True,
    )
)
results["agree_other_error"] = outcome(
    lambda: agree_process_phase("setup", RuntimeError("disk full") if rank == 0 else True)
)
in_use = BlockingIOError(11, "the run folder is in use by process 7", "runs/x")
results["agree_os_error"] = outcome(
    lambda: agree_process_phase("locking", in_use if rank == 0 else True)
)
results["agree_false_everywhere"] = outcome(lambda: agree_process_phase("both", False))
results["broadcast"] = outcome(
    lambda: distributed.broadcast_json({"trial": 3, "rank": rank} if rank == 0 else None)
)


def shards(mine: int):
    return lambda: [{"x": np.full((2, 3), 10 * rank + index, np.float32)} for index in range(mine)]


def consume(batches):
    coordinated = distributed.coordinated(batches)
    seen = [float(batch["x"][0, 0]) for batch in coordinated]
    return {"seen": seen, "uneven": coordinated.uneven}


results["coordinated_even"] = outcome(lambda: consume(shards(2)()))
results["coordinated_uneven"] = outcome(lambda: consume(shards(3 if rank == 0 else 1)()))
results["coordinated_empty_here"] = outcome(lambda: consume(shards(0 if rank == 1 else 2)()))


def failing_loader():
    yield {"x": np.zeros((2, 3), np.float32)}
    if rank == 1:
        raise OSError("the shard file vanished")
    yield {"x": np.zeros((2, 3), np.float32)}


results["coordinated_loader_fails"] = outcome(lambda: consume(failing_loader()))


def placed():
    local = np.arange(6, dtype=np.float32).reshape(2, 3) + 100 * rank
    batch = distributed.global_batch({"x": local, "scale": np.float32(2.0)})
    params = distributed.replicated({"w": np.ones(3, np.float32)})
    total = jax.jit(lambda b, p: (b["x"] @ p["w"]).sum() * b["scale"])(batch, params)
    return {
        "shape": list(batch["x"].shape),
        "total": float(total.addressable_data(0)),
        "gathered": collective_host(Images(batch["x"][:, :, None, None]))
        .generated[:, :, 0, 0]
        .tolist(),
    }


results["global_batch"] = outcome(placed)


def local_rows():
    scores = TokenScores(
        losses=np.full((rank + 1, 2), rank, np.float32), weights=np.ones((rank + 1, 2), np.float32)
    )
    return collective_host(scores).losses.tolist()


results["local_rows"] = outcome(local_rows)


def deleted_on_one():
    x = distributed.global_batch({"x": np.ones((2, 4, 4, 3), np.float32)})["x"]
    if rank == 1:
        x = jnp.array(x.addressable_data(0))
        x.delete()
        return collective_host(Images(x)).generated.shape
    return collective_host(Images(x)).generated.shape


results["deleted_on_one"] = outcome(deleted_on_one)


def plan_differs():
    x = distributed.global_batch({"x": np.ones((2, 4, 4, 3), np.float32)})["x"]
    reference = None if rank == 0 else x
    return collective_host(Images(x, reference)).generated.shape


results["plan_differs"] = outcome(plan_differs)


def transfer_fails():
    x = distributed.global_batch({"x": np.ones((2, 4, 4, 3), np.float32)})["x"]
    original = transfer._received
    calls = []

    def received(value):
        calls.append(1)
        if rank == 1 and len(calls) == 2:
            raise MemoryError("no room for the reference images")
        return original(value)

    transfer._received = received
    try:
        return collective_host(Images(x, x)).generated.shape
    finally:
        transfer._received = original


results["transfer_fails"] = outcome(transfer_fails)
results["after_failures"] = outcome(lambda: distributed.broadcast_json("still in step"))
results["plain_host_on_zero"] = outcome(
    lambda: artifacts.host(Images(jnp.zeros((1, 2, 2, 3)))).generated.shape if rank == 0 else None
)
(out / f"rank{rank}.json").write_text(json.dumps(results, default=list))
print(f"rank {rank} done", flush=True)
