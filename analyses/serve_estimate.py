"""Is this draft worth serving, and how? One engine's configurations valued exactly: ``python -m analyses.serve_estimate``.

Given a source of roots (a synthetic world; ``--pair smollm2``; Hugging Face names or folders,
``--backend hf --target T --draft D``; or ``--capture DIR``, replayed without a model call) and an
engine (``--engine``, one of ``analyses._engine_configs.ENGINES``), every configuration of
``--config FILE`` (settings as the engine writes them) or of the engine's default grid
(``analyses._engine_configs.default_configs``) is valued at every root as the engine runs it
(``analyses._engine_valuation``: the sweep's valuation and rules), under each verifier mode that is
lossless for its drafting law.  Reported:

(a) ``one_minus_tv.parquet``: 1 - TV(p, q) = sum_x min(p(x), q(x)) at each draft position d along
    the draft's top-1 chain from each root (ranked by ``--draft-law``, as the engines' chains; p and
    q under the setting), its mean over roots and its standard error clustered by request
    (trajectory);
(b) ``serve.parquet``: per configuration and mode, the engine's own metrics (``simlab.engine_metrics``:
    ``accept_length`` E[tau + 1], ``accepted`` E[tau], SpecForge's ``chain``, vLLM's and llama.cpp's
    ``draft_acceptance_rate`` = E[tau] / draft tokens, ``uncond_d``, ``cond_d``; the engine's names in
    ``ENGINE_METRICS``), exact at each root, and both aggregations over requests (the source's
    trajectories): ``pooled`` (vLLM, SGLang: 1 + sum accepted / sum steps) and ``per_request_mean``
    (SpecForge: the mean of the per-request means), from the same per-request laws
    (``simlab.acceptance_profiles``), each root one verification step of its request (with as many
    roots in every request the two are equal); and ``pooled_equal_tokens``, vLLM's pooled mean when
    every request emits the same number of tokens (request r then takes N / m_r steps, m_r its mean
    acceptance length: the harmonic mean of the m_r, at most their mean); ``disagreements.parquet``
    lists the pairs of configurations a pooled aggregation and SpecForge's order in opposite senses
    (vLLM issue 42508);
(c) the speed-up over plain decoding at two draft prices (``--draft-prices``): sum_i E_i sum_i Tp_i /
    (n sum_i T_i) over the n roots, E_i the EOS-truncated E[tau + 1], T_i T-hat of the step
    (``simlab.latency``) with the draft priced so, Tp_i one target forward of one token;
(d) the best configurations at each price with standard errors clustered by request (the delta
    method for the ratio) and which lie within 2 standard errors of the best (the paired
    difference's);
(e) the configurations the engine would adjust (a key it resets itself, shown with its written value)
    or refuse (a setting it cannot build): the sweep's rules (``analyses._engine_configs``);
(f) ``exports.json`` and ``profile-<setting>.json`` for the best configuration at the first price:
    the JSON acceptance profile (``simlab.acceptance_profiles.AcceptanceProfile``), llama.cpp's and
    vLLM's synthetic-mode flag and config, SGLang's environment, and how far a constant-rate
    conversion of the mean length misstates the profile (``constant_rate_misstatement``).

Standard errors, cost and the output files: ``docs/derivations/serve_estimate.md``; the manual: ``docs/serve_estimate.md``.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl

from analyses import _engine_configs as engines
from analyses._engine_valuation import not_run_table, prepare_drafters, summarise, value_roots
from analyses._study import Opened, Report, chart_files, declared, run_study
from simlab.errors import argument_of
from backends.cli import ToolParser, add_output_flags, chart_writer, check_flags, fail, name_list, progress, progress_bar
from analyses._flags import LatencyConfig, SourceConfig, add_draft_law_flag, add_latency_flags, add_source_flags
from analyses._flags import make_latency, make_source, study_config
from simlab import acceptance_profiles as profiles
from simlab import stats
from simlab.engine_metrics import aggregate
from simlab.sampling import SamplingSettings

PROG = "python -m analyses.serve_estimate"

SYNTHETIC_PRICES = "0.05,0.2"
"""The two draft prices on a synthetic world (whose draft has no weights): a draft forward of 0.05
(a one-layer EAGLE-style head on a ~20-layer target) and 0.2 (a small draft model) times the target's."""
LIVE_PRICES = "profile,weights"
"""The two draft prices where the models are known: the latency profile's own draft time, and the
draft's weight bytes read per token over the target's (memory-bound decoding) times the target's forward."""
FALLBACK_PRICE = "0.2"
"""The second price where the draft's weights are unknown (a capture of models not cached here)."""


