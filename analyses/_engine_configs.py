"""Engine configurations as the engines write them, mapped to the lab's builders and verifiers.

Shared by ``analyses.sweep`` (a helper, not a study).  A configuration is one engine setting
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
=============  ==========================================================  ======================================

Counting conventions: EAGLE's ``total_token`` and SGLang's ``speculative_num_draft_tokens`` count
the verified root, the lab's budget does not; EAGLE's ``depth`` counts expansion rounds after
the root's (``simlab.builders.eagle``), SGLang's ``speculative_num_steps`` counts draft forwards
(levels), so ``depth = num_steps - 1``; vLLM's EAGLE and draft-model proposers draft the argmax
chain (SGLang's with ``topk = 1`` too).

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
from dataclasses import dataclass, field
from pathlib import Path

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
}
"""Each engine's required keys (``method``, ``name`` and ``modes`` are optional everywhere)."""
OPTIONAL = ("method", "name", "modes")
VLLM_CHAIN_METHODS = ("eagle", "eagle3", "draft_model", "mtp")
"""vLLM ``method`` values whose proposer drafts the argmax chain of an autoregressive drafter (the
lab's ``EAGLE2(k, k - 1, 1)``; any ``*_mtp`` name too: vllm-project/vllm ``vllm/config/speculative.py``
``EagleModelTypes``).  ``ngram``, ``suffix``, ``medusa``, ``mlp_speculator``, ``dflash`` draft otherwise
and are refused, not relabelled."""
SAMPLED = ("sequoia",)
"""Engines whose trees are sampled (valued by the mean of exact values over drawn trees)."""


@dataclass(frozen=True)
class EngineConfig:
    """One engine setting: ``engine``, its keys as written (``settings``), the verifier
    ``modes`` to run, and a ``name`` (default: the engine and its keys)."""

    engine: str
    settings: tuple[tuple[str, int], ...]
    modes: tuple[str, ...] = MODES
    name: str = ""
    method: str = ""
    lab: dict = field(default_factory=dict, compare=False)
    unrunnable: str = field(default="", compare=False)
    """Why the engine itself cannot run this setting ("" when it can): a grid point kept for
    ``not_run`` (``grid_configs``); a configuration file's entry is refused instead."""

    @property
    def label(self) -> str:
        return self.name or f"{self.engine} " + " ".join(f"{k}={v}" for k, v in self.settings)

    @property
    def budget(self) -> int:
        """Draft tokens (root excluded) the configuration verifies at most."""
        return self.lab["budget"]

    def verifier(self, mode: str, laws) -> str | None:
        """The lab verifier of ``mode`` for trees of drafting ``laws`` (None: the mode has none)."""
        name = VERIFIER_MODES[mode]
        if isinstance(name, dict):
            found = {name[law] for law in laws if law in name}
            return found.pop() if len(found) == 1 and all(law in name for law in laws) else None
        return name


def lab_builder(engine: str, s: dict) -> dict:
    """The lab builder's options for one engine setting ``s`` (module table).

    Raises:
        ValueError: a key's value out of the engine's range, naming the key.
    """
    for key, value in s.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "depth" else 1):
            raise ValueError(f"{key}: must be an integer >= {0 if key == 'depth' else 1}, got {value!r}")
    if engine == "eagle":
        if s["total_token"] < 2:
            raise ValueError(f"total_token: counts the root, must be >= 2, got {s['total_token']}")
        return {"kind": "eagle2", "budget": s["total_token"] - 1, "depth": s["depth"], "top_k": s["top_k"]}
    if engine == "vllm":
        k = s["num_speculative_tokens"]
        return {"kind": "eagle2", "budget": k, "depth": k - 1, "top_k": 1}
    if engine == "sglang":
        n = s["speculative_num_draft_tokens"]
        if n < 2:
            raise ValueError(f"speculative_num_draft_tokens: counts the root, must be >= 2, got {n}")
        return {
            "kind": "eagle2",
            "budget": n - 1,
            "depth": s["speculative_num_steps"] - 1,
            "top_k": s["speculative_eagle_topk"],
        }
    return {"kind": engine, "budget": s["budget"]}


