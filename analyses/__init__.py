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

Helper modules (their names start with ``_``; no ``main``; imported by the studies above, never run):

* ``_study``: the study runner (parsing, source, latency, ``--out``, staging, publishing, printing,
  errors and sharding, once for every study);
* ``_flags``: the study kit: the one source config and flag group, the latency flags, ``make_source``,
  ``make_latency`` and the live-model defaults;
* ``_grid_study``: what the action-grid studies share (config, grid and parallelism flags, set-up);
* ``_labels``: per-root action values (E[tau + 1] and T-hat of every grid action per verifier);
* ``_selector_data``: label rows and features to the selector's tensors, and the static choices;
* ``_builder_roster``: the builders ``compare_builders`` fits on training roots (each entry a
  registered ``simlab.builders`` builder, its laws and defaults read from there);
* ``_specblock_serving``: the SpecBlock study's prompt-stream serving and bandit part;
* ``_block_drafters``: the trained block drafters next to a pair (``specblock`` and
  ``compare_builders`` both use them);
* ``_engine_configs``: engine settings as the engines write them, mapped to the lab's builders,
  each engine's default grid, and the one map from engine verifier modes to lab verifiers
  (``sweep``, ``serve_estimate``);
* ``_engine_valuation``: engine configurations valued at every root of a source (``sweep``,
  ``serve_estimate``).

Anatomy of a study: a ``Study`` for the runner ``analyses._study`` (``STUDY = declared(globals())``
builds it from the module's conventional names; ``main(argv)`` is ``run_study(STUDY, argv)``):

1. **Config and flags**: a frozen ``Config(SourceConfig, LatencyConfig)`` dataclass whose lists are
   tuples parsed once; ``flags(parser, defaults)`` adds the kit's source and latency groups
   (``analyses._flags``) and the study's own; ``config(args, parser)`` builds the config and
   refuses, with one line, what the study cannot honour.
2. **Open**: ``open(config, parser, progress) -> Opened`` (the source from ``make_source``, the
   latency model from ``make_latency``).
3. **Values**: ``value_root(config, opened, task)`` values one root (so the runner can shard the
   roots across ``torchrun`` ranks) and ``merge`` joins them in root order, or ``values`` computes
   everything in one process; values come from the core (``simlab.valuation``,
   ``simlab.efficiency``, the tree verifiers), never recomputed here.
4. **Report**: ``run(config, opened, values, progress) -> Report``: named frames and charts (staged
   under ``--out`` and published atomically by the runner) and the printed tables.
5. The runner does the rest once: parsing, ``--out`` (default ``out/<study>/<source slug>``),
   progress on stderr, the "wrote" line, exit 2 with one line for a bad flag or input, 130 on Ctrl-C.

A study imports helpers and the core, never another runnable study (``tests/test_layers.py``):
what two studies share lives in a helper (``_selector_data.DEFAULT_RUN``, where ``train_selector``
writes and ``evaluate_selector`` reads; ``_block_drafters``, the block drafter set-up of
``specblock`` and ``compare_builders``).
"""
