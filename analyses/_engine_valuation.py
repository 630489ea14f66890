"""Engine configurations valued at every root of a source: the valuation ``analyses.sweep`` and
``analyses.serve_estimate`` share (a helper, not a study).

A configuration (``analyses._engine_configs.EngineConfig``) is valued at a root under each of its
verifier modes that is lossless for its drafting law (``value_root``): a deterministic tree (EAGLE,
the chains, TreeGraft, SpecBlock, any registered deterministic builder a configuration's
``lab["kind"]`` names) exactly, one tree per root; a sampled tree (Sequoia) by the mean of the exact
values of ``config.samples`` trees, with its standard error; the trees are drawn once per root
(``simlab.valuation.draw_trees``) and valued per mode by ``simlab.valuation.trees_value`` (the
valuation every study shares).  ``summarise`` gathers the rows per
(setting, configuration, mode) under the engines' metric names (``simlab.engine_metrics``).

``config`` below is any object with the fields ``seed``, ``samples`` and ``draft_law`` (and, for
``prepare_drafters``, ``capture``, ``backend``, ``target``, ``pair``, ``drafters``, ``rank_noise``,
``small_ratio``, ``block_ratio``, ``fill``, ``device``): ``analyses.sweep.Config`` has them.
"""

from __future__ import annotations

import math
import sys
import zlib
from dataclasses import replace

import numpy as np
import polars as pl

from analyses import _engine_configs as engines
from analyses._categories import with_category
from simlab.trees import drafting_table
from simlab import builders, tree_verifiers
from simlab.engine_metrics import aggregate
from simlab.errors import argument_of
from simlab.sampling import seeded_rng
from simlab.valuation import draw_trees, trees_value


class Builders:
    """The lab builder of each configuration at a root (Sequoia fitted per setting on its roots).

    Args:
        config: the study's settings (``seed``).
        latency: the latency model (Sequoia's fit).
        block_drafter: ``pair -> block drafter`` for SpecBlock (``analyses._block_drafters``), or None.
    """

    def __init__(self, config, latency, block_drafter):
        self.config, self.latency, self.block_drafter, self.sequoia = config, latency, block_drafter, {}

    def fit(self, configs, roots, setting) -> list[dict]:
        """Sequoia's trees for the setting's budgets from the acceptance vector measured on ``roots``
        (in-sample: the study's roots); rows of budgets that cannot be built."""
        from analyses._builder_roster import Roster, fit_sequoia

        budgets = tuple(sorted({c.budget for c in configs if c.engine == "sequoia"}))
        if not budgets:
            return []
        roster = Roster(budgets, self.latency)
        fit_sequoia(roster, roots, setting, self.config.seed)
        self.sequoia.update(roster.sequoia)
        return [
            {"config": f"sequoia budget={r['budget']}", "setting": setting.name, "reason": r["reason"]} for r in roster.not_run
        ]

    def get(self, c: engines.EngineConfig, root, setting):
        """The builder of ``c`` at ``root`` under ``setting``, or None (SpecBlock without a block
        drafter, a Sequoia budget its fit could not build).  Sequoia (fitted per setting),
        TreeGraft (the root's prompt length cached) and SpecBlock (the root's block drafter) take
        per-root extras; every other kind is ``simlab.builders.get(lab["kind"], **options)`` with the
        configuration's lab options, so a new engine's deterministic builder needs no code here.

        Raises:
            ValueError: from ``simlab.builders.get`` (an unknown kind or a bad option).
        """
        lab = c.lab
        kind = lab["kind"]
        if kind == "sequoia":
            return self.sequoia.get((setting.name, lab["budget"]))
        if kind == "treegraft":
            return builders.get("treegraft", budget=lab["budget"], cached=root.prompt_length)
        if kind == "specblock":
            if self.block_drafter is None:
                return None
            return builders.get("specblock", drafter=self.block_drafter(root.pair), budget=lab["budget"])
        return builders.get(kind, **{k: v for k, v in lab.items() if k != "kind"})


