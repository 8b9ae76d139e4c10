"""JupyterLab settings `make lab` starts with: the notebooks under notebooks/ are saved without outputs or run-time
metadata (tools/nbstrip.py), so the checkout stays clean however often they are run and saved. (The git filter
that `make setup` installs keeps outputs out of commits made from other editors.)"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nbstrip import strip  # noqa: E402


def strip_lab_notebooks(model, path, contents_manager, **kwargs):
    if model.get("type") == "notebook" and path.lstrip("/").startswith("notebooks/"):
        strip(model["content"])


c = get_config()  # noqa: F821 - provided by Jupyter when it reads this file
c.FileContentsManager.pre_save_hook = strip_lab_notebooks
