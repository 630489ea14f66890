"""The shared argument checks (``simlab.checks``): the float-range check and the one device rule,
and the seeded streams (``simlab.sampling.seeded_rng``)."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from simlab.checks import check_device, check_in_range
from simlab.sampling import Stream, seeded_rng


@pytest.mark.parametrize(
    "value, kwargs",
    [
        (0.0, {}),
        (1.0, {}),
        (0.5, {"low_open": True}),
        (1, {"low_open": True}),
        (np.float32(0.25), {"high_open": True}),
        (0.49, {"low": 0.0, "high": 0.5, "high_open": True}),
        (np.int64(0), {}),
    ],
)
def test_in_range_accepts_the_interval_and_returns_a_float(value, kwargs):
    out = check_in_range(value, "x", **kwargs)
    assert type(out) is float and out == float(value)


@pytest.mark.parametrize(
    "value, kwargs, interval",
    [
        (0.0, {"low_open": True}, "(0, 1]"),
        (1.0, {"high_open": True}, "[0, 1)"),
        (-1e-300, {}, "[0, 1]"),
        (1 + 1e-15, {}, "[0, 1]"),
        (math.nan, {}, "[0, 1]"),
        (math.inf, {}, "[0, 1]"),
        (True, {}, "[0, 1]"),
        ("0.5", {}, "[0, 1]"),
        (None, {}, "[0, 1]"),
        (0.5, {"low": 0.0, "high": 0.5, "high_open": True}, "[0, 0.5)"),
    ],
)
def test_in_range_refuses_with_one_line_naming_the_argument(value, kwargs, interval):
    with pytest.raises(ValueError) as info:
        check_in_range(value, "top_p", **kwargs)
    assert str(info.value) == f"top_p: must lie in {interval}, got {value!r}"


def test_device_rule_resolves_auto_and_keeps_cpu():
    assert check_device("cpu") == "cpu"
    assert check_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(
    "device, message",
    [
        ("nonsense", "--engine-device: unknown device 'nonsense'"),
        ("meta", "--engine-device: 'meta' is not a device"),
        (0, "--engine-device: must be a device name"),
        (None, "--engine-device: must be a device name"),
    ],
)
def test_device_rule_refuses_names_it_cannot_use(device, message):
    with pytest.raises(ValueError) as info:
        check_device(device, "--engine-device")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_device_rule_refuses_cuda_where_there_is_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only build, wherever this runs
    for device in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(ValueError, match=r"^device: .* no such usable CUDA device"):
            check_device(device)
    assert check_device("auto") == "cpu"


def test_device_rule_refuses_a_cuda_index_beyond_the_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == "cuda:1" and check_device("auto") == "cuda"
    with pytest.raises(ValueError, match="'cuda:2'"):
        check_device("cuda:2")


def test_named_streams_keep_the_historical_keys():
    """The names replace the literals 0..3 the studies used: the same generators, draw for draw."""
    for stream, value in ((Stream.PROMPT, 0), (Stream.TREE, 1), (Stream.WALK, 2), (Stream.LABELS, 3)):
        assert np.array_equal(seeded_rng(7, stream, 5).random(4), seeded_rng(7, value, 5).random(4))
    assert len({seeded_rng(7, s, 5).random() for s in Stream}) == len(Stream)
    digest = hashlib.blake2b(np.asarray((7, 1, 5), dtype=np.int64).tobytes(), digest_size=8).digest()
    assert seeded_rng(7, Stream.TREE, 5).random() == np.random.default_rng(int.from_bytes(digest, "little")).random()
