"""The block drafters a SpecBlock tree is built from: trained ones (real models) or the synthetic stand-in.

Shared by ``analyses.specblock`` and ``analyses.compare_builders`` (a helper, not a study).  A
``config`` here is any object with the fields of ``DrafterConfig`` (``analyses.specblock.Config``
has them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from simlab.specblock import PairBlockDrafter

TRAINED = {
    "rank_guided": "full",
    "block_topk": "full",
    "no_shift": "no_shift",
    "no_valid_prefix": "no_valid_prefix",
    "attention_free": "attention_free",
}
"""The trained drafter variant each block builder uses with real models."""


@dataclass(frozen=True)
class DrafterConfig:
    """Where the block drafters come from: ``backend`` (``"hf"``: trained drafters under ``drafters``,
    default ``<target's folder>/../block_drafter``, or for a named pretrained ``pair`` its cache's
    ``backends.block_drafter.pretrained.drafter_dir()``; else the stand-in ``PairBlockDrafter`` with
    ``K`` slots, rank noise ``rank_noise`` and seed ``seed``)."""

    backend: str
    target: str | None = None
    drafters: str | None = None
    K: int = 4
    rank_noise: float = 0.2
    seed: int = 0
    pair: str | None = None


def drafter_folder(config) -> Path:
    """Where the trained drafters are (``--drafters``; default beside the target's folder, or the
    named pair's cache for ``--pair``)."""
    if config.drafters:
        return Path(config.drafters).expanduser()
    if getattr(config, "pair", None):
        from backends.block_drafter.pretrained import drafter_dir

        return drafter_dir()
    return Path(config.target or ".").expanduser().parent / "block_drafter"


def train_command(config, variant: str) -> str:
    """The command that trains ``variant`` where ``drafter_folder(config)`` looks."""
    folder = drafter_folder(config)
    if getattr(config, "pair", None):
        out = f" --out {folder / variant}" if config.drafters else ""
        return f"python -m backends.block_drafter --pair {config.pair} --variant {variant}{out}"
    pair = Path(config.target or ".").expanduser().parent
    return f"python -m backends.block_drafter --pair {pair} --variant {variant} --out {folder / variant}"


def drafters_for(config) -> tuple[dict, list[dict]]:
    """(variant -> drafter factory(pair), rows of the builders not run with their reasons).

    Raises:
        ValueError: ``drafters: ...`` with real models when the full drafter is not trained yet.
    """
    if config.backend != "hf":
        make = lambda pair: PairBlockDrafter(pair.vocab_size, config.K, config.rank_noise, config.seed)
        reason = "the synthetic stand-in drafter is not trained (needs --backend hf and a trained drafter)"
        return {"full": make}, [{"builder": b, "reason": reason} for b in ("no_shift", "no_valid_prefix", "attention_free")] + [
            {"builder": "stream", "reason": reason}
        ]
    from backends.block_drafter.drafter import VARIANTS, TorchBlockDrafter, load  # torch: loaded only when needed

    folder = drafter_folder(config)
    out, missing = {}, []
    for variant in VARIANTS:
        if not (folder / variant / "manifest.json").is_file():
            missing.append(
                {
                    "builder": next(b for b, v in TRAINED.items() if v == variant) if variant != "full" else "rank_guided",
                    "reason": f"no drafter at {folder / variant}: {train_command(config, variant)}",
                }
            )
            continue
        model, manifest = load(folder / variant, "drafters")
        out[variant] = partial(TorchBlockDrafter, model, feature_layers=manifest.get("feature_layers"))
    if "full" not in out:
        raise ValueError(f"drafters: {missing[0]['reason']}")
    return out, missing
