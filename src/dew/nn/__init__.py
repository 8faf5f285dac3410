"""Neural-network building blocks (Equinox modules)."""
