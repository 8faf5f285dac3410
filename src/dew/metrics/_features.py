"""What a score reads generated samples through: the feature and preprocessing definition
document 000 asks a user comparing generative scores to record."""

import dataclasses
from typing import Any, Protocol, runtime_checkable

__all__ = ["DescribesFeatures", "FeatureDefinition"]


@dataclasses.dataclass(frozen=True)
class FeatureDefinition:
    """The network a metric embeds samples with, and how it prepares them.

    - `network`: the network and the layer read, e.g. pytorch-fid's
      `"pytorch-fid 0.3.0 FID InceptionV3, pool3 (2048 features)"`.
    - `preprocessing`: what is done to a sample before the network, e.g.
      `"bilinear resize to 299x299 without antialiasing, [0, 1] scaled to [-1, 1]"`.
    - `weights_sha256`: the SHA-256 of the weights file the network was loaded from
      (computed once, when it is loaded), or `None` for weights that came from no file.
    """

    network: str
    preprocessing: str
    weights_sha256: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        """The fields as a JSON-ready mapping."""
        return dataclasses.asdict(self)


@runtime_checkable
class DescribesFeatures(Protocol):
    """A metric that scores samples through a feature network and says which: the
    `Trainer` puts `feature_definition()` in every `SamplingProtocol` record, under the
    metric's name (`FID`, `CLIPScore`)."""

    name: str

    def feature_definition(self) -> dict[str, Any]:
        """`FeatureDefinition.to_dict()` of the metric's network, and anything else that
        decides the score's meaning (FID's reference population)."""
        ...