@dataclass(frozen=True)
class Config(SourceConfig, LatencyConfig):
    """The estimator's settings (the command-line flags; ``samples``, ``small_ratio``, ``block_ratio``,
    ``rank_noise`` and ``drafters`` are the shared valuation's, fixed here; ``configs``: the engine's
    configurations, ``analyses._engine_configs.EngineConfig``, read once from ``--config`` or the
    engine's default grid)."""

    vocab: int = 32
    trajectories: int = 4
    roots_per_trajectory: int = 2
    spacing: int = 8
    settings: str = "1"
    engine: str = ""
    config: str | None = None
    modes: tuple[str, ...] = tuple(engines.MODES)
    draft_prices: tuple[str, str] | None = None
    positions: int | None = None
    best: int = 10
    draft_law: str = "raw"
    fill: bool = False
    samples: int = 4
    small_ratio: float = 0.011
    block_ratio: float = 0.1
    rank_noise: float = 0.2
    drafters: str | None = None
    configs: tuple = ()
    out: str | None = None
    quiet: bool = False


ENGINE_METRICS = {
    "vllm": (
        ("mean_acceptance_length", "accept_length", "vLLM 'Mean acceptance length' = 1 + accepted / drafts"),
        ("draft_acceptance_rate", "draft_acceptance_rate", "vLLM 'Avg Draft acceptance rate' = accepted / draft tokens"),
        ("per_position_d", "uncond_d", "vLLM per-position acceptance rate (counter / drafts): P(tau >= d)"),
    ),
    "sglang": (
        ("accept_length", "accept_length", "SGLang spec accept length (tokens per verify step, bonus included)"),
        ("simulated_acc_len", "chain", "SpecForge simulated_acc_len (no bonus)"),
    ),
    "eagle": (
        ("avg_accept_length", "accept_length", "EAGLE average acceptance length tau (bonus included)"),
        ("n_alpha_d", "cond_d", "EAGLE n-alpha: P(draft d accepted | drafts before accepted)"),
    ),
    "llama.cpp": (
        ("draft_acceptance_rate", "draft_acceptance_rate", "llama-server 'draft acceptance rate' = accepted / generated drafts"),
        ("accept_length", "accept_length", "E[tau + 1], what --spec-synthetic-acceptance-length takes"),
    ),
}
"""Each engine's printed names for the lab's columns (``docs/metrics.md`` has the sources); an
engine not listed is shown under the lab's names."""