class FilledPair:
    """A replayed capture (``backends.capture_store.CapturedPair``) whose missing nodes are evaluated
    by the capture's own models (``--fill``): every stored node is read from its logits, the models
    are opened on the first node the capture lacks (``backends.capture.open_captured_pair``: as the
    capture opened them, and refused where their fingerprints differ from the recorded ones) and see
    only those (``calls`` counts them).  ``prog`` names the study in the note it prints on stderr.

    Raises:
        ValueError: from the capture or the models (``capture: ...`` for a model that is not the
            captured one or a folder that is not there; a bad device).
    """

    def __init__(self, captured, stored, device: str, prog: str = "python -m analyses.sweep"):
        self.captured, self.stored, self.device, self.prog = captured, stored, device, prog
        self.vocab_size, self.live, self.calls = captured.vocab_size, None, 0

    def distributions(self, contexts):
        from backends.capture import open_captured_pair

        contexts = [tuple(int(t) for t in c) for c in contexts]
        missing = [c for c in contexts if not self.captured.holds(c)]
        P = np.empty((len(contexts), self.vocab_size))
        Q = np.empty_like(P)
        kept = [i for i, c in enumerate(contexts) if self.captured.holds(c)]
        if kept:
            P[kept], Q[kept] = self.captured.distributions([contexts[i] for i in kept])
        if missing:
            if self.live is None:
                self.live = open_captured_pair(
                    self.stored, self.device, note=lambda line: print(f"{self.prog}: {line}", file=sys.stderr)
                )
            self.calls += len(missing)
            rest = [i for i, c in enumerate(contexts) if not self.captured.holds(c)]
            P[rest], Q[rest] = self.live.distributions(missing)
        return P, Q


def value_root(
    c: engines.EngineConfig, builder, root, setting, index: int, config, latency, capture: bool, tables=None, prices=None
):
    """Rows (one per mode) of configuration ``c`` at ``root``, and not-run reasons by mode.

    Each row: ``setting``, ``trajectory``, ``root``, ``category``, ``config`` (the label), ``engine``,
    ``mode``, ``verifier``, ``method`` ("exact": one deterministic tree; "mc": the mean over sampled
    trees), ``tokens`` (draft tokens, root excluded), ``E`` (E[tau + 1] with EOS truncation; the
    mean over the trees) and ``E_se`` (its Monte Carlo standard error, 0 for one tree), ``T``
    (T-hat in seconds, ``latency.tree_step_time``), and ``_plain`` / ``_eos``
    (``simlab.engine_metrics.EngineMetrics`` aggregated over the trees, without / with EOS
    truncation); with ``prices`` (name -> ``simlab.latency.LatencyModel``) also ``_prices``, name ->
    T-hat under that model.

    ``index``: the seed stream of the configuration's sampled trees (the CRC-32 of its label).
    ``tables``: the root's (table, drafting table) shared by every configuration (each node's p
    and q fetched once per root); None: new ones.

    Raises:
        ValueError: ``capture: ...`` from a capture or its models (``--fill``): the run stops.
    """
    if tables is None:
        table = root.table()
        tables = (table, drafting_table(table, config.draft_law))
    table, drafting = tables
    why = engines.vocab_limit(c, table.vocab_size) or engines.draft_law_limit(c, config.draft_law, setting)
    if why:
        return [], {m: why for m in c.modes}
    try:
        deterministic = getattr(builder, "deterministic", False)
        rng = None if deterministic else seeded_rng(config.seed, 27, index, root.root)
        trees = draw_trees(builder, table, drafting=drafting, samples=config.samples, rng=rng)
        for tree in trees:
            tree.fill()
    except ValueError as exc:  # a node the capture lacks, or a tree the builder cannot draft at this root
        if capture and argument_of(exc)[0] == "capture":  # the capture, or its models (--fill), refused: the run stops
            raise
        if capture and argument_of(exc)[0] == "context":
            why = (
                "the capture lacks nodes of this tree (a replay calls no model; --fill evaluates them with the capture's models)"
            )
            return [], {m: why for m in c.modes}
        return [], {m: f"no tree here: {exc}" for m in c.modes}
    laws = frozenset().union(*(t.laws() for t in trees)) or builder.laws
    lossless = set(tree_verifiers.lossless_names(laws, setting))
    rows, missing = [], {}
    priced = (
        {name: float(np.mean([model.tree_step_time(len(root.context), t) for t in trees])) for name, model in prices.items()}
        if prices
        else None
    )
    for mode in c.modes:
        name = c.verifier(mode, laws)
        value = trees_value(trees, name, latency) if name is not None and name in lossless else None
        if value is None:
            missing[mode] = f"no {mode} verifier is lossless for {', '.join(sorted(law.value for law in laws))} children"
            continue
        rows.append(
            {
                "setting": setting.name,
                "trajectory": root.trajectory,
                "root": root.root,
                "category": root.category,
                "config": c.label,
                "engine": c.engine,
                "mode": mode,
                "verifier": name,
                "method": "exact" if len(trees) == 1 else "mc",
                "tokens": value.tokens,
                "E": value.metrics.accept_length,
                "E_se": value.metrics_se,
                "T": value.T,
                "_plain": value.plain,
                "_eos": value.metrics,
            }
        )
        if priced is not None:
            rows[-1]["_prices"] = priced
    return rows, missing


