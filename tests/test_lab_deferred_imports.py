"""treewy_lab.deferred_imports: jsonschema's IRI parsers are built on first use, not when the lab imports altair,
and they answer as the real module does."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from treewy_lab import deferred_imports

ROOT = Path(__file__).resolve().parent.parent
IRIS = ["http://example.com/ä", "not an iri", "#frag", "a b", "urn:isbn:0451450523"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("rfc3987_syntax") is None,
                                reason="rfc3987_syntax is not installed: nothing to defer")


def _python(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


CHECKS = f"""
import json, sys, inspect, jsonschema
inspect.getmodule(json.dumps)   # probes every loaded module's __file__
built = "rfc3987_syntax.syntax_helpers" in sys.modules
fc = jsonschema.FormatChecker()
answers = [[fc.conforms(s, "iri"), fc.conforms(s, "iri-reference")] for s in {IRIS!r}]
print(json.dumps({{"built_before_a_check": built, "answers": answers}}))
"""


def test_the_lab_and_altair_build_no_iri_parser_and_a_check_gives_the_real_answers():
    lab = _python("import treewy_lab, altair\n" + CHECKS)
    real = _python(CHECKS)
    assert lab["built_before_a_check"] is False
    assert real["built_before_a_check"] is True          # the test can see the import it guards against
    assert lab["answers"] == real["answers"]
    assert [a for a, _ in real["answers"]] == [True, False, False, False, True]


def test_nothing_is_deferred_when_already_imported_or_not_installed(monkeypatch):
    monkeypatch.delitem(sys.modules, "rfc3987_syntax", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert deferred_imports.defer_iri_parsers() is False
    assert "rfc3987_syntax" not in sys.modules
    real = object()
    monkeypatch.setitem(sys.modules, "rfc3987_syntax", real)
    assert deferred_imports.defer_iri_parsers() is False
    assert sys.modules["rfc3987_syntax"] is real


def test_any_public_name_reaches_the_real_module(monkeypatch):
    monkeypatch.delitem(sys.modules, "rfc3987_syntax", raising=False)
    assert deferred_imports.defer_iri_parsers() is True
    stand_in = sys.modules["rfc3987_syntax"]
    with pytest.raises(AttributeError):
        stand_in.__file__
    assert "rfc3987_syntax" in repr(stand_in)
    assert importlib.util.find_spec("rfc3987_syntax").origin.endswith("__init__.py")
    assert "iri" in stand_in.RFC3987_SYNTAX_TERMS       # imports the real module, which takes its place
    assert sys.modules["rfc3987_syntax"] is not stand_in
    assert stand_in.is_valid_syntax("iri", "http://example.com/") is True
