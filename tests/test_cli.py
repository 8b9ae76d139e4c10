import subprocess
import sys

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