def eagle_limit(lab: dict) -> str:
    """Why EAGLE's ``topK_genrate`` cannot build the tree ("" when it can): it keeps the
    ``total_token - 1`` best of its top_k + depth top_k^2 candidates with ``torch.topk``, which
    raises when asked for more (SafeAILab/EAGLE@cb7e084 ``eagle/model/cnets.py::topK_genrate``)."""
    if lab.get("kind") != "eagle2":
        return ""
    candidates = lab["top_k"] + lab["depth"] * lab["top_k"] ** 2
    if lab["budget"] <= candidates:
        return ""
    return (
        f"total_token - 1 = {lab['budget']} draft tokens exceeds EAGLE's top_k + depth top_k^2 = {candidates} "
        "candidates (its torch.topk fails)"
    )


def make_config(entry: dict, where: str = "config", strict: bool = True) -> EngineConfig:
    """One ``EngineConfig`` from a dict written as the engine writes it (``{"engine": "eagle",
    "total_token": 60, "depth": 7, "top_k": 10}``).

    ``strict``: refuse a setting the engine cannot run (``eagle_limit``); else keep it, its
    reason in ``unrunnable``.

    Raises:
        ValueError: ``<where>: ...`` for an unknown engine, a missing or unknown key, a bad value or
            mode, or (``strict``) a setting the engine cannot run.
    """
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be an object with an 'engine' key, got {entry!r}")
    engine = entry.get("engine")
    if engine not in KEYS:
        raise ValueError(f"{where}: engine must be one of {', '.join(KEYS)}, got {engine!r}")
    unknown = sorted(set(entry) - set(KEYS[engine]) - set(OPTIONAL) - {"engine"})
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} for engine {engine} (keys: {', '.join(KEYS[engine] + OPTIONAL)})")
    missing = [k for k in KEYS[engine] if k not in entry]
    if missing:
        raise ValueError(f"{where}: engine {engine} needs {missing[0]!r}")
    modes = entry.get("modes", list(MODES))
    if not isinstance(modes, list) or not modes or any(m not in MODES for m in modes):
        raise ValueError(f"{where}: modes must be a non-empty list of {', '.join(MODES)}, got {modes!r}")
    for key in ("name", "method"):
        if not isinstance(entry.get(key, ""), str):
            raise ValueError(f"{where}: {key} must be a string, got {entry[key]!r}")
    method = entry.get("method", "")
    if engine == "vllm" and method and method not in VLLM_CHAIN_METHODS and not method.endswith("_mtp"):
        raise ValueError(
            f"{where}: method {method!r} does not draft an autoregressive argmax chain, the only vLLM drafter the "
            f"sweep models (methods: {', '.join(VLLM_CHAIN_METHODS)}, *_mtp)"
        )
    settings = {k: entry[k] for k in KEYS[engine]}
    try:
        lab = lab_builder(engine, settings)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    why = eagle_limit(lab) if engine == "eagle" else ""
    if why and strict:
        raise ValueError(f"{where}: {why}")
    return EngineConfig(engine, tuple(settings.items()), tuple(modes), entry.get("name", ""), entry.get("method", ""), lab, why)


def read_configs(path) -> list[EngineConfig]:
    """The configurations of a JSON file: a list of entries, or ``{"configs": [...]}``.

    Raises:
        ValueError: ``config: ...`` for an unreadable file, bad JSON, or a bad entry (``config[i]: ...``).
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
    out = [make_config(e, f"config[{i}]") for i, e in enumerate(entries)]
    labels = [c.label for c in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"config: {str(path)!r} lists a configuration twice ({next(x for x in labels if labels.count(x) > 1)})")
    return out


def grid_configs(eagle: tuple, chains: tuple, sequoia: tuple, treegraft: tuple, specblock: tuple, modes) -> list[EngineConfig]:
    """The default sweep: EAGLE's (total_token, depth, top_k) grid (``eagle``: three tuples),
    vLLM chains of each length in ``chains``, and the other builders at their budgets; an EAGLE
    point the engine cannot build is kept with its ``unrunnable`` reason (the sweep lists it in
    ``not_run``)."""
    entries = [
        {"engine": "eagle", "total_token": t, "depth": d, "top_k": k} for t in eagle[0] for d in eagle[1] for k in eagle[2]
    ]
    entries += [{"engine": "vllm", "num_speculative_tokens": k} for k in chains]
    entries += [
        {"engine": name, "budget": b}
        for name, budgets in zip(SAMPLED + ("treegraft", "specblock"), (sequoia, treegraft, specblock))
        for b in budgets
    ]
    return [make_config({**e, "modes": list(modes)}, strict=False) for e in entries]