def flags(parser: ToolParser, d: Config) -> None:
    """The source and latency flags, the engine's group and ``--out``/``--quiet``."""
    add_source_flags(parser, d)
    add_latency_flags(parser, d)
    g = parser.add_argument_group("engine and configurations")
    g.add_argument("--engine", required=True, choices=list(engines.ENGINES), help="the serving engine")
    g.add_argument(
        "--config",
        default=d.config,
        help="JSON file of the engine's settings as it writes them, e.g. "
        '[{"engine": "vllm", "num_speculative_tokens": 3}] (default: the engine\'s default grid); '
        "a setting the engine cannot build is listed as refused",
    )
    g.add_argument("--modes", default=",".join(d.modes), help=f"verifier modes: comma list of {', '.join(engines.MODES)}")
    g.add_argument(
        "--draft-prices",
        default=d.draft_prices,
        help="two draft prices, comma separated, each 'profile' (the latency profile's draft time), 'weights' (the "
        "draft's weight bytes per token over the target's, times the target's forward; known models only) or a "
        f"number r > 0 (r times the target's forward) (default: {LIVE_PRICES} where the models are known, "
        f"{SYNTHETIC_PRICES} on a synthetic world)",
    )
    g.add_argument(
        "--positions", type=int, default=d.positions, help="draft positions of 1 - TV (default: the deepest configuration's)"
    )
    g.add_argument("--best", type=int, default=d.best, help="configurations shown per price in the table of the best")
    add_draft_law_flag(g, d.draft_law)
    g.add_argument(
        "--fill",
        action="store_true",
        help="with --capture: evaluate the nodes a capture lacks with the capture's own models",
    )
    add_output_flags(parser, PROG)


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (``--modes`` and ``--draft-prices`` as tuples of names, ``--config`` read
    into ``configs``), or exit 2 with one line (also when no configuration can run)."""
    try:
        modes = name_list(args.modes, "--modes", engines.MODES)
        prices = parse_prices(args.draft_prices) if args.draft_prices is not None else None
        if args.config is not None:
            try:
                configs = engines.read_configs(args.config, strict=False, engine=args.engine, modes=modes)
            except ValueError as exc:
                raise ValueError(f"--{exc}") from None
        else:
            configs = engines.default_configs(args.engine, modes)
    except ValueError as exc:
        fail(PROG, str(exc))
    config = study_config(Config, args, modes=modes, draft_prices=prices, configs=tuple(configs))
    check_flags(
        PROG,
        [
            (config.positions is None or config.positions >= 1, f"--positions: must be >= 1, got {config.positions}"),
            (config.best >= 1, f"--best: must be >= 1, got {config.best}"),
            (not config.fill or bool(config.capture), "--fill: fills the nodes a capture lacks; it needs --capture"),
        ],
    )
    if not any(not c.unrunnable for c in configs):
        fail(PROG, f"--config: no configuration the engine can run: {refusals(config)[0]['reason']}")
    return config


def refusals(config: Config) -> list[dict]:
    """The not-run rows of the configurations the engine refuses (``EngineConfig.unrunnable``)."""
    return [{"config": c.label, "setting": "all", "mode": "all", "reason": c.unrunnable} for c in config.configs if c.unrunnable]


def runnable(config: Config) -> list:
    """The configurations the engine runs."""
    return [c for c in config.configs if not c.unrunnable]


def parse_prices(text: str) -> tuple[str, str]:
    """``--draft-prices``: exactly two distinct entries, each ``profile``, ``weights`` or a number r > 0.

    Raises:
        ValueError: ``--draft-prices: ...`` naming the bad entry.
    """
    entries = [e.strip() for e in str(text).split(",")]
    if len(entries) != 2:
        raise ValueError(f"--draft-prices: name two prices (e.g. profile,weights or 0.05,0.2), got {text!r}")
    for e in entries:
        if e in ("profile", "weights"):
            continue
        try:
            r = float(e)
        except ValueError:
            raise ValueError(f"--draft-prices: {e!r} is not 'profile', 'weights' or a number") from None
        if not 0 < r < math.inf:
            raise ValueError(f"--draft-prices: a ratio must be a finite number > 0, got {e!r}")
    if entries[0] == entries[1] or (entries[0] not in ("profile", "weights") and float(entries[0]) == float(entries[1])):
        raise ValueError(f"--draft-prices: the two prices are the same ({text!r}); name two")
    return entries[0], entries[1]


# ---------------------------------------------------------------------------------------------
# the draft prices


@dataclass(frozen=True)
class Price:
    """One draft price: its ``name`` (as written), what it means (``how``) and the latency model."""

    name: str
    how: str
    latency: object


def weight_ratio(source) -> float | None:
    """The draft's weight bytes read per token over the target's: the source's own
    (``draft_weight_ratio``: a named pair, live or captured), else, for live models, the entries of
    their ``nn.Linear`` weights (``backends.pretrained.linear_weights``); None where unknown."""
    ratio = source.draft_weight_ratio() if hasattr(source, "draft_weight_ratio") else None
    if ratio is None and getattr(source, "name", "") == "hf":
        from backends.pretrained import linear_weights

        try:
            ratio = linear_weights(source.pair.draft) / linear_weights(source.pair.target)
        except (AttributeError, ZeroDivisionError):
            return None
    return ratio


def make_prices(names, latency, source, synthetic: bool, quiet: bool) -> tuple[Price, Price]:
    """The two ``Price`` of ``names`` (``parse_prices``; None: the default) on ``latency``.

    Raises:
        ValueError: ``--draft-prices: ...`` for ``weights`` where the draft's weights are unknown.
    """
    if names is None:
        if synthetic:
            names = tuple(SYNTHETIC_PRICES.split(","))
        elif weight_ratio(source) is not None:
            names = tuple(LIVE_PRICES.split(","))
        else:
            names = ("profile", FALLBACK_PRICE)
            progress(
                PROG,
                f"note: the draft's weights are unknown here; the second draft price is {FALLBACK_PRICE} x the target's "
                "forward (--draft-prices names two)",
                quiet,
            )
    out = []
    for name in names:
        if name == "profile":
            ratio = latency.draft(0, 1) / latency.target(0, 1)
            out.append(
                Price(name, f"profile: the latency profile's draft, {ratio:.4g} x the target's one-token forward", latency)
            )
            continue
        if name == "weights":
            ratio = weight_ratio(source)
            if ratio is None:
                where = "a synthetic world has no weights" if synthetic else "this source's draft weights are unknown here"
                raise ValueError(f"--draft-prices: 'weights' needs known models ({where}); give a number instead")
            how = f"weights: {ratio:.4g} x the target's forward (weight bytes read per token)"
        else:
            ratio = float(name)
            how = f"{ratio:g} x the target's forward"
        out.append(
            Price(name, how, replace(latency, draft=latency.target.scaled(ratio), source=f"{latency.source}; draft {how}"))
        )
    return out[0], out[1]


# ---------------------------------------------------------------------------------------------
# standard errors clustered by request


def clustered_se(influence: dict, cluster: dict) -> float:
    """``simlab.stats.clustered_se`` (CR1: sqrt(G / (G - 1) sum_g (sum_{i in g} psi_i)^2)) of an
    estimator with per-root influence ``influence`` (root -> psi_i), roots grouped by ``cluster``
    (root -> request); NaN with fewer than two requests."""
    roots = list(influence)
    return stats.clustered_se([influence[r] for r in roots], [cluster[r] for r in roots])


def mean_influence(values: dict) -> tuple[float, dict]:
    """The mean of root -> x_i and its influence (x_i - mean) / n."""
    n = len(values)
    mean = sum(values.values()) / n
    return mean, {r: (x - mean) / n for r, x in values.items()}


def speedup_influence(E: dict, T: dict, Tp: dict) -> tuple[float, dict]:
    """S = mean(E) mean(Tp) / mean(T) over the roots (keys of ``E``) and its influence (the delta
    method): psi_i = S / n ((E_i - mean E) / mean E - (T_i - mean T) / mean T + (Tp_i - mean Tp) / mean Tp)."""
    n = len(E)
    e, t, tp = (sum(x.values()) / n for x in (E, T, Tp))
    s = e * tp / t
    return s, {r: s / n * ((E[r] - e) / e - (T[r] - t) / t + (Tp[r] - tp) / tp) for r in E}


# ---------------------------------------------------------------------------------------------
# (a) 1 - TV along the draft's top-1 chain


def chain_tv(setting, root, tables, positions: int) -> list[dict]:
    """Rows of 1 - TV(p, q) = sum_x min(p, q) along the draft's top-1 chain from ``root``, one per
    position up to ``positions``, read from the root's ``tables`` (the (table, drafting table) the
    valuation filled: ``analyses._engine_valuation.value_roots``' ``at_root``; the chain's nodes are
    fetched once); a chain that leaves a capture's nodes stops there."""
    table, drafting = tables
    rows, path = [], ()
    for d in range(1, positions + 1):
        try:
            p, q = table.p(path), table.q(path)
            top = int(np.argmax(drafting.q(path)))
        except ValueError as exc:
            if argument_of(exc)[0] == "context":
                break
            raise
        rows.append(
            {
                "setting": setting.name,
                "trajectory": root.trajectory,
                "root": root.root,
                "position": d,
                "one_minus_tv": float(np.minimum(p, q).sum()),
            }
        )
        path = path + (top,)
    return rows


