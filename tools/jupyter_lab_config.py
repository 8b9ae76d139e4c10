"""JupyterLab settings that `make lab` and `treewy lab` start with.

- In a checkout (a root holding tools/nbstrip.py), notebooks under notebooks/ are saved without outputs or run-time
  metadata (tools/nbstrip.py), so the checkout stays clean however often they are run and saved. (The git filter
  that `make setup` installs keeps outputs out of commits made from other editors.) The copies `treewy lab` makes
  keep their outputs.
- No news or update prompt: labconfig/default_setting_overrides.json, found through JUPYTER_CONFIG_PATH. These are
  defaults, so a choice made in JupyterLab's settings still wins.
- A quiet terminal: warnings and the URL to open, not every extension's start-up line.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from nbstrip import strip  # noqa: E402

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager  # noqa: E402


def strip_lab_notebooks(model, path, contents_manager, **kwargs):
    if model.get("type") == "notebook" and path.lstrip("/").startswith("notebooks/"):
        strip(model["content"])


class LabContentsManager(AsyncLargeFileManager):
    """The server's default contents manager with the hook registered once. (Set through the pre_save_hook trait,
    the hook is applied twice as the server and JupyterLab load their configuration, and traitlets warns.)"""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if (Path(self.root_dir) / "tools" / "nbstrip.py").is_file():
            self.register_pre_save_hook(strip_lab_notebooks)


os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("JUPYTER_CONFIG_PATH")) if p)

c = get_config()  # noqa: F821 - provided by Jupyter when it reads this file
c.ServerApp.contents_manager_class = LabContentsManager
c.Application.log_level = "WARN"