def prepare_drafters(prog: str, config, configs, source, latency, named: set):
    """The latency model with the extra drafters the configurations need (TreeGraft's ``small``,
    SpecBlock's ``block``), the ``Builders``, and not-run rows for SpecBlock where it cannot run
    (a capture stores no block drafter; drafters that cannot be built).

    ``named``: the drafters ``latency`` already times (a published profile's)."""
    from analyses._block_drafters import DrafterConfig, drafters_for
    from simlab.latency import ForwardTime

    if "small" not in named:
        latency = latency.with_drafter("small", ForwardTime.constant(config.small_ratio * latency.target(0, 1)))
    not_run, block_drafter = [], None
    if any(c.engine == "specblock" for c in configs) and config.capture:
        reason = "SpecBlock's block drafter runs on the live models (a capture stores no drafter); run it on --backend hf"
        not_run.append({"config": "specblock", "setting": "all", "mode": "all", "reason": reason})
    elif any(c.engine == "specblock" for c in configs):
        try:
            drafter_of, _ = drafters_for(
                DrafterConfig(config.backend, config.target, config.drafters, 4, config.rank_noise, config.seed, pair=config.pair)
            )
            block_drafter = drafter_of["full"]
            if config.backend == "hf" and "block" not in named:  # the trained drafter's forward, measured
                from backends.block_drafter.drafter import forward_seconds

                latency = latency.with_drafter("block", forward_seconds(block_drafter(source.pair).model))
        except ValueError as exc:
            not_run.append({"config": "specblock", "setting": "all", "mode": "all", "reason": str(exc)})
        if "block" not in dict(latency.drafters):  # synthetic: --block-ratio of a one-token target forward
            latency = latency.with_drafter("block", ForwardTime.constant(config.block_ratio * latency.target(0, 1)))
    return latency, Builders(config, latency, block_drafter), not_run


def value_roots(prog: str, configs, roots: dict, config, latency, made: Builders, bar, source=None, prices=None, at_root=None):
    """Every configuration at every root: (rows, not-run rows, the ``FilledPair`` of each setting).

    ``roots``: setting -> its roots (``Source.roots``); ``source``: the capture source, for
    ``config.fill``; ``bar``: a progress bar advanced per root; ``prices``: as ``value_root``;
    ``at_root(setting, root, tables)``: called after each root's configurations with the root's
    (table, drafting table), whose fetched nodes it may read again without a model call.  A
    sampled configuration's seed stream is the CRC-32 of its label, so a row does not depend on
    its neighbours.

    Raises:
        ValueError: from the source, the capture, or a Sequoia fit (``context: ...`` on a capture
            is a not-run row instead).
    """
    capture = bool(config.capture)
    seed_index = {c.label: zlib.crc32(c.label.encode()) for c in configs}
    rows, filled, not_run = [], [], []
    for setting, rs in roots.items():
        if config.fill:
            filled.append(FilledPair(rs[0].pair, source.captures[setting.name][1], config.device, prog))
            rs = [replace(r, pair=filled[-1]) for r in rs]
        try:
            not_run += made.fit(configs, rs, setting)
        except ValueError as exc:
            if not (capture and argument_of(exc)[0] == "context"):
                raise
            why = "Sequoia's acceptance vector needs nodes the capture lacks (--fill evaluates them with its models)"
            not_run.append({"config": "sequoia", "setting": setting.name, "mode": "all", "reason": why})
        for root in rs:
            table = root.table()
            tables = (table, drafting_table(table, config.draft_law))
            for c in configs:
                builder = made.get(c, root, setting)
                if builder is None:
                    continue
                got, missing = value_root(
                    c, builder, root, setting, seed_index[c.label], config, latency, capture, tables, prices
                )
                rows += got
                not_run += [{"config": c.label, "setting": setting.name, "mode": m, "reason": why} for m, why in missing.items()]
            if at_root is not None:
                at_root(setting, root, tables)
            bar.update()
    return rows, not_run, filled