def one_minus_tv(rows: list[dict]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per root and position, summary by setting and position: the mean and its standard error
    clustered by request) of ``chain_tv``'s rows (``roots`` counts the roots reached)."""
    per_root = pl.DataFrame(
        rows,
        schema={"setting": pl.String, "trajectory": pl.Int64, "root": pl.Int64, "position": pl.Int64, "one_minus_tv": pl.Float64},
    )
    summary = []
    for (setting, d), part in per_root.group_by(["setting", "position"], maintain_order=True):
        values = dict(zip(part["root"].to_list(), part["one_minus_tv"].to_list()))
        mean, psi = mean_influence(values)
        se = clustered_se(psi, dict(zip(part["root"].to_list(), part["trajectory"].to_list())))
        summary.append({"setting": setting, "position": d, "roots": part.height, "one_minus_tv": mean, "se": se})
    schema = {"setting": pl.String, "position": pl.Int64, "roots": pl.Int64, "one_minus_tv": pl.Float64, "se": pl.Float64}
    return per_root, pl.DataFrame(summary, schema=schema).sort("setting", "position")


# ---------------------------------------------------------------------------------------------
# (b)-(d): aggregations, speed-ups, the best


def request_laws(rows: list[dict]) -> dict[tuple, list[profiles.RequestLaw]]:
    """(setting, config, mode) -> one ``RequestLaw`` per request (trajectory), each root one step,
    from the rows' exact per-root laws without EOS truncation (what the engines' counters add)."""
    steps: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        steps[(r["setting"], r["config"], r["mode"])][r["trajectory"]].append(r["_plain"])
    return {key: [profiles.RequestLaw.from_metrics(ms) for ms in by.values()] for key, by in steps.items()}


def pooled_equal_tokens(requests: list[profiles.RequestLaw]) -> float:
    """vLLM's pooled mean where every request emits the same number of tokens N: request r then takes
    N / m_r steps (m_r its mean acceptance length, ``simlab.acceptance_profiles.per_request_means``),
    and 1 + sum accepted / sum steps = sum N / sum (N / m_r) is the harmonic mean of the m_r."""
    means = profiles.per_request_means(requests)
    return float(means.size / np.sum(1.0 / means))


