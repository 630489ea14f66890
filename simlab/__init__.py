"""simlab: an exact analytic lab for multi-path speculative decoding.

Modules:
    simlab.distributions  validation, sampling transforms, divergences
    simlab.drafting       drafting laws of a node's children (i.i.d., without replacement)
    simlab.verifiers      node-level verifiers (OTLP solvers); ``simlab.verifiers.get(name)``
    simlab.otlp           the optimal-transport LP and its closed-form optimum
"""

from simlab import distributions, drafting, otlp, verifiers

__all__ = ["distributions", "drafting", "otlp", "verifiers"]