def not_run_table(prog: str, config, rows: list[dict], not_run: list[dict], filled) -> pl.DataFrame:
    """The not-run rows as a frame (duplicates dropped), after the ``--fill`` note on stderr (the
    nodes the capture's models evaluated); exits 2 (``backends.cli.fail``) when no configuration
    ran at all, naming the first reason."""
    from backends.cli import fail

    if config.fill and not config.quiet:
        print(
            f"{prog}: note: --fill evaluated {sum(f.calls for f in filled)} nodes the capture lacks with its models",
            file=sys.stderr,
        )
    frame = pl.DataFrame(
        not_run, schema={"config": pl.String, "setting": pl.String, "mode": pl.String, "reason": pl.String}
    ).unique(maintain_order=True)
    if not rows:
        fail(prog, f"--config: no configuration could run on this source: {frame['reason'][0]}")
    return frame


def summarise(rows: list[dict]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(summary sorted by throughput, per-root rows, per-position rates) from ``value_root`` rows.

    The summary has one row per (setting, configuration, mode): ``roots``, mean ``tokens``, the
    engine metrics of ``simlab.engine_metrics.aggregate`` over the roots (``accept_length``,
    ``accepted``, ``chain``, ``uncond_d``, ``cond_d``; ``_eos`` with EOS truncation), ``E``,
    ``E_se`` (Monte Carlo only), ``T`` and ``TPS`` = sum E / sum T; sorted by setting, then TPS
    descending.  Per position: ``unconditional``, ``conditional`` and their ``_eos`` versions."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["setting"], r["config"], r["mode"]), []).append(r)
    summary, positions = [], []
    for (setting, name, mode), rs in groups.items():
        plain, eos = aggregate([r["_plain"] for r in rs]), aggregate([r["_eos"] for r in rs])
        E, T = sum(r["E"] for r in rs), sum(r["T"] for r in rs)
        summary.append(
            {
                "setting": setting,
                "config": name,
                "engine": rs[0]["engine"],
                "mode": mode,
                "verifier": rs[0]["verifier"],
                "method": rs[0]["method"],
                "roots": len(rs),
                "tokens": float(np.mean([r["tokens"] for r in rs])),
                **plain.row(),
                **{f"{k}_eos": v for k, v in eos.row().items() if not k.startswith(("uncond_", "cond_"))},
                "E": E / len(rs),
                "E_se": math.sqrt(sum(r["E_se"] ** 2 for r in rs)) / len(rs),
                "T": T / len(rs),
                "TPS": E / T,
            }
        )
        for d in range(plain.unconditional.size):
            positions.append(
                {
                    "setting": setting,
                    "config": name,
                    "mode": mode,
                    "position": d + 1,
                    "unconditional": float(plain.unconditional[d]),
                    "conditional": float(plain.conditional[d]),
                    "unconditional_eos": float(eos.unconditional[d]) if d < eos.unconditional.size else 0.0,
                    "conditional_eos": float(eos.conditional[d]) if d < eos.conditional.size else float("nan"),
                }
            )
    per_root = with_category(
        pl.DataFrame(
            [
                {
                    **{k: v for k, v in r.items() if not k.startswith("_")},
                    **{k: v for k, v in r["_plain"].row().items() if not k.startswith(("uncond_", "cond_"))},
                }
                for r in rows
            ]
        )
    )
    fixed = [c for c in next(iter(summary)) if not c.startswith(("uncond_", "cond_"))]
    frame = pl.DataFrame(summary, infer_schema_length=None)
    frame = frame.select(*fixed, *[c for c in frame.columns if c not in fixed]).sort(["setting", "TPS"], descending=[False, True])
    return frame, per_root, pl.DataFrame(positions)


def refuse_raw_draft_law_on_capture(prog: str, config, settings) -> None:
    """Exit 2 with one line (``backends.cli.fail``, on ``--draft-law``) when ``config`` replays a
    capture (``config.capture``) with ``config.draft_law == "raw"`` at a setting other than T = 1:
    a capture holds q under its own setting only, not the drafters' untempered law."""
    from backends.cli import fail
    from simlab.sampling import SamplingSettings

    if config.capture and config.draft_law == "raw" and any(s != SamplingSettings() for s in settings):
        fail(
            prog,
            "--draft-law: a capture holds q under its own setting only, not the drafters' untempered law; "
            "use --draft-law setting, or a capture at T = 1",
        )
