"""The trained block drafter as a ``simlab.specblock.BlockDrafter``, and its files.

``TorchBlockDrafter(model, pair)`` drafts for the trees of ``simlab.specblock.RankGuided``:
``first_block`` seeds the root with the target's fused features at the previous token
(``HFPair.target_features``) and the root's last token; ``next_blocks`` seeds every pending node
with the hidden state of the slot that drafted it and its token, all in one batched forward.
Slot log-probabilities are the drafter's log-softmax (temperature 1, float64); the rank class is
the rank head's argmax.  The drafter reads the model's weights as they are at each call: an
``Adapter`` (``backends.block_drafter.adapt``) that owns the model changes them between prompts.

Files (``save`` / ``load``; a folder): ``drafter.pt`` (the state dict), ``manifest.json`` (spec,
feature layers, vocabulary, seed, torch version, threads, device, CPU, the training seconds and
the held-out acceptance by slot).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from backends.block_drafter.model import BlockDrafterModel, DrafterSpec
from simlab.specblock.block import Block

VARIANTS = {
    "full": {},
    "no_shift": {"shift": False},
    "no_valid_prefix": {"valid_prefix": False},
    "attention_free": {"arch": "attention_free"},
}
"""The trained variants: the drafter, the paper's two training-time ablations, and the lab's
earlier attention-free drafter (a departure kept for comparison: ``docs/departures.md``)."""


class TorchBlockDrafter:
    """A ``BlockDrafter`` over a ``BlockDrafterModel`` and the ``HFPair`` whose target it reads.

    ``feature_layers``: the target layers the drafter was trained on (its manifest's), checked
    against the pair's when given (a drafter of a truncated copy has the width of the whole target's).

    Raises:
        ValueError: ``vocab_size: ...`` when the drafter's vocabulary differs from the target's,
            ``feature_dim: ...`` when its input width differs from the target's fused features,
            ``feature_layers: ...`` when its layers differ from the pair's.
    """

    def __init__(self, model: BlockDrafterModel, pair, feature_layers: Sequence[int] | None = None):
        if not hasattr(pair, "target_features"):
            raise ValueError(
                f"pair: the block drafter reads the target's hidden states; {type(pair).__name__} has no target_features"
            )
        if feature_layers is not None and tuple(feature_layers) != tuple(pair.feature_layers()):
            raise ValueError(
                f"feature_layers: the drafter was trained on the target's layers {tuple(feature_layers)}, "
                f"the pair's are {tuple(pair.feature_layers())} (another target or a truncated copy)"
            )
        if model.vocab_size != pair.vocab_size:
            raise ValueError(f"vocab_size: the drafter has {model.vocab_size} tokens, the target {pair.vocab_size}")
        width = int(pair.target.config.hidden_size) * len(pair.feature_layers())
        if model.feature_dim != width:
            raise ValueError(f"feature_dim: the drafter reads {model.feature_dim} features, the target gives {width}")
        self.model, self.pair = model, pair
        self.K, self.vocab_size = model.spec.K, model.vocab_size

    def _blocks(self, table, tokens, **seed) -> list[Block]:
        if table.vocab_size != self.vocab_size:
            raise ValueError(f"vocab_size: the drafter has {self.vocab_size} tokens, the table's pair {table.vocab_size}")
        with torch.no_grad():
            hidden, logits, ranks = self.model(torch.tensor(tokens, dtype=torch.long), **seed)
            logprobs = torch.log_softmax(logits.double(), dim=-1).numpy()
            classes = ranks.argmax(-1).numpy().astype(np.int64)
        return [Block(logprobs[i], classes[i], tuple(hidden[i])) for i in range(len(tokens))]

    def first_block(self, table) -> Block:
        feature = torch.from_numpy(self.pair.target_features([table.context]))
        return self._blocks(table, [table.context[-1]], feature=feature)[0]

    def next_blocks(self, table, seeds: Sequence) -> list[Block]:
        if not seeds:
            return []
        inherited = torch.stack([state for _, state in seeds])
        return self._blocks(table, [path[-1] for path, _ in seeds], inherited=inherited)


def save(model: BlockDrafterModel, out: Path, manifest: dict) -> None:
    """Write ``drafter.pt`` and ``manifest.json`` under ``out``, both staged and published together."""
    from backends.cli import OutputSet

    out.mkdir(parents=True, exist_ok=True)
    full = {
        "spec": asdict(model.spec),
        "feature_dim": model.feature_dim,
        "vocab_size": model.vocab_size,
        "width": model.width,
        **manifest,
    }
    with OutputSet(out) as outputs:
        outputs.stage("drafter.pt", lambda path: torch.save(model.state_dict(), path))
        outputs.stage("manifest.json", lambda path: Path(path).write_text(json.dumps(full, indent=2)))
        outputs.publish()


def load(folder, what: str = "drafter") -> tuple[BlockDrafterModel, dict]:
    """(model in eval mode, manifest) from a folder written by ``save``; a manifest without a
    ``rank_top1`` field is read as ``"vocabulary"``, the statistic such a drafter was trained with.

    Raises:
        ValueError: ``<what>: ...`` for a missing folder or files that do not load.
    """
    folder = Path(folder).expanduser()
    if not (folder / "manifest.json").is_file() or not (folder / "drafter.pt").is_file():
        raise ValueError(
            f"{what}: {str(folder)!r} holds no block drafter (drafter.pt, manifest.json); "
            "train one with python -m backends.block_drafter"
        )
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        model = BlockDrafterModel(
            DrafterSpec(**{"rank_top1": "vocabulary", **manifest["spec"]}),  # no rank_top1 field: the whole-vocabulary statistic
            manifest["feature_dim"],
            manifest["vocab_size"],
            manifest["width"],
        )
        model.load_state_dict(torch.load(folder / "drafter.pt", weights_only=True))
    except (OSError, KeyError, TypeError, RuntimeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what}: cannot load the block drafter in {str(folder)!r} ({type(exc).__name__}: {exc})") from None
    return model.eval(), manifest


def forward_seconds(model: BlockDrafterModel, seeds: Sequence[int] = (1, 10, 40), repeats: int = 7, warmup: int = 2):
    """Measured forward time of the drafter by tokens (K per seed): a ``simlab.latency.ForwardTime``
    over the token axis (median of ``repeats`` timed node-seeded forwards; the context does not matter)."""
    import statistics
    import time

    from simlab.latency import ForwardTime

    K, W, rows = model.spec.K, model.width, []
    with torch.no_grad():
        for n in seeds:
            token, inherited = torch.zeros(n, dtype=torch.long), torch.zeros(n, W)
            times = []
            for run in range(warmup + repeats):
                start = time.perf_counter()
                model(token, inherited=inherited)
                if run >= warmup:
                    times.append(time.perf_counter() - start)
            rows.append(max(statistics.median(times), 1e-9))
    rows = list(np.maximum.accumulate(rows))  # more seeds never take less time
    return ForwardTime((0,), tuple(K * n for n in seeds), (tuple(rows),))
