"""Sources of roots: where a study's contexts, model pairs and (for captures) trees come from.

A **source** yields, for one sampling setting at a time, the **roots** of a study
(``Root``: a context on a trajectory, the model pair rooted there with that setting, and
whatever the source brings along: captured grid drafts or a captured tree).  Three sources are
registered (``SOURCES``), each in its own module:

=============  ===============================================  =============================
name           module                                           roots from
=============  ===============================================  =============================
``synthetic``  ``backends.sources.synthetic``                   seeded walks of a synthetic world
``hf``         ``backends.sources.live``                        continuations of prompts, two
                                                                live Hugging Face models
``capture``    ``backends.sources.replay``                      captures replayed from disk
=============  ===============================================  =============================

Every source places its roots with ``backends.roots`` and declares the ``SourceConfig`` fields it
honours (``honours``); ``analyses._flags`` builds the one flag group every study takes
and refuses the flags the chosen source cannot honour.  A new source is one module with a class
decorated ``@register_source("name")`` (``backends.sources.base``: ``Source``, ``Root``, ``SOURCES``)
and one import line below.
"""

from backends.sources.base import SOURCES, Root, Source, register_source, slug
from backends.sources.synthetic import SyntheticSource  # registration order = help order
from backends.sources.live import HFSource
from backends.sources.replay import CaptureSource

__all__ = ["CaptureSource", "HFSource", "Root", "SOURCES", "Source", "SyntheticSource", "register_source", "slug"]
