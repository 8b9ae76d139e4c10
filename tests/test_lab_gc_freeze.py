"""setup() freezes what it loaded for the collector, in a kernel, once; never a notebook's own objects."""

import os
from pathlib import Path

from treewy_lab.setup import freeze_loaded_libraries

ROOT = Path(__file__).resolve().parent.parent

CELLS = ("""
import gc, treewy_lab
treewy_lab.setup(banner=False)
frozen = gc.get_freeze_count()
""", """
import torch
model = torch.nn.Linear(4, 4)
model.self = model   # a reference cycle: only the collector frees it
treewy_lab.setup(banner=False)
print(frozen > 100_000, gc.get_freeze_count() <= frozen, any(o is model for o in gc.get_objects()))
""")


def test_setup_in_a_kernel_freezes_the_loaded_libraries_once_and_never_the_notebooks_objects():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT),
                              env={**os.environ, "PYTHONPATH": str(ROOT), "TREEWY_DEVICE": "cpu"})
    out = []
    try:
        for cell in CELLS:
            reply = kc.execute_interactive(cell, timeout=300, output_hook=lambda m: out.append(m))
            assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    printed = "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
    # frozen objects leave gc.get_objects() (and die by reference count only, so the count can fall); the model made
    # after the first setup() stays with the collector
    assert printed.split() == ["True", "True", "True"], printed


def test_nothing_is_frozen_outside_a_kernel():
    import gc

    before = gc.get_freeze_count()
    assert freeze_loaded_libraries() is False
    assert gc.get_freeze_count() == before == 0
