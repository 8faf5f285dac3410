"""Equinox backbones."""

from dew.nn.backbones._remat import REMAT_POLICIES as REMAT_POLICIES
from dew.nn.backbones.bidirectional_transformer import (
    BidirectionalTransformer as BidirectionalTransformer,
)
from dew.nn.backbones.causal_transformer import CausalTransformer as CausalTransformer
from dew.nn.backbones.dit import DiT as DiT
from dew.nn.backbones.vit import ViT as ViT

# Each backbone is documented in its own module (`dew.nn.backbones.causal_transformer`, ...),
# and importable from here too.
__all__ = ["REMAT_POLICIES"]
