"""Latency model: per-forward times of the draft and the target, and the time of one step.

A **forward time** t(l, n) is the wall time in seconds of one model forward that adds ``n``
new tokens on top of a context of ``l`` tokens.  A ``LatencyModel`` holds t_q (draft) and
t_p (target) and estimates the time of one speculative step with a tree of a given shape
(DDTE Sec. 6, App. E):

    T-hat(l, a) = sum_{j < L1} t_q(l + j) + sum_{j < L2} t_q(l + L1 + jK) + t_p(l + L1 + K L2)

for a delayed tree a = (K, L1, L2), generalised to any tree by ``tree_time``: one draft
forward per depth level d = 0..D-1 over the m_d tokens at that depth (m_0 = 1, the root) at
context l + (tokens at depths 1..d), then one target forward over the root token and every
tree token at context l + (all tree tokens).  The estimated throughput of an action is
E[tau + 1] / T-hat in tokens per second.

Where the times come from:

* ``LatencyModel.from_cost_ratio(c)``: synthetic worlds; t_p = ``target_seconds`` and t_q =
  c t_p (Leviathan et al.'s cost coefficient c = t_q / t_p), optionally growing by a fraction
  ``per_token`` of the one-token time for each extra token in the forward;
* ``LatencyModel.load(path)``: a profile file (JSON or TOML) the user supplies (format in
  ``ForwardTime``);
* ``backends.latency_probe.measure``: a warm-up microbenchmark of real models on this machine.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simlab.builders.cost import DraftCost, delayed_levels
from simlab.checks import check_int
from simlab.files import atomic_write


def check_axis(values, name: str, minimum: int) -> tuple[int, ...]:
    """A table axis as a tuple of strictly increasing integers >= ``minimum`` (tokens).

    Raises:
        ValueError: naming ``name``: not a non-empty sequence of integers, below the minimum,
            or not strictly increasing.
    """
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise ValueError(f"{name}: must be a non-empty list of integers, got {values!r}")
    out = [check_int(v, name, minimum) for v in values]
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"{name}: must be strictly increasing, got {out}")
    return tuple(out)


def _interp(x: float, grid: tuple[int, ...], values: np.ndarray) -> np.ndarray:
    """Piecewise-linear in x over ``grid`` (rows of ``values``), linear beyond the ends."""
    if len(grid) == 1:
        return values[0]
    i = int(np.clip(np.searchsorted(grid, x) - 1, 0, len(grid) - 2))
    w = (x - grid[i]) / (grid[i + 1] - grid[i])
    return values[i] * (1 - w) + values[i + 1] * w


@dataclass(frozen=True)
class ForwardTime:
    """t(l, n): seconds of one forward of n new tokens at context length l, from a table.

    Bilinear interpolation between grid points, linear extrapolation beyond them (from the
    two outermost points of each axis), never below the smallest tabulated time.  An axis
    with one point makes the time constant along it.  Profile-file form (JSON or TOML):
    ``{"contexts": [l...], "tokens": [n...], "seconds": [[t(l, n) for n in tokens] for l in contexts]}``.

    Args:
        contexts: context lengths l (tokens), strictly increasing, >= 0.
        tokens: new tokens per forward n, strictly increasing, >= 1.
        seconds: (len(contexts), len(tokens)) positive finite times in seconds.

    Raises:
        ValueError: a bad axis, a table of the wrong shape, a non-positive or non-finite time.
    """

    contexts: tuple[int, ...]
    tokens: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]

    def __post_init__(self):
        object.__setattr__(self, "contexts", check_axis(self.contexts, "contexts", 0))
        object.__setattr__(self, "tokens", check_axis(self.tokens, "tokens", 1))
        try:
            table = np.asarray(self.seconds, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"seconds: must be a table of numbers, got {self.seconds!r}") from None
        if table.shape != (len(self.contexts), len(self.tokens)):
            raise ValueError(
                f"seconds: must have shape ({len(self.contexts)}, {len(self.tokens)}) = (contexts, tokens), got {table.shape}"
            )
        if not np.all(np.isfinite(table)) or np.any(table <= 0):
            raise ValueError("seconds: every time must be positive and finite")
        object.__setattr__(self, "seconds", tuple(tuple(float(v) for v in row) for row in table))

    def scaled(self, factor: float) -> "ForwardTime":
        """The table with every time multiplied by ``factor`` (> 0, finite).

        Raises:
            ValueError: a factor that is not a positive finite number.
        """
        if not (isinstance(factor, (int, float)) and 0 < factor < float("inf")):
            raise ValueError(f"factor: must be a positive finite number, got {factor!r}")
        return ForwardTime(self.contexts, self.tokens, tuple(tuple(t * factor for t in row) for row in self.seconds))

    @classmethod
    def constant(cls, seconds: float) -> "ForwardTime":
        """The same time for every (l, n)."""
        return cls((0,), (1,), ((seconds,),))

    @classmethod
    def affine(cls, seconds: float, per_token: float = 0.0, per_context: float = 0.0) -> "ForwardTime":
        """t(l, n) = seconds (1 + per_token (n - 1) + per_context l), exactly (a 2 x 2 table)."""
        for name, value in (("per_token", per_token), ("per_context", per_context)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
        t = lambda l, n: seconds * (1 + per_token * (n - 1) + per_context * l)
        return cls((0, 1), (1, 2), ((t(0, 1), t(0, 2)), (t(1, 1), t(1, 2))))

    def __call__(self, context: float, tokens: float = 1) -> float:
        """Seconds of one forward of ``tokens`` new tokens at context length ``context``.

        Raises:
            ValueError: a context below 0 or a token count below 1 (or either not finite).
        """
        for name, value, low in (("context", context, 0), ("tokens", tokens, 1)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float, np.integer, np.floating))
                or not value >= low
                or not math.isfinite(value)
            ):
                raise ValueError(f"{name}: must be a finite number >= {low}, got {value!r}")
        table = np.asarray(self.seconds)
        row = _interp(float(context), self.contexts, table)
        value = float(_interp(float(tokens), self.tokens, row[:, None])[0])
        return max(value, float(table.min()))

    def to_dict(self) -> dict:
        return {"contexts": list(self.contexts), "tokens": list(self.tokens), "seconds": [list(r) for r in self.seconds]}

    @classmethod
    def from_dict(cls, data, name: str) -> "ForwardTime":
        if not isinstance(data, dict) or set(data) != {"contexts", "tokens", "seconds"}:
            raise ValueError(f"{name}: must be a table with exactly the keys contexts, tokens, seconds, got {data!r:.200}")
        try:
            return cls(data["contexts"], data["tokens"], data["seconds"])
        except ValueError as exc:
            raise ValueError(f"{name}.{exc}") from None


@dataclass(frozen=True)
class LatencyModel:
    """Draft and target forward times, and the time of one speculative step (module docstring).

    Args:
        draft: t_q (the drafter named ``"draft"``).
        target: t_p.
        source: where the times come from (free text, e.g. the machine and models measured).
        drafters: further named drafters' forward times (a drafter set, e.g. TreeGraft's
            ``"small"`` n-gram step beside the ``"draft"`` (mid) model), as (name, ForwardTime)
            pairs; a ``DraftForward`` of model m is timed by m's table.

    Raises:
        ValueError: a drafter named ``draft`` or ``target`` in ``drafters``, or a repeated name.
    """

    draft: ForwardTime
    target: ForwardTime
    source: str = ""
    drafters: tuple[tuple[str, ForwardTime], ...] = ()

    def __post_init__(self):
        names = [name for name, _ in self.drafters]
        if len(set(names)) != len(names) or {"draft", "target"} & set(names):
            raise ValueError(f"drafters: names must be distinct and not 'draft' or 'target', got {names}")

    def forward(self, model: str) -> ForwardTime:
        """The forward-time table of drafter ``model`` (``"draft"``, ``"target"`` or one of ``drafters``).

        Raises:
            ValueError: ``model: ...`` for a drafter the model has no times for.
        """
        if model == "draft":
            return self.draft
        if model == "target":
            return self.target
        for name, table in self.drafters:
            if name == model:
                return table
        raise ValueError(
            f"model: the latency model has no times for drafter {model!r}; it has "
            f"{', '.join(['draft'] + [n for n, _ in self.drafters])}"
        )

    def with_drafter(self, name: str, table: ForwardTime) -> "LatencyModel":
        """The same model with one more (or a replaced) named drafter."""
        return LatencyModel(
            self.draft, self.target, self.source, tuple((n, t) for n, t in self.drafters if n != name) + ((name, table),)
        )

    @classmethod
    def from_cost_ratio(cls, c: float, *, target_seconds: float = 1.0, per_token: float = 0.0) -> "LatencyModel":
        """Synthetic times: t_p(l, n) = target_seconds (1 + per_token (n - 1)), t_q = c t_p.

        Raises:
            ValueError: c or target_seconds not positive and finite, per_token negative.
        """
        for name, value in (("c", c), ("target_seconds", target_seconds)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}: must be a positive finite number, got {value!r}")
        return cls(
            ForwardTime.affine(c * target_seconds, per_token),
            ForwardTime.affine(target_seconds, per_token),
            f"cost ratio c = {c:g}, t_p = {target_seconds:g} s, +{per_token:g} per extra token",
        )

    def tree_time(self, context: int, levels: Sequence[int]) -> float:
        """T-hat in seconds for a tree with ``levels[d - 1]`` tokens at depth d (d = 1..D).

        Draft forwards: one per depth d = 0..D-1 over m_d tokens (m_0 = 1, the root; m_d =
        levels[d - 1]) at context ``context + sum(levels[:d])``; then one target forward over
        1 + sum(levels) tokens at context ``context + sum(levels)``.  No draft: t_p(l, 1).

        Raises:
            ValueError: a negative context or a level with fewer than 1 token.
        """
        return self.step_time(check_int(context, "context", 0), DraftCost.levels(levels))

    def step_time(self, context: int, cost: DraftCost) -> float:
        """T-hat in seconds of one step: the draft forwards of ``cost`` (each t_q at context
        ``context + forward.context``), then one target forward over the root and the
        ``cost.verified`` tree tokens at context ``context + cost.verified``.

        Raises:
            ValueError: a negative context, or ``cost`` not a ``DraftCost``.
        """
        context = check_int(context, "context", 0)
        if not isinstance(cost, DraftCost):
            raise ValueError(f"cost: must be a simlab.builders.cost.DraftCost, got {type(cost).__name__}")
        total = sum(self.forward(f.model)(context + f.context, f.tokens) for f in cost.forwards)
        return total + self.target(context + cost.verified, 1 + cost.verified)

    def tree_step_time(self, context: int, tree) -> float:
        """T-hat of verifying ``tree``: its builder's cost (``tree.cost``), else its level-by-level one."""
        return self.step_time(context, tree.cost if tree.cost is not None else DraftCost.of_tree(tree))

    def delayed_time(self, K: int, L1: int, L2: int, context: int) -> float:
        """DDTE's T-hat(x, a) for a = (K, L1, L2) at context length ``context`` (seconds).

        Raises:
            ValueError: K < 1, L1 or L2 negative (``simlab.builders.Delayed``'s checks), a bad context.
        """
        check_int(K, "K", 1)  # the action's checks, as Delayed(K, L1, L2) makes them
        check_int(L1, "L1", 0)
        check_int(L2, "L2", 0)
        return self.tree_time(context, delayed_levels(K, L1, L2))

    def to_dict(self) -> dict:
        out = {"unit": "seconds", "source": self.source, "draft": self.draft.to_dict(), "target": self.target.to_dict()}
        if self.drafters:
            out["drafters"] = {name: table.to_dict() for name, table in self.drafters}
        return out

    def save(self, path) -> None:
        """Write the profile as JSON (atomically)."""
        atomic_write(Path(path), lambda tmp: Path(tmp).write_text(json.dumps(self.to_dict(), indent=2)))

    @classmethod
    def load(cls, path) -> "LatencyModel":
        """Read a profile file: JSON (``.json``) or TOML (``.toml``), keys ``draft``, ``target``
        (each a ``ForwardTime`` table), optional ``unit`` (must be ``"seconds"``), ``source`` and
        ``drafters`` (a table of further named drafters, each a ``ForwardTime`` table).

        Raises:
            ValueError: a missing or unreadable file, another format, missing keys, bad tables.
        """
        if not isinstance(path, (str, Path)):
            raise ValueError(f"latency: a profile path must be a string or Path, got {path!r}")
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"latency: no such profile file {str(path)!r}")
        try:
            if file.suffix == ".toml":
                data = tomllib.loads(file.read_text(encoding="utf-8"))
            elif file.suffix == ".json":
                data = json.loads(file.read_text(encoding="utf-8"))
            else:
                raise ValueError(f"latency: profile {str(path)!r} must be a .json or .toml file")
        except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"latency: cannot parse {str(path)!r} ({str(exc).splitlines()[0]})") from None
        if not isinstance(data, dict) or "draft" not in data or "target" not in data:
            raise ValueError(f"latency: {str(path)!r} needs a 'draft' and a 'target' table")
        if data.get("unit", "seconds") != "seconds":
            raise ValueError(f"latency: unit must be 'seconds', got {data.get('unit')!r}")
        extra = data.get("drafters", {})
        if not isinstance(extra, dict):
            raise ValueError(f"latency: 'drafters' must be a table of named drafters, got {extra!r:.100}")
        return cls(
            ForwardTime.from_dict(data["draft"], "draft"),
            ForwardTime.from_dict(data["target"], "target"),
            str(data.get("source", file.name)),
            tuple((str(n), ForwardTime.from_dict(t, str(n))) for n, t in extra.items()),
        )
