"""One workload catalogue: the simulator samples and the vLLM sweep requests the same lengths."""

import numpy as np
import pytest

from treewy.serve.sweep import WORKLOADS as SERVE
from treewy.sim.workloads import WORKLOADS as SIM
from treewy.sim.workloads import sample_lengths
from treewy.workloads import CATALOGUE


def arg(args, name):
    return args[args.index(name) + 1]


@pytest.mark.parametrize("name", [n for n, w in CATALOGUE.items() if w.dataset == "random"])
def test_random_workloads_have_one_length_distribution(name):
    args = SERVE[name].bench_args(None)
    center_in, center_out = int(arg(args, "--random-input-len")), int(arg(args, "--random-output-len"))
    ratio = float(arg(args, "--random-range-ratio"))
    prompt, out = sample_lengths(name, 4000, np.random.default_rng(0))
    for lens, c in ((prompt, center_in), (out, center_out)):
        assert lens.min() >= int(c * (1 - ratio)) and lens.max() <= int(c * (1 + ratio)) + 1
        assert abs(lens.mean() / c - 1) < 0.05


def test_both_sides_know_the_same_workloads():
    assert set(SIM) <= set(SERVE) == set(CATALOGUE)
    assert SERVE["generation-heavy"].bench_args(None)[:6] == [
        "--dataset-name", "random", "--random-input-len", "1024", "--random-output-len", "8192"]
    spec_out = sample_lengths("spec-bench", 3, np.random.default_rng(0))[1]
    assert SERVE["spec-bench"].output_len == CATALOGUE["spec-bench"].output_len == spec_out[0] == 256


def test_unknown_workload_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"workload = 'chat': unknown workload; known workloads are \['sharegpt-chat'"):
        sample_lengths("chat", 4, np.random.default_rng(0))
