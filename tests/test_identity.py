"""`dew.config._identity`: a run's identity is its configuration, not where its folder is;
local paths are recorded and compared absolute."""

import os
import pathlib

import pytest
from _builders import TINY as SIZES

from dew.config import ModelConfig, RunConfig, TrainerConfig
from dew.config._identity import absolute_paths, comparable
from dew.registry import datasets


def _config(**data):
    return RunConfig(
        model=ModelConfig("causal_transformer", SIZES),
        data=datasets["token_windows"](seq_len=8, **data),
        trainer=TrainerConfig(name="run", checkpoint_dir="runs"),
    )


def test_relative_local_paths_become_absolute_and_are_kept_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config, given = absolute_paths(_config(path="licenses.npy"))
    assert config.data.kwargs["path"] == str(tmp_path / "licenses.npy")
    assert given == {"data.kwargs.path": "licenses.npy"}
    # An absolute path, a URI, and a configuration without paths are left as they are.
    for unchanged in (_config(path=str(tmp_path / "x.npy")), _config(path="gs://b/x.npy")):
        assert absolute_paths(unchanged) == (unchanged, {})
    assert absolute_paths(_config()) == (_config(), {})


def test_a_builder_declares_its_paths_by_annotation_or_by_name(tmp_path, monkeypatch):
    from dew.data import Dataset

    def corpus(*, source: os.PathLike, vocab_path: str, label: str, batch_size, seed):
        return Dataset(train=lambda partition: iter(()))

    datasets.register("corpus_for_identity", corpus)
    try:
        monkeypatch.chdir(tmp_path)
        data = datasets["corpus_for_identity"](source="a.bin", vocab_path="v.txt", label="b.txt")
        config = RunConfig(model=ModelConfig("causal_transformer", SIZES), data=data)
        resolved, given = absolute_paths(config)
    finally:
        datasets.unregister("corpus_for_identity")
    assert given == {"data.kwargs.source": "a.bin", "data.kwargs.vocab_path": "v.txt"}
    assert resolved.data.kwargs == {
        "source": str(tmp_path / "a.bin"),
        "vocab_path": str(tmp_path / "v.txt"),
        "label": "b.txt",  # a plain string that neither its annotation nor its name call a path
    }


def test_where_a_folder_is_is_no_part_of_the_comparison(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here = _config(path="licenses.npy").to_dict()
    moved = {**here, "trainer": {**here["trainer"], "checkpoint_dir": "/elsewhere", "name": "b"}}
    assert comparable(here) == comparable(moved)
    resolved = absolute_paths(_config(path="licenses.npy"))[0].to_dict()
    assert comparable(here) == comparable(resolved)  # relative and absolute: one file
    other = {**here, "trainer": {**here["trainer"], "seed": 1}}
    assert comparable(here) != comparable(other)
    assert comparable(here, ignoring=()) != comparable(moved, ignoring=())
    monkeypatch.chdir(pathlib.Path(tmp_path).parent)  # another directory: another file
    assert comparable(here) != comparable(resolved)


@pytest.mark.parametrize("value", [None, 3, "", "s3://bucket/tokens.npy"])
def test_values_that_are_not_local_paths_are_compared_as_they_are(value):
    plain = {"data": {"name": "token_windows", "kwargs": {"path": value}}}
    assert comparable(plain) == plain


def test_a_list_of_paths_is_recorded_with_each_relative_entry_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = datasets["text"](paths=["corpus/*.txt", "/data/more.txt"], seq_len=8, cache_dir="c")
    config = RunConfig(model=ModelConfig("causal_transformer", SIZES), data=data)
    resolved, given = absolute_paths(config)
    assert resolved.data.kwargs["paths"] == (str(tmp_path / "corpus" / "*.txt"), "/data/more.txt")
    assert resolved.data.kwargs["cache_dir"] == str(tmp_path / "c")
    assert given == {"data.kwargs.paths[0]": "corpus/*.txt", "data.kwargs.cache_dir": "c"}
    assert comparable(config.to_dict()) == comparable(resolved.to_dict())


def test_the_modules_that_register_a_run_s_names_are_no_part_of_the_comparison():
    here = _config().to_dict()
    told = {**here, "trainer": {**here["trainer"], "imports": ["my_data"]}}
    assert comparable(here) == comparable(told)
    assert comparable(here, ignoring=()) != comparable(told, ignoring=())


def test_where_a_source_keeps_its_cache_is_no_part_of_the_comparison():
    here = _config().to_dict()
    told = {**here, "data": {**here["data"], "kwargs": {**here["data"]["kwargs"]}}}
    told["data"]["kwargs"]["cache_dir"] = "/elsewhere/cache"
    assert comparable(here) == comparable(told)
    other = {**told, "data": {**told["data"], "kwargs": {**told["data"]["kwargs"], "seq_len": 4}}}
    assert comparable(here) != comparable(other)
