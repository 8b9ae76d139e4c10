"""The notebooks' prose reads as finished text: no placeholder left in a markdown cell, no wrapped line that Markdown
turns into a list item, every numbered section holds the call it describes, and every figure in a "What we saw"
cell comes from data: registered in tests/claims.toml (tests/test_claims.py checks it against its source) or, in a
notebook that quotes no measured figure, printed by one of its own cells (``figures_not_printed``, run by
tests/test_notebooks.py on the executed notebook)."""

import json
import math
import re
from pathlib import Path

import pytest

import test_claims

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

CODE_OR_MATH = re.compile(r"```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$", re.S)
PLACEHOLDER = re.compile(
    r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b"          # WHAT_WE_SAW, FIGURE_1
    r"|\b(?:TODO|TBD|FIXME|XXX+|(?i:lorem ipsum))\b"
    r"|\{[^{}\n]*\}"                              # {figure}, {ratio:.2f}: a template never filled
    r"|<(?i:placeholder|fill[^>]*)>|\?\?\?")
#: Words in capitals that are names, not placeholders.
NAMES = {"TRITON_INTERPRET", "TREEWY_SMALL", "TREEWY_DEVICE", "VLLM_PLUGINS", "SGLANG_SIMULATE_ACC_LEN"}
ORDERED_ITEM = re.compile(r"^\s*\d{1,9}[.)]\s")


def _markdown(path):
    return [(i, "".join(c["source"])) for i, c in enumerate(json.loads(path.read_text())["cells"])
            if c["cell_type"] == "markdown"]


def placeholders(text: str) -> list[str]:
    """Placeholder-like tokens in markdown text, code spans and math left out."""
    prose = CODE_OR_MATH.sub(" ", text)
    return [m.group(0) for m in PLACEHOLDER.finditer(prose) if m.group(0) not in NAMES]


def accidental_list_items(text: str) -> list[str]:
    """Lines that start with "<number>. " or "<number>) " right after a line of running text: a wrapped sentence
    that Markdown renders as a numbered list item (a list is preceded by a blank line or by another item)."""
    bad, prev, in_list = [], "", False
    for line in text.split("\n"):
        if ORDERED_ITEM.match(line):
            if prev.strip() and not in_list:
                bad.append(line)
            in_list = True
        elif not line.strip():
            in_list = False
        elif not line.startswith((" ", "\t")):
            in_list = False   # an unindented line of text ends the list
        prev = line
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_placeholder_in_the_prose(path):
    found = [(i, p) for i, text in _markdown(path) for p in placeholders(text)]
    assert not found, f"{path.name}: placeholder-like text in markdown cells (cell, text): {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_wrapped_line_renders_as_a_list_item(path):
    found = [(i, line) for i, text in _markdown(path) for line in accidental_list_items(text)]
    assert not found, f"{path.name}: lines Markdown reads as numbered list items (rewrap them): {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_numbered_section_holds_its_call(path):
    """A '## 3 · ...' heading is followed by at least one code cell before the next heading: its output then
    shows under it (05's section 3 once printed its table at the bottom, under section 4)."""
    cells = json.loads(path.read_text())["cells"]
    empty, section, calls = [], None, 0
    for c in [*cells, {"cell_type": "markdown", "source": ["## end"]}]:
        text = "".join(c["source"])
        if c["cell_type"] == "markdown" and re.search(r"^## ", text, re.M):
            if section is not None and calls == 0:
                empty.append(section)
            heading = re.findall(r"^## (.*)$", text, re.M)[-1]
            section, calls = (heading if re.match(r"\d", heading) else None), 0
        elif c["cell_type"] == "code":
            calls += 1
    assert not empty, f"{path.name}: numbered sections with no code cell of their own: {empty}"


def test_the_checks_catch_what_they_are_for():
    assert placeholders("## What we saw\n\nWHAT_WE_SAW\n") == ["WHAT_WE_SAW"]
    assert placeholders("TreeWY is {ratio}x faster; TODO: check") == ["{ratio}", "TODO"]
    assert placeholders("`TRITON_INTERPRET=1`, $\\{x\\}$, TREEWY_SMALL and a (3, 3, 3) tree") == []
    wrapped = "- TreeWY admits more requests (2.30× at\n  256) and its p99 TTFT is lower\n"
    assert accidental_list_items(wrapped) == ["  256) and its p99 TTFT is lower"]
    assert accidental_list_items("The map:\n\n0. this one\n1. [01](01.ipynb): the\n   rewrite\n2. trees\n") == []


def _numbers(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", text)
            if x.replace(",", "").replace(".", "", 1).lstrip("-").replace("e", "", 1).replace("-", "", 1)
            .replace("+", "", 1).isdigit()]


def figures_not_printed(executed: dict, stem: str) -> list[tuple[str, str]]:
    """(figure, sentence) for each figure in the executed notebook's "What we saw" that is neither registered in
    tests/claims.toml nor printed, at its precision, by one of the notebook's cells."""
    text = next(("".join(c["source"]).split("## What we saw", 1)[1].split("## Try this", 1)[0]
                 for c in executed["cells"] if c["cell_type"] == "markdown" and "## What we saw" in "".join(c["source"])),
                "")
    printed = []
    for c in executed["cells"]:
        for o in c.get("outputs", []):
            data = o.get("text") or o.get("data", {}).get("text/plain") or o.get("data", {}).get("text/html") or ""
            printed += _numbers("".join(data) if isinstance(data, list) else data)
    registered = {(e["place"], e["figure"]) for e in test_claims.ENTRIES}
    missing = []
    for figure, _, sentence in test_claims._figures(text):
        if (stem, figure) in registered:
            continue
        if not any(test_claims._printed(abs(v), figure) == figure for v in printed if v and math.isfinite(v)):
            missing.append((figure, sentence))
    return missing


def test_a_figure_no_cell_printed_is_found():
    executed = {"cells": [
        {"cell_type": "code", "source": [], "outputs": [{"output_type": "stream", "text": "{'o': 2.3e-16, 'u': 0.5}"}]},
        {"cell_type": "markdown", "source": ["## What we saw\n\n- errors ~1e-16, and 0.50 of it; 0.70 % lost\n\n"
                                             "## Try this\n"]}]}
    assert [f for f, _ in figures_not_printed(executed, "99_x")] == ["0.70"]
