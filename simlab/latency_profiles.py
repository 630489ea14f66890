"""Published latency profiles: t_target(l, n) and t_draft(l, n) as the seed papers and their
official repositories give them, each with its source (``--latency NAME``).

A profile is data, never a measurement of this machine and never a figure made up: where a
source gives one number, the table is constant along the axis it does not cover (said in the
profile's ``note``); where a source gives no unit (only relative times), the profile is a
**ratio profile** in units of t_target(l, 1) = 1 (``unit = "ratio"``), and throughputs computed
with it are in tokens per t_target(1), not per second.  A figure derived from a published one
(a total drafting time split over the forwards that make it) says so.

Profiles and their sources (each one's figures and how a per-forward time is derived from them:
``docs/derivations/latency_profiles.md``):

* ``sequoia-demo``: Sequoia, official repo Infini-AI-Lab/Sequoia@0ff3ff7 ``demo-config.json`` (a ratio profile);
* ``treegraft-a100``: TreeGraft (arXiv 2608.26112), official repo fjm9933/TreeGraft@f53e3a8
  ``graft/combine_tree/scheduler_artifacts.py`` (2 x A100, fp16, ms);
* ``specblock-a100``: SpecBlock (arXiv 2605.07243), Llama-3.1-8B on one A100-80GB (ms);
* ``qwen2.5-a100`` and ``qwen2.5-a100-hf``: Qwen team, "Qwen2.5 Speed Benchmark", official repo
  QwenLM/Qwen2.5@010c37c ``docs/source/benchmark/speed_benchmark.rst`` (one A100 80GB, BF16; vLLM 0.6.3
  and transformers 4.46.0 respectively).

The Qwen2.5 profiles time the general Qwen2.5-1.5B-Instruct and -0.5B-Instruct, whose shapes the
Coder models of ``--pair qwen2.5-coder`` (``backends.qwen_pair``) share (28 layers, hidden 1536,
12 / 2 heads, MLP 8960; 24 layers, hidden 896, 14 / 2 heads, MLP 4864); the page times no Coder
model.  Its "input length" is the context axis l of the tables, and each speed is the mean over
the 2048 tokens generated after it (contexts l .. l + 2047), taken as the one-token forward at l.

DDTE (arXiv 2602.16994, Sec. 6 and App. E) measures t_p(l) and t_q(l) in a warm-up
microbenchmark and publishes no values, so there is no DDTE profile (``UNPUBLISHED``).  Sequoia's
A100 on-chip table gives the target's incremental time per token (Llama-2-7B 24.2 ms, 13B 31.2
ms, Vicuna-33B 53.2 ms) but no draft time and no t(n): no profile is built from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from simlab.latency import ForwardTime, LatencyModel


@dataclass(frozen=True)
class Profile:
    """One published profile (module docstring): ``target``, ``draft`` and further named
    ``drafters`` as ``ForwardTime`` tables (seconds, or units of t_target(1) for ``unit="ratio"``),
    the ``source`` (paper + table, or official repo@commit + file) and a ``note`` on what the
    source does not cover."""

    name: str
    unit: str
    target: ForwardTime
    draft: ForwardTime
    source: str
    note: str
    drafters: tuple[tuple[str, ForwardTime], ...] = ()

    def __post_init__(self):
        if self.unit not in ("seconds", "ratio"):
            raise ValueError(f"unit: 'seconds' or 'ratio', got {self.unit!r}")

    def model(self) -> LatencyModel:
        """The profile as a ``LatencyModel`` (its ``source`` names the profile, unit and source)."""
        unit = "seconds" if self.unit == "seconds" else "ratio profile, units of t_target(1)"
        return LatencyModel(self.draft, self.target, f"{self.name} ({unit}): {self.source}", self.drafters)


def _tokens(tokens, values) -> ForwardTime:
    """A table along n only (the same at every context length)."""
    return ForwardTime((0,), tuple(tokens), (tuple(values),))


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "sequoia-demo",
            "ratio",
            target=_tokens((1, 2, 4, 8, 16, 32), (1.0, 1.0, 1.0, 1.2, 1.4, 1.8)),
            draft=ForwardTime.constant(0.03),
            source="Sequoia, official repo Infini-AI-Lab/Sequoia@0ff3ff7 demo-config.json (target_time [10,10,10,12,14,18] "
            "at valid_budget [1,2,4,8,16,32], draft_time 0.3), divided by target_time[0]",
            note="no unit and no GPU given; t(n) beyond 32 tokens extrapolated linearly; no context dependence given",
        ),
        Profile(
            "treegraft-a100",
            "seconds",
            target=ForwardTime.constant(0.08198963666666646),
            draft=ForwardTime.constant(0.048087486666666656),
            drafters=(("small", ForwardTime.constant(0.00092)),),
            source="TreeGraft, official repo fjm9933/TreeGraft@f53e3a8 graft/combine_tree/scheduler_artifacts.py (x_mean[1:3]: "
            "T_tgt and T_mid in ms, the order of scheduler_runtime.py::_context_features; 2 x A100 fp16); n-gram step 0.92 ms: paper arXiv 2608.26112 (All-Small baseline)",
            note="means over the scheduler's training runs (which pairs is not recorded); one number each: constant in n and context",
        ),
        Profile(
            "specblock-a100",
            "seconds",
            target=ForwardTime.constant(0.037),
            draft=ForwardTime.constant(0.017 / 7),
            drafters=(("block", ForwardTime.constant(0.007 / 2)),),
            source="SpecBlock, paper arXiv 2605.07243 (main results and drafting-latency analysis, Llama-3.1-8B, A100-80GB, "
            "batch 1): verify about 37 ms, EAGLE-3 drafting 17 ms over 7 levels, SpecBlock 7 ms over 2 block forwards",
            note="per-forward draft times derived (total / forwards, equal forwards assumed); constant in n and context",
        ),
    )
}

QWEN25_PAGE = (
    "Qwen2.5 Speed Benchmark, official repo QwenLM/Qwen2.5@010c37c docs/source/benchmark/speed_benchmark.rst "
    "(qwen.readthedocs.io benchmark/speed_benchmark), BF16 rows, one A100 80GB, batch 1"
)
QWEN25_INPUTS = (1, 6144, 14336, 30720)
"""The page's input lengths (tokens): the context axis of the Qwen2.5 profiles."""
QWEN25_TOKENS_PER_SECOND = {
    "vllm": {"0.5B": (311.55, 304.79, 290.28, 264.51), "1.5B": (183.33, 176.68, 168.69, 152.04)},
    "transformers": {"0.5B": (47.40, 47.45, 47.11, 47.16), "1.5B": (39.68, 40.88, 40.43, 38.59)},
}
"""The page's tokens/s per engine and model at ``QWEN25_INPUTS`` (tables "0.5B (vLLM)", "1.5B (vLLM)",
"0.5B (Transformer)", "1.5B (Transformer)")."""