def disagreements(laws: dict[tuple, list[profiles.RequestLaw]]) -> pl.DataFrame:
    """The pairs of (configuration, mode) of one setting that a pooled aggregation and SpecForge's
    mean of per-request means order in opposite senses (a tie on either side is no disagreement):
    ``steps``: "roots" (each root one step of its request: ``compare_aggregations`` and its note) or
    "equal tokens" (``pooled_equal_tokens`` against the per-request mean)."""
    values = {k: (profiles.pooled(v), profiles.per_request_mean(v), pooled_equal_tokens(v)) for k, v in laws.items()}
    keys, out = list(values), []
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            if a[0] != b[0]:
                continue
            (pa, ma, ea), (pb, mb, eb) = values[a], values[b]
            names = {"setting": a[0], "a": f"{a[1]} / {a[2]}", "b": f"{b[1]} / {b[2]}"}
            if np.sign(pa - pb) * np.sign(ma - mb) < 0:
                c = profiles.compare_aggregations(laws[a], laws[b])
                out.append(
                    {
                        **names,
                        "steps": "roots",
                        "pooled_a": c.pooled_a,
                        "pooled_b": c.pooled_b,
                        "per_request_a": c.per_request_a,
                        "per_request_b": c.per_request_b,
                        "note": c.note(),
                    }
                )
            if np.sign(ea - eb) * np.sign(ma - mb) < 0:
                note = (
                    f"pooled over equal-token requests (vLLM/SGLang): A {ea:.6g}, B {eb:.6g} ({'A > B' if ea > eb else 'A < B'}); "
                    f"mean of per-request means (SpecForge): A {ma:.6g}, B {mb:.6g} ({'A > B' if ma > mb else 'A < B'}); "
                    "the two aggregations disagree in sign"
                )
                out.append(
                    {
                        **names,
                        "steps": "equal tokens",
                        "pooled_a": ea,
                        "pooled_b": eb,
                        "per_request_a": ma,
                        "per_request_b": mb,
                        "note": note,
                    }
                )
    schema = {k: pl.String for k in ("setting", "a", "b", "steps")} | {
        k: pl.Float64 for k in ("pooled_a", "pooled_b", "per_request_a", "per_request_b")
    }
    return pl.DataFrame(out, schema={**schema, "note": pl.String})


