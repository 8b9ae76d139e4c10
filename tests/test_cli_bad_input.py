"""`treewy sweep` and `treewy simulate` on bad arguments: one line `treewy X: error: ...` naming the flag, exit code 2,
and nothing computed or written first."""

from __future__ import annotations

import importlib

import pytest

from treewy.cli import main

SIM_MODULE = importlib.import_module("treewy.sim.sweep")  # treewy.sim.sweep as an attribute is the sweep() function


def _one_line_error(capsys, command: str, *needles: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"treewy {command}: error: "), err
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[-1], (needle, err)
    return lines[-1]


@pytest.fixture
def no_sweep(monkeypatch):
    """Every case below must be refused before a model loads or a sweep runs."""
    import treewy.models
    import treewy.experiments.acceptance

    def refuse(*a, **k):
        raise AssertionError("the sweep started work before checking its arguments")
    monkeypatch.setattr(treewy.models, "load", refuse)
    monkeypatch.setattr(treewy.experiments.acceptance, "sweep", refuse)


SWEEP_CASES = [
    (["--shapes", "a,b"], ["--shapes 'a,b'"]),
    (["--shapes", "0,1"], ["--shapes '0,1'", "positive"]),
    (["--drafters", "eagle"], ["--drafters 'eagle'", "mtp, ngram"]),
    (["--modes", "bogus"], ["--modes 'bogus'", "reconstruct, store_all"]),
    (["--modes", ""], ["--modes ''"]),
    (["--chains", "1-2-3"], ["--chains '1-2-3'", "1-6"]),
    (["--chains", "3-1"], ["--chains '3-1'", "from 3 down to 1"]),
    (["--chains", "0"], ["--chains '0'"]),
    (["--prompts", "0"], ["--prompts 0"]),
    (["--prompt-len", "0"], ["--prompt-len 0"]),
    (["--max-new-tokens", "0"], ["--max-new-tokens 0"]),
    (["--device", "potato"], ["--device 'potato'"]),
]


@pytest.mark.parametrize("args, needles", SWEEP_CASES, ids=[" ".join(a) for a, _ in SWEEP_CASES])
def test_sweep_refuses_bad_arguments_in_one_line(args, needles, capsys, no_sweep):
    assert main(["sweep", *args]) == 2
    _one_line_error(capsys, "sweep", *needles)


def test_sweep_refuses_a_bad_out_before_any_work(tmp_path, capsys, no_sweep):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder").mkdir()
    assert main(["sweep", "--out", str(tmp_path / "afile" / "y.parquet")]) == 2
    _one_line_error(capsys, "sweep", "--out", "cannot write")
    assert main(["sweep", "--out", str(tmp_path / "folder")]) == 2
    _one_line_error(capsys, "sweep", "--out", "is a folder")
    assert main(["sweep", "--out", str(tmp_path / "y.txt")]) == 2
    _one_line_error(capsys, "sweep", "--out", "expected a .parquet file")


def test_sweep_names_the_model_it_cannot_load(capsys, monkeypatch):
    import treewy.experiments.acceptance

    monkeypatch.setattr(treewy.experiments.acceptance, "sweep", lambda *a, **k: pytest.fail("no model, no sweep"))
    assert main(["sweep", "--model", "gpt2", "--prompts", "1", "--prompt-len", "8"]) == 2
    _one_line_error(capsys, "sweep", "--model 'gpt2'", "checkpoint directory")


SIM = ["simulate", "--workload", "spec-bench", "--concurrency", "1", "--kernels", "none"]


SIM_CASES = [
    (["--model", "gpt-4"], ["model = 'gpt-4'", "known presets"]),
    (["--gmu", "0"], ["gmu = 0.0"]),
    (["--tp", "0"], ["tp = 0"]),
    (["--state-dtype", "int4"], ["--state-dtype = 'int4'", "float32"]),
    (["--kernels", "/nonexistent.json"], ["kernels = '/nonexistent.json'", "no such file"]),
    (["--seed", "-1"], ["seed = -1", "2**63 - 1"]),
    (["--seed", str(2**70)], [f"seed = {2**70}"]),
    (["--concurrency", "1000000"], ["concurrency = 1000000", "at most 4096"]),
]


@pytest.mark.parametrize("args, needles", SIM_CASES, ids=[" ".join(a) for a, _ in SIM_CASES])
def test_simulate_refuses_bad_arguments_in_one_line(args, needles, capsys):
    assert main([*SIM, *args]) == 2
    _one_line_error(capsys, "simulate", *needles)


@pytest.mark.parametrize("flag, value", [("--concurrency", ""), ("--tree", ""), ("--tree", "2,0"),
                                         ("--concurrency", "a")])
def test_simulate_refuses_empty_or_non_positive_lists(flag, value, capsys):
    with pytest.raises(SystemExit) as e:  # argparse's own error: usage, then the one error line
        main([*SIM, flag, value])
    assert e.value.code == 2
    _one_line_error(capsys, "simulate", f"argument {flag}: {value!r}: expected comma-separated positive integers")


def test_simulate_out_must_be_a_parquet_file_checked_before_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(SIM_MODULE, "simulate", lambda *a, **k: pytest.fail("ran before checking --out"))
    txt = tmp_path / "results.txt"
    assert main([*SIM, "--out", str(txt)]) == 2
    _one_line_error(capsys, "simulate", "--out", "expected a .parquet file")
    assert not txt.exists()
    assert main([*SIM, "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "simulate", "--out", "is a folder")


def test_simulate_out_writes_the_parquet_and_the_table_beside_it(tmp_path, capsys):
    import polars as pl

    out = tmp_path / "new" / "r.parquet"
    assert main([*SIM, "--out", str(out)]) == 0
    assert pl.read_parquet(out).height == 2 and "SIMULATED" in (tmp_path / "new" / "r.txt").read_text()


def test_a_value_error_under_any_command_is_one_line(capsys, monkeypatch):
    """ValueErrors the library raises (e.g. a tensor-parallel degree the memory model refuses) reach the user as
    one line, not a traceback."""
    def bad(*a, **k):
        raise ValueError("tp = 3: does not divide\nthe 32 value heads")
    monkeypatch.setattr(SIM_MODULE, "simulate", bad)
    assert main([*SIM, "--tp", "3"]) == 2
    assert capsys.readouterr().err == "treewy simulate: error: tp = 3: does not divide the 32 value heads\n"
