"""The versions of a capture's ``settings.json`` and the one function that reads an older one.

``settings.json`` (``backends.capture_store``) holds the ``CaptureSettings`` fields and, since
format 1, the number of its format under the key ``"format"``.  The format number is a property of
the file, not a setting: it is not a ``CaptureSettings`` field and not part of the settings hash
(``capture_store.settings_hash``), so the shards of a capture keep their hash whatever format its
settings.json was written in.

Formats:

* **0** (no ``"format"`` key): every settings.json written before the number, the captures made
  today by code of before it included.  Its first version held ``ORIGINAL_FIELDS``; each field of
  ``ADDED_FIELDS`` was added later and is absent from a file written before it; a capture without
  one was made the way its ``LEGACY_VALUES`` entry says (for example ``roots_per_forward`` 1 and
  ``evaluation`` ``"forward"``: one tree forward per root, ancestors evaluated again; an empty model
  fingerprint: models unknown).
* **1** (``"format": 1``): every field of ``CaptureSettings`` of its time present; it lacks
  ``trajectory`` (``LEGACY_VALUES_1``: its continuations were sampled ``"forward"``, the whole
  context evaluated at every step).
* **2** (``"format": 2``, ``FORMAT``): every field of ``CaptureSettings`` present.

``upgrade_settings(data)`` brings the object of a settings.json of any format to the current one
(the fields of ``CaptureSettings``, without the number); ``stored_settings(fields)`` is the object
the writer stores.  ``upgrade_nodes`` does the same for one node shard's rows (the ``category``
column, absent from shards written before it).  A file of a newer format than this code reads is refused naming both numbers.
To add a field: give it a default in ``CaptureSettings``, add it with the value captures before it
had to ``ADDED_FIELDS`` of a new format, raise ``FORMAT`` and add the step to ``_STEPS``.
"""

from __future__ import annotations

import polars as pl

from simlab.errors import ArgumentError

FORMAT = 2
"""The format this code writes (``stored_settings``) and reads without an upgrade."""
KEY = "format"
"""The key of settings.json that holds its format number (absent: format 0)."""

ORIGINAL_FIELDS = (
    "target",
    "draft",
    "prompts",
    "roots_per_prompt",
    "spacing",
    "shape",
    "width",
    "depth",
    "trunk",
    "temperature",
    "top_p",
    "top_k",
    "dtype",
    "store_top",
    "full",
    "seed",
    "samples",
)
"""The fields of the first settings.json (commit 3c1f22f): present in a file of every format."""


def _labels_engine(data: dict) -> str:
    """``labels_engine`` of a capture made before the field: ``"unrecorded"`` where it has labels
    (either engine computed them: either resumes it), else ``""``."""
    return "unrecorded" if data.get("labels") else ""


LEGACY_VALUES = {
    "prompts_sha256": "",  # prompts compared by the prompt file's path
    "labels": "",  # no --labels
    "roots_per_forward": 1,  # one root per forward
    "evaluation": "forward",  # every drafting level a tree forward over the ancestors again
    "labels_engine": _labels_engine,
    "trim_draft_vocab": False,  # a draft with more ids than the target was refused
    "pair": "",  # models named by --target and --draft
    "target_fingerprint": "",  # the models unknown: opened and resumed unchecked, with a note
    "draft_fingerprint": "",
}
"""The fields a format-0 settings.json may lack, each with the value captures made before it had
(a value, or a function of the file's object)."""
LEGACY_VALUES_1 = {
    "trajectory": "forward",  # the continuations sampled with the whole context evaluated at every step
}
"""The fields a format-1 settings.json lacks, each with the value its capture was made with."""


ADDED_FIELDS = (*LEGACY_VALUES, *LEGACY_VALUES_1)
"""The fields added to settings.json after its first version (in format 0, absent where older)."""


def _from_0(data: dict) -> dict:
    """Format 0 to 1: every field of ``ADDED_FIELDS`` it lacks takes its ``LEGACY_VALUES`` entry."""
    filled = {name: (value(data) if callable(value) else value) for name, value in LEGACY_VALUES.items() if name not in data}
    return {**data, **filled}


def _from_1(data: dict) -> dict:
    """Format 1 to 2: ``trajectory`` (absent: ``"forward"``)."""
    return {**LEGACY_VALUES_1, **data}


_STEPS = {0: _from_0, 1: _from_1}
"""``_STEPS[n]`` brings an object of format n to format n + 1."""


def format_of(data: dict) -> int:
    """The format number of a settings.json's object (0 where it has none).

    Raises:
        ArgumentError: ``format: ...`` for a number that is not an integer in 1..``FORMAT`` (a file
            written by a newer version of the lab names both numbers).
    """
    if KEY not in data:
        return 0
    number = data[KEY]
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ArgumentError(KEY, f"expected a format number >= 1, got {number!r}")
    if number > FORMAT:
        raise ArgumentError(
            KEY, f"format {number} is newer than the formats this version of the lab reads (up to {FORMAT}); update simlab"
        )
    return number


def upgrade_settings(data: dict) -> dict:
    """The fields of a settings.json's object brought to format ``FORMAT``, without the number: the
    ``CaptureSettings`` fields a capture of its format was made with (see the module docstring).
    Nothing is checked beyond the format number (``capture_store`` checks every field's type and
    range, and refuses a field that is missing or unknown).

    Args:
        data: the object of a settings.json (a dict, not modified).

    Returns:
        a new dict of the settings' fields.

    Raises:
        ArgumentError: ``format: ...`` (``format_of``).
    """
    number = format_of(data)
    data = {k: v for k, v in data.items() if k != KEY}
    while number < FORMAT:
        data = _STEPS[number](data)
        number += 1
    return data


def upgrade_nodes(nodes: pl.DataFrame) -> pl.DataFrame:
    """A node shard's rows with the columns of the current shards: a shard written before the
    ``category`` column (the prompt's workload category) gets it, null (no category).  A resumed
    capture may hold shards of both kinds under one settings.json, so shards are upgraded one by one
    (``capture_store.read_nodes``), whatever the folder's format.

    Args:
        nodes: the rows of one ``nodes-r*.parquet`` shard.

    Returns:
        ``nodes``, or ``nodes`` with a null String column ``category`` appended.
    """
    if "category" in nodes.columns:
        return nodes
    return nodes.with_columns(pl.lit(None, dtype=pl.String).alias("category"))


def stored_settings(fields: dict) -> dict:
    """The object ``capture_store`` writes as settings.json: ``fields`` (every ``CaptureSettings``
    field) with the format number ``FORMAT``."""
    return {KEY: FORMAT, **fields}


__all__ = [
    "ADDED_FIELDS",
    "FORMAT",
    "KEY",
    "LEGACY_VALUES",
    "LEGACY_VALUES_1",
    "ORIGINAL_FIELDS",
    "format_of",
    "stored_settings",
    "upgrade_settings",
]
