"""A sweep's ledger read with `json` alone, not dew's reader: its header line, then its events
folded in order (decision 0045), in the shape of a version-1 ledger's object; and that shape
written back as a version-1 ledger, as dew before decision 0045 wrote one."""

import json
import pathlib


def ledger_json(path):
    """`{**header, "budget", "trials": [...], "running": [...]}` of the version-2 ledger at
    `path`, entries in index order (a pruned trial's with `"pruned": True`); a last line
    without its newline is left out."""
    first, *lines, _tail = pathlib.Path(path).read_text().split("\n")
    header = json.loads(first)
    assert header["version"] == 2, header
    finished, running, budget = {}, {}, header["budget"]
    for line in lines:
        [(kind, body)] = json.loads(line).items()
        if kind == "budget":
            budget = max(budget, body)
        elif kind == "running":
            assert body["index"] not in running and body["index"] not in finished, line
            running[body["index"]] = body
        else:  # a trial's end: finished, or stopped by its sweep's pruner (decision 0055)
            assert kind in ("finished", "pruned") and body["index"] not in finished, line
            running.pop(body["index"], None)
            finished[body["index"]] = {**body, "pruned": True} if kind == "pruned" else body
    return {
        **header,
        "budget": budget,
        "trials": [finished[index] for index in sorted(finished)],
        "running": [running[index] for index in sorted(running)],
    }


def old_ledger_text(data):
    """`data` (`ledger_json`'s shape) as a version-1 ledger: one JSON object."""
    return json.dumps({**data, "version": 1}, indent=1) + "\n"
