import numpy as np
import pytest

VOCAB = 128_000
K = 4


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


@pytest.fixture(scope="session")
def node():
    """A realistic node at V = 128,000: p, q = softmax of N(0, 2^2) logits; k = 4 i.i.d. children."""
    rng = np.random.default_rng(0)
    p = _softmax(2.0 * rng.standard_normal(VOCAB))
    q = _softmax(2.0 * rng.standard_normal(VOCAB))
    children = np.array([int(i) for i in rng.choice(VOCAB, size=K, p=q)])
    return p, q, children
