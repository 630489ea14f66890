"""Every tree verifier prints under a label of its own (tables and charts tell them apart)."""

from __future__ import annotations

from collections import Counter

from simlab import tree_verifiers


def test_no_two_tree_verifiers_share_a_display_label():
    labels = tree_verifiers.paper_names()
    shared = {label: [n for n, lab in labels.items() if lab == label] for label, c in Counter(labels.values()).items() if c > 1}
    assert not shared, shared
    assert labels["naive"] != labels["naive_chain"] and labels["optimal"] != labels["ot_exact"]
