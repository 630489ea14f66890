"""The quantised self-draft of the pretrained pair (``backends.drafts.quant``, ``quant:B:G``).

The rounding is checked on random tensors against its definition (a grid of 2^B levels per group,
the group's minimum and maximum kept, error at most half a step); the draft on a truncated copy of
the real weights (the first 2 of 30 layers): every linear weight is the rounding of the target's,
the target is left untouched, the tied head stays tied, the draft runs as an ordinary pair member
(tree attention probe), more bits bring it closer to the target, and its cost is the bits it reads.
"""

from __future__ import annotations

import pytest

from backends import pretrained
from backends.drafts import quant
from pair_checks import check_pair_member


@pytest.fixture(scope="module")
def target(smollm2_folder):
    import torch

    torch.set_num_threads(1)
    return pretrained.load_target(smollm2_folder, layers=2)


@pytest.mark.parametrize("bits,group", [(2, 8), (3, 16), (4, 64), (8, 32)])
def test_the_rounding_is_its_definition(bits, group):
    import torch

    weight = torch.randn(12, 4 * group, generator=torch.Generator().manual_seed(bits * group), dtype=torch.float64)
    weight[3, :group] = 0.25  # a constant group is kept as it is
    out = quant.quantise(weight, bits, group)
    assert out.shape == weight.shape and out.dtype == weight.dtype
    groups, rounded = weight.reshape(-1, group), out.reshape(-1, group)
    lo, hi = groups.min(1).values, groups.max(1).values
    step = (hi - lo) / (2**bits - 1)
    assert torch.equal(rounded.min(1).values, lo) and torch.allclose(rounded.max(1).values, hi, rtol=0, atol=1e-12)
    assert max(len(torch.unique(row)) for row in rounded) <= 2**bits
    assert bool(((rounded - groups).abs() <= step[:, None] / 2 + 1e-12).all())
    codes = (rounded - lo[:, None]) / torch.where(step > 0, step, 1)[:, None]
    assert torch.allclose(codes, codes.round(), rtol=0, atol=1e-9)
    assert torch.equal(out[3, :group], weight[3, :group])
    assert torch.allclose(quant.quantise(out, bits, group), out, rtol=0, atol=1e-12)  # a fixed point


def test_the_rounding_and_the_spec_refuse_bad_input():
    import torch

    w = torch.zeros(2, 8)
    for kwargs, match in (
        ({"bits": 1, "group": 4}, r"^bits: "),
        ({"bits": 9, "group": 4}, r"^bits: "),
        ({"bits": True, "group": 4}, r"^bits: "),
        ({"bits": 4, "group": 1}, r"^group: "),
        ({"bits": 4, "group": 3}, r"^weight: .*groups of 3"),
    ):
        with pytest.raises(ValueError, match=match):
            quant.quantise(w, **kwargs)
    with pytest.raises(ValueError, match=r"^weight: .*2-D"):
        quant.quantise(torch.zeros(8), 4, 4)
    with pytest.raises(ValueError, match=r"^weight: has a non-finite entry"):
        quant.quantise(torch.full((2, 8), float("nan")), 4, 4)
    for bad in ("quant", "quant:4", "quant:1:64", "quant:9:64", "quant:4:1", "quant:4:x", "quant:\u00b2:64", "quant:4:64:x"):
        with pytest.raises(ValueError, match=r"^draft: "):
            pretrained.parse_draft(bad)
    assert pretrained.parse_draft("quant:04:064") == "quant:4:64"


def test_the_draft_is_the_rounded_target_and_leaves_the_target_untouched(target):
    import torch

    model, _ = target
    before = {k: v.clone() for k, v in model.state_dict().items()}
    draft = pretrained.draft_model(model, "quant:4:64")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert draft.lm_head.weight is draft.model.embed_tokens.weight  # tied weights stay tied
    assert draft.config.name_or_path == "quant:4:64" and not draft.training
    mine = dict(draft.named_modules())
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 2 * 7 + 1
    for name, module in linears:
        assert mine[name].weight is not module.weight
        assert torch.equal(mine[name].weight, quant.quantise(module.weight, 4, 64)), name
    for name, p in model.named_parameters():  # norms are kept as they are
        if "norm" in name:
            assert torch.equal(dict(draft.named_parameters())[name], p)
    with pytest.raises(ValueError, match=r"^draft: quant:4:7: the input size 576 of .* not divisible by 7"):
        quant.build(model, "quant:4:7")


