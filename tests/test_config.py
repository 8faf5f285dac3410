"""Run configurations: round trips, validation, building and overrides."""

import dataclasses
import json
import math
import re
import tomllib

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dew.config import (
    SCHEDULES,
    DataConfig,
    ModelConfig,
    ObjectiveConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
    UndeclaredPathError,
    declared_paths,
    override,
)
from dew.data import Dataset
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.registry import NotRegisteredError, optimizers

SIZES = {
    "vocab_size": 4,
    "emb_features": 16,
    "num_layers": 1,
    "num_heads": 2,
    "mlp_features": 32,
    "max_seq_len": 16,
}


def lm_config(**trainer):
    return RunConfig(
        model=ModelConfig("causal_transformer", SIZES),
        data=DataConfig("token_windows", {"seq_len": 8, "vocab_size": 4}),
        optim=OptimConfig(optimizer="adam", learning_rate=0.01),
        trainer=TrainerConfig(name="lm-rate", steps=10, batch_size=8, **trainer),
    )


@pytest.fixture
def dew_checks_only(monkeypatch):
    """Switch off the test session's runtime type checker (jaxtyping + beartype), so the
    configs' own validation runs, as it does for a user without a type checker."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)


# Strategies for valid configs.

identifiers = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
texts = st.text(st.characters(codec="utf-8"), max_size=12)
names = texts.filter(lambda text: text.strip() == text and text != "")
scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
nested_keys = texts.filter(lambda key: key != "" and "." not in key)


def values(*, none: bool):
    leaves = st.one_of(st.none(), scalars) if none else scalars
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(nested_keys, inner, max_size=3)
        ),
        max_leaves=8,
    )


def kwargs(reserved, *, none):
    keys = identifiers.filter(lambda key: key not in reserved)
    return st.dictionaries(keys, values(none=none), max_size=4)


finite = st.floats(allow_nan=False, allow_infinity=False)
positive = finite.filter(lambda number: number > 0)
segments = texts.filter(
    lambda text: text.strip() != "" and text not in {".", ".."} and "/" not in text
).filter(lambda text: "\\" not in text and "\0" not in text)
run_names = st.none() | st.lists(segments, min_size=1, max_size=3).map("/".join)
counts = st.integers(1, 2**63 - 1)


def sections(*, none: bool):
    """Strategies for each section, built once (building them per draw is slow)."""
    models = st.builds(ModelConfig, names, kwargs({"key"}, none=none))
    datas = st.builds(DataConfig, names, kwargs({"batch_size", "seed"}, none=none))
    optims = st.builds(
        OptimConfig,
        optimizer=st.sampled_from(optimizers.names()) | names,
        learning_rate=positive,
        schedule=st.sampled_from(SCHEDULES),
        warmup_steps=st.integers(0, 2**20),
        weight_decay=finite.filter(lambda decay: decay >= 0),
        clipping=st.none() | positive,
        kwargs=kwargs({"learning_rate", "weight_decay"}, none=none),
    )
    trainers = st.builds(
        TrainerConfig,
        name=run_names,
        checkpoint_dir=texts.filter(lambda text: text.strip() != ""),
        steps=counts,
        batch_size=counts,
        log_every=counts,
        eval_every=st.none() | counts,
        checkpoint_every=st.none() | counts,
        seed=st.integers(0, 2**32 - 1),
    )
    objectives = st.builds(ObjectiveConfig, names, kwargs({"model"}, none=none))
    return models, datas, optims, trainers, objectives


@st.composite
def run_configs(draw, *, none: bool = True):
    models, datas, optims, trainers, objectives = SECTIONS[none]
    optim, trainer = draw(optims), draw(trainers)
    if optim.warmup_steps > trainer.steps:
        optim = dataclasses.replace(optim, warmup_steps=trainer.steps)
    return RunConfig(draw(models), draw(datas), optim, trainer, draw(objectives))


SECTIONS = {none: sections(none=none) for none in (False, True)}


RUN_CONFIGS = run_configs()
TOML_CONFIGS = run_configs(none=False)


def exact(value, ordered=True):
    """A form that tells apart what `==` does not: 1, 1.0 and True; 0.0 and -0.0 (and the
    order of a mapping's keys, unless `ordered` is false)."""
    if isinstance(value, dict):
        items = tuple((key, exact(item, ordered)) for key, item in value.items())
        return ("dict", items if ordered else tuple(sorted(items)))
    if isinstance(value, list):
        return ("list", tuple(exact(item, ordered) for item in value))
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


PLAIN = (dict, list, str, int, float, bool, type(None))


def only_plain(value):
    if isinstance(value, dict):
        return all(isinstance(key, str) and only_plain(item) for key, item in value.items())
    if isinstance(value, list):
        return all(only_plain(item) for item in value)
    return isinstance(value, PLAIN)


# Round trips.


@given(RUN_CONFIGS)
def test_a_config_round_trips_exactly_through_plain_data_and_json(config):
    plain = config.to_dict()
    assert only_plain(plain)
    back = RunConfig.from_dict(plain)
    assert back == config
    assert exact(back.to_dict()) == exact(plain)
    through_json = RunConfig.from_dict(json.loads(json.dumps(plain, allow_nan=False)))
    assert through_json == config
    assert exact(through_json.to_dict()) == exact(plain)


@given(TOML_CONFIGS)
def test_a_config_round_trips_exactly_through_toml(config):
    text = config.to_toml()
    back = RunConfig.from_toml(text)
    assert back == config
    # TOML (tomli_w) writes a mapping's nested tables after its other keys, so a kwargs
    # mapping holding a mapping may read back with its keys in another order.
    assert exact(back.to_dict(), ordered=False) == exact(config.to_dict(), ordered=False)


@given(RUN_CONFIGS)
def test_each_section_round_trips_on_its_own(config):
    for section in (config.model, config.data, config.optim, config.trainer, config.objective):
        assert type(section).from_dict(section.to_dict()) == section


@given(RUN_CONFIGS, st.data())
def test_overriding_declared_paths_with_their_own_values_changes_nothing(config, data):
    plain = config.to_dict()
    paths = data.draw(st.lists(st.sampled_from(declared_paths(config)), max_size=4))
    point = {}
    for path in paths:
        node = plain
        try:
            for segment in path.split("."):
                node = node[segment]
        except KeyError:
            continue  # a keyword the builder takes that kwargs does not set yet
        point[path] = node
    assert override(config, point) == config


def test_a_toml_file_round_trips(tmp_path):
    config = override(
        lm_config(eval_every=5),
        {
            "model.kwargs.dtype": "float32",
            "optim.clipping": 1.0,
            "optim.kwargs": {"b1": 0.95, "nesterov": True},
        },
    )
    path = tmp_path / "run.toml"
    config.dump_toml(path)
    assert RunConfig.load(path) == config
    tables = tomllib.loads(path.read_text(encoding="utf-8"))
    assert tables["model"]["kwargs"]["emb_features"] == 16
    assert tables["optim"]["kwargs"] == {"b1": 0.95, "nesterov": True}
    assert "checkpoint_every" not in tables["trainer"]


def test_a_hand_written_toml_file_loads_with_defaults_for_missing_keys(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        """
[model]
name = "causal_transformer"

[model.kwargs]
vocab_size = 4
emb_features = 16
num_layers = 1
num_heads = 2
mlp_features = 32
max_seq_len = 16

[data]
name = "token_windows"
kwargs = { seq_len = 8, vocab_size = 4 }

[optim]
learning_rate = 1
weight_decay = 0

[trainer]
steps = 20
""",
        encoding="utf-8",
    )
    config = RunConfig.load(path)
    assert config.model == ModelConfig("causal_transformer", SIZES)
    assert config.data == DataConfig("token_windows", {"seq_len": 8, "vocab_size": 4})
    assert config.optim == OptimConfig(learning_rate=1.0, weight_decay=0.0)
    assert type(config.optim.learning_rate) is float
    assert type(config.optim.weight_decay) is float
    assert config.trainer == TrainerConfig(steps=20)


@pytest.mark.parametrize(
    ("section", "value", "message"),
    [
        (
            "optim",
            {"learning_rate": "x"},
            "optim.learning_rate must be a finite number > 0, got 'x'",
        ),
        ("trainer", [1, 2], "trainer must be a mapping (a TOML table), got [1, 2] of type list"),
        ("model", {"name": "m", "kwargs": [1]}, "model.kwargs must be a mapping of keyword"),
        ("model", {"name": 3}, "model.name must be a non-empty string, got 3"),
        ("trainer", {"steps": "10"}, "trainer.steps must be an integer >= 1, got '10'"),
        ("model", None, "run.json is not a whole run_record: it lacks model"),
    ],
)
def test_a_hand_edited_run_json_is_a_value_error_naming_the_file_and_the_field(
    dew_checks_only, tmp_path, section, value, message
):
    from dew.telemetry.records import FitStarted, RunRecord
    from dew.tracking import LocalTracker

    config = RunConfig(ModelConfig("m"), DataConfig("d"), trainer=TrainerConfig(name="r"))
    data = json.loads(RunRecord(**config.to_dict()).to_json())
    if value is None:
        del data[section]
    else:
        data[section] = {**data[section], **value} if isinstance(value, dict) else value
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    # The journal's step total (an extended run's) must not hide a bad run.json.
    with LocalTracker(tmp_path) as tracker:
        tracker.log_artifact("fit_started", FitStarted(stage="lm", start_step=0, steps=20))
    with pytest.raises(ValueError, match=re.escape(message.split("(")[0])) as caught:
        RunConfig.from_run_record(tmp_path)
    shown = " ".join([str(caught.value), *getattr(caught.value, "__notes__", [])])
    assert message in shown
    assert str(path) in shown


def test_loading_a_bad_toml_file_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nname = "m"\n[data]\nname = "d"\n[trainer]\nsteps = 0\n')
    with pytest.raises(ValueError, match=r"trainer\.steps must be an integer >= 1, got 0\.") as e:
        RunConfig.load(path)
    assert any(str(path) in note for note in e.value.__notes__)
    path.write_text("[model\n")
    with pytest.raises(ValueError, match=r"bad\.toml is not valid TOML"):
        RunConfig.load(path)


def test_toml_refuses_none_inside_kwargs_and_names_the_path():
    config = RunConfig(ModelConfig("m", {"sizes": [1, None]}), DataConfig("d"))
    with pytest.raises(ValueError, match=r"model\.kwargs\.sizes\[1\] is None, which TOML"):
        config.to_toml()
    assert RunConfig.from_dict(config.to_dict()) == config


def test_toml_writes_strings_and_keys_that_need_escaping():
    text = 'a "quote", a \\ backslash,\ttab\nnewline \x00 \x7f é 😀'
    config = RunConfig(
        ModelConfig("m", {"labels": {"needs quoting": text, "-": [{}], "x y": []}}),
        DataConfig("d"),
    )
    assert RunConfig.from_toml(config.to_toml()) == config


# Plain data and immutability.


def test_kwargs_are_read_only_and_compared_by_value():
    source = {"sizes": [1, 2], "block": {"width": 3}}
    config = ModelConfig("m", source)
    source["sizes"].append(3)
    source["block"]["width"] = 4
    assert config.kwargs == {"sizes": (1, 2), "block": {"width": 3}}
    assert config.kwargs["sizes"] == (1, 2)
    with pytest.raises(TypeError):
        config.kwargs["sizes"] = (0,)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.name = "other"  # type: ignore[misc]
    assert config == ModelConfig("m", {"block": {"width": 3}, "sizes": (1, 2)})
    assert config.to_dict() == {"name": "m", "kwargs": {"sizes": [1, 2], "block": {"width": 3}}}
    assert hash(config) == hash(ModelConfig.from_dict(config.to_dict()))


def test_integers_are_stored_as_floats_in_float_fields(dew_checks_only):
    optim = OptimConfig(learning_rate=1, weight_decay=0, clipping=2)
    assert (optim.learning_rate, optim.weight_decay, optim.clipping) == (1.0, 0.0, 2.0)
    assert all(type(value) is float for value in (optim.learning_rate, optim.clipping))
    loaded = OptimConfig.from_dict({"learning_rate": np.int64(3), "clipping": np.float32(0.5)})
    assert loaded.learning_rate == 3.0 and type(loaded.learning_rate) is float
    assert loaded.clipping == 0.5 and type(loaded.clipping) is float
    assert TrainerConfig.from_dict({"steps": np.int64(7)}).steps == 7


def test_numpy_scalars_in_kwargs_become_python_numbers():
    config = ModelConfig("m", {"width": np.int32(4), "rate": np.float64(0.5), "flag": True})
    assert [type(value) for value in config.kwargs.values()] == [int, float, bool]


# Validation: each message names the field by its dotted path.

BASE = {"model": {"name": "m"}, "data": {"name": "d"}}

VALUE_ERRORS = [
    ({"trainer": {"steps": 0}}, "trainer.steps must be an integer >= 1, got 0."),
    ({"trainer": {"batch_size": -3}}, "trainer.batch_size must be an integer >= 1, got -3."),
    ({"trainer": {"log_every": 0}}, "trainer.log_every must be an integer >= 1, got 0."),
    ({"trainer": {"eval_every": 0}}, "trainer.eval_every must be None or an integer >= 1, got 0."),
    (
        {"trainer": {"checkpoint_every": -1}},
        "trainer.checkpoint_every must be None or an integer >= 1, got -1.",
    ),
    ({"trainer": {"seed": -1}}, "trainer.seed must be an integer >= 0, got -1."),
    ({"trainer": {"seed": 2**32}}, "trainer.seed must be an integer in [0, 2**32), got 4294967296"),
    ({"trainer": {"checkpoint_dir": " "}}, "trainer.checkpoint_dir must be a non-empty string"),
    (
        {"optim": {"learning_rate": -1.0}},
        "optim.learning_rate must be a finite number > 0, got -1.0.",
    ),
    ({"optim": {"learning_rate": 0}}, "optim.learning_rate must be a finite number > 0, got 0.0."),
    (
        {"optim": {"learning_rate": math.inf}},
        "optim.learning_rate must be a finite number > 0, got inf.",
    ),
    (
        {"optim": {"weight_decay": math.nan}},
        "optim.weight_decay must be a finite number >= 0, got nan.",
    ),
    (
        {"optim": {"clipping": 0.0}},
        "optim.clipping must be None or a finite number > 0, got 0.0.",
    ),
    ({"optim": {"warmup_steps": -1}}, "optim.warmup_steps must be an integer >= 0, got -1."),
    (
        {"optim": {"schedule": "cosin"}},
        "optim.schedule 'cosin' is not one of 'constant', 'cosine', 'linear', 'warmup_cosine'.",
    ),
    ({"optim": {"optimizer": " adam"}}, "optim.optimizer ' adam' may not start or end with"),
    (
        {"optim": {"warmup_steps": 20}, "trainer": {"steps": 10}},
        "optim.warmup_steps (20) must not exceed trainer.steps (10).",
    ),
    (
        {"optim": {"kwargs": {"learning_rate": 0.1}}},
        "optim.kwargs may not set 'learning_rate': set optim.learning_rate.",
    ),
    (
        {"optim": {"kwargs": {"weight_decay": 0.1}}},
        "optim.kwargs may not set 'weight_decay': set optim.weight_decay.",
    ),
    ({"model": {"name": ""}}, "model.name must be a non-empty string, got ''."),
    (
        {"model": {"name": "m", "kwargs": {"key": 0}}},
        "model.kwargs may not set 'key': ModelConfig.build supplies the initialisation key.",
    ),
    (
        {"model": {"name": "m", "kwargs": {"not valid": 1}}},
        "model.kwargs key 'not valid' must be a Python identifier",
    ),
    (
        {"model": {"name": "m", "kwargs": {"block": {"a.b": 1}}}},
        "model.kwargs.block has key 'a.b'; keys of mappings in configs must be non-empty strings "
        "without '.'",
    ),
    (
        {"model": {"name": "m", "kwargs": {"sizes": [1, math.nan]}}},
        "model.kwargs.sizes[1] must be finite, got nan",
    ),
    (
        {"model": {"name": "m", "kwargs": {"big": 2**64}}},
        "model.kwargs.big must fit in a signed 64-bit integer",
    ),
    (
        {"data": {"name": "d", "kwargs": {"batch_size": 4}}},
        "data.kwargs may not set 'batch_size': it comes from trainer.batch_size.",
    ),
    (
        {"data": {"name": "d", "kwargs": {"seed": 4}}},
        "data.kwargs may not set 'seed': it comes from trainer.seed.",
    ),
    (
        {"trainer": {"on_nonfinite": "stop"}},
        "trainer.on_nonfinite must be 'raise' or 'continue', got 'stop'.",
    ),
    (
        {"trainer": {"strategy": "fsdp+tensor"}},
        "trainer.strategy must be 'data' or 'fsdp', got 'fsdp+tensor' (fsdp+tensor needs a mesh: "
        "build the Trainer in Python).",
    ),
    ({"trainer": {"step": 10}}, "trainer has unknown key 'step'; allowed keys are 'name', "),
    ({"optimizer": {}}, "RunConfig has unknown key 'optimizer'; allowed keys are 'model', "),
    ({"model": {"kwargs": {}}}, "model is missing the required key 'name'; allowed keys are"),
]


@pytest.mark.parametrize(("change", "message"), VALUE_ERRORS)
def test_a_bad_value_raises_naming_its_dotted_path(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RunConfig.from_dict({**BASE, **change})


@pytest.mark.parametrize(
    "name", ["", " ", "/a", "a/", "a//b", "a/ /b", "a/../b", "..", ".", "a\\b"]
)
def test_a_run_name_needs_non_empty_segments(name):
    with pytest.raises(ValueError, match=r"trainer\.name must be None or a run name"):
        RunConfig.from_dict({**BASE, "trainer": {"name": name}})


def test_a_run_name_may_have_segments():
    assert TrainerConfig(name="lm-rate/trial-0").name == "lm-rate/trial-0"


def test_a_required_section_must_be_present():
    with pytest.raises(ValueError, match="RunConfig is missing the required key 'data'"):
        RunConfig.from_dict({"model": {"name": "m"}})


TYPE_ERRORS = [
    ({"trainer": {"steps": True}}, "trainer.steps must be an integer >= 1, got True."),
    ({"trainer": {"steps": 2.0}}, "trainer.steps must be an integer >= 1, got 2.0."),
    ({"trainer": {"name": 3}}, "trainer.name must be None or a run name"),
    ({"optim": {"learning_rate": True}}, "optim.learning_rate must be a finite number > 0"),
    ({"optim": {"clipping": "1"}}, "optim.clipping must be None or a finite number > 0"),
    ({"model": {"name": None}}, "model.name must be a non-empty string, got None."),
    ({"model": {"name": "m", "kwargs": [1]}}, "model.kwargs must be a mapping of keyword"),
    ({"model": {"name": "m", "kwargs": {"s": {1, 2}}}}, "model.kwargs.s must be None, a bool"),
    ({"model": "m"}, "model must be a mapping (a TOML table), got 'm'"),
]


@pytest.mark.parametrize(("change", "message"), TYPE_ERRORS)
def test_a_value_of_the_wrong_type_raises_naming_its_dotted_path(dew_checks_only, change, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        RunConfig.from_dict({**BASE, **change})


def test_constructed_directly_a_config_names_its_class(dew_checks_only):
    with pytest.raises(ValueError, match=r"^TrainerConfig\.steps must be an integer >= 1"):
        TrainerConfig(steps=0)
    with pytest.raises(ValueError, match=r"^OptimConfig\.learning_rate must be a finite"):
        OptimConfig.from_dict({"learning_rate": -1})
    with pytest.raises(TypeError, match=r"^RunConfig\.data must be a DataConfig, got dict"):
        RunConfig(ModelConfig("m"), {"name": "d"})  # type: ignore[arg-type]


# Building.


def test_a_model_config_builds_the_registered_model():
    config = ModelConfig("causal_transformer", SIZES)
    model = config.build(key=jax.random.key(0))
    assert isinstance(model, CausalTransformer)
    again = config.build(key=jax.random.key(0))
    assert jnp.array_equal(model.stack.head.weight, again.stack.head.weight)


def test_building_with_bad_kwargs_names_the_model_and_its_parameters():
    with pytest.raises(TypeError, match="model 'causal_transformer' does not take 'vocab'; its"):
        ModelConfig("causal_transformer", {"vocab": 4}).build(key=jax.random.key(0))
    with pytest.raises(TypeError, match="model 'causal_transformer' needs 'emb_features'"):
        ModelConfig("causal_transformer", {"vocab_size": 4}).build(key=jax.random.key(0))
    with pytest.raises(NotRegisteredError, match="no model is registered as 'transformer'"):
        ModelConfig("transformer").build(key=jax.random.key(0))


def test_a_data_config_builds_the_registered_dataset():
    data = DataConfig("token_windows", {"seq_len": 4}).build(batch_size=2, seed=0)
    assert isinstance(data, Dataset)
    assert data.batch == 2
    with pytest.raises(TypeError, match="dataset 'token_windows' needs 'seq_len'"):
        DataConfig("token_windows").build(batch_size=2, seed=0)


def rates(optim, steps, at):
    schedule = optim.learning_rate_schedule(steps)
    return [round(float(schedule(step)), 6) for step in at]


def test_the_schedules_decay_over_the_run():
    at = (0, 5, 10)
    assert rates(OptimConfig(learning_rate=0.1), 10, at) == [0.1, 0.1, 0.1]
    assert rates(OptimConfig(learning_rate=0.1, schedule="linear"), 10, at) == [0.1, 0.05, 0.0]
    assert rates(OptimConfig(learning_rate=0.1, schedule="cosine"), 10, at) == [0.1, 0.05, 0.0]
    warm = OptimConfig(learning_rate=0.1, schedule="warmup_cosine", warmup_steps=4)
    assert rates(warm, 12, (0, 2, 4, 8, 12)) == [0.0, 0.05, 0.1, 0.05, 0.0]
    cosine = OptimConfig(learning_rate=0.1, schedule="cosine", warmup_steps=4)
    assert rates(cosine, 12, range(13)) == rates(warm, 12, range(13))
    constant = OptimConfig(learning_rate=0.1, warmup_steps=2)
    assert rates(constant, 10, (0, 1, 2, 9)) == [0.0, 0.05, 0.1, 0.1]
    with pytest.raises(ValueError, match=r"warmup_steps \(4\) must not exceed the run's steps"):
        warm.build(3)


def step(optimizer, params, grads):
    with jax.numpy_dtype_promotion("standard"):
        updates, _ = optimizer.update(grads, optimizer.init(params), params)
    return updates


def test_clipping_comes_before_the_optimizer():
    params, grads = {"w": jnp.ones(4)}, {"w": jnp.full(4, 10.0)}
    optimizer = OptimConfig("sgd", learning_rate=1.0, clipping=1.0).build(10)
    norm = float(jnp.linalg.norm(step(optimizer, params, grads)["w"]))
    assert norm == pytest.approx(1.0)


def test_weight_decay_goes_to_the_optimizer_that_takes_it_and_through_the_gradient_otherwise():
    params, zero = {"w": jnp.full(3, 2.0)}, {"w": jnp.zeros(3)}
    sgd = OptimConfig("sgd", learning_rate=0.5, weight_decay=0.1).build(10)
    assert jnp.allclose(step(sgd, params, zero)["w"], -0.5 * 0.1 * 2.0)
    adamw = OptimConfig("adamw", learning_rate=0.5, weight_decay=0.1).build(10)
    expected = step(optax.adamw(0.5, weight_decay=0.1), params, zero)
    assert jnp.allclose(step(adamw, params, zero)["w"], expected["w"])
    undecayed = OptimConfig("adamw", learning_rate=0.5).build(10)
    assert jnp.allclose(step(undecayed, params, zero)["w"], 0.0)


def test_optimizer_kwargs_reach_the_optimizer():
    params, grads = {"w": jnp.zeros(2)}, {"w": jnp.ones(2)}
    nesterov = OptimConfig("sgd", learning_rate=1.0, kwargs={"momentum": 0.9, "nesterov": True})
    expected = step(optax.sgd(1.0, momentum=0.9, nesterov=True), params, grads)
    assert jnp.allclose(step(nesterov.build(10), params, grads)["w"], expected["w"])
    with pytest.raises(TypeError, match="optimizer 'sgd' does not take 'b1'; its parameters"):
        OptimConfig("sgd", kwargs={"b1": 0.9}).build(10)
    with pytest.raises(NotRegisteredError, match="no optimizer is registered as 'adamm'"):
        OptimConfig("adamm").build(10)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_built_in_optimizer_builds_with_every_schedule(schedule):
    for name in ("adam", "adamw", "sgd", "lion", "adafactor", "rmsprop"):
        optim = OptimConfig(name, schedule=schedule, warmup_steps=1, weight_decay=0.01)
        updates = step(optim.build(5), {"w": jnp.ones((2, 2))}, {"w": jnp.ones((2, 2))})
        assert updates["w"].shape == (2, 2)


# Overrides.


def test_override_sets_dotted_paths_through_validation():
    config = lm_config()
    tuned = override(
        config,
        {
            "optim.learning_rate": 0.003,
            "trainer.steps": 20,
            "model.kwargs.emb_features": 32,
            "data.kwargs.seq_len": 4,
            "optim.schedule": "cosine",
        },
    )
    assert tuned.optim.learning_rate == 0.003
    assert tuned.trainer.steps == 20
    assert tuned.model.kwargs["emb_features"] == 32
    assert tuned.data.kwargs["seq_len"] == 4
    assert tuned.optim.schedule == "cosine"
    assert config.optim.learning_rate == 0.01
    assert override(config, {}) == config
    assert type(override(config, {"optim.learning_rate": 1}).optim.learning_rate) is float


def test_override_refuses_an_invalid_value_with_the_field_path():
    with pytest.raises(ValueError, match=r"optim\.learning_rate must be a finite number > 0") as e:
        override(lm_config(), {"optim.learning_rate": -1.0})
    assert "while applying the override {'optim.learning_rate': -1.0}" in e.value.__notes__[0]


@pytest.mark.parametrize(
    ("path", "nearest"),
    [
        ("optim.learning_rat", "'optim.learning_rate'."),
        ("trainer.step", "'trainer.steps'."),
        ("model.kwargs.emb_featurs", "'model.kwargs.emb_features'."),
        ("data.kwargs.val_fracton", "'data.kwargs.val_fraction'."),
        ("optim.learning_rate.x", "'optim.learning_rate'."),
    ],
)
def test_override_refuses_an_undeclared_path_naming_the_nearest(path, nearest):
    message = f"override path '{path}' is not declared by RunConfig; nearest declared paths: "
    with pytest.raises(UndeclaredPathError, match=re.escape(message + nearest)):
        override(lm_config(), {path: 1})


def test_an_undeclared_path_is_a_key_error():
    with pytest.raises(KeyError):
        override(lm_config(), {"optim.lr": 0.1})


def test_with_nothing_close_the_error_lists_the_sections_declared_paths():
    with pytest.raises(UndeclaredPathError, match=r"'optim\.zzz' .*declared paths: 'optim', "):
        override(lm_config(), {"optim.zzz": 1})


def test_a_new_kwargs_key_is_declared_only_where_the_builder_takes_it():
    config = lm_config()
    tuned = override(
        config,
        {"model.kwargs.dtype": "bfloat16", "data.kwargs.val_fraction": 0.2, "optim.kwargs.b1": 0.8},
    )
    assert tuned.model.kwargs["dtype"] == "bfloat16"
    assert tuned.data.kwargs["val_fraction"] == 0.2
    assert tuned.optim.kwargs == {"b1": 0.8}
    with pytest.raises(UndeclaredPathError, match=r"'optim\.kwargs\.momentum' is not declared"):
        override(config, {"optim.kwargs.momentum": 0.9})
    with pytest.raises(UndeclaredPathError, match=r"'model\.kwargs\.key' is not declared"):
        override(config, {"model.kwargs.key": 0})


def test_an_unregistered_builder_declares_only_its_existing_kwargs():
    config = RunConfig(ModelConfig("my_model", {"width": 4}), DataConfig("d"))
    assert override(config, {"model.kwargs.width": 8}).model.kwargs == {"width": 8}
    with pytest.raises(UndeclaredPathError, match="model 'my_model' is not registered"):
        override(config, {"model.kwargs.depth": 2})


def test_override_reaches_into_nested_kwargs_and_applies_paths_in_order():
    config = RunConfig(ModelConfig("m", {"block": {"width": 4, "act": "relu"}}), DataConfig("d"))
    tuned = override(config, {"model.kwargs.block.width": 8})
    assert tuned.model.kwargs == {"block": {"width": 8, "act": "relu"}}
    replaced = override(config, {"model.kwargs.block": {"width": 2}, "model.kwargs.block.width": 3})
    assert replaced.model.kwargs == {"block": {"width": 3}}
    with pytest.raises(UndeclaredPathError, match=r"nearest declared paths: 'model\.kwargs\.block"):
        override(config, {"model.kwargs.block.depth": 1})


def test_override_can_replace_a_whole_section():
    tuned = override(lm_config(), {"optim": {"optimizer": "sgd"}})
    assert tuned.optim == OptimConfig("sgd")


def test_declared_paths_cover_fields_kwargs_and_builder_keywords():
    paths = declared_paths(lm_config())
    for path in (
        "optim.learning_rate",
        "trainer.steps",
        "trainer.checkpoint_every",
        "model.kwargs.emb_features",
        "model.kwargs.attention_impl",
        "data.kwargs.path",
        "optim.kwargs.b2",
    ):
        assert path in paths
    assert "model.kwargs.key" not in paths
    assert "data.kwargs.batch_size" not in paths
    assert "optim.kwargs.learning_rate" not in paths
    assert len(paths) == len(set(paths))
