"""Runnable studies: ``python -m analyses.<name>``.

* ``divergence_by_depth``: divergence and per-verifier acceptance by draft-tree depth (the main job);
* ``block_efficiency_grid``: E[tau + 1] over delayed-tree actions (K, L1, L2) per verifier.
"""
