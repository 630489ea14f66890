import os

from hypothesis import HealthCheck, settings

# Numeric properties: no deadline; derandomized so every run (and CI) checks the same examples.
settings.register_profile(
    "simlab",
    deadline=None,
    derandomize=True,
    max_examples=int(os.environ.get("SIMLAB_HYPOTHESIS_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("simlab")
