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

**Each engine's own rules** (read in its code; the key-by-key table is in ``docs/metrics.md``):

* EAGLE (SafeAILab/EAGLE@cb7e084 ``eagle/model/cnets.py::topK_genrate``): the root's ``top_k``
  candidates and ``top_k^2`` per round, ``depth`` rounds; ``torch.topk`` keeps ``total_token - 1``
  of the ``top_k + depth top_k^2`` candidates and raises when asked for more (``engine_limit``).
* vLLM (vllm-project/vllm@f19b16d ``vllm/config/speculative.py``): ``num_speculative_tokens`` must
  be > 0; with no ``speculative_token_tree`` the tree is the chain of ``num_speculative_tokens``
  tokens; a ``*_mtp`` method is renamed ``mtp`` (the same chain).
* SGLang (sgl-project/sglang@d9ccf6a ``python/sglang/srt/arg_groups/speculative_hook.py::
  _handle_eagle_family``; @fba8ecc ``speculative/eagle_worker.py::draft_forward``; @263bc85
  ``speculative/eagle_utils.py::organize_draft_results``): with ``speculative_eagle_topk = 1`` it
  resets ``speculative_num_draft_tokens`` to ``speculative_num_steps + 1`` (a warning, no error):
  the lab applies the same reset and the label says so (``adjusted``); ``num_steps`` draft forwards
  give ``topk + (num_steps - 1) topk^2`` candidates, of which ``torch.topk`` keeps
  ``num_draft_tokens - 1`` and raises when asked for more: refused (``engine_limit``).

Refused although the engine would run it (the lab's limits, each refused in one line naming the
key as written): a setting that drafts no token (EAGLE's ``total_token = 1``, SGLang's
``num_draft_tokens = 1`` at ``topk > 1``: plain decoding), EAGLE's ``total_token = -1`` (a choice
by timing on the GPU, ``eagle/model/ea_model.py``), EAGLE's negative ``depth`` (its loop then runs
no round, as for 0), and one of more than ``MAX_LEVELS`` draft positions (the lab's EAGLE-2
builder grows at most ``MAX_LEVELS - 1`` rounds after the root's).  A ``top_k`` above the
vocabulary fails in the engine (``vocab_limit``: the sweep lists it as not run at the root).  Not
checked (they depend on the models or the server, which a configuration does not name): vLLM's
``n_predict`` divisibility for MTP drafters, SGLang's attention-backend and page-size limits on
``topk > 1``.

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
}
"""Each engine's required keys (``method``, ``name`` and ``modes`` are optional everywhere)."""
OPTIONAL = ("method", "name", "modes")
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
SAMPLED = ("sequoia",)
"""Engines whose trees are sampled (valued by the mean of exact values over drawn trees)."""


MAX_LEVELS = 65
"""The most levels (draft positions) a configuration may reach: ``simlab.builders.EAGLE2`` grows
at most 64 rounds after the root's (its ``depth`` range); the engines themselves have no such limit."""


@dataclass(frozen=True)
class EngineConfig:
    """One engine setting: ``engine``, its keys with the values the engine runs (``settings``), the
    verifier ``modes`` to run, and a ``name`` (default: the engine and its keys).

    ``adjusted``: (key, value as written, the engine's rule) for each key the engine resets itself
    (SGLang's ``speculative_num_draft_tokens`` at ``topk = 1``); the label gives both values."""

    engine: str
    settings: tuple[tuple[str, int], ...]
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

    def verifier(self, mode: str, laws) -> str | None:
        """The lab verifier of ``mode`` for trees of drafting ``laws`` (None: the mode has none)."""
        name = VERIFIER_MODES[mode]
        if isinstance(name, dict):
            found = {name[law] for law in laws if law in name}
            return found.pop() if len(found) == 1 and all(law in name for law in laws) else None
        return name


ENGINE_NAMES = {"eagle": "EAGLE", "vllm": "vLLM", "sglang": "SGLang"}

SGLANG_TOPK1_RULE = "SGLang runs num_steps + 1 at topk 1"
"""SGLang's reset (module docstring), as a label states it."""


