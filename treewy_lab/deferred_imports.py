"""Import-time work of third-party packages that the lab never uses, put off until something uses it.

``rfc3987_syntax``: jsonschema (which altair imports) imports it where it is installed (JupyterLab's jupyter-events
asks for ``jsonschema[format-nongpl]``), and it builds about 35 Earley parsers at import, for jsonschema's ``iri``
and ``iri-reference`` formats (python-jsonschema/jsonschema#1428): 0.95 s of ``import treewy_lab``'s 2.2 s on a
2-core CPU. No chart schema of the lab has those formats. Deferred, jsonschema still registers both checkers, and the
first check of an IRI imports the real module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


class _DeferredRfc3987Syntax(types.ModuleType):
    """Stands in ``sys.modules["rfc3987_syntax"]`` until it is used: ``is_valid_syntax`` (what jsonschema imports)
    imports the real module when called; any other public attribute imports it at once."""

    def __init__(self, spec):
        super().__init__(spec.name, f"{spec.name}, imported on first use (treewy_lab.deferred_imports)")
        self.__spec__ = spec   # the real module's, for importlib.util.find_spec and the like

    def _real(self) -> types.ModuleType:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return importlib.import_module(self.__name__)

    def is_valid_syntax(self, *args, **kwargs):
        return self._real().is_valid_syntax(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):   # probes of every loaded module (inspect.getmodule asks each for __file__)
            raise AttributeError(name)
        return getattr(self._real(), name)


def defer_iri_parsers() -> bool:
    """Stand a deferred ``rfc3987_syntax`` in for the real one; True if it did (installed and not yet imported)."""
    name = "rfc3987_syntax"
    spec = None if name in sys.modules else importlib.util.find_spec(name)
    if spec is None:
        return False
    sys.modules[name] = _DeferredRfc3987Syntax(spec)
    return True
