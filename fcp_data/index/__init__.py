"""The length index: per-sample token counts of text, image and video datasets (``fcp index``).

``LengthIndex.load(path)`` memory-maps a built index; ``build_index(inputs, spec, out, ...)`` builds one
(local process pool or Ray, resumable, per-shard parts written atomically, the index replaced all-or-nothing).
See ``format.py`` for the layout and ``limits.py`` for the per-sample ingestion limits (:class:`Limits`).
"""

from fcp_data.index.format import KIND_IMAGE, KIND_TEXT, KIND_VIDEO, LengthIndex
from fcp_data.index.limits import Limits
from fcp_data.index.merge import build_index, summarize

__all__ = ["LengthIndex", "Limits", "build_index", "summarize", "KIND_TEXT", "KIND_IMAGE", "KIND_VIDEO"]
