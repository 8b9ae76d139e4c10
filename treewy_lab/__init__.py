"""The lab: widget panels and altair charts over polars frames, used by the notebooks.

Imports flow notebooks -> treewy_lab -> treewy. Call ``treewy_lab.setup()`` in a notebook's first cell.
"""

from treewy_lab.setup import setup

__all__ = ["setup"]
