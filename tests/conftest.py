import importlib.util
import os
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    skips = {
        "gpu": (not torch.cuda.is_available(), "needs a CUDA GPU"),
        "vllm": (importlib.util.find_spec("vllm") is None, "needs vllm (pip install -e '.[serve]')"),
    }
    for item in items:
        for marker, (skip, why) in skips.items():
            if skip and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=why))


def pytest_runtest_logreport(report):
    """As each test ends (written by the controller alone under xdist), so that a run cut off by a time limit still
    says what it did: with TREEWY_FAILURE_LOG=FILE each failure's test id and traceback are appended to FILE; with
    TREEWY_DURATION_LOG=FILE each test's outcome and seconds (the slow ones are what to split off next time)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    failures, durations = os.environ.get("TREEWY_FAILURE_LOG"), os.environ.get("TREEWY_DURATION_LOG")
    if failures and report.failed:
        with open(failures, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
    if durations and (report.when == "call" or report.skipped):
        with open(durations, "a") as f:
            f.write(f"{report.outcome:8s} {report.duration:8.2f} {report.nodeid}\n")


def _nan_filled(make):
    def poisoned(*args, **kwargs):
        x = make(*args, **kwargs)
        return x.fill_(float("nan")) if x.is_floating_point() else x
    return poisoned


@pytest.fixture(autouse=True)
def poisoned_empty(monkeypatch):
    """Every float torch.empty / empty_like / Tensor.new_empty returns NaNs (as fla's tests do), so an
    output element a kernel forgets to write fails its test instead of passing on leftover memory."""
    monkeypatch.setattr(torch, "empty", _nan_filled(torch.empty))
    monkeypatch.setattr(torch, "empty_like", _nan_filled(torch.empty_like))
    monkeypatch.setattr(torch.Tensor, "new_empty", _nan_filled(torch.Tensor.new_empty))


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module: small decoding steps on a busy CPU run far faster that way."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def one_config_per_shape():
    """On a GPU, each autotuned kernel runs the first config its pruning keeps for a shape, untimed
    (``treewy.testing.untimed_autotune``), for the modules whose results are the same under every config."""
    if not torch.cuda.is_available():
        yield
        return
    from treewy.testing import untimed_autotune

    with untimed_autotune():
        yield


@pytest.fixture
def bench_script():
    """A script of benchmarks/ loaded afresh as ``benchmarks.NAME``, the module ``python -m benchmarks.NAME`` runs:
    ``bench_script("vllm_serve_gpu")``."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"benchmarks.{name}",
                                                      Path(__file__).parents[1] / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return load
