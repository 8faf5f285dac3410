"""Test-wide settings: strict JAX promotion rules, and shared helpers."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
from hypothesis import HealthCheck, settings

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

# derandomize: CI runs the same examples every time, so a failure reproduces exactly.
settings.register_profile(
    "dew",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("dew")
