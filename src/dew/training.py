"""The names the dew guide imports from `dew.training`: the trackers.

```python
>>> from dew.training import LocalTracker, MLflowTracker, TensorBoardTracker, Trackers
>>> from dew.training import WandbTracker

```
"""

from dew.tracking import InMemoryTracker as InMemoryTracker
from dew.tracking import LocalTracker as LocalTracker
from dew.tracking import MLflowTracker as MLflowTracker
from dew.tracking import TensorBoardTracker as TensorBoardTracker
from dew.tracking import Trackers as Trackers
from dew.tracking import WandbTracker as WandbTracker

__all__ = [
    "InMemoryTracker",
    "LocalTracker",
    "MLflowTracker",
    "TensorBoardTracker",
    "Trackers",
    "WandbTracker",
]
