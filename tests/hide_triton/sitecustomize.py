"""Put this folder first on PYTHONPATH to run Python as if triton were not installed (macOS, Windows)."""

import sys


class _HideTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by tests/hide_triton)", name=name)
        return None


sys.meta_path.insert(0, _HideTriton())
