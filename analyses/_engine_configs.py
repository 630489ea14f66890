"""Engine configurations as the engines write them, mapped to the lab's builders and verifiers.

Shared by ``analyses.sweep`` and ``analyses.serve_estimate`` (a helper, not a study); each serving
engine's default grid is ``default_configs``.  A configuration is one engine setting
(``EngineConfig``): the engine's own keys, the lab builder they mean, and its label.

=============  ==========================================================  ======================================
engine         keys (as the engine writes them)                            lab builder
=============  ==========================================================  ======================================
``eagle``      ``total_token``, ``depth``, ``top_k`` (EAGLE-2/3,           ``EAGLE2(total_token - 1, depth, top_k)``
               SafeAILab/EAGLE ``EaModel.from_pretrained``)
``vllm``       ``num_speculative_tokens`` (vLLM ``speculative_config``;   ``EAGLE2(k, k - 1, 1)``: the drafter's
               ``method`` recorded)                                        top-1 chain of k tokens
``sglang``     ``speculative_num_steps``, ``speculative_eagle_topk``,      ``EAGLE2(num_draft_tokens - 1,
               ``speculative_num_draft_tokens`` (SGLang server args)       num_steps - 1, topk)``
``sequoia``    ``budget`` (draft tokens; Sequoia's tree for the roots'     ``Sequoia`` (children w/o replacement)
               measured acceptance vector)
``treegraft``  ``budget`` (TreeGraft's B_ver at its default schedule)      ``TreeGraft(budget=...)``
``specblock``  ``budget``                                                  SpecBlock's ``RankGuided``
``llama.cpp``  ``draft_max``, ``draft_min``, ``draft_p_min`` (its          ``EAGLE2(draft_max, draft_max - 1, 1)``
               server's ``--draft-max``, ``--draft-min``,                  at ``draft_p_min <= 0``, else
               ``--draft-p-min``; ``method``: ``--spec-type``,             ``ConfidentChain(draft_max,
               ``draft`` only)                                             draft_p_min, draft_min)``
``tensorrt-``  ``max_draft_len``; optional ``use_dynamic_tree``,           ``EAGLE2(max_draft_len,
``llm``        ``dynamic_tree_max_topK``, ``max_total_draft_tokens``       max_draft_len - 1, 1)``; dynamic:
               (``EagleDecodingConfig``; ``decoding_type``: its            ``EAGLE2(max_total_draft_tokens,
               method)                                                     max_draft_len - 1, topK)``
=============  ==========================================================  ======================================

Counting conventions, each engine's own rules (read in its code, with commits) and the settings refused
although the engine would run them: ``docs/derivations/engine_configs.md``.

**Verifier modes** (``VERIFIER_MODES``, the one map from an engine's verification to a lab verifier):
``exact_match`` (strict: accept a draft iff it equals the token the target samples; SGLang and
vLLM at T = 0, and ``target-only`` tree sampling), ``one_hot`` (accept x w.p. p(x), q taken
one-hot: vLLM's rejection sampler without draft probabilities, EAGLE's T > 0 verification),
``probabilistic`` (rejection sampling with the draft's q, for sampled children: Sequoia's
recursive rejection sampling without replacement).  A mode is run only where its verifier is
lossless for the builder's drafting law (``simlab.tree_verifiers.lossless_names``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from simlab import builders
from simlab.builders.confident_chain import DRAFT_TOP_K as LLAMA_DRAFT_TOP_K
from simlab.builders.sequoia import MAX_BUDGET as SEQUOIA_MAX_BUDGET
from simlab.drafting import Drafting

VERIFIER_MODES = {
    "exact_match": "exact_match",  # vLLM's strict exact-match (the law of nss, under the engines' name)
    "one_hot": "onehot",
    "probabilistic": {Drafting.WITHOUT_REPLACEMENT: "rrs_wor", Drafting.IID: "naive"},
}
"""Engine verification mode -> the lab's tree verifier (``probabilistic``: per drafting law)."""
MODES = tuple(VERIFIER_MODES)

