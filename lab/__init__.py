"""The lab: widget panels and altair charts over polars frames, used by the notebooks.

Imports flow notebooks -> lab -> treewy. Call ``lab.setup()`` in a notebook's first cell.
"""

from lab.setup import setup

__all__ = ["setup"]
