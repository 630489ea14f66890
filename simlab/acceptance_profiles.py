"""Per-position acceptance profiles the engines can replay, their conversions, and the engines' two
aggregations of acceptance length, exact from per-request laws.

With tau the draft tokens accepted in one verification step of a chain of K drafts:

* **mean acceptance length** L = E[tau + 1], the bonus (or correction) token **included**: vLLM's
  "Mean acceptance length", SGLang's ``accept_length`` and ``SGLANG_SIMULATE_ACC_LEN``, llama.cpp's
  ``--spec-synthetic-acceptance-length``; ``accepted`` = E[tau] = L - 1 has no bonus (SpecForge's
  ``simulated_acc_len``, ``speculators``' expected accepted length);
* **unconditional** survival u_d = P(tau >= d), d = 1..K, non-increasing (vLLM's per-position
  counter over drafts; vLLM's ``synthetic_acceptance_rates`` and llama.cpp's
  ``--spec-synthetic-acceptance-rates`` take these);
* **conditional** rates c_d = P(tau >= d | tau >= d - 1) = u_d / u_{d-1} (u_0 = 1), the rate an
  engine's synthetic sampler draws at position d (``u < c_d``).  Where u_{d-1} = 0 position d is
  never reached and c_d is set to 0 (the canonical value: a draw there never happens).

``AcceptanceProfile`` holds both arrays (they determine each other and the law of tau exactly); its
JSON format (``PROFILE_FORMAT``, version ``PROFILE_VERSION``) round-trips exactly, and
``llama_cpp_args``, ``vllm_speculative_config`` and ``sglang_env`` write it in each engine's form.

**Engine conversions**, each as its source states it (the formulas: the derivations page below):

* llama.cpp PR 27711: ``llama_cpp_length_to_conditional``, ``llama_cpp_rates_to_conditional``;
* vLLM ``vllm/config/speculative.py`` (PR 40662): ``vllm_length_to_rates``,
  ``vllm_rates_to_conditional``;
* SGLang ``spec_utils._sample_simulated_acc_len``: ``sglang_tau_law``.

**Aggregations** (vLLM issue 42508): a request r with n_r verification steps and per-step E[tau_s].
vLLM (``metrics.py``: 1 + sum accepted / sum drafts) and SGLang's server log
(``spec_num_accept_tokens / spec_num_forward_ct``) pool over requests (``pooled``); SpecForge's
``benchmarks/sglang.py`` averages the per-request means ``completion_tokens / spec_verify_ct``
(``statistics.fmean``; ``per_request_mean``).  ``compare_aggregations`` says where two
configurations' orderings disagree in sign.  The identities between the three forms, why both
aggregations are exact from the same laws, the engines' conversion formulas and the step count's
caveat: ``docs/derivations/acceptance_profiles.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from simlab.checks import check_choice, check_in_range, check_int, check_real_array
from simlab.engine_metrics import EngineMetrics

PROFILE_FORMAT = "simlab.acceptance_profile"
"""The ``format`` field of a profile's JSON document."""
PROFILE_VERSION = 1
"""The version of the JSON format ``AcceptanceProfile.to_json`` writes and ``from_json`` reads."""
ROUNDING = 1e-12
"""Tolerance for the rounding of summed masses (``from_engine_metrics``) and for the consistency of
a profile's two arrays; every other input is checked exactly."""


# ---------------------------------------------------------------------------------------------
# converters


def _rates(values, name: str, *, non_increasing: bool = False) -> np.ndarray:
    """``values`` as float64 (K,), K >= 1, finite, in [0, 1] (and non-increasing where asked)."""
    arr = check_real_array(values, name)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name}: must be a non-empty 1-D list of rates, got shape {arr.shape}")
    bad = np.flatnonzero(~((arr >= 0.0) & (arr <= 1.0)))  # NaN fails too
    if bad.size:
        raise ValueError(f"{name}: position {bad[0] + 1} has rate {arr[bad[0]]!r}, outside [0, 1]")
    if non_increasing:
        up = np.flatnonzero(np.diff(arr) > 0)
        if up.size:
            d = up[0] + 1
            raise ValueError(
                f"{name}: survival must be non-increasing, position {d + 1} ({arr[d]!r}) > position {d} ({arr[d - 1]!r})"
            )
    return arr