def test_the_draft_is_an_ordinary_pair_member_and_more_bits_bring_it_closer(target):
    import torch

    model, tokenizer = target
    pair = check_pair_member(model, tokenizer, quant.build(model, "quant:4:64"), "quant:4:64")
    root = pair.encode("Here is a list:")
    ids = torch.tensor([list(root)])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits.double(), -1)
        tv = {}
        for spec in ("quant:2:64", "quant:4:64", "quant:8:32"):
            lq = torch.log_softmax(quant.build(model, spec)(ids).logits.double(), -1)
            tv[spec] = float(0.5 * (lp.exp() - lq.exp()).abs().sum(-1).mean())
    assert tv["quant:8:32"] < 0.02 < tv["quant:4:64"] < tv["quant:2:64"]


def test_the_cost_is_the_bits_it_reads(target):
    model, _ = target
    config = model.config.to_dict()
    draft = quant.build(model, "quant:4:64")
    expected = pretrained.linear_weights(draft) / pretrained.linear_weights(model) * (4 + 32 / 64) / 16
    assert pretrained.weight_ratio("quant:4:64", config) == pytest.approx(expected, rel=1e-12) == 4.5 / 16
    assert pretrained.precision_ratio("quant:3:32") == 4 / 16 and pretrained.precision_ratio("adapter:14") == 1.0


@pytest.mark.slow
def test_the_default_draft_is_the_quantised_self_draft_on_the_whole_pair(smollm2_folder):
    import torch

    pair = pretrained.named_pair("smollm2", None, device="cpu")
    assert pretrained.DEFAULT_DRAFT == "quant:4:64" and pair.tree_attention
    assert len(pair.draft.model.layers) == 30 and pair.draft.model.layers[0] is not pair.target.model.layers[0]
    w = pair.target.model.layers[7].mlp.down_proj.weight
    assert torch.equal(pair.draft.model.layers[7].mlp.down_proj.weight, quant.quantise(w, 4, 64))


def test_the_acceptance_tool_measures_a_draft_and_refuses_bad_flags(target, capsys, tmp_path, monkeypatch):
    import json

    from backends import draft_acceptance

    model, tokenizer = target
    draft = quant.build(model, "quant:8:32")
    once = draft_acceptance.measure(model, draft, tokenizer, ["Name a colour."], 2, 3, seed=5)
    assert once == draft_acceptance.measure(model, draft, tokenizer, ["Name a colour."], 2, 3, seed=5)
    assert len(once["target"]) == len(once["draft"]) == 3 and all(0.9 < a <= 1 for a in once["target"] + once["draft"])
    assert once["target"][0] == once["draft"][0]  # depth 0: the same prompt, no path drawn yet
    for argv, match in (
        (["--draft", "quant:1:64"], "--draft: expected quant:B:G"),
        (["--paths", "0"], "--paths: must be >= 1"),
        (["--prompts", "nope"], "--prompts: unknown prompt set"),
        (["--out", str(tmp_path / "x.txt")], "--out: a .json file"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            draft_acceptance.main(argv + ["--quiet"])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and match in err, err
    monkeypatch.setattr(pretrained, "load_target", lambda folder, *a, **k: target)
    monkeypatch.setattr(pretrained, "target_folder", lambda log=None: None)
    monkeypatch.setattr(draft_acceptance, "measure", lambda *a: {"target": [0.5, 0.25], "draft": [0.5, 0.75]})
    out = tmp_path / "q.json"
    assert draft_acceptance.main(["--draft", "quant:4:64", "--depth", "2", "--out", str(out), "--quiet"]) == 0
    record = json.loads(out.read_text())
    assert record["draft"] == "quant:4:64" and record["weight_ratio"] == round(4.5 / 16, 5) and record["threads"] == 1
    assert "0.250" in capsys.readouterr().out and list(tmp_path.iterdir()) == [out]