KEYS = {
    "eagle": ("total_token", "depth", "top_k"),
    "vllm": ("num_speculative_tokens",),
    "sglang": ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"),
    "sequoia": ("budget",),
    "treegraft": ("budget",),
    "specblock": ("budget",),
    "llama.cpp": ("draft_max", "draft_min", "draft_p_min"),
    "tensorrt-llm": ("max_draft_len",),
}
"""Each engine's required keys (``method``, ``name`` and ``modes`` are optional everywhere)."""
OPTIONAL = ("method", "name", "modes")
ENGINE_OPTIONAL = {
    "tensorrt-llm": (
        "decoding_type",
        "use_dynamic_tree",
        "dynamic_tree_max_topK",
        "max_total_draft_tokens",
        "use_rejection_sampling",
        "greedy_sampling",
    ),
}
"""Optional keys of one engine, as it spells them (TensorRT-LLM's ``EagleDecodingConfig`` fields;
``decoding_type`` is its ``method``)."""
KEY_TYPES = {
    ("llama.cpp", "draft_p_min"): "real",
    ("tensorrt-llm", "use_dynamic_tree"): "bool",
    ("tensorrt-llm", "use_rejection_sampling"): "bool",
    ("tensorrt-llm", "greedy_sampling"): "bool",
}
"""Keys whose values are not integers: ``real`` (a finite number, as llama.cpp's ``std::stof``
reads ``--draft-p-min``) or ``bool``; every other key takes an integer."""
REFUSED_KEYS = {
    "tensorrt-llm": {
        "eagle_choices": "a static tree TensorRT-LLM deprecates (release 1.4) and marks 'still under development'; "
        "its node order is not mapped to simlab.builders.static",
        "posterior_threshold": "typical acceptance (Medusa's epsilon) is lossy: no lab verifier values it",
        "draft_len_schedule": "the draft length then depends on the batch size, which a configuration does not name",
        "max_concurrency": "speculation then depends on the batch size, which a configuration does not name",
        "acceptance_window": "speculation is then switched off by measured acceptance, a run-time rule",
        "acceptance_length_threshold": "speculation is then switched off by measured acceptance, a run-time rule",
        "sa_config": "suffix-automaton drafts then override the model's, from the request's history",
        "max_non_leaves_per_layer": "a TensorRT-engine (not PyTorch) tree option whose rule was not read",
        "num_eagle_layers": "deprecated and TensorRT-engine only; the PyTorch backend sets it to max_draft_len",
    },
    "llama.cpp": {
        "draft_p_split": "the speculative example's tree split (llama-speculative), not the server's draft chain",
    },
}
"""Keys an engine reads but the lab refuses, each with its reason (one line naming the key)."""
LLAMA_METHODS = ("draft",)
"""llama.cpp ``--spec-type`` / ``speculative.type`` values the lab models: ``draft`` (a draft model's
chain, ``common_speculative_use_draft_model``).  ``eagle3`` drafts nothing at ggml-org/llama.cpp@6c8a045
(its ``common_speculative_gen_draft`` case is empty, PR 18039 in progress) and the ``ngram_*`` types
draft from the context: refused."""
TRTLLM_METHODS = ("Eagle", "Eagle3")
"""TensorRT-LLM ``decoding_type`` values the lab models (``EagleDecodingConfig`` /
``Eagle3DecodingConfig``, the one-model EAGLE-3 worker).  ``DraftTarget`` is refused: its drafter is
the argmax chain too, but at T > 0 its verification (TorchSampler's rejection sampling on the
draft's logits re-sampled under the request's strategy, TRTLLM-7772) was not pinned to a lab
verifier; ``MTP``, ``Medusa``, ``NGram``, ``Lookahead``, ``SA`` and others draft otherwise."""
VLLM_CHAIN_METHODS = ("eagle", "eagle3", "draft_model", "mtp")
"""vLLM ``method`` values whose proposer drafts the argmax chain of an autoregressive drafter (the
lab's ``EAGLE2(k, k - 1, 1)``; any ``*_mtp`` name too, which vLLM renames ``mtp``:
vllm-project/vllm@f19b16d ``vllm/config/speculative.py`` ``EagleModelTypes``).  ``ngram``,
``ngram_gpu``, ``suffix``, ``medusa``, ``mlp_speculator`` (and ``dflash`` where a vLLM has it) draft
otherwise and are refused, not relabelled."""
TREE_METHODS = {"sglang": ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE"), "eagle": ("EAGLE", "EAGLE2", "EAGLE3")}
"""``method`` values (any case) of the engines whose drafters build the EAGLE-style top-k tree the
sweep values: SGLang's ``speculative_algorithm`` run by its EAGLE worker (``NGRAM`` and others draft
otherwise and are refused), EAGLE's own releases."""
SAMPLED = tuple(name for name in ("sequoia", "treegraft", "specblock") if builders.sampled(name))
"""Engines whose trees are sampled (valued by the mean of exact values over drawn trees): the
builders whose declared drafting laws draw (``simlab.builders.sampled``)."""


MAX_LEVELS = 65
"""The most levels (draft positions) a configuration may reach: ``simlab.builders.EAGLE2`` grows
at most 64 rounds after the root's (its ``depth`` range); the engines themselves have no such limit."""


@dataclass(frozen=True)
class EngineConfig:
    """One engine setting: ``engine``, its keys with the values the engine runs (``settings``), the
    verifier ``modes`` to run, and a ``name`` (default: the engine and its keys).

    ``adjusted``: (key, value as written, the engine's rule) for each key the engine resets itself
    (SGLang's ``speculative_num_draft_tokens`` at ``topk = 1``, llama.cpp's clamped ``draft_min``);
    the label gives both values.  ``settings`` values are integers except llama.cpp's
    ``draft_p_min`` (a number) and TensorRT-LLM's flags (bools)."""

    engine: str
    settings: tuple[tuple[str, int | float | bool], ...]
    modes: tuple[str, ...] = MODES
    name: str = ""
    method: str = ""
    lab: dict = field(default_factory=dict, compare=False)
    unrunnable: str = field(default="", compare=False)
    """Why the engine itself cannot run this setting ("" when it can): a grid point kept for
    ``not_run`` (``grid_configs``); a configuration file's entry is refused instead."""
    adjusted: tuple[tuple[str, int, str], ...] = ()

    @property
    def label(self) -> str:
        """The name (default: the engine and the keys it runs); an adjusted key adds its written value
        and the engine's rule: ``... speculative_num_draft_tokens=6 (written 3: SGLang runs num_steps + 1 at topk 1)``."""
        if self.name:
            notes = "; ".join(f"{k}={dict(self.settings)[k]}, written {w}: {rule}" for k, w, rule in self.adjusted)
            return f"{self.name} ({notes})" if notes else self.name
        notes = "; ".join(f"written {w}: {rule}" for _, w, rule in self.adjusted)
        keys = " ".join(f"{k}={v}" for k, v in self.settings)
        return f"{self.engine} {keys}" + (f" ({notes})" if notes else "")

    @property
    def budget(self) -> int:
        """Draft tokens (root excluded) the configuration verifies at most."""
        return self.lab["budget"]

    @property
    def levels(self) -> int | None:
        """Draft positions (tree levels below the root) the configuration reaches at most: ``depth + 1``
        of an EAGLE-2 tree, the budget of a chain; None for a builder without a fixed bound (Sequoia,
        TreeGraft, SpecBlock)."""
        kind = self.lab.get("kind")
        if kind == "eagle2":
            return self.lab["depth"] + 1
        if kind == "confident_chain":
            return self.lab["budget"]
        return None

    def verifier(self, mode: str, laws) -> str | None:
        """The lab verifier of ``mode`` for trees of drafting ``laws`` (None: the mode has none)."""
        name = VERIFIER_MODES[mode]
        if isinstance(name, dict):
            found = {name[law] for law in laws if law in name}
            return found.pop() if len(found) == 1 and all(law in name for law in laws) else None
        return name


ENGINE_NAMES = {"eagle": "EAGLE", "vllm": "vLLM", "sglang": "SGLang", "llama.cpp": "llama.cpp", "tensorrt-llm": "TensorRT-LLM"}

SGLANG_TOPK1_RULE = "SGLang runs num_steps + 1 at topk 1"
"""SGLang's reset (module docstring), as a label states it."""
LLAMA_CLAMP_RULE = "llama.cpp's server clamps draft_min to [0, draft_max]"
"""llama.cpp's clamp (module docstring), as a label states it."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def engine_settings(engine: str, s: dict) -> tuple[dict, tuple[tuple[str, int, str], ...]]:
    """The settings the engine runs for the settings ``s`` as written, and the adjustments
    (key, written value, rule) it makes silently: SGLang resets ``speculative_num_draft_tokens``
    to ``speculative_num_steps + 1`` when ``speculative_eagle_topk`` is 1; llama.cpp's server clamps
    ``draft_min`` to ``[0, draft_max]``; TensorRT-LLM's dynamic tree fills in
    ``max_total_draft_tokens = dynamic_tree_max_topK * max_draft_len`` when it is not written (a
    default, not an adjustment: no note) (module docstring)."""
    if engine == "sglang" and s["speculative_eagle_topk"] == 1 and isinstance(s["speculative_num_steps"], int):
        runs = s["speculative_num_steps"] + 1
        if s["speculative_num_draft_tokens"] != runs:
            return {**s, "speculative_num_draft_tokens": runs}, (
                ("speculative_num_draft_tokens", s["speculative_num_draft_tokens"], SGLANG_TOPK1_RULE),
            )
    if engine == "llama.cpp" and _is_int(s["draft_max"]) and _is_int(s["draft_min"]) and s["draft_max"] >= 1:
        runs = max(min(s["draft_max"], s["draft_min"]), 0)
        if s["draft_min"] != runs:
            return {**s, "draft_min": runs}, (("draft_min", s["draft_min"], LLAMA_CLAMP_RULE),)
    if (
        engine == "tensorrt-llm"
        and s.get("use_dynamic_tree") is True
        and "max_total_draft_tokens" not in s
        and _is_int(s.get("dynamic_tree_max_topK"))
        and _is_int(s["max_draft_len"])
    ):
        return {**s, "max_total_draft_tokens": s["dynamic_tree_max_topK"] * s["max_draft_len"]}, ()
    return dict(s), ()


class SettingError(ValueError):
    """A refused value of one engine key: ``str`` is ``"<key>: <message>"``; ``key`` is the key as
    written, so a caller that took the value from a flag names the flag instead (``grid_configs``)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def lab_builder(engine: str, s: dict) -> dict:
    """The lab builder's options for one engine setting ``s``, as the engine runs it
    (``engine_settings``; module table).

    Raises:
        SettingError: (a ValueError, ``<key>: ...``) naming the key as written: a value of the wrong
            type (``KEY_TYPES``: integers, llama.cpp's finite ``draft_p_min``, TensorRT-LLM's bools),
            out of the engine's range, a setting that drafts no token, a TensorRT-LLM option the lab
            does not value (``greedy_sampling: false``, ``use_rejection_sampling: true``, a topK
            without ``use_dynamic_tree``), or one beyond the lab's ``MAX_LEVELS`` on an EAGLE-2 tree.
    """
    for key, value in s.items():
        kind = KEY_TYPES.get((engine, key), "int")
        if kind == "real":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise SettingError(key, f"must be a finite number, got {value!r}")
        elif kind == "bool":
            if not isinstance(value, bool):
                raise SettingError(key, f"must be true or false, got {value!r}")
        elif not _is_int(value):
            raise SettingError(key, f"must be an integer, got {value!r}")
    if engine == "llama.cpp":
        return _llama_builder(s)
    if engine == "tensorrt-llm":
        return _trtllm_builder(s)
    if engine == "eagle" and s["total_token"] == -1:
        raise SettingError(
            "total_token",
            "-1 makes EAGLE pick one of 40, 48, 50, 56, 60 by timing the target on its GPU "
            "(EaModel.from_pretrained): write the total_token it picked",
        )
    s, _ = engine_settings(engine, s)  # before the ranges: SGLang ignores num_draft_tokens at topk 1
    if engine == "eagle" and s["depth"] < 0:
        raise SettingError(
            "depth",
            f"must be an integer >= 0, got {s['depth']} (EAGLE runs no expansion round for a negative depth, as for 0: write 0)",
        )
    for key, value in s.items():
        if value < (0 if key == "depth" else 1):
            raise SettingError(key, f"must be an integer >= {0 if key == 'depth' else 1}, got {value!r}")
    if engine == "eagle":
        if s["total_token"] < 2:
            raise SettingError(
                "total_token",
                f"counts the root, must be >= 2, got {s['total_token']} (EAGLE would draft no token: "
                "plain decoding, which the sweep does not value)",
            )
        lab = {"kind": "eagle2", "budget": s["total_token"] - 1, "depth": s["depth"], "top_k": s["top_k"]}
        key, levels = "depth", s["depth"] + 1
    elif engine == "vllm":
        k = s["num_speculative_tokens"]
        lab = {"kind": "eagle2", "budget": k, "depth": k - 1, "top_k": 1}
        key, levels = "num_speculative_tokens", k
    elif engine == "sglang":
        n = s["speculative_num_draft_tokens"]
        if n < 2:
            raise SettingError(
                "speculative_num_draft_tokens",
                f"counts the root, must be >= 2, got {n} (SGLang would draft no token: "
                "plain decoding, which the sweep does not value)",
            )
        lab = {"kind": "eagle2", "budget": n - 1, "depth": s["speculative_num_steps"] - 1, "top_k": s["speculative_eagle_topk"]}
        key, levels = "speculative_num_steps", s["speculative_num_steps"]
    else:
        if engine == "sequoia" and s["budget"] > SEQUOIA_MAX_BUDGET:
            raise SettingError(
                "budget",
                f"at most {SEQUOIA_MAX_BUDGET} draft tokens for the lab's Sequoia DP (its time grows as the "
                f"budget squared; a limit of the lab), got {s['budget']}",
            )
        return {"kind": engine, "budget": s["budget"]}
    if levels > MAX_LEVELS:
        raise SettingError(
            key,
            f"{levels} draft positions; the lab's EAGLE-2 builder reaches at most {MAX_LEVELS} "
            f"(a limit of the lab, not of {ENGINE_NAMES[engine]}), got {s[key]}",
        )
    return lab


def _llama_builder(s: dict) -> dict:
    """llama.cpp's draft chain (module docstring): the top-1 chain of ``draft_max`` tokens where the
    confidence rule cannot stop it (``draft_p_min <= 0``), else ``simlab.builders.ConfidentChain``."""
    if s["draft_max"] < 1:
        raise SettingError(
            "draft_max",
            f"must be an integer >= 1, got {s['draft_max']} (llama.cpp's server clamps it to 0 and then drafts no "
            "token: plain decoding, which the lab does not value)",
        )
    s, _ = engine_settings("llama.cpp", s)
    n_max, n_min, p_min = s["draft_max"], s["draft_min"], float(s["draft_p_min"])
    if p_min <= 0.0 and n_max <= MAX_LEVELS:  # every token passes: the chain always holds n_max >= n_min tokens
        return {"kind": "eagle2", "budget": n_max, "depth": n_max - 1, "top_k": 1}
    return {"kind": "confident_chain", "budget": n_max, "p_min": p_min, "n_min": n_min, "top_k": LLAMA_DRAFT_TOP_K}


def _trtllm_builder(s: dict) -> dict:
    """TensorRT-LLM's EAGLE-3 one-model drafting (module docstring): the argmax chain of
    ``max_draft_len`` tokens, or with ``use_dynamic_tree`` EAGLE-2's tree."""
    n = s["max_draft_len"]
    if n < 1:
        raise SettingError("max_draft_len", f"must be an integer >= 1, got {n} (TensorRT-LLM raises: max_draft_len must be > 0)")
    if s.get("greedy_sampling", True) is False:
        raise SettingError(
            "greedy_sampling", "false selects typical acceptance (lossy, Medusa's posterior threshold): no lab verifier values it"
        )
    if s.get("use_rejection_sampling", False) is True:
        raise SettingError(
            "use_rejection_sampling",
            "true (a prototype) verifies non-greedy batches by rejection sampling, whose rule on greedy drafts was not "
            "read; false (the default) verifies by exact match",
        )
    dynamic = s.get("use_dynamic_tree", False)
    if not dynamic:
        for key in ("dynamic_tree_max_topK", "max_total_draft_tokens"):
            if key in s:
                raise SettingError(
                    key,
                    "is read only with use_dynamic_tree true here (TensorRT-LLM ignores dynamic_tree_max_topK without it, "
                    "with a warning): write use_dynamic_tree: true or drop the key",
                )
        lab = {"kind": "eagle2", "budget": n, "depth": n - 1, "top_k": 1}
    else:
        k = s.get("dynamic_tree_max_topK")
        if k is None or k < 1:
            raise SettingError(
                "dynamic_tree_max_topK",
                f"must be an integer >= 1 with use_dynamic_tree, got {k!r} (TensorRT-LLM raises)",
            )
        s, _ = engine_settings("tensorrt-llm", s)
        total = s["max_total_draft_tokens"]
        if not n <= total <= k * n:
            raise SettingError(
                "max_total_draft_tokens",
                f"must lie in [max_draft_len, dynamic_tree_max_topK * max_draft_len] = [{n}, {k * n}], got {total} "
                "(TensorRT-LLM raises)",
            )
        lab = {"kind": "eagle2", "budget": total, "depth": n - 1, "top_k": k}
    if n > MAX_LEVELS:
        raise SettingError(
            "max_draft_len",
            f"{n} draft positions; the lab's EAGLE-2 builder reaches at most {MAX_LEVELS} "
            f"(a limit of the lab, not of TensorRT-LLM), got {n}",
        )
    return lab


def engine_limit(engine: str, lab: dict) -> str:
    """Why the engine cannot build the tree of ``lab`` ("" when it can), naming the key as written:
    EAGLE's ``topK_genrate`` keeps the ``total_token - 1`` best of its top_k + depth top_k^2
    candidates with ``torch.topk`` (SafeAILab/EAGLE@cb7e084 ``eagle/model/cnets.py``), SGLang's
    ``organize_draft_results`` the ``num_draft_tokens - 1`` best of its topk + (num_steps - 1) topk^2
    (sgl-project/sglang@263bc85 ``speculative/eagle_utils.py``); ``torch.topk`` raises when asked
    for more.  A vLLM chain of k tokens has k candidates: always buildable."""
    if lab.get("kind") != "eagle2" or engine not in ("eagle", "sglang"):
        return ""
    candidates = lab["top_k"] + lab["depth"] * lab["top_k"] ** 2
    if lab["budget"] <= candidates:
        return ""
    if engine == "sglang":
        return (
            f"speculative_num_draft_tokens: {lab['budget'] + 1} - 1 = {lab['budget']} draft tokens exceeds SGLang's "
            f"topk + (num_steps - 1) topk^2 = {candidates} candidates (its torch.topk fails)"
        )
    return (
        f"total_token - 1 = {lab['budget']} draft tokens exceeds EAGLE's top_k + depth top_k^2 = {candidates} "
        "candidates (its torch.topk fails)"
    )


def vocab_limit(config: EngineConfig, vocab: int) -> str:
    """Why the engine cannot draft ``config``'s tree over a vocabulary of ``vocab`` tokens ("" when it
    can, naming the key as written): EAGLE's ``topK_genrate`` and SGLang's ``fast_topk`` take the
    top_k of the draft's distribution with ``torch.topk``, which raises for more than its size (the
    sweep checks it at a root, where the vocabulary is known)."""
    key = {"eagle": "top_k", "sglang": "speculative_eagle_topk", "tensorrt-llm": "dynamic_tree_max_topK"}.get(config.engine)
    top_k = config.lab.get("top_k", 0)
    if key is None or top_k <= vocab:
        return ""
    return f"{key}: {top_k} exceeds the vocabulary of {vocab} tokens ({ENGINE_NAMES[config.engine]}'s torch.topk fails)"


def draft_law_limit(config: EngineConfig, draft_law: str, setting) -> str:
    """Why ``config``'s tree cannot be drawn as its engine draws it from the drafting law
    ``draft_law`` at ``setting`` ("" when it can): llama.cpp's ``draft_p_min`` compares the draft's
    untempered probabilities (``simlab.builders.confident_chain``), so with ``--draft-law setting``
    at any setting but plain T = 1 (at T = 0 q is one-hot: every confidence is 1 and the flag would
    be silently ignored) the chain is not run.

    Args:
        config: the configuration; draft_law: ``"raw"`` or ``"setting"``
            (``analyses._flags.drafting_table``); setting: its ``simlab.sampling.SamplingSettings``.
    """
    from simlab.sampling import SamplingSettings

    if config.lab.get("kind") != "confident_chain" or config.lab.get("p_min", 0) <= 0:
        return ""
    if draft_law == "raw" or setting == SamplingSettings():
        return ""
    return (
        f"draft_p_min: {config.lab['p_min']} compares the draft's untempered probabilities, which --draft-law setting "
        f"does not hold at {setting.name} (at T = 0 every confidence is 1); use --draft-law raw (a capture: one at T = 1)"
    )


def make_config(entry: dict, where: str | None = "config", strict: bool = True) -> EngineConfig:
    """One ``EngineConfig`` from a dict written as the engine writes it (``{"engine": "eagle",
    "total_token": 60, "depth": 7, "top_k": 10}``), with the values the engine runs
    (``engine_settings``: an adjusted key keeps its written value in the label).

    ``strict``: refuse a setting the engine cannot run (``engine_limit``); else keep it, its
    reason in ``unrunnable``.  ``where`` None: a refused key's value raises ``SettingError`` without
    a prefix (``grid_configs`` names the flag it came from).

    Raises:
        ValueError: ``<where>: ...`` for an unknown engine, a missing or unknown key, a key the lab
            refuses (``REFUSED_KEYS``, ``<where>: <key>: not valued by the lab: <why>``), a method the
            lab does not model, a bad value, a bad or repeated mode, or (``strict``) a setting the
            engine cannot run.  TensorRT-LLM's ``decoding_type`` is its ``method``.
    """
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be an object with an 'engine' key, got {entry!r}")
    engine = entry.get("engine")
    if not isinstance(engine, str) or engine not in KEYS:
        raise ValueError(f"{where}: engine must be one of {', '.join(KEYS)}, got {engine!r}")
    refused = sorted(set(entry) & set(REFUSED_KEYS.get(engine, {})))
    if refused:
        raise ValueError(f"{where}: {refused[0]}: not valued by the lab: {REFUSED_KEYS[engine][refused[0]]}")
    optional = ENGINE_OPTIONAL.get(engine, ())
    unknown = sorted(set(entry) - set(KEYS[engine]) - set(OPTIONAL) - set(optional) - {"engine"})
    if unknown:
        raise ValueError(
            f"{where}: unknown key {unknown[0]!r} for engine {engine} (keys: {', '.join(KEYS[engine] + optional + OPTIONAL)})"
        )
    if "decoding_type" in entry:  # TensorRT-LLM's name for its method
        if "method" in entry and entry["method"] != entry["decoding_type"]:
            raise ValueError(f"{where}: decoding_type {entry['decoding_type']!r} and method {entry['method']!r} disagree")
        entry = {k: v for k, v in entry.items() if k != "decoding_type"} | {"method": entry["decoding_type"]}
    missing = [k for k in KEYS[engine] if k not in entry]
    if missing:
        raise ValueError(f"{where}: engine {engine} needs {missing[0]!r}")
    modes = entry.get("modes", list(MODES))
    if not isinstance(modes, list) or not modes or any(m not in MODES for m in modes):
        raise ValueError(f"{where}: modes must be a non-empty list of {', '.join(MODES)}, got {modes!r}")
    repeated = [m for m in modes if modes.count(m) > 1]
    if repeated:
        raise ValueError(f"{where}: modes lists {repeated[0]!r} twice (its rows would be counted twice)")
    for key in ("name", "method"):
        if not isinstance(entry.get(key, ""), str):
            raise ValueError(f"{where}: {key} must be a string, got {entry[key]!r}")
    method = entry.get("method", "")
    tree_methods = TREE_METHODS.get(engine)
    if method and tree_methods is not None and method.upper() not in tree_methods:
        raise ValueError(
            f"{where}: method {method!r} is not a drafter whose tree the sweep models for engine {engine} "
            f"(methods: {', '.join(tree_methods)}); it would be valued as an EAGLE-style tree under your label"
        )
    if engine == "llama.cpp" and method and method not in LLAMA_METHODS:
        raise ValueError(
            f"{where}: method {method!r} is not a drafter the lab models for llama.cpp (methods: {', '.join(LLAMA_METHODS)}: "
            "a draft model's chain; eagle3 drafts nothing at the commit read, the ngram types draft from the context)"
        )
    if engine == "tensorrt-llm" and method and method not in TRTLLM_METHODS:
        raise ValueError(
            f"{where}: decoding_type {method!r} is not a drafter the lab models for TensorRT-LLM (decoding types: "
            f"{', '.join(TRTLLM_METHODS)}; DraftTarget's T > 0 verification is not pinned to a lab verifier, the others "
            "draft otherwise)"
        )
    if engine == "vllm" and method and method not in VLLM_CHAIN_METHODS and not method.endswith("_mtp"):
        raise ValueError(
            f"{where}: method {method!r} does not draft an autoregressive argmax chain, the only vLLM drafter the "
            f"sweep models (methods: {', '.join(VLLM_CHAIN_METHODS)}, *_mtp)"
        )
    written = {k: entry[k] for k in KEYS[engine] + optional if k in entry}
    try:
        lab = lab_builder(engine, written)
    except SettingError as exc:
        raise SettingError(exc.key, exc.message) if where is None else ValueError(f"{where}: {exc}") from None
    settings, adjusted = engine_settings(engine, written)
    why = engine_limit(engine, lab)
    if why and strict:
        raise ValueError(f"{where}: {why}")
    return EngineConfig(
        engine, tuple(settings.items()), tuple(modes), entry.get("name", ""), entry.get("method", ""), lab, why, adjusted
    )


def read_configs(path, *, strict: bool = True, engine: str | None = None, modes=None) -> list[EngineConfig]:
    """The configurations of a JSON file: a list of entries, or ``{"configs": [...]}``.

    ``strict``: refuse a setting the engine cannot build (``make_config``); else keep it with its
    reason in ``unrunnable`` (``analyses.serve_estimate`` lists it as refused).  ``engine``: every
    entry must be a setting of that engine.  ``modes``: the modes of an entry that names none
    (default: every mode).

    Raises:
        ValueError: ``config: ...`` for an unreadable file, bad JSON, or a bad entry (``config[i]: ...``,
            another engine's entry included); a label listed twice, or two entries the engine runs as
            one setting (the same lab builder) under a shared mode (SGLang's topk-1 reset or
            llama.cpp's draft_min clamp can make two written settings one): their rows would count twice.
    """
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"config: cannot read {str(path)!r} ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"config: {str(path)!r} is not JSON ({exc})") from None
    entries = data.get("configs") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise ValueError(f'config: {str(path)!r} must hold a non-empty list of configurations or {{"configs": [...]}}')
    out = []
    for i, e in enumerate(entries):
        if engine is not None and isinstance(e, dict) and e.get("engine") != engine:
            raise ValueError(f"config[{i}]: a setting of engine {e.get('engine')!r}; the engine is {engine}")
        if modes is not None and isinstance(e, dict):
            e = {"modes": list(modes), **e}
        out.append(make_config(e, f"config[{i}]", strict=strict))
    labels = [c.label for c in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"config: {str(path)!r} lists a configuration twice ({next(x for x in labels if labels.count(x) > 1)})")
    runs: dict[tuple, int] = {}
    for i, c in enumerate(out):
        for mode in c.modes:
            j = runs.setdefault((c.engine, tuple(sorted(c.lab.items())), mode), i)
            if j != i:
                raise ValueError(
                    f"config[{i}]: runs the setting of config[{j}] ({out[j].label}) under mode {mode}: "
                    "its rows would be counted twice"
                )
    return out


ENGINES = ("vllm", "sglang", "llama.cpp", "eagle", "tensorrt-llm")
"""The serving engines ``default_configs`` (and ``analyses.serve_estimate``) take, as a configuration's
``engine`` spells them."""

EAGLE_TOTAL_TOKENS = (40, 48, 50, 56, 60)
EAGLE_DEPTHS = (5, 6, 7)
EAGLE_TOP_KS = (8, 10)
VLLM_TOKENS = tuple(range(1, 8))
SGLANG_STEPS, SGLANG_TOPKS, SGLANG_DRAFT_TOKENS = (1, 3, 5, 7), (1, 2, 4, 8), (2, 4, 8, 16, 32)
LLAMA_DRAFT_MAX, LLAMA_P_MIN = (4, 8, 16, 32), (0.0, 0.5, 0.75, 0.9)
TRTLLM_CHAINS = tuple(range(1, 8))
TRTLLM_TREE_LENS, TRTLLM_TREE_TOPKS, TRTLLM_TREE_TOKENS = (3, 5, 7), (4, 8), (8, 16, 32, 64)


def default_entries(engine: str) -> list[dict]:
    """The entries (as the engine writes them) of ``engine``'s default grid (``default_configs``)."""
    if engine == "eagle":
        return [
            {"engine": "eagle", "total_token": t, "depth": d, "top_k": k}
            for t in EAGLE_TOTAL_TOKENS
            for d in EAGLE_DEPTHS
            for k in EAGLE_TOP_KS
        ]
    if engine == "vllm":
        return [{"engine": "vllm", "num_speculative_tokens": k} for k in VLLM_TOKENS]
    if engine == "llama.cpp":
        return [
            {"engine": "llama.cpp", "draft_max": n, "draft_min": 0, "draft_p_min": p}
            for n in LLAMA_DRAFT_MAX
            for p in LLAMA_P_MIN
        ]
    if engine == "tensorrt-llm":
        chains = [{"engine": "tensorrt-llm", "max_draft_len": n} for n in TRTLLM_CHAINS]
        trees = [
            {
                "engine": "tensorrt-llm",
                "max_draft_len": n,
                "use_dynamic_tree": True,
                "dynamic_tree_max_topK": k,
                "max_total_draft_tokens": t,
            }
            for n in TRTLLM_TREE_LENS
            for k in TRTLLM_TREE_TOPKS
            for t in TRTLLM_TREE_TOKENS
            if n <= t <= k * n  # EagleDecodingConfig's range
        ]
        return chains + trees
    if engine == "sglang":
        out, seen = [], set()
        for steps in SGLANG_STEPS:
            for topk in SGLANG_TOPKS:
                for n in SGLANG_DRAFT_TOKENS:
                    if steps * topk + 1 < n:  # bench_speculative.py's filter
                        continue
                    written = {"speculative_num_steps": steps, "speculative_eagle_topk": topk, "speculative_num_draft_tokens": n}
                    runs, _ = engine_settings("sglang", written)
                    key = tuple(runs.values())
                    if key not in seen:
                        seen.add(key)
                        out.append({"engine": "sglang", **runs})
        return out
    raise ValueError(f"engine: must be one of {', '.join(ENGINES)}, got {engine!r}")


def default_configs(engine: str, modes=MODES) -> list[EngineConfig]:
    """Each engine's default grid: the configurations a user of ``engine`` would screen, its documented
    defaults and the neighbours a tuner tries, each written as the engine writes it and mapped by
    ``make_config`` (so every one is runnable by the engine and valued by the lab):

    * ``eagle``: ``total_token`` in 40, 48, 50, 56, 60 (the values EAGLE's ``total_token = -1``
      chooses among by timing, SafeAILab/EAGLE@cb7e084 ``eagle/model/ea_model.py``; 60 is
      ``EaModel.from_pretrained``'s default), ``depth`` in 5, 6, 7 (7: ``from_pretrained``'s default
      in the EAGLE-3 release; 5: the EAGLE-2 evaluation scripts'), ``top_k`` in 8, 10 (10: the
      default): 30 settings.
    * ``vllm``: ``num_speculative_tokens`` 1..7 (vLLM has no default for it: it is required; its
      docs' examples use 5, vLLM ``docs/features/spec_decode.md``): 7 chains.
    * ``sglang``: the grid of SGLang's tuning script, sgl-project/sglang@01d2a3d
      ``scripts/playground/bench_speculative.py`` (``--steps 1 3 5 7``, ``--topk 1 2 4 8``,
      ``--num_draft_tokens 2 4 8 16 32``, keeping ``steps * topk + 1 >= num_draft_tokens``), which
      holds SGLang's documented default ``(num_steps, topk, num_draft_tokens) = (5, 4, 8)``
      (docs/advanced_features/speculative_decoding.md); the ``topk = 1`` points are written as SGLang
      runs them (``num_draft_tokens = num_steps + 1``) and listed once: 43 settings.
    * ``llama.cpp``: ``draft_max`` in 4, 8, 16, 32 and ``draft_p_min`` in 0, 0.5, 0.75, 0.9 at
      ``draft_min`` 0 (the defaults are ``n_max = 16``, ``n_min = 0``, ``p_min = 0.75``,
      ggml-org/llama.cpp@6c8a045 ``common/common.h::common_params_speculative``; ``p_min = 0`` is the
      plain greedy chain): 16 settings.
    * ``tensorrt-llm``: EAGLE-3 linear chains of ``max_draft_len`` 1..7 (no default: the field is
      required, NVIDIA/TensorRT-LLM@0004396 ``tensorrt_llm/llmapi/llm_args.py``, so the grid is
      vLLM's), and dynamic trees of ``max_draft_len`` 3, 5, 7, ``dynamic_tree_max_topK`` 4, 8 and
      ``max_total_draft_tokens`` 8, 16, 32, 64 within the engine's range ``[max_draft_len,
      dynamic_tree_max_topK * max_draft_len]``: 7 chains and 13 trees.

    Args:
        engine: one of ``ENGINES``.
        modes: the verifier modes of every configuration (a non-empty sequence of ``MODES``).

    Returns:
        list[EngineConfig], in the order above, labels distinct.

    Raises:
        ValueError: ``engine: ...`` for an engine not in ``ENGINES``; ``modes: ...`` for a bad mode list.
    """
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(f"engine: must be one of {', '.join(ENGINES)}, got {engine!r}")
    listed = list(modes) if isinstance(modes, (list, tuple)) else None
    if not listed or any(m not in MODES for m in listed) or len(set(listed)) != len(listed):
        raise ValueError(f"modes: must be a non-empty list of {', '.join(MODES)} without repeats, got {modes!r}")
    return [make_config({**e, "modes": listed}, where=f"{engine} default") for e in default_entries(engine)]


def grid_configs(
    eagle: tuple, chains: tuple, sequoia: tuple, treegraft: tuple, specblock: tuple, modes, flags: dict | None = None
) -> list[EngineConfig]:
    """The default sweep: EAGLE's (total_token, depth, top_k) grid (``eagle``: three tuples),
    vLLM chains of each length in ``chains``, and the other builders at their budgets; an EAGLE
    point the engine cannot build is kept with its ``unrunnable`` reason (the sweep lists it in
    ``not_run``).

    Raises:
        ValueError: ``<flag>: ...`` for a value the lab refuses, ``flags`` mapping (engine, key) to
            the flag the value came from (the key itself where it has none).
    """
    flags = flags or {}
    entries = [
        {"engine": "eagle", "total_token": t, "depth": d, "top_k": k} for t in eagle[0] for d in eagle[1] for k in eagle[2]
    ]
    entries += [{"engine": "vllm", "num_speculative_tokens": k} for k in chains]
    entries += [
        {"engine": name, "budget": b}
        for name, budgets in zip(("sequoia", "treegraft", "specblock"), (sequoia, treegraft, specblock))
        for b in budgets
    ]
    out = []
    for e in entries:
        try:
            out.append(make_config({**e, "modes": list(modes)}, where=None, strict=False))
        except SettingError as exc:
            raise ValueError(f"{flags.get((e['engine'], exc.key), exc.key)}: {exc.message}") from None
    return out