def survival_from_conditional(conditional) -> np.ndarray:
    """u_d = prod_{j <= d} c_j: P(tau >= d) from the conditional rates, float64 (K,).

    Raises:
        ValueError: ``conditional: ...`` for a rate outside [0, 1], NaN, or an empty or non-1-D input.
    """
    return np.cumprod(_rates(conditional, "conditional"))


def conditional_from_survival(unconditional) -> np.ndarray:
    """c_d = u_d / u_{d-1} (u_0 = 1), 0 where u_{d-1} = 0 (position d never reached), float64 (K,).

    Raises:
        ValueError: ``unconditional: ...`` for a rate outside [0, 1], NaN, an increase, or an
            empty or non-1-D input.
    """
    u = _rates(unconditional, "unconditional", non_increasing=True)
    before = np.concatenate([[1.0], u[:-1]])
    return np.where(before > 0, u / np.where(before > 0, before, 1.0), 0.0)


def accept_length_from_survival(unconditional) -> float:
    """L = E[tau + 1] = 1 + sum_d u_d (bonus included; E[tau] is L - 1).

    Raises:
        ValueError: as ``conditional_from_survival``.
    """
    return 1.0 + float(np.sum(_rates(unconditional, "unconditional", non_increasing=True)))


def tau_law(unconditional) -> np.ndarray:
    """P(tau = j), j = 0..K, float64 (K + 1,): u_j - u_{j+1} with u_0 = 1, u_{K+1} = 0.

    Raises:
        ValueError: as ``conditional_from_survival``.
    """
    u = np.concatenate([[1.0], _rates(unconditional, "unconditional", non_increasing=True), [0.0]])
    return u[:-1] - u[1:]


def survival_from_tau_law(law) -> np.ndarray:
    """P(tau >= d), d = 1..K, from P(tau = j), j = 0..K (float64 (K + 1,), summing to 1 within 1e-12).

    Raises:
        ValueError: ``law: ...`` for a negative or NaN mass, a sum off 1, or fewer than 2 entries.
    """
    law = check_real_array(law, "law")
    if law.ndim != 1 or law.size < 2:
        raise ValueError(f"law: must be 1-D with K + 1 >= 2 entries (tau = 0..K), got shape {law.shape}")
    if not np.all(law >= 0):
        raise ValueError("law: masses must be non-negative and not NaN")
    if abs(law.sum() - 1.0) > ROUNDING:
        raise ValueError(f"law: must sum to 1, got {law.sum()!r}")
    return np.minimum(np.cumsum(law[::-1])[::-1][1:], 1.0)


# ---------------------------------------------------------------------------------------------
# the profile


