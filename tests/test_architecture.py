"""The package's shape: no import cycle anywhere (imports under `if TYPE_CHECKING:` count), the
pure core never imports the shell, no module but the training package reaches into the
Trainer, and no module runs over 500 lines."""

import ast
import pathlib

import dew

ROOT = pathlib.Path(dew.__file__).parent
CORE = ("naming", "artifacts", "metrics", "objectives", "nn", "steps", "telemetry")
GROUND = (
    "_checks",
    "_domains",
    "_nonfinite",
    "_json",
    "_files",
    "_interrupts",
    "io",
    "_pth",
    "_safetensors",
    "_torch_pickle",
    "_weights",
    "_processes",
    "_host",
    "_compiled_calls",
    "_shape_drawing",
    "_cache_dir",
    "_integers",
    "_finite_params",
    "_lazy",
    "_version",
    "_reductions",
    "_directions",
    "_accumulate",
    "_throughput",
    "_precision",
    "_precisions",
)  # below the core: import only one another
SHELL = (
    "training",
    "evaluation",
    "_pass",
    "_loop",
    "tracking",
    "config",
    "registry",
    "cli",
    "checkpoints",
    "supervised",
    "events",
    "profiling",
    "distributed",
)


def _module_name(path: pathlib.Path) -> str:
    parts = ["dew", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _executed(tree: ast.AST):
    """Every node of `tree` that can run: all but the bodies of `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (child for branch in node.orelse for child in [branch, *_executed(branch)])
            continue
        yield node
        yield from _executed(node)


def _imports(name: str, *, typing: bool = True) -> set[str]:
    """Every dew module `name` imports, at module level or inside a function, and (with
    `typing`) under `if TYPE_CHECKING:` too: an annotation that names a module's class
    depends on that module as much as a call does (decision 0066)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree) if typing else _executed(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a import b` imports the module a.b where there is one, else a itself.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        found |= {target for target in targets if target in MODULES and target != name}
    return found


GRAPH = {name: _imports(name) for name in MODULES}
RUNTIME_GRAPH = {name: _imports(name, typing=False) for name in MODULES}

# Imports made for annotations alone (under `if TYPE_CHECKING:`) that close a cycle, each with
# why the cycle stays. Every other cycle, annotations included, fails the test.
ANNOTATION_CYCLES = {
    ("dew.config._recipe", "dew.config._config"): (
        "RunConfig.train runs the recipe; the recipe's functions annotate the RunConfig they take"
    ),
    ("dew.config._identity", "dew.config._config"): (
        "the recipe compares RunConfigs through _identity, which annotates the RunConfig"
    ),
}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (module -> modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return None


def _parents(name: str) -> set[str]:
    """A module and the packages above it (importing `a.b.c` runs `a.b`'s __init__)."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts) + 1)}


def test_the_import_graph_finds_imports():
    assert "dew.naming" in GRAPH["dew.events"]
    assert GRAPH["dew.naming"] <= {"dew._integers"}
    assert "dew.config._recipe" in GRAPH["dew.config._config"]
    # an import under TYPE_CHECKING counts, though it never runs
    assert "dew.config._config" in GRAPH["dew.config._recipe"]
    assert "dew.config._config" not in RUNTIME_GRAPH["dew.config._recipe"]


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_of_dew_is_in_an_import_cycle():
    for (name, target), why in ANNOTATION_CYCLES.items():  # annotations alone, and still needed
        assert target in GRAPH[name] and target not in RUNTIME_GRAPH[name], (name, target, why)
    graph = {
        name: {target for target in targets if (name, target) not in ANNOTATION_CYCLES}
        for name, targets in GRAPH.items()
    }
    cycle = _find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_no_module_reaches_into_the_trainer():
    """The loop's policies get what they need as arguments and the `Loop` they are handed,
    never the Trainer (decision 0066): no module but `dew.training`'s own `__init__` imports
    `dew.training._trainer`, not even for an annotation."""
    trainer = "dew.training._trainer"
    assert sorted(name for name, targets in GRAPH.items() if trainer in targets) == ["dew.training"]


def test_the_core_imports_no_shell_module():
    shell = {f"dew.{name}" for name in SHELL}
    offending = {
        name: sorted(target for target in targets if _parents(target) & shell)
        for name, targets in GRAPH.items()
        if name.count(".") and name.split(".")[1] in CORE
    }
    assert {name: found for name, found in offending.items() if found} == {}


def _floor(name: str) -> str:
    segment = name.split(".")[1] if name.count(".") else ""
    return "ground" if segment in GROUND else "core" if segment in CORE else "shell"


def test_the_core_imports_only_the_core_and_the_ground_floor():
    offending = {
        name: sorted(target for target in targets if _floor(target) == "shell")
        for name, targets in GRAPH.items()
        if _floor(name) == "core"
    }
    assert {name: found for name, found in offending.items() if found} == {}


def test_the_ground_floor_imports_only_the_ground_floor():
    offending = {
        name: sorted(target for target in GRAPH[name] if _floor(target) != "ground")
        for name in GRAPH
        if _floor(name) == "ground"
    }
    assert {name: found for name, found in offending.items() if found} == {}
    assert GRAPH["dew._json"] == set() and "dew._weights" in GRAPH["dew.io"]


MOST_LINES = 500  # decision 0016: one concept per module, none over 500 lines


def test_no_module_of_dew_runs_over_500_lines():
    lines = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert lines["dew.cli"] > 0 and lines["dew._pass"] > 0  # the packages' __init__ files count
    offenders = {name: count for name, count in lines.items() if count > MOST_LINES}
    assert offenders == {}, (
        f"modules over {MOST_LINES} lines (decision 0016: split each into modules of one "
        f"concept): {', '.join(f'{name} ({count})' for name, count in sorted(offenders.items()))}"
    )


def _is_separator(node: ast.AST) -> bool:
    """`"/"` or dew.naming's `SEPARATOR`, however it is reached."""
    if isinstance(node, ast.Constant):
        return node.value == "/"
    return (isinstance(node, ast.Name) and node.id == "SEPARATOR") or (
        isinstance(node, ast.Attribute) and node.attr == "SEPARATOR"
    )


def _joins_or_splits(node: ast.AST) -> bool:
    """Whether `node` joins or splits a string on `/`: `.split("/")` and its kin,
    `"/".join(...)`, an f-string with a `/` right after one of its values and before
    another (`f"{stage}/{split}"`, `f"/{split}/{metric}"`), or `a + "/" + b`. A path that
    pathlib builds, `f"params/{key}.txt"` and `"a/b"` literals are no joins."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        method, args = node.func.attr, node.args
        if method in {"split", "rsplit", "partition", "rpartition"} and args:
            return _is_separator(args[0])
        if method == "join":
            return _is_separator(node.func.value)
    if isinstance(node, ast.JoinedStr):
        parts = node.values
        return any(
            isinstance(part, ast.Constant)
            and str(part.value).startswith("/")
            and isinstance(parts[i - 1], ast.FormattedValue)
            and any(isinstance(later, ast.FormattedValue) for later in parts[i + 1 :])
            for i, part in enumerate(parts[1:], start=1)
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_separator(node.left) or _is_separator(node.right)
    return False


def _string_handling(name: str) -> list[tuple[str, str]]:
    """`(function, source)` of every place module `name` joins or splits on `/`."""
    tree = ast.parse(MODULES[name].read_text())
    found = []
    for scope in [tree, *ast.walk(tree)]:
        if scope is not tree and not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in _own_nodes(scope):
            if _joins_or_splits(node):
                found.append((getattr(scope, "name", "<module>"), ast.unparse(node)))
    return found


def _own_nodes(scope: ast.AST):
    """The nodes of `scope` that no function nested inside it holds."""
    for child in ast.iter_child_nodes(scope):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        yield child
        yield from _own_nodes(child)


# Functions that join or split strings on "/" that are not tags nor parameter paths. Every
# other place must call dew.naming (document 001: no other code joins or splits tags).
NOT_TAGS = {
    ("dew.config._fields", "_run_name"): "a run name is a relative folder path",
    ("dew.cli._tracker_options", "group"): "a trial run `<sweep>/trial-<i>` groups by folder",
    ("dew.config.sweep._sweep", "_follow"): "a trial's run name `<sweep>/trial-<i>`",
    ("dew.config.sweep._sweep", "_run_trials"): "a trial's run name `<sweep>/trial-<i>`",
    ("dew.config._recipe", "run_folder"): "a checkpoint URI under a bucket's root",
    ("dew.cli._commands", "_trial_line"): "the trial counter `trial 3/8` the console prints",
}


def test_the_tag_handling_finder_finds_joins_and_splits():
    source = """
def parts(tag, stage, split, metric, SEPARATOR):
    tag.split("/"); tag.rsplit("/", 1); tag.partition(SEPARATOR); "/".join((stage, split))
    f"{stage}/{split}"; f"^{stage}/({split})/{metric}$"; stage + "/" + split
    tag.endswith(f"/{split}/{metric}"); SEPARATOR.join(tag)
def paths(folder, name, total):
    folder / name; f"{name}.json"; f"params/{name}.txt"; name.split("."); ".".join(name)
    f"{folder}data/{name}"; f"see ~/.cache/{name}"; f"evaluation/records {total}"
"""
    tree = ast.parse(source)
    flagged = {fn.name: [n for n in ast.walk(fn) if _joins_or_splits(n)] for fn in tree.body}
    assert len(flagged["parts"]) == 9 and flagged["paths"] == []


def test_no_module_but_naming_joins_or_splits_tags():
    found = {
        (name, function, source)
        for name in MODULES
        if name != "dew.naming"
        for function, source in _string_handling(name)
        if (name, function) not in NOT_TAGS
    }
    assert found == set(), (
        "build and parse tags and parameter paths with dew.naming (document 001: no other code "
        "joins or splits them); a '/'-joined string that is no tag belongs in NOT_TAGS, with why: "
        + "; ".join(f"{name}.{function}: {source}" for name, function, source in sorted(found))
    )


def test_keys_are_derived_in_dew_domains_alone():
    """Every `fold_in` goes through `dew._domains.derive`, which keeps the rule that a key
    receives either domains or counters (splits are an objective's counters)."""
    folding = sorted(
        name
        for name, path in MODULES.items()
        if name != "dew._domains"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and node.attr == "fold_in"
    )
    assert MODULES["dew._domains"].read_text().count("jax.random.fold_in") == 2
    assert folding == [], f"modules calling fold_in outside dew._domains: {folding}"