def estimates(rows: list[dict], prices: tuple[Price, Price], plain_time: dict) -> pl.DataFrame:
    """Per (setting, config, mode, price): the speed-up over plain decoding with its clustered SE,
    T-hat, the rank at that price, the gap to the best with its paired clustered SE, and whether it
    lies within 2 SE of the best; also E[tau + 1] (EOS-truncated, ``E``) with its clustered SE.

    ``plain_time``: (setting, root) -> one target forward of one token at the root's context."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["setting"], r["config"], r["mode"])].append(r)
    out = []
    for label in ("a", "b"):
        price = prices[0] if label == "a" else prices[1]
        table = []
        for (setting, name, mode), rs in groups.items():
            key = [(r["trajectory"], r["root"]) for r in rs]
            cluster = {k: k[0] for k in key}
            E = {k: r["E"] for k, r in zip(key, rs)}
            T = {k: r["_prices"][price.name] for k, r in zip(key, rs)}
            Tp = {k: plain_time[(setting, k[1])] for k in key}
            s, psi = speedup_influence(E, T, Tp)
            mc = sum(r["E_se"] ** 2 for r in rs) * (s / (len(rs) * np.mean(list(E.values())))) ** 2
            e, psi_e = mean_influence(E)
            table.append(
                {
                    "setting": setting,
                    "config": name,
                    "mode": mode,
                    "price": label,
                    "draft_price": price.how,
                    "E": e,
                    "E_se": math.sqrt(clustered_se(psi_e, cluster) ** 2 + sum(r["E_se"] ** 2 for r in rs) / len(rs) ** 2),
                    "T": float(np.mean(list(T.values()))),
                    "T_plain": float(np.mean(list(Tp.values()))),
                    "speedup": s,
                    "speedup_se": math.sqrt(clustered_se(psi, cluster) ** 2 + mc),
                    "_psi": psi,
                    "_mc": mc,
                    "_cluster": cluster,
                }
            )
        for setting in dict.fromkeys(t["setting"] for t in table):
            part = sorted((t for t in table if t["setting"] == setting), key=lambda t: -t["speedup"])
            best = part[0]
            for rank, t in enumerate(part, start=1):
                diff = {k: best["_psi"].get(k, 0.0) - t["_psi"].get(k, 0.0) for k in {*best["_psi"], *t["_psi"]}}
                gap_se = (
                    0.0
                    if t is best
                    else math.sqrt(clustered_se(diff, {**best["_cluster"], **t["_cluster"]}) ** 2 + best["_mc"] + t["_mc"])
                )
                gap = best["speedup"] - t["speedup"]
                # None: no standard error (one request), so "within 2 SE" cannot be told
                within = True if t is best else (None if math.isnan(gap_se) else gap <= 2 * gap_se)
                out.append(
                    {
                        **{k: v for k, v in t.items() if not k.startswith("_")},
                        "rank": rank,
                        "gap_to_best": gap,
                        "gap_se": gap_se,
                        "within_2se": within,
                    }
                )
    return pl.DataFrame(out, infer_schema_length=None)


def serve_table(summary: pl.DataFrame, speed: pl.DataFrame, laws: dict, configs, refused: list) -> pl.DataFrame:
    """The summary of every configuration: the sweep's columns, ``draft_acceptance_rate``, both
    aggregations, both speed-ups with SEs, ``status`` (runs / adjusted: the rule / refused: the reason)."""
    status = {
        c.label: ("adjusted: " + "; ".join(f"{k} written {w}, runs {dict(c.settings)[k]} ({rule})" for k, w, rule in c.adjusted))
        if c.adjusted
        else "runs"
        for c in configs
    }
    agg = pl.DataFrame(
        [
            {
                "setting": s,
                "config": c,
                "mode": m,
                "requests": len(v),
                "pooled": profiles.pooled(v),
                "per_request_mean": profiles.per_request_mean(v),
                "pooled_equal_tokens": pooled_equal_tokens(v),
            }
            for (s, c, m), v in laws.items()
        ]
    )
    wide = None
    for label in ("a", "b"):
        part = speed.filter(pl.col("price") == label).select(
            "setting",
            "config",
            "mode",
            pl.col("T").alias(f"T_{label}"),
            pl.col("speedup").alias(f"speedup_{label}"),
            pl.col("speedup_se").alias(f"speedup_se_{label}"),
            pl.col("rank").alias(f"rank_{label}"),
            pl.col("within_2se").alias(f"within_2se_{label}"),
        )
        wide = part if wide is None else wide.join(part, on=["setting", "config", "mode"])
    frame = (
        summary.drop("T", "TPS")
        .with_columns((pl.col("accepted") / pl.col("tokens")).alias("draft_acceptance_rate"))
        .join(agg, on=["setting", "config", "mode"])
        .join(wide, on=["setting", "config", "mode"])
        .with_columns(pl.col("config").replace_strict(status, default="runs").alias("status"))
        .sort(["setting", "rank_a"])
    )
    if refused:
        frame = pl.concat(
            [frame, pl.DataFrame([{"config": r["config"], "status": f"refused: {r['reason']}"} for r in refused])],
            how="diagonal_relaxed",
        )
    return frame


# ---------------------------------------------------------------------------------------------
# (f) exports


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", name).strip("_") or "setting"


def exports(rows: list[dict], speed: pl.DataFrame) -> list[dict]:
    """For each setting, the best configuration at the first price: its ``AcceptanceProfile`` (from
    the roots' exact laws without EOS truncation, pooled as vLLM's counters), the engines'
    synthetic-mode forms and the constant-rate misstatement; none for a setting whose best drafts no
    token at any root."""
    out = []
    for best in speed.filter((pl.col("price") == "a") & (pl.col("rank") == 1)).iter_rows(named=True):
        metrics = [
            r["_plain"] for r in rows if (r["setting"], r["config"], r["mode"]) == (best["setting"], best["config"], best["mode"])
        ]
        pooled = aggregate(metrics)
        if pooled.unconditional.size == 0:  # every root's tree was empty (a dropped llama.cpp chain): nothing to replay
            continue
        profile = profiles.AcceptanceProfile.from_engine_metrics(pooled)
        wrong = profiles.constant_rate_misstatement(profile)
        vllm = {mode: profiles.vllm_speculative_config(profile, mode) for mode in ("rates", "length")}
        out.append(
            {
                "setting": best["setting"],
                "config": best["config"],
                "mode": best["mode"],
                "draft_price": best["draft_price"],
                "speedup": best["speedup"],
                "profile": json.loads(profile.to_json()),
                "llama.cpp": {mode: profiles.llama_cpp_args(profile, mode) for mode in ("rates", "length")},
                "vllm": {
                    mode: {"speculative_config": v, "flag": ["--speculative-config", json.dumps(v)]} for mode, v in vllm.items()
                },
                "sglang": profiles.sglang_env(profile),
                "constant_rate_misstatement": {
                    "rate": wrong.rate,
                    "worst_position": wrong.worst_position,
                    "conditional_error": wrong.conditional_error.tolist(),
                    "unconditional_error": wrong.unconditional_error.tolist(),
                    "ks": wrong.ks.tolist(),
                    "exact_accept_length": wrong.exact_accept_length.tolist(),
                    "constant_rate_accept_length": wrong.constant_rate_accept_length.tolist(),
                },
                "_profile": profile,
            }
        )
    return out


def chart(speed: pl.DataFrame, prices: tuple[Price, Price], subtitle: str, top: int = 25):
    import altair as alt

    names = {"a": f"a: {prices[0].how}", "b": f"b: {prices[1].how}"}
    kept = speed.filter((pl.col("price") == "a") & (pl.col("rank") <= top)).select("setting", "config", "mode")
    data = speed.join(kept, on=["setting", "config", "mode"]).with_columns(
        (pl.col("config") + " / " + pl.col("mode")).alias("configuration"),
        pl.col("price").replace_strict(names).alias("draft price"),
        (pl.col("speedup") - 2 * pl.col("speedup_se")).alias("low"),
        (pl.col("speedup") + 2 * pl.col("speedup_se")).alias("high"),
    )
    base = alt.Chart(data).encode(
        y=alt.Y("configuration:N", sort="-x", title=None, axis=alt.Axis(labelLimit=420)),
        yOffset="draft price:N",
        color=alt.Color("draft price:N", legend=alt.Legend(orient="bottom", labelLimit=600)),
    )
    bars = base.mark_bar().encode(
        x=alt.X("speedup:Q", title="speed-up over plain decoding (bars: +-2 SE clustered by request)"),
        tooltip=["config", "mode", "draft price", "speedup", "speedup_se", "E", "T", "within_2se"],
    )
    rules = base.mark_rule(color="black").encode(x="low:Q", x2="high:Q")
    even = alt.Chart(data).mark_rule(color="firebrick", strokeDash=[4, 4]).encode(x=alt.datum(1.0))  # plain decoding
    return (
        alt.layer(bars, rules, even)
        .properties(width=360)
        .facet(facet=alt.Facet("setting:N", title=None), columns=2)
        .resolve_scale(y="independent")
        .properties(title=alt.TitleParams("Is this draft worth serving? Speed-up by configuration", subtitle=subtitle))
    )


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Served(Opened):
    """``Opened`` with the drafters the configurations need (``made``,
    ``analyses._engine_valuation.prepare_drafters``), the rows not run so far (refused by the engine
    or without their drafter), the two draft ``prices`` and the 1 - TV chain's ``positions``."""

    made: object = None
    not_run: tuple = ()
    prices: tuple = ()
    positions: int = 1


