import importlib.util

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


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module: small decoding steps on a busy CPU run far faster that way."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
