"""The CPU engine and every panel that does not need the kernels work without triton (macOS, Windows) and
in any import order; the kernel panels say in one line what is missing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
HIDE_TRITON = Path(__file__).parent / "hide_triton"


def run_python(code: str, hide_triton: bool) -> str:
    path = [str(HIDE_TRITON)] if hide_triton else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path + [str(ROOT)]), "TREEWY_DEVICE": "cpu"}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


ENGINE = """
from treewy import DraftTree, generate, load
from treewy.models.tokenizer import encode
model = load("tiny")
prompt = [encode("def add(a, b):")]
plain = generate(model, prompt, drafter=None, max_new_tokens=6)
spec = generate(model, prompt, drafter="mtp", tree=DraftTree.from_widths((2, 2)), max_new_tokens=6)
assert spec.tokens == plain.tokens, (spec.tokens, plain.tokens)
print("engine ok")
"""


def test_engine_and_panels_run_without_triton():
    out = run_python(ENGINE + """
import sys
import treewy.ops
from treewy.env import MISSING_TRITON, describe
try:
    treewy.ops.tree_verify
    raise SystemExit("treewy.ops.tree_verify imported without triton")
except ImportError as e:
    assert str(e) == MISSING_TRITON, e
from treewy_lab.panels import ParityPanel, TimingPanel, TreePanel
for panel in (ParityPanel(), TimingPanel()):
    assert panel.status.value == MISSING_TRITON and panel.run_button.disabled, panel.status.value
assert "PASS" in TreePanel(widths=(2, 1)).status.value
assert describe()["features"]["triton kernels"].startswith("not installed")
assert "triton" not in sys.modules
print("panels ok")
""", hide_triton=True)
    assert "engine ok" in out and "panels ok" in out, out


@pytest.mark.parametrize("first", ["import triton", "from transformers import Qwen3_5ForCausalLM"])
def test_engine_works_in_any_import_order(first):
    assert "engine ok" in run_python(first + "\n" + ENGINE, hide_triton=False)


def test_top_level_names():
    out = run_python("import treewy\nfrom treewy import DraftTree, generate, load\n"
                     "print(DraftTree.chain(3).num_drafts, callable(generate), callable(load))\n"
                     "try:\n    treewy.nope\nexcept AttributeError as e:\n    print(e)", hide_triton=False)
    assert out.splitlines()[-2:] == ["3 True True", "module 'treewy' has no attribute 'nope'"]


def test_lab_sets_up_without_vl_convert():
    """The GPU machine carries no vl-convert (a large wheel): the lab still starts; the banner says charts go online."""
    out = run_python("import sys\nsys.modules['vl_convert'] = None\nimport treewy_lab\ninfo = treewy_lab.setup(banner=False)\n"
                     "print(info['features']['offline charts'])\nfrom treewy_lab.panels import TreePanel\n"
                     "print(TreePanel(widths=(2,)).error)", hide_triton=False)
    lines = [line.replace("\x1b[2K", "") for line in out.splitlines()]
    assert "no: vl-convert-python is not installed, so charts load Vega from the internet" in lines and "None" in lines


def test_the_launcher_s_node_limit_is_the_kernels():
    """treewy.serve checks --tree against tree.MAX_NODES without importing Triton: it must be the kernels' limit."""
    from treewy.ops import MAX_KERNEL_NODES
    from treewy.serve.launcher_command import MAX_KERNEL_NODES as serve_limit
    assert serve_limit == MAX_KERNEL_NODES