def open_source(config: Config, parser: ToolParser, say) -> Served:
    """The source (trees as deep as the deepest configuration or the 1 - TV chain), the latency
    model, the configurations' drafters and the two draft prices; exit 2 with one line where a
    capture cannot give the drafters' untempered law or a price cannot be made."""
    runs = runnable(config)
    levels = max(c.levels or c.budget for c in runs)
    positions = config.positions or levels
    source, settings = make_source(
        PROG,
        parser,
        config,
        grid=False,
        depth=max(levels, positions) + 1,
        quiet=config.quiet,
        study_honours={"capture": {"device"}},
    )
    if config.capture and config.draft_law == "raw" and any(s != SamplingSettings() for s in settings):
        fail(
            PROG,
            "--draft-law: a capture holds q under its own setting only, not the drafters' untempered law; "
            "use --draft-law setting, or a capture at T = 1",
        )
    latency = make_latency(PROG, parser, config, source, max(c.budget for c in runs))
    latency, made, cannot = prepare_drafters(PROG, config, runs, source, latency, {n for n, _ in latency.drafters})
    try:
        prices = make_prices(config.draft_prices, latency, source, source.name == "synthetic", config.quiet)
    except ValueError as exc:
        fail(PROG, str(exc))
    return Served(source, settings, latency, made=made, not_run=(*refusals(config), *cannot), prices=prices, positions=positions)


def values(config: Config, opened: Served, say) -> tuple:
    """(rows, not-run rows, the roots by setting, 1 - TV by setting and position): every
    configuration valued at every root (``analyses._engine_valuation.value_roots``) and the
    draft's top-1 chain read from each root's tables."""
    roots = {s: list(opened.source.roots(s)) for s in opened.settings}
    prices = {p.name: p.latency for p in opened.prices}
    with progress_bar(total=sum(map(len, roots.values())), desc="roots", unit="root", quiet=config.quiet) as bar:
        chains = []
        rows, valued, filled = value_roots(
            PROG,
            runnable(config),
            roots,
            config,
            opened.latency,
            opened.made,
            bar,
            opened.source,
            prices,
            at_root=lambda setting, root, tables: chains.extend(chain_tv(setting, root, tables, opened.positions)),
        )
    if filled:
        roots = {s: [replace(r, pair=f) for r in rs] for (s, rs), f in zip(roots.items(), filled)}
    _, tv = one_minus_tv(chains)
    return rows, not_run_table(PROG, config, rows, [*opened.not_run, *valued], filled), roots, tv


def shardable(config: Config, opened: Served, parser: ToolParser) -> str | None:
    """Always a reason: the valuation fills each root's tables once for every configuration and, with
    ``--fill``, the capture's models for the roots together (``value_roots``), not root by root."""
    return "the estimator values every root's configurations together (analyses._engine_valuation.value_roots); run it in one process"


def run(config: Config, opened: Served, valued, say) -> Report:
    """The aggregations, speed-ups, the best, exports and the chart (``serve_table``, ``estimates``, ``exports``)."""
    rows, not_run, roots, tv = valued
    source, latency, prices = opened.source, opened.latency, opened.prices
    plain_time = {(s.name, r.root): latency.target(len(r.context), 1) for s, rs in roots.items() for r in rs}
    summary, per_root, positions_frame = summarise(rows)
    laws = request_laws(rows)
    speed = estimates(rows, prices, plain_time)
    table = serve_table(summary, speed, laws, runnable(config), refusals(config))
    differ = disagreements(laws)
    exported = exports(rows, speed)
    subtitle = f"source: {source.describe()}; engine: {config.engine}; latency: {latency.source}"
    document = [{k: v for k, v in e.items() if not k.startswith("_")} for e in exported]
    outputs = {
        "serve.parquet": table,
        "speedup.parquet": speed,
        "one_minus_tv.parquet": tv,
        "per_root.parquet": per_root,
        "by_position.parquet": positions_frame,
        "disagreements.parquet": differ,
        "not_run.parquet": not_run,
        "exports.json": lambda tmp: Path(tmp).write_text(json.dumps(document, indent=1)),
        **{
            f"profile-{slug(e['setting'])}.json": lambda tmp, text=e["_profile"].to_json(): Path(tmp).write_text(text)
            for e in exported
        },
        **chart_files("speedup", chart(speed, prices, subtitle), chart_writer),
    }
    return Report(outputs, None, report(config, source, latency, prices, table, speed, tv, differ, not_run, exported))