@dataclass(frozen=True, eq=False)
class AcceptanceProfile:
    """The exact per-position acceptance of a chain of K drafts (the module docstring's conventions).

    Attributes:
        conditional: c_d = P(tau >= d | tau >= d - 1), d = 1..K, float64 (K,), in [0, 1]; 0 where
            position d is never reached.
        unconditional: u_d = P(tau >= d), float64 (K,), in [0, 1], non-increasing; u_d = prod c_j
            within ``ROUNDING``.

    Raises:
        ValueError: ``conditional: ...`` / ``unconditional: ...`` for a rate outside [0, 1], an
            increase in survival, different lengths, a nonzero rate past a zero survival, or arrays
            that disagree by more than ``ROUNDING``.
    """

    conditional: np.ndarray
    unconditional: np.ndarray

    def __post_init__(self):
        c = _rates(self.conditional, "conditional")
        u = _rates(self.unconditional, "unconditional", non_increasing=True)
        if c.size != u.size:
            raise ValueError(f"unconditional: has {u.size} positions, conditional has {c.size}")
        before = np.concatenate([[1.0], u[:-1]])
        unreached = np.flatnonzero((before == 0) & (c != 0))
        if unreached.size:
            raise ValueError(
                f"conditional: position {unreached[0] + 1} is never reached (survival 0 before it) "
                f"but has rate {c[unreached[0]]!r}; use 0"
            )
        gap = np.abs(np.cumprod(c) - u)
        if gap.max() > ROUNDING:
            d = int(gap.argmax())
            raise ValueError(
                f"unconditional: position {d + 1} is {u[d]!r}, but the product of the conditional rates is {np.cumprod(c)[d]!r}"
            )
        c, u = c.copy(), u.copy()
        c.flags.writeable = False
        u.flags.writeable = False
        object.__setattr__(self, "conditional", c)
        object.__setattr__(self, "unconditional", u)

    def __eq__(self, other) -> bool:
        """Equal when both arrays are equal bit for bit (NumPy's elementwise ``==`` has no truth value)."""
        if not isinstance(other, AcceptanceProfile):
            return NotImplemented
        return np.array_equal(self.conditional, other.conditional) and np.array_equal(self.unconditional, other.unconditional)

    __hash__ = None

    @property
    def depth(self) -> int:
        """K, the positions (drafts per step)."""
        return int(self.unconditional.size)

    @property
    def accepted(self) -> float:
        """E[tau] = sum_d u_d (no bonus)."""
        return float(np.sum(self.unconditional))

    @property
    def accept_length(self) -> float:
        """E[tau + 1] = 1 + sum_d u_d (bonus included)."""
        return 1.0 + self.accepted

    def tau_law(self) -> np.ndarray:
        """P(tau = j), j = 0..K, float64 (K + 1,)."""
        return tau_law(self.unconditional)

    @classmethod
    def from_conditional(cls, conditional) -> AcceptanceProfile:
        """The profile of conditional rates c (K,); rates past a zero survival become 0 (never drawn).

        Raises:
            ValueError: ``conditional: ...`` as ``survival_from_conditional``.
        """
        c = _rates(conditional, "conditional").copy()
        u = np.cumprod(c)
        before = np.concatenate([[1.0], u[:-1]])
        c[before == 0] = 0.0
        return cls(c, u)

    @classmethod
    def from_unconditional(cls, unconditional) -> AcceptanceProfile:
        """The profile of survival u (K,).

        Raises:
            ValueError: ``unconditional: ...`` as ``conditional_from_survival``.
        """
        u = _rates(unconditional, "unconditional", non_increasing=True)
        return cls(conditional_from_survival(u), u)

    @classmethod
    def from_engine_metrics(cls, metrics: EngineMetrics) -> AcceptanceProfile:
        """The profile of a verifier's exact law (``simlab.engine_metrics.EngineMetrics``, one tree
        or an ``aggregate``): its ``unconditional`` survival, rounding of summed masses (up to
        ``ROUNDING`` above 1 or as an increase) removed.  Under EOS truncation the survival counts
        positions up to the EOS, and ``accept_length`` here is 1 + ``metrics.accepted`` (the bonus
        always counted, as the engines' synthetic modes count it).

        Raises:
            TypeError: ``metrics`` not an ``EngineMetrics``.
            ValueError: ``metrics: ...`` for a survival outside [0, 1] or increasing by more than
                ``ROUNDING``.
        """
        if not isinstance(metrics, EngineMetrics):
            raise TypeError(f"metrics: must be an EngineMetrics, got {type(metrics).__name__}")
        u = check_real_array(metrics.unconditional, "metrics")
        if u.ndim != 1 or u.size == 0 or not np.all((u >= -ROUNDING) & (u <= 1.0 + ROUNDING)):
            raise ValueError(f"metrics: unconditional must be a non-empty list of rates in [0, 1], got {u!r}")
        if np.any(np.diff(u) > ROUNDING):
            raise ValueError(f"metrics: unconditional survival increases: {u!r}")
        u = np.minimum.accumulate(np.clip(u, 0.0, 1.0))
        return cls.from_unconditional(u)

    def to_json(self) -> str:
        """The versioned JSON document (``PROFILE_FORMAT``, ``PROFILE_VERSION``): both arrays as
        shortest round-trip decimals (``from_json`` restores them bit for bit) and, for reading,
        ``depth``, ``accept_length`` and ``accepted`` with their conventions."""
        return json.dumps(
            {
                "format": PROFILE_FORMAT,
                "version": PROFILE_VERSION,
                "depth": self.depth,
                "conditional": [float(x) for x in self.conditional],
                "unconditional": [float(x) for x in self.unconditional],
                "accept_length": self.accept_length,
                "accepted": self.accepted,
                "conventions": {
                    "conditional": "P(tau >= d | tau >= d-1), d = 1..depth; 0 where position d is never reached",
                    "unconditional": "P(tau >= d), d = 1..depth",
                    "accept_length": "E[tau + 1], bonus token included",
                    "accepted": "E[tau], no bonus",
                },
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> AcceptanceProfile:
        """The profile a ``to_json`` document holds.

        Raises:
            TypeError: ``text`` not a string.
            ValueError: ``text: ...`` for invalid JSON, another format or version, missing arrays,
                a ``depth`` that disagrees; the profile's own errors for bad rates.
        """
        if not isinstance(text, (str, bytes)):
            raise TypeError(f"text: must be a JSON string, got {type(text).__name__}")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"text: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != PROFILE_FORMAT:
            raise ValueError(f"text: not an acceptance profile (format must be {PROFILE_FORMAT!r})")
        if doc.get("version") != PROFILE_VERSION:
            raise ValueError(f"text: version {doc.get('version')!r} is not supported (this reader: {PROFILE_VERSION})")
        if not isinstance(doc.get("conditional"), list) or not isinstance(doc.get("unconditional"), list):
            raise ValueError("text: needs the lists 'conditional' and 'unconditional'")
        profile = cls(doc["conditional"], doc["unconditional"])
        if doc.get("depth") != profile.depth:
            raise ValueError(f"text: depth {doc.get('depth')!r} but the lists have {profile.depth} positions")
        return profile


# ---------------------------------------------------------------------------------------------
# engines' synthetic modes: the exports and each engine's conversion as its source states it


def _number(x: float) -> str:
    return repr(float(x))


def _length(length, depth: int) -> float:
    return check_in_range(length, "length", 1.0, float(depth + 1))


def llama_cpp_args(profile: AcceptanceProfile, mode: str = "rates") -> list[str]:
    """The llama-server / llama-cli arguments replaying ``profile`` (llama.cpp PR 27711): ``mode``
    "rates" gives ``["--spec-synthetic-acceptance-rates", "u_1,u_2,...,u_K"]`` (unconditional, comma
    separated: the flag's list syntax is not in the PR text this lab could read, see the docs), "length"
    gives ``["--spec-synthetic-acceptance-length", "L"]`` (E[tau + 1], replayed as a constant rate,
    ``llama_cpp_length_to_conditional``).  llama.cpp reads K from its draft implementation: run it
    with a draft maximum of ``profile.depth``.

    Raises:
        TypeError: ``profile`` not an ``AcceptanceProfile``.
        ValueError: ``mode: ...`` not "rates" or "length".
    """
    profile = _profile(profile)
    mode = check_choice(mode, "mode", ("rates", "length"), "export mode")
    if mode == "length":
        return ["--spec-synthetic-acceptance-length", _number(profile.accept_length)]
    return ["--spec-synthetic-acceptance-rates", ",".join(_number(u) for u in profile.unconditional)]


def vllm_speculative_config(profile: AcceptanceProfile, mode: str = "rates") -> dict:
    """The ``speculative_config`` keys replaying ``profile`` in vLLM (PR 40662, PR 41035):
    ``num_speculative_tokens`` = K, ``rejection_sample_method`` = "synthetic" and either
    ``synthetic_acceptance_rates`` (``mode`` "rates": the unconditional list u_1..u_K, non-increasing)
    or ``synthetic_acceptance_length`` (``mode`` "length": E[tau + 1], which vLLM turns into
    ``vllm_length_to_rates``).  Merge with the method and draft model keys; ``json.dumps`` of the
    merged dict is the ``--speculative-config`` value.

    Raises:
        TypeError: ``profile`` not an ``AcceptanceProfile``.
        ValueError: ``mode: ...`` not "rates" or "length".
    """
    profile = _profile(profile)
    mode = check_choice(mode, "mode", ("rates", "length"), "export mode")
    out = {"num_speculative_tokens": profile.depth, "rejection_sample_method": "synthetic"}
    if mode == "length":
        out["synthetic_acceptance_length"] = profile.accept_length
    else:
        out["synthetic_acceptance_rates"] = [float(u) for u in profile.unconditional]
    return out


def sglang_env(profile: AcceptanceProfile) -> dict[str, str]:
    """The environment replaying ``profile``'s mean in SGLang: ``{"SGLANG_SIMULATE_ACC_LEN": "L"}``
    with L = E[tau + 1] (SGLang fills ``simulate_acc_len - 1`` accepted drafts, so its value includes
    the bonus).  SGLang replays only the mean: ``sglang_tau_law`` is the law it draws.

    Raises:
        TypeError: ``profile`` not an ``AcceptanceProfile``.
    """
    return {"SGLANG_SIMULATE_ACC_LEN": _number(_profile(profile).accept_length)}


def _profile(profile) -> AcceptanceProfile:
    if not isinstance(profile, AcceptanceProfile):
        raise TypeError(f"profile: must be an AcceptanceProfile, got {type(profile).__name__}")
    return profile


def geometric_rate(length, depth) -> float:
    """The p in [0, 1] with p + p^2 + ... + p^K = L - 1 (K = ``depth``), to the last bit by bisection
    (the sum is increasing in p).

    Raises:
        ValueError: ``depth: ...`` not an integer >= 1; ``length: ...`` outside [1, K + 1].
    """
    depth = check_int(depth, "depth", 1)
    target = _length(length, depth) - 1.0

    def gap(p: float) -> float:
        return sum(p**d for d in range(1, depth + 1)) - target

    lo, hi = 0.0, 1.0
    while True:  # at most ~1,100 halvings of [0, 1] reach adjacent doubles
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return hi if abs(gap(hi)) <= abs(gap(lo)) else lo


def llama_cpp_length_to_conditional(length, depth) -> np.ndarray:
    """llama.cpp PR 27711's conversion of ``--spec-synthetic-acceptance-length`` L: the constant
    conditional rate p of ``geometric_rate`` at every position, float64 (K,).

    Raises:
        ValueError: as ``geometric_rate``.
    """
    depth = check_int(depth, "depth", 1)
    return np.full(depth, geometric_rate(length, depth))


def llama_cpp_rates_to_conditional(unconditional) -> np.ndarray:
    """llama.cpp PR 27711's conversion of ``--spec-synthetic-acceptance-rates`` (unconditional,
    validated in [0, 1] and non-increasing) into the conditional probabilities its sampler draws:
    ``conditional_from_survival``.

    Raises:
        ValueError: ``unconditional: ...`` as ``conditional_from_survival``.
    """
    return conditional_from_survival(unconditional)


def vllm_length_to_rates(length, n) -> list[float]:
    """vLLM's ``SpeculativeConfig._acceptance_length_to_rates(length, n)`` (PR 40662), as written:
    ``num_drafts = length - 1; num_full = int(num_drafts)``, then ``[1.0] * num_full +
    [num_drafts - num_full] + [0.0] * (n - num_full - 1)``, the unconditional "minimum-variance
    schedule" (tau is floor(L - 1) or one more).  At ``length == n + 1`` the written expression has
    n + 1 entries (a trailing 0.0, since ``[0.0] * -1`` is empty); this function returns what it
    computes.

    Raises:
        ValueError: ``n: ...`` not an integer >= 1; ``length: ...`` outside [1, n + 1] (vLLM's own check).
    """
    n = check_int(n, "n", 1)
    num_drafts = _length(length, n) - 1
    num_full = int(num_drafts)
    return [1.0] * num_full + [num_drafts - num_full] + [0.0] * (n - num_full - 1)


def vllm_rates_to_conditional(unconditional) -> np.ndarray:
    """The conditional rates vLLM's synthetic rejection kernel draws with (``u < rate`` at each step,
    PR 41035) from ``synthetic_acceptance_rates`` (unconditional, validated in [0, 1] and
    non-increasing by ``SpeculativeConfig``): ``conditional_from_survival``.

    Raises:
        ValueError: ``unconditional: ...`` as ``conditional_from_survival``.
    """
    return conditional_from_survival(unconditional)


def sglang_tau_law(length, depth, method: str = "match-expected") -> np.ndarray:
    """P(tau = j), j = 0..K, that SGLang's ``SGLANG_SIMULATE_ACC_LEN`` = L draws
    (``spec_utils._sample_simulated_acc_len`` with max length K + 1; tau = accept length - 1):
    "match-expected": L clipped to [1, K + 1], accept length floor(L) w.p. 1 - frac(L) and
    floor(L) + 1 w.p. frac(L); "multinomial": round(clip(X, 1, K + 1)), X ~ N(L, 1) (ties have
    probability 0).  float64 (K + 1,).

    Raises:
        ValueError: ``depth: ...`` not an integer >= 1; ``length: ...`` not a number >= 1 (SGLang
            clips larger values to K + 1); ``method: ...`` not one of the two.
    """
    depth = check_int(depth, "depth", 1)
    length = check_in_range(length, "length", 1.0, math.inf)
    method = check_choice(method, "method", ("match-expected", "multinomial"), "SGLang simulation method")
    law = np.zeros(depth + 1)
    if method == "match-expected":
        length = min(length, float(depth + 1))
        lower = int(length // 1)
        frac = length - lower
        law[lower - 1] += 1.0 - frac
        if frac > 0:
            law[lower] += frac
        return law
    # accept length m in 1..K+1: round(clip(X)) = m; clip puts the tails at the ends
    edges = np.arange(1, depth + 1) + 0.5  # boundaries between m and m + 1
    cdf = stats.norm.cdf(edges - length)
    law = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    return law


# ---------------------------------------------------------------------------------------------
# how far a constant-rate conversion misstates a real profile


@dataclass(frozen=True, eq=False)
class Misstatement:
    """A constant conditional rate (llama.cpp's conversion of the profile's mean length at K) against
    the profile.

    Attributes:
        rate: p with p + ... + p^K = L - 1 (``geometric_rate``), L and K the profile's.
        conditional_error: p - c_d, d = 1..K, float64 (K,).
        unconditional_error: p^d - u_d, float64 (K,) (0 summed over d: the mean is matched at K).
        ks: draft lengths k = 1..K, int64 (K,).
        exact_accept_length: the profile's E[tau + 1] with k drafts, 1 + sum_{d <= k} u_d, float64 (K,).
        constant_rate_accept_length: 1 + sum_{d <= k} p^d (the rate fitted at K, run at k).
        length_flag_accept_length: what ``--spec-synthetic-acceptance-length L`` replays at draft
            length k: L where L <= k + 1 (the rate is re-solved at k), NaN where L > k + 1 (refused).
    """

    rate: float
    conditional_error: np.ndarray
    unconditional_error: np.ndarray
    ks: np.ndarray
    exact_accept_length: np.ndarray
    constant_rate_accept_length: np.ndarray
    length_flag_accept_length: np.ndarray

    @property
    def worst_position(self) -> int:
        """The position d (1-based) with the largest |p^d - u_d|."""
        return int(np.argmax(np.abs(self.unconditional_error))) + 1


def constant_rate_misstatement(profile: AcceptanceProfile) -> Misstatement:
    """How far llama.cpp's constant-rate conversion of the profile's mean length misstates the
    profile, per position and in E[tau + 1] at every draft length k = 1..K (``Misstatement``).

    Raises:
        TypeError: ``profile`` not an ``AcceptanceProfile``.
    """
    profile = _profile(profile)
    depth, length = profile.depth, profile.accept_length
    p = geometric_rate(length, depth)
    powers = p ** np.arange(1, depth + 1)
    ks = np.arange(1, depth + 1)
    exact = 1.0 + np.cumsum(profile.unconditional)
    constant = 1.0 + np.cumsum(powers)
    flag = np.where(length <= ks + 1, length, np.nan)
    return Misstatement(p, p - profile.conditional, powers - profile.unconditional, ks, exact, constant, flag)


# ---------------------------------------------------------------------------------------------
# the two aggregations


@dataclass(frozen=True, eq=False)
class RequestLaw:
    """One request's exact per-step acceptance: step s has E[tau_s] and P(tau_s >= d).

    Attributes:
        accepted: E[tau_s], s = 1..n (the request's verification steps, n >= 1), float64 (n,).
        unconditional: P(tau_s >= d), float64 (n, D), zero past a step's own depth.

    Raises:
        ValueError: ``unconditional: ...`` for a shape other than (n, D), n, D >= 1, or a survival
            outside [0, 1] or increasing; ``accepted: ...`` when E[tau_s] differs from sum_d P(tau_s >= d).
    """

    accepted: np.ndarray
    unconditional: np.ndarray

    def __post_init__(self):
        accepted = check_real_array(self.accepted, "accepted")
        u = check_real_array(self.unconditional, "unconditional")
        if accepted.ndim != 1 or accepted.size == 0 or u.ndim != 2 or u.shape[0] != accepted.size or u.shape[1] == 0:
            raise ValueError(
                f"unconditional: must be (steps, depth) with steps = len(accepted) >= 1, got {u.shape} and {accepted.shape}"
            )
        if not np.all((u >= 0) & (u <= 1)) or np.any(np.diff(u, axis=1) > 0):
            raise ValueError("unconditional: each step's survival must lie in [0, 1] and not increase")
        if np.any(np.abs(accepted - u.sum(axis=1)) > 1e-9):  # E[tau] = sum_d P(tau >= d)
            raise ValueError("accepted: must equal each step's summed survival (E[tau] = sum_d P(tau >= d))")
        for name, arr in (("accepted", accepted), ("unconditional", u)):
            arr = arr.copy()
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)

    @property
    def steps(self) -> int:
        """n, the verification steps (vLLM's drafts, SGLang's ``spec_verify_ct``)."""
        return int(self.accepted.size)

    @classmethod
    def from_metrics(cls, metrics: Sequence[EngineMetrics]) -> RequestLaw:
        """From one ``EngineMetrics`` per step (its ``accepted`` and ``unconditional``).  Steps that
        drafted nothing (an empty tree: llama.cpp's draft below ``--draft-min`` dropped) accept
        nothing; a request of such steps only has depth 1 with P(tau >= 1) = 0.

        Raises:
            ValueError: ``metrics: ...`` when empty or holding something else.
        """
        if isinstance(metrics, EngineMetrics) or not isinstance(metrics, Sequence) or len(metrics) == 0:
            raise ValueError("metrics: must be a non-empty sequence of EngineMetrics, one per step")
        if not all(isinstance(m, EngineMetrics) for m in metrics):
            raise ValueError("metrics: every entry must be an EngineMetrics")
        depth = max(1, max(m.unconditional.size for m in metrics))
        u = np.zeros((len(metrics), depth))
        for i, m in enumerate(metrics):
            u[i, : m.unconditional.size] = m.unconditional
        return cls(np.array([float(m.accepted) for m in metrics]), u)

    @classmethod
    def from_tau_laws(cls, laws, steps: int | None = None) -> RequestLaw:
        """From P(tau_s = j), j = 0..K: float64 (n, K + 1), one row per step, or one law (K + 1,)
        repeated over ``steps`` steps.

        Raises:
            ValueError: ``laws: ...`` for a row not a law (``survival_from_tau_law``) or a bad shape;
                ``steps: ...`` given with a 2-D ``laws``, or missing / below 1 with a 1-D one.
        """
        arr = check_real_array(laws, "laws")
        if arr.ndim == 1:
            if steps is None:
                raise ValueError("steps: needed with one law (the number of verification steps)")
            arr = np.tile(arr, (check_int(steps, "steps", 1), 1))
        elif arr.ndim == 2:
            if steps is not None:
                raise ValueError("steps: only with one law (a 2-D laws has one row per step)")
            if arr.shape[0] == 0:
                raise ValueError("laws: needs at least one step")
        else:
            raise ValueError(f"laws: must be 1-D (one law) or 2-D (one per step), got shape {arr.shape}")
        try:
            u = np.array([survival_from_tau_law(row) for row in arr])
        except ValueError as exc:
            raise ValueError(f"laws: {exc}") from None
        return cls(u.sum(axis=1), u)


def _requests(requests, name: str) -> list[RequestLaw]:
    if isinstance(requests, RequestLaw) or not isinstance(requests, Sequence) or len(requests) == 0:
        raise ValueError(f"{name}: must be a non-empty sequence of RequestLaw")
    if not all(isinstance(r, RequestLaw) for r in requests):
        raise ValueError(f"{name}: every entry must be a RequestLaw")
    return list(requests)


def pooled(requests: Sequence[RequestLaw]) -> float:
    """vLLM's / SGLang's pooled mean acceptance length, exact: 1 + sum_r sum_s E[tau_rs] / sum_r n_r
    (vLLM ``metrics.py``: 1 + accepted / drafts; SGLang ``metrics_reporter``: accept tokens /
    forward count; the step counts n_r as given).

    Raises:
        ValueError: ``requests: ...`` when empty or not ``RequestLaw``.
    """
    reqs = _requests(requests, "requests")
    return 1.0 + sum(float(r.accepted.sum()) for r in reqs) / sum(r.steps for r in reqs)


def per_request_means(requests: Sequence[RequestLaw]) -> np.ndarray:
    """Each request's mean acceptance length 1 + (1 / n_r) sum_s E[tau_rs] (SGLang's per-request
    ``completion_tokens / spec_verify_ct``), float64 (R,).

    Raises:
        ValueError: ``requests: ...`` when empty or not ``RequestLaw``.
    """
    return np.array([1.0 + float(r.accepted.mean()) for r in _requests(requests, "requests")])


def per_request_mean(requests: Sequence[RequestLaw]) -> float:
    """SpecForge's ``average_acceptance_length``, exact: the unweighted mean over requests of
    ``per_request_means`` (``specforge/benchmarks/sglang.py``: ``statistics.fmean``).

    Raises:
        ValueError: ``requests: ...`` when empty or not ``RequestLaw``.
    """
    return float(np.mean(per_request_means(requests)))


def pooled_positions(requests: Sequence[RequestLaw]) -> np.ndarray:
    """vLLM's pooled per-position acceptance rate: sum_rs P(tau_rs >= d) / sum_r n_r, float64 (D,).

    Raises:
        ValueError: ``requests: ...`` when empty or not ``RequestLaw``.
    """
    reqs = _requests(requests, "requests")
    depth = max(r.unconditional.shape[1] for r in reqs)
    total = np.zeros(depth)
    for r in reqs:
        total[: r.unconditional.shape[1]] += r.unconditional.sum(axis=0)
    return total / sum(r.steps for r in reqs)


@dataclass(frozen=True)
class AggregationComparison:
    """Two configurations' aggregations on their per-request laws.

    Attributes:
        pooled_a, pooled_b: ``pooled`` (vLLM, SGLang).
        per_request_a, per_request_b: ``per_request_mean`` (SpecForge).
        disagree: True when the two orderings have opposite signs (one says A > B, the other B > A).
    """

    pooled_a: float
    pooled_b: float
    per_request_a: float
    per_request_b: float
    disagree: bool

    def note(self) -> str:
        """One line: both orderings, and the disagreement where there is one."""

        def order(a, b):
            return "A > B" if a > b else "A < B" if a < b else "A = B"

        line = (
            f"pooled (vLLM/SGLang): A {self.pooled_a:.6g}, B {self.pooled_b:.6g} ({order(self.pooled_a, self.pooled_b)}); "
            f"mean of per-request means (SpecForge): A {self.per_request_a:.6g}, B {self.per_request_b:.6g} "
            f"({order(self.per_request_a, self.per_request_b)})"
        )
        return line + ("; the two aggregations disagree in sign" if self.disagree else "")


def compare_aggregations(a: Sequence[RequestLaw], b: Sequence[RequestLaw]) -> AggregationComparison:
    """Both aggregations of configurations A and B from their per-request laws, and whether they
    rank A and B in opposite orders (vLLM issue 42508).

    Raises:
        ValueError: ``a: ...`` / ``b: ...`` when empty or not ``RequestLaw``.
    """
    a, b = _requests(a, "a"), _requests(b, "b")
    pa, pb, ma, mb = pooled(a), pooled(b), per_request_mean(a), per_request_mean(b)
    return AggregationComparison(pa, pb, ma, mb, bool(np.sign(pa - pb) * np.sign(ma - mb) < 0))
