"""`DataConfig` and the dataset registry whose entries build one by name. The built-in
builders are named as `"module:attribute"` and imported when first looked up (their modules
import JAX; decision 0047)."""

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dew._registry import (
    DATASET_SUPPLIED,
    Registry,
    _register_builtins,
    _takes,
    check_arguments,
    keyword_parameters,
)
from dew.config._fields import (
    _EMPTY,
    _kwargs,
    _registry_name,
    _Section,
    _set,
    _where,
)

if TYPE_CHECKING:
    from dew.data import Dataset

__all__ = ["DataConfig", "DatasetRegistry", "datasets"]


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """A dataset by registered name (`dew.registry.datasets`) and its keyword arguments;
    `dew.registry.datasets[name](**kwargs)` builds one after checking the arguments.

    ```python
    >>> from dew.data import Partition
    >>> data = DataConfig("token_windows", {"seq_len": 8}).build(batch_size=4, seed=0)
    >>> next(data.train(Partition()))["text"].shape
    (4, 9)

    ```
    """

    name: str
    kwargs: Mapping[str, Any] = _EMPTY

    def __post_init__(self) -> None:
        where = _where(self)
        _set(self, "name", _registry_name(f"{where}.name", self.name))
        reserved = {
            "batch_size": "it comes from trainer.batch_size",
            "seed": "it comes from trainer.seed",
        }
        _set(self, "kwargs", _kwargs(f"{where}.kwargs", self.kwargs, reserved))

    def build(
        self, *, batch_size: int, seed: int, cache_dir: str | os.PathLike[str] | None = None
    ) -> "Dataset":
        """The dataset: `dew.registry.datasets.builder(name)(batch_size=..., seed=...,
        **kwargs)`. `cache_dir` is where a builder that takes a `cache_dir` (`text`'s token
        cache) keeps its cache when the configuration names none (a run's `data-cache`)."""
        builder = datasets.builder(self.name)
        check_arguments("dataset", self.name, builder, self.kwargs, supplied=DATASET_SUPPLIED)
        kwargs = dict(self.kwargs)
        if cache_dir is not None and "cache_dir" not in kwargs:
            names, _ = keyword_parameters(builder)
            if "cache_dir" in names:
                kwargs["cache_dir"] = os.fspath(cache_dir)
        data = builder(batch_size=batch_size, seed=seed, **kwargs)
        from dew.data import Dataset

        if not isinstance(data, Dataset):
            raise TypeError(
                f"dataset {self.name!r} returned {type(data).__name__}; a dataset builder must "
                "return a dew.data.Dataset."
            )
        return data


class DatasetRegistry(Registry[Callable[..., "Dataset"]]):
    """The dataset registry: `register(name, builder)` with
    `builder(*, batch_size, seed, **kwargs) -> Dataset`; `self[name](**kwargs)` returns a
    `dew.config.DataConfig(name, kwargs)` after checking `kwargs` against the builder;
    `builder(name)` returns the builder itself."""

    def __getitem__(self, name: str) -> Callable[..., Any]:
        builder = self._entry(name)

        def data_config(**kwargs: Any) -> Any:
            config = DataConfig(name, kwargs)
            check_arguments("dataset", name, builder, kwargs, supplied=DATASET_SUPPLIED)
            return config

        data_config.__name__ = name
        data_config.__doc__ = f"A DataConfig for the dataset {name!r}."
        return data_config

    def builder(self, name: str) -> Callable[..., "Dataset"]:
        """The builder registered as `name`: `builder(*, batch_size, seed, **kwargs)`."""
        return self._entry(name)


datasets = DatasetRegistry(
    "dataset", lambda name, entry: _takes("dataset", name, entry, DATASET_SUPPLIED)
)

_register_builtins(
    datasets,
    {
        "arrays": "dew._datasets:arrays_file",
        "tokens": "dew._datasets:token_file",
        "token_windows": "dew._datasets:token_windows",
        "preference_pairs": "dew._datasets:preference_pairs",
        "prompts": "dew._datasets:prompts",
        "shapes": "dew._shapes:shapes",
        "moving_shapes": "dew._shapes:moving_shapes",
        "text": "dew.data._text:text_entry",
        "image_folder": "dew.data._image_folder:image_folder_entry",
        "huggingface": "dew.data._huggingface:huggingface_entry",
    },
)
