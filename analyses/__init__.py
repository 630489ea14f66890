"""Studies: compositions of a source (``backends``) and the exact core (``simlab``).

Runnable studies (``python -m analyses.<name>``; each module has ``main(argv) -> int``):

* ``divergence_by_depth``: divergence and per-verifier acceptance by draft-tree depth (the main job,
  pinned by ``tests/test_main_job.py``);
* ``block_efficiency_grid``: E[tau + 1] over delayed-tree actions (K, L1, L2) per verifier;
* ``compare_verifiers``: verification strategies under matched settings on the action grid;
* ``train_selector`` / ``evaluate_selector``: DDTE's neural delayed-expansion selector, trained
  on grid labels and evaluated against the static choices;
* ``ddte_audit``: how much of a published DDTE number each public-code convention explains;
* ``compare_builders``: every registered builder with every lossless verifier at matched budgets;
* ``sequoia_tree``: Sequoia's hardware-aware tree from an acceptance vector and a latency profile;
* ``treegraft``, ``specblock``: TreeGraft and SpecBlock measured exactly;
* ``parallel_drafters``: parallel (Medusa, DDTree) vs autoregressive (EAGLE-2, a static tree)
  drafting at matched budgets;
* ``sweep``: many engine configurations (EAGLE, vLLM, SGLang, Sequoia, TreeGraft, SpecBlock
  settings as the engines write them) under the engines' acceptance metrics and a latency profile;
* ``serve_estimate``: is a draft worth serving on an engine (vLLM, SGLang, llama.cpp, EAGLE,
  TensorRT-LLM), and with which configuration: 1 - TV by position, the engine's metrics, both
  aggregations, the speed-up at two draft prices, the best configurations with standard errors,
  and acceptance profiles the engines' synthetic modes replay;
* ``lossy_rules``: the engines' lossy verification knobs (Medusa's typical acceptance, SGLang's
  thresholds; with ``--rules``, Fast-HSD's rules and DIVERSE): throughput gain over strict
  exact-match against the exact TV of the emitted law;
* ``spectr_gbv``: SpecTr-GBV's released multi-draft block rule against Block Verification, exactly.

Helper modules (names starting with ``_``, never run) and the anatomy of a study (its ``Study`` parts
and the runner): ``docs/derivations/analyses.md``.
"""
