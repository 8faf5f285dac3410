"""Search a hyperparameter space: one ordinary run per point, recorded in a ledger.

`sweep(config, space, train=..., trials=..., ledger=...)` trains one trial per point of
`space`. Each trial is `config` with the point applied by `dew.config.override` and with
`trainer.name` set to `"<config.trainer.name>/trial-<index>"`, so every trial keeps its own
record, checkpoints and tracking directory. `train(run_config)` trains it and returns its
score, a float (non-finite scores are data and are kept).

A space maps dotted paths of the run record to what a trial may take there:

- a list or tuple of choices (`[0.01, 0.003]`), or `Choice(values)`;
- `Uniform(low, high, log=False)`: a float range (random and Optuna search only);
- `IntUniform(low, high, log=False)`: an integer range, both ends included (likewise).

Three search backends ship, and `Search` is the protocol for writing another:

- `random_search` draws each path independently and reproducibly from the trial index
  (`random_search(seed=7)` for another seed);
- `grid_search` walks the cartesian product in order and stops at the grid's size;
- `optuna_search` asks Optuna's sampler (extra `hpo`); with a shared RDB storage, several
  worker processes split one sweep's trials.

The ledger is a JSON-lines file (decision 0045): a header line `{"version": 2, "space",
"search", "config", "direction", "budget"}`, then one event a line, appended and fsynced:
`{"running": {"index", "overrides"}}` before a trial trains, `{"finished": {"index",
"overrides", "value"}}` before it is reported to the tracker, `{"budget": N}` when a larger
budget opens it; with a pruner (`optuna_search(pruner="median")`, decision 0055), a finished
trial's entry adds the validation scores it reported (`"reports"`) and a trial the pruner
stopped is recorded as `{"pruned": {...}}` (see `pruning_stopper`). A version-1 ledger (one JSON
object) is read and converted. A rerun of the same call skips the finished trials, retrains from
its start a trial that was cut off mid-training (its checkpoints resume it) and continues. A
ledger written for another space, another search or another base configuration
(`config.to_dict()`) is refused before any training. Non-finite scores are written `"NaN"`,
`"+Inf"`, `"-Inf"`.

A tracker passed to `sweep` receives each trial's score under `VALUE_TAG`
(`sweep/validation/value`, dew's `stage/split/metric` scheme) at step `index`, and its
`dew.telemetry.records.TrialFinished` record as artifact `"trial_finished"`.

```python
>>> import tempfile
>>> from dew.config import DataConfig, ModelConfig, RunConfig, TrainerConfig
>>> from dew.config.sweep import grid_search, sweep
>>> config = RunConfig(ModelConfig("mlp"), DataConfig("toy"), trainer=TrainerConfig(name="demo"))
>>> def train(run):
...     return abs(run.optim.learning_rate - 0.003) + run.trainer.batch_size / 100
>>> ledger = tempfile.mkdtemp() + "/ledger.json"
>>> space = {"optim.learning_rate": [0.01, 0.003], "trainer.batch_size": [16, 32]}
>>> trials = sweep(config, space, train=train, trials=4, ledger=ledger, search=grid_search)
>>> for trial in trials:
...     print(trial.index, trial.overrides)
0 {'optim.learning_rate': 0.01, 'trainer.batch_size': 16}
1 {'optim.learning_rate': 0.01, 'trainer.batch_size': 32}
2 {'optim.learning_rate': 0.003, 'trainer.batch_size': 16}
3 {'optim.learning_rate': 0.003, 'trainer.batch_size': 32}
>>> min(trials, key=lambda trial: trial.value).index
2

```
"""

from typing import TYPE_CHECKING

from dew._lazy import lazy_names

if TYPE_CHECKING:  # the names as type checkers, IDEs and the reference site see them
    from dew.config.sweep._optuna import OptunaSearch as OptunaSearch
    from dew.config.sweep._optuna import optuna_search as optuna_search
    from dew.config.sweep._optuna_run import _OptunaRun as _OptunaRun
    from dew.config.sweep._pruning import PruningStopper as PruningStopper
    from dew.config.sweep._pruning import pruning_stopper as pruning_stopper
    from dew.config.sweep._search import GridSearch as GridSearch
    from dew.config.sweep._search import IndexedSearch as IndexedSearch
    from dew.config.sweep._search import RandomSearch as RandomSearch
    from dew.config.sweep._search import Search as Search
    from dew.config.sweep._search import SearchRun as SearchRun
    from dew.config.sweep._search import SweepStateError as SweepStateError
    from dew.config.sweep._search import Trial as Trial
    from dew.config.sweep._search import grid_search as grid_search
    from dew.config.sweep._search import random_search as random_search
    from dew.config.sweep._space import Choice as Choice
    from dew.config.sweep._space import Field as Field
    from dew.config.sweep._space import IntUniform as IntUniform
    from dew.config.sweep._space import Space as Space
    from dew.config.sweep._space import Uniform as Uniform
    from dew.config.sweep._space import _checked_space as _checked_space
    from dew.config.sweep._sweep import TRIAL_FINISHED as TRIAL_FINISHED
    from dew.config.sweep._sweep import VALUE_TAG as VALUE_TAG
    from dew.config.sweep._sweep import sweep as sweep

__all__ = [
    "VALUE_TAG",
    "Choice",
    "GridSearch",
    "IndexedSearch",
    "IntUniform",
    "OptunaSearch",
    "PruningStopper",
    "RandomSearch",
    "Search",
    "SearchRun",
    "SweepStateError",
    "Trial",
    "Uniform",
    "grid_search",
    "optuna_search",
    "pruning_stopper",
    "random_search",
    "sweep",
]

# Each public name and the module it comes from, imported when the name is first used.
_HOMES = {
    "OptunaSearch": "dew.config.sweep._optuna",
    "_OptunaRun": "dew.config.sweep._optuna_run",
    "optuna_search": "dew.config.sweep._optuna",
    "PruningStopper": "dew.config.sweep._pruning",
    "pruning_stopper": "dew.config.sweep._pruning",
    "GridSearch": "dew.config.sweep._search",
    "IndexedSearch": "dew.config.sweep._search",
    "RandomSearch": "dew.config.sweep._search",
    "Search": "dew.config.sweep._search",
    "SearchRun": "dew.config.sweep._search",
    "SweepStateError": "dew.config.sweep._search",
    "Trial": "dew.config.sweep._search",
    "grid_search": "dew.config.sweep._search",
    "random_search": "dew.config.sweep._search",
    "Choice": "dew.config.sweep._space",
    "Field": "dew.config.sweep._space",
    "IntUniform": "dew.config.sweep._space",
    "Space": "dew.config.sweep._space",
    "Uniform": "dew.config.sweep._space",
    "_checked_space": "dew.config.sweep._space",
    "TRIAL_FINISHED": "dew.config.sweep._sweep",
    "VALUE_TAG": "dew.config.sweep._sweep",
    "sweep": "dew.config.sweep._sweep",
}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
