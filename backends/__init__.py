"""Where p and q come from: synthetic worlds (``backends.synthetic``) and, later, real models.

Every backend returns a ``simlab.pairs.ModelPair``.
"""
