"""Strict exact-match: what serving engines call their plain speculative-decoding verifier.

Sample the target's own token Y ~ p at the node; a draft child is accepted iff it equals Y (with
several children: Y is accepted iff it is one of them), otherwise Y is emitted as the correction
token.  This is NSS's rule (``simlab.verifiers.nss``) under the engines' name: the same class,
the same law B(x, t) = p(t) for every children x, hence lossless for every drafting law, and the
same acceptance alpha = sum_t p(t) pi(t) with pi(t) the probability that t is a child
(``simlab.drafting.inclusion_probability``): sum over the distinct children of p(x) for a
deterministic node, the collision probability sum_t p(t) (1 - (1 - q(t))^k) for k i.i.d. drafts,
sum_t p(t) q(t) for one draw repeated.

Which lab verifier each mode of vLLM v1's rejection sampler is
(vllm-project/vllm@0097a7b ``vllm/v1/sample/rejection_sampler.py``; one chain of drafts):

* greedy requests (temperature 0, ``rejection_greedy_sample_kernel``): accept the draft iff it
  equals the target's argmax, emit the argmax on the first mismatch: the lab's ``greedy``;
* random sampling without draft probabilities (``IS_NGRAM``: n-gram and the drafters that pass
  none): accept draft x iff p(x) >= U, else emit a draw from p with x removed
  (``sample_recovered_tokens_kernel``): the one-hot rule (``onehot``) at k = 1, whose law is this
  one's (a draw from p; ``tests/test_lossy_rules.py`` checks the laws agree);
* random sampling with draft probabilities: accept x iff p(x) / q(x) >= U, else a draw from
  (p - q)+: speculative sampling, the lab's ``naive`` (NaiveTree) at k = 1, ``naive_chain`` on a path.

The lab's tests are strict (``U < ratio``) where vLLM's are not (``ratio >= U``): the two differ
only on the null event U = ratio, except that vLLM accepts a draft with p(x) = 0 when its float32
uniform is exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from simlab.verifiers.nss import NSS


@dataclass(frozen=True)
class ExactMatch(NSS):
    """Strict exact-match (the engines' name for NSS's rule): the output is a draw from p,
    accepted iff it is a child; lossless for every drafting law."""

    name = "exact_match"
    label = "strict exact-match (vLLM)"
    ot_based = False  # DDTE's OT family (the selector's verifiers) lists NSS under its own name