def engine_settings(engine: str, s: dict) -> tuple[dict, tuple[tuple[str, int, str], ...]]:
    """The settings the engine runs for the settings ``s`` as written, and the adjustments
    (key, written value, rule) it makes silently: SGLang resets ``speculative_num_draft_tokens``
    to ``speculative_num_steps + 1`` when ``speculative_eagle_topk`` is 1 (module docstring)."""
    if engine == "sglang" and s["speculative_eagle_topk"] == 1 and isinstance(s["speculative_num_steps"], int):
        runs = s["speculative_num_steps"] + 1
        if s["speculative_num_draft_tokens"] != runs:
            return {**s, "speculative_num_draft_tokens": runs}, (
                ("speculative_num_draft_tokens", s["speculative_num_draft_tokens"], SGLANG_TOPK1_RULE),
            )
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
        SettingError: (a ValueError, ``<key>: ...``) naming the key as written: a value out of the
            engine's range, a setting that drafts no token, or one beyond the lab's ``MAX_LEVELS``.
    """
    for key, value in s.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingError(key, f"must be an integer, got {value!r}")
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
    key = {"eagle": "top_k", "sglang": "speculative_eagle_topk"}.get(config.engine)
    top_k = config.lab.get("top_k", 0)
    if key is None or top_k <= vocab:
        return ""
    return f"{key}: {top_k} exceeds the vocabulary of {vocab} tokens ({ENGINE_NAMES[config.engine]}'s torch.topk fails)"


def make_config(entry: dict, where: str | None = "config", strict: bool = True) -> EngineConfig:
    """One ``EngineConfig`` from a dict written as the engine writes it (``{"engine": "eagle",
    "total_token": 60, "depth": 7, "top_k": 10}``), with the values the engine runs
    (``engine_settings``: an adjusted key keeps its written value in the label).

    ``strict``: refuse a setting the engine cannot run (``engine_limit``); else keep it, its
    reason in ``unrunnable``.  ``where`` None: a refused key's value raises ``SettingError`` without
    a prefix (``grid_configs`` names the flag it came from).

    Raises:
        ValueError: ``<where>: ...`` for an unknown engine, a missing or unknown key, a bad value,
            a bad or repeated mode, or (``strict``) a setting the engine cannot run.
    """
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be an object with an 'engine' key, got {entry!r}")
    engine = entry.get("engine")
    if not isinstance(engine, str) or engine not in KEYS:
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
    if engine == "vllm" and method and method not in VLLM_CHAIN_METHODS and not method.endswith("_mtp"):
        raise ValueError(
            f"{where}: method {method!r} does not draft an autoregressive argmax chain, the only vLLM drafter the "
            f"sweep models (methods: {', '.join(VLLM_CHAIN_METHODS)}, *_mtp)"
        )
    written = {k: entry[k] for k in KEYS[engine]}
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


def read_configs(path) -> list[EngineConfig]:
    """The configurations of a JSON file: a list of entries, or ``{"configs": [...]}``.

    Raises:
        ValueError: ``config: ...`` for an unreadable file, bad JSON, or a bad entry (``config[i]: ...``);
            a label listed twice, or two entries the engine runs as one setting under a shared mode
            (SGLang's topk-1 reset can make two written settings one): their rows would count twice.
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
    runs: dict[tuple, int] = {}
    for i, c in enumerate(out):
        for mode in c.modes:
            j = runs.setdefault((c.engine, c.settings, mode), i)
            if j != i:
                raise ValueError(
                    f"config[{i}]: runs the setting of config[{j}] ({out[j].label}) under mode {mode}: "
                    "its rows would be counted twice"
                )
    return out


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
        for name, budgets in zip(SAMPLED + ("treegraft", "specblock"), (sequoia, treegraft, specblock))
        for b in budgets
    ]
    out = []
    for e in entries:
        try:
            out.append(make_config({**e, "modes": list(modes)}, where=None, strict=False))
        except SettingError as exc:
            raise ValueError(f"{flags.get((e['engine'], exc.key), exc.key)}: {exc.message}") from None
    return out
