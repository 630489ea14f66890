"""The shared argument checks (``simlab.checks``): the float-range check, the real-array cast, the
registry-name check, the one device rule, and the seeded streams (``simlab.sampling.seeded_rng``)."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import polars as pl
import pytest
import torch

from simlab.checks import check_choice, check_device, check_in_range, check_real_array
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


@pytest.mark.parametrize(
    "value, message",
    [
        (None, "x: not a numeric array (got None, which a cast would turn into NaN)"),
        ([0.5, None, 0.5], "x: not a numeric array (got None, which a cast would turn into NaN)"),
        (np.array([[0.5], [None]], dtype=object), "x: not a numeric array (got None, which a cast would turn into NaN)"),
        (np.ma.masked_array([0.5, 7.0, 0.5], mask=[False, True, False]), "x: a masked array with masked entries"),
        (np.ma.masked_invalid([0.5, np.nan]), "x: a masked array with masked entries"),
        ([np.ma.masked_array([1.0, 2.0], mask=[True, False])], "x: a masked array with masked entries"),  # inside a list
        (pl.Series([0.5, None]), "x: not a numeric array (got 1 null values, which a cast would turn into NaN)"),
    ],
)
def test_real_array_refuses_none_and_masked_entries(value, message):
    """Issue 40 item 9: ``None`` became NaN and a masked array lost its mask (the hidden 7.0 came
    back as data); both are what a cast would silently change, so both are refused by name."""
    with pytest.raises(ValueError) as info:
        check_real_array(value, "x")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_real_array_takes_a_masked_array_with_nothing_masked():
    out = check_real_array(np.ma.masked_array([0.25, 0.75]), "x")
    assert type(out) is np.ndarray and out.dtype == np.float64 and out.tolist() == [0.25, 0.75]
    assert check_real_array(np.array([1, 2.5], dtype=object), "x").tolist() == [1.0, 2.5]  # numbers in objects still cast


def test_choice_names_the_argument_for_any_value():
    assert check_choice("b", "name", {"a": 1, "b": 2}, "thing") == "b"
    for value in ("c", ["b"], None, b"b"):
        with pytest.raises(ValueError, match=r"^name: unknown thing .*; choose one of a, b$"):
            check_choice(value, "name", {"a": 1, "b": 2}, "thing")


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