def report(config, source, latency, prices, table, speed, tv, differ, not_run, exported) -> tuple:
    """The printed answer (``analyses._study.Report.printed`` items): 1 - TV, the configurations
    under the engine's names, the best, the refusals, the disagreements and the exports."""
    items: list = [
        f"Source: {source.describe()}; engine: {config.engine}; latency: {latency.source}",
        f"Draft prices: a = {prices[0].how}; b = {prices[1].how}",
        (tv, "1 - TV(p, q) along the draft's top-1 chain, by position (se: clustered by request)"),
    ]
    names = ENGINE_METRICS.get(config.engine, ())
    renames = {lab: mine for mine, lab, _ in names if not lab.endswith("_d")}
    shown = table.select(
        "setting",
        "config",
        "mode",
        *[pl.col(c).alias(renames.get(c, c)) for c in ("accept_length", "accepted", "draft_acceptance_rate", "chain")],
        "pooled",
        "pooled_equal_tokens",
        "per_request_mean",
        "speedup_a",
        "speedup_se_a",
        "speedup_b",
        "speedup_se_b",
        pl.col("status").str.split(":").list.first(),  # the full rule or reason: serve.parquet, the refusals below
    )
    items.append(
        (
            shown,
            f"Configurations of {config.engine} (exact; names as {config.engine} prints them where it names them: "
            + ("; ".join(f"{mine} = {how}" for mine, _, how in names) or "the lab's")
            + "; pooled: vLLM/SGLang, each root one step; pooled_equal_tokens: the same if every request emits as many "
            "tokens; per_request_mean: SpecForge; every column: serve.parquet)",
        )
    )
    for label, price in zip("ab", prices):
        best = speed.filter((pl.col("price") == label) & (pl.col("rank") <= config.best)).select(
            "setting", "rank", "config", "mode", "speedup", "speedup_se", "gap_to_best", "gap_se", "within_2se", "E", "E_se"
        )
        items.append(
            (
                best,
                f"Best configurations, draft price {label} ({price.how}); within_2se: within 2 SE of the best (null: no SE, one request)",
            )
        )
    if not_run.height:
        items.append(
            (
                not_run.group_by("reason", maintain_order=True).agg(
                    pl.col("mode").unique().sort().str.join(" ").alias("modes"),
                    pl.col("config").unique(maintain_order=True).str.join("; ").str.slice(0, 90).alias("configs"),
                ),
                "Refused by the engine or not run (every row: not_run.parquet)",
            )
        )
    if differ.height:
        items.append(f"The two aggregations disagree in sign on {differ.height} pair(s) (disagreements.parquet), e.g.:")
        for note, a, b, steps in differ.select("note", "a", "b", "steps").head(3).iter_rows():
            items.append(f"  A = {a}, B = {b} (steps: {steps}): {note}")
    else:
        items.append(
            "The pooled (vLLM/SGLang; roots as steps, or equal tokens per request) and per-request-mean (SpecForge) "
            "aggregations order every pair of configurations alike"
        )
    return (*items, *export_lines(exported))


def export_lines(exported: list[dict]) -> tuple:
    """The printed lines of each setting's exports (``exports``)."""
    items = []
    for e in exported:
        vllm = e["vllm"]["rates"]["flag"]
        wrong = e["constant_rate_misstatement"]
        err = wrong["unconditional_error"][wrong["worst_position"] - 1]
        items.append(f"Exports for the best at price a, setting {e['setting']}: {e['config']} / {e['mode']}")
        items.append(f"  llama.cpp: {' '.join(e['llama.cpp']['rates'])}")
        items.append(f"  vLLM:      {vllm[0]} '{vllm[1]}'")
        items.append(f"  SGLang:    {' '.join(f'{k}={v}' for k, v in e['sglang'].items())}")
        items.append(
            f"  a constant rate (llama.cpp's --spec-synthetic-acceptance-length {e['llama.cpp']['length'][1]}) replays "
            f"p = {wrong['rate']:.4f} at every position: P(tau >= d) off by {err:+.4f} at d = {wrong['worst_position']}"
        )
    return tuple(items)


STUDY = declared(globals())
"""The estimator as a study: one process (``shardable`` says why), every root valued together (``values``)."""


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
