"""The lab: widget panels and altair charts over polars frames, used by the notebooks.

Imports flow notebooks -> treewy_lab -> treewy. Call ``treewy_lab.setup()`` in a notebook's first cell. Importing
the lab loads nothing heavy: it first keeps bytecode where the Python keeps none (``treewy_lab.bytecode``), before
anything loads torch, and puts off the IRI parsers that jsonschema would build for altair
(``treewy_lab.deferred_imports``).
"""

from treewy_lab.bytecode import keep_bytecode
from treewy_lab.deferred_imports import defer_iri_parsers

BYTECODE_CACHE = keep_bytecode()
defer_iri_parsers()

from treewy_lab.setup import setup  # noqa: E402  (after keep_bytecode, so torch's bytecode is kept too)

__all__ = ["BYTECODE_CACHE", "setup"]
