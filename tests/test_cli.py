import argparse
import subprocess
import sys

import pytest
import torch

from treewy import check, cli


def test_check_passes_and_prints_the_table(capsys):
    assert cli.main(["check"]) == 0
    out = capsys.readouterr().out
    assert "(3, 3, 3)" in out and "float32" in out and "PASS" in out


def test_check_fails_when_a_row_misses_its_tolerance(monkeypatch, capsys):
    monkeypatch.setitem(check.TOLERANCE, torch.float32, 1e-12)  # fp32 cannot reach this
    assert cli.main(["check"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_console_script_lists_its_commands():
    out = subprocess.run([sys.executable, "-m", "treewy.cli", "--help"], capture_output=True, text=True, check=True)
    for name in cli.COMMANDS:
        assert name in out.stdout


def test_every_command_has_help():
    for name in cli.COMMANDS:
        r = subprocess.run([sys.executable, "-m", "treewy.cli", name, "--help"], capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)


def test_version_prints_the_installed_version():
    from importlib.metadata import version
    r = subprocess.run([sys.executable, "-m", "treewy.cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"treewy {version('treewy')}"


TREE_FORMS = [("2,2,1", [(2, 2, 1)]), ("(2,2,1)", [(2, 2, 1)]), ("(2, 2, 1)", [(2, 2, 1)]),
              ("1,1,1;2,2,1", [(1, 1, 1), (2, 2, 1)]), ("(1,1,1);(2,2,1)", [(1, 1, 1), (2, 2, 1)]),
              ("(1, 1, 1), (2, 2, 1)", [(1, 1, 1), (2, 2, 1)])]


@pytest.mark.parametrize("text, shapes", TREE_FORMS, ids=[t for t, _ in TREE_FORMS])
def test_sweep_takes_trees_as_the_docs_write_them(text, shapes):
    from treewy.experiments.acceptance import _parse_shapes

    assert _parse_shapes(text) == shapes


def test_sweep_gets_past_its_argument_checks_with_a_parenthesized_tree(monkeypatch):
    import treewy.models

    class Loaded(Exception):
        pass

    def load(*a, **k):   # every argument is checked before the model loads: reaching it means --shapes passed
        raise Loaded
    monkeypatch.setattr(treewy.models, "load", load)
    with pytest.raises(Loaded):
        cli.main(["sweep", "--shapes", "(2,2,1)"])


@pytest.mark.parametrize("text", ["(2,2,1", "2,2,1)", "(2,2,1)x", "()"])
def test_sweep_refuses_a_malformed_tree_in_one_line(text, monkeypatch, capsys):
    import treewy.models

    monkeypatch.setattr(treewy.models, "load", lambda *a, **k: pytest.fail("loaded a model for a bad --shapes"))
    assert cli.main(["sweep", "--shapes", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"treewy sweep: error: --shapes {text!r}: ") and "(2, 2, 1)" in err[0]


@pytest.mark.parametrize("text", ["(2,2,1)", "(2, 2, 1)", "2,2,1"])
def test_simulate_takes_a_tree_as_the_docs_write_it(text):
    from treewy.sim.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--tree", text]).tree == (2, 2, 1)
