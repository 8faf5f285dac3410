"""Equinox backbones."""

from dew.nn.backbones.bidirectional_transformer import (
    BidirectionalTransformer as BidirectionalTransformer,
)
from dew.nn.backbones.causal_transformer import CausalTransformer as CausalTransformer

__all__ = ["BidirectionalTransformer", "CausalTransformer"]
