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


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def micro_pair_dir(tmp_path_factory):
    """The tiny reference pair (``python -m backends.reference_pair --micro``), trained once per session."""
    from backends.reference_pair import PairSpec, build

    out = tmp_path_factory.mktemp("micro_pair")
    build(out, seed=0, spec=PairSpec.micro(), log=lambda message: None)
    return out
