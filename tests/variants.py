"""The verifiers the generic tests run on and the edge cases they run them at (``simlab.conformance``):
one list each.

Every list is built from the registries when called (``simlab.verifiers.REGISTRY``,
``simlab.tree_verifiers.names``), so a verifier registered by its own module, or by a test
(``tests/test_new_verifier.py``), is picked up with no list edited.  Which tests apply to a
verifier follows from what it declares (``drafting``, ``needs_greedy_target``, ``lossless_for``,
a closed-form acceptance found by override: ``NodePlan.has_formula``), never from its name.
"""

from __future__ import annotations

from simlab import tree_verifiers, verifiers
from simlab.conformance import EDGE_CASES, edge_case  # noqa: F401 - the edge cases, public in simlab.conformance
from simlab.drafting import Drafting
from simlab.sampling import SamplingSettings

OPTION_VARIANTS = {
    "specinfer": [{"order": "fixed"}],
    "khisti": [
        {"mode": "truncated", "s": 2},
        {"mode": "truncated", "s": 3},
        {"mode": "truncated", "s": 2, "tail": "champion"},
        {"mode": "truncated", "s": 2, "tail": "rank"},
    ],
    "optimal": [{"replacement": False}],
    "spectr": [{"rho": "four_step"}],
    "sglang_threshold": [{"threshold_single": 0.3, "threshold_acc": 0.5}],
}
"""Options beyond the defaults worth testing, by verifier (the options its class takes)."""


def node_variants() -> list:
    """Every registered node verifier with its default options, then the option variants."""
    return [verifiers.get(name) for name in verifiers.names()] + [
        verifiers.get(name, **options) for name in verifiers.names() for options in OPTION_VARIANTS.get(name, [])
    ]


def renames_another(verifier) -> bool:
    """True for a registered node rule (or its top-down lifting) whose class only renames another
    registered class: the algorithm is inherited whole (the same ``_plan`` and leaf rule), as
    ``exact_match`` is NSS's class under the engines' name.  The statistical tests, which test the
    algorithm and cost seconds each, run it once, under the original's name."""
    node = getattr(verifier, "node", verifier)
    cls = type(node)
    return any(
        base is not cls
        and issubclass(cls, base)
        and all(getattr(cls, f) is getattr(base, f) for f in ("_plan", "leaf_law", "leaf_draw"))
        for base in verifiers.REGISTRY.values()
    )


def variant_id(verifier) -> str:
    """``name-option=value-...``: a readable pytest id."""
    return f"{verifier.name}-{'-'.join(f'{f}={getattr(verifier, f)}' for f in verifier.__dataclass_fields__)}".rstrip("-")


SAMPLED_T = SamplingSettings(temperature=1.0)
"""A setting at T > 0 (a verifier that needs a greedy target is not paired there)."""


def lossless_tree_names(law: Drafting) -> list[str]:
    """Every tree verifier (registered now) declared lossless for trees of ``law`` at T > 0."""
    return tree_verifiers.lossless_names({law}, SAMPLED_T)