def _per_token(speeds) -> ForwardTime:
    """A table along the context only: 1 / (tokens/s) seconds per one-token forward at ``QWEN25_INPUTS``."""
    return ForwardTime(QWEN25_INPUTS, (1,), tuple((1.0 / v,) for v in speeds))


def _qwen25(name: str, engine: str, how: str) -> Profile:
    """The Qwen2.5 profile ``name`` of the page's ``engine`` tables (module docstring)."""
    speeds = QWEN25_TOKENS_PER_SECOND[engine]
    return Profile(
        name,
        "seconds",
        target=_per_token(speeds["1.5B"]),
        draft=_per_token(speeds["0.5B"]),
        source=f"{QWEN25_PAGE}, {how}: target Qwen2.5-1.5B-Instruct, draft Qwen2.5-0.5B-Instruct, 1 / (tokens/s) per forward",
        note="the general Qwen2.5 models (the Coder models' shapes); speeds are means over 2048 generated tokens after "
        "each input length, taken at that length; one token per forward: constant in n (no tree forward timed)",
    )


PROFILES.update(
    (p.name, p)
    for p in (
        _qwen25("qwen2.5-a100", "vllm", "vLLM 0.6.3 (tables 0.5B (vLLM), 1.5B (vLLM))"),
        _qwen25(
            "qwen2.5-a100-hf", "transformers", "transformers 4.46.0, Flash Attention 2.5.8 (tables 0.5B / 1.5B (Transformer))"
        ),
    )
)

UNPUBLISHED = {
    "ddte": "DDTE measures t_p(l), t_q(l) in a warm-up microbenchmark and publishes no values (arXiv 2602.16994, App. E)"
}
"""Seed systems without a published profile, and why."""


def names() -> tuple[str, ...]:
    return tuple(PROFILES)


def profile(name: str) -> LatencyModel:
    """The named profile as a ``LatencyModel``.

    Raises:
        ValueError: ``latency: ...`` for an unknown name (naming the known ones).
    """
    if name not in PROFILES:
        raise ValueError(f"latency: unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name].model()


def load(text: str) -> LatencyModel:
    """A profile by name (``PROFILES``) or from a ``.json``/``.toml`` file (``LatencyModel.load``).

    Raises:
        ValueError: ``latency: ...`` for an unknown name, or what ``LatencyModel.load`` raises.
    """
    if text in PROFILES:
        return profile(text)
    if not str(text).endswith((".json", ".toml")):
        raise ValueError(
            f"latency: unknown profile {text!r}; use one of {', '.join(PROFILES)}, or a .json/.toml profile file (--latency list)"
        )
    return LatencyModel.load(text)


def listing() -> str:
    """One line per profile (name, unit, t_target(1), t_draft(1), source and note), then the seed
    systems without one: what ``--latency list`` prints."""
    lines = []
    for p in PROFILES.values():
        scale, suffix = (1000.0, " ms") if p.unit == "seconds" else (1.0, "")
        times = ", ".join(
            f"t_{n}(1) {t(0, 1) * scale:.4g}{suffix}" for n, t in (("target", p.target), ("draft", p.draft), *p.drafters)
        )
        unit = "seconds" if p.unit == "seconds" else "ratio profile, units of t_target(1)"
        lines.append(f"{p.name} ({unit}): {times}; source: {p.source}; note: {p.note}")
    lines += [f"({name}: no profile; {why})" for name, why in UNPUBLISHED.items()]
    return "\n".join(lines)
