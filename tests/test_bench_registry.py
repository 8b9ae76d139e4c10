"""treewy/bench/registry.py and benchmarks/run.py: every registered op runs each provider under --smoke, the rows carry
device, date and versions, the timed steps compute their op, and the roofline counts the bytes each step must move."""

import json

import pytest
import torch

from benchmarks import run as run_cmd
from treewy.bench.registry import OPS, SHAPES, get_op, get_shape
from treewy.ops import naive_tree_commit, naive_tree_conv1d, naive_tree_recurrent
from treewy.testing import rel_err


def test_one_command_times_every_op_and_provider_and_records_the_run(tmp_path, capsys):
    out = tmp_path / "ops.json"
    assert run_cmd.main(["--op", "all", "--shapes", "chain3_B1", "222_B256", "--smoke", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert meta["smoke"] and meta["date"] and "interpreter" in meta["device"] and meta["torch"] and meta["triton"]
    got = {(r["op"], r["shape"], r["provider"]) for r in data["rows"]}
    assert got == {(op.name, s, p) for op in OPS.values() for s in ("chain3_B1", "222_B256") for p in op.providers}
    for r in data["rows"]:
        if r["provider"] == "fla":
            assert r["us"] is None and r["note"]                  # never run under the interpreter; trees refused
        else:
            assert r["us"] > 0 and r["min_bytes"] > 0 and r["gbps"] > 0, r
    trees = [r for r in data["rows"] if r["shape"] == "222_B256"]
    assert {r["T"] for r in trees} == {15} and {r["B"] for r in trees} == {2}   # the smoke batch for B = 256


def test_base_keeps_ours_and_the_named_baselines(tmp_path):
    out = tmp_path / "ops.json"
    assert run_cmd.main(["--op", "verify", "--shapes", "chain3_B1", "--base", "store_all", "--smoke",
                         "--json", str(out)]) == 0
    assert [r["provider"] for r in json.loads(out.read_text())["rows"]] == ["treewy", "store_all"]


@pytest.mark.parametrize("argv,named", [(["--op", "nope", "--smoke"], "op = 'nope'"),
                                        (["--op", "verify", "--shapes", "B9", "--smoke"], "shape = 'B9'"),
                                        (["--smoke"], "--op")])
def test_bad_names_are_one_line_errors(argv, named, capsys):
    assert run_cmd.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("benchmarks.run: error: ") and named in err


def _smoke_inputs(op, shape):
    s = get_shape(shape)
    return s.tree, s.batch(True), op.inputs(s.tree, s.batch(True), s.dims(True), s.state_dtype, "cpu", torch.float32)


def test_timed_commit_and_conv_steps_compute_their_reference():
    op = get_op("commit")
    tree, B, ((q, k, v, g, beta, S), acc) = _smoke_inputs(op, "222_B256")
    par = tree.parents.to(torch.int32)
    S0 = S.clone()
    fn = op.step("treewy", ((q, k, v, g, beta, S), acc), tree)
    fn()
    from treewy.ops import naive_tree_verify

    _, u = naive_tree_verify(*(t.double() for t in (q, k, v, g, beta, S0)), par)
    assert rel_err(S, naive_tree_commit(S0.double(), u, k.double(), g.double(), par, acc)) < 1e-5
    op = get_op("conv")
    tree, B, (x, w, cs) = _smoke_inputs(op, "333_B1")
    assert rel_err(op.step("treewy", (x, w, cs), tree)(), naive_tree_conv1d(x.double(), w.double(), cs.double(),
                                                                              tree.parents)) < 1e-5


def test_timed_store_all_step_is_the_recurrence():
    op = get_op("verify")
    tree, B, x = _smoke_inputs(op, "222_B256")
    o, states = op.step("store_all", x, tree)()
    ro, rstates = naive_tree_recurrent(*(t.double() for t in x), tree.parents)
    assert rel_err(o, ro) < 1e-5 and rel_err(states, rstates) < 1e-5


def test_roofline_counts_the_state_once_and_what_only_treewy_moves():
    s = SHAPES["chain3_B256"]
    d, tree, B = s.dims(), s.tree, s.B
    verify, commit = get_op("verify"), get_op("commit")
    state = B * d["HV"] * d["V"] * d["K"] * 4 * 2                                  # read once, written once
    path = tree.max_depth + 1
    treewy_only = B * tree.num_nodes * d["HV"] * d["V"] * 4 + B * path * (d["HV"] * d["V"] * 4 + d["H"] * d["K"] * 2
                                                                           + d["HV"] * 4)   # u out, pending path in
    assert verify.min_bytes("treewy", tree, B, d, s.state_dtype) - verify.min_bytes("store_all", tree, B, d,
                                                                                      s.state_dtype) == treewy_only
    assert commit.min_bytes("store_all", tree, B, d, s.state_dtype) == state
    bf16 = SHAPES["chain3_B256_bf16"]
    assert verify.min_bytes("treewy", tree, B, d, bf16.state_dtype) == \
        verify.min_bytes("treewy", tree, B, d, s.state_dtype) - state // 2
