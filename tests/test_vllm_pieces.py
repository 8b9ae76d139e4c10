"""benchmarks/vllm_pieces.sh: the vLLM payload cut into pieces that travel one per run, and joined where the last
one lands, on a stand-in payload (a site of two files, an MoE tarball of one)."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_pieces.sh"


def _tar_xz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _payload(src: Path) -> str:
    site = _tar_xz({"vllm/__init__.py": b"__version__ = '0.26.0'\n", "bin/vllm": os.urandom(50_000)})
    cut = len(site) // 2
    src.mkdir()
    (src / "vllm026.part-a").write_bytes(site[:cut])
    (src / "vllm026.part-b").write_bytes(site[cut:])
    (src / "vllm026-moe.tar.xz").write_bytes(_tar_xz({"vllm/moe_ops.py": b"OPS = 1\n"}))
    return hashlib.sha256(site).hexdigest()


def _run(tmp_path, *args, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "STAGE": str(tmp_path / "stage"), "SITE": str(tmp_path / "site"),
                               "VLLM_PIECES_CHECK": "0", **env})


def test_pieces_staged_one_per_run_unpack_the_site_the_moe_ops_and_the_plugin_entry_point(tmp_path):
    sha = _payload(tmp_path / "src")
    cut = _run(tmp_path, "cut", str(tmp_path / "src"), str(tmp_path / "pieces"), "3", SITE_SHA_OVERRIDE=sha)
    assert cut.returncode == 0, cut.stderr
    pieces = sorted(p.name for p in (tmp_path / "pieces").glob("piece.*"))
    assert pieces == ["piece.0", "piece.1", "piece.2"]
    for i, piece in enumerate(pieces):
        r = _run(tmp_path, "stage", str(tmp_path / "pieces"), piece)
        assert r.returncode == 0, r.stderr
        assert f"{i + 1} of 3 pieces" in r.stdout
        assert ("joined" in r.stdout) == (i == 2)
    site = tmp_path / "site"
    assert (site / "vllm" / "__init__.py").read_text() == "__version__ = '0.26.0'\n"
    assert (site / "vllm" / "moe_ops.py").is_file() and (site / "bin" / "vllm").stat().st_size == 50_000
    entry = (site / "treewy_plugin-0.0.0.dist-info" / "entry_points.txt").read_text()
    assert "treewy = treewy.serve.plugin:register" in entry
    assert list((tmp_path / "stage").glob("piece.*")) == []
    # the payload's sources get their bytecode once, where they were unpacked
    assert sorted(p.name.split(".")[0] for p in (site / "vllm" / "__pycache__").glob("*.pyc")) == ["__init__", "moe_ops"]


def test_wheels_cut_with_the_payload_are_unpacked_into_the_site(tmp_path):
    """``cut SRC DEST N WHEEL...``: wheels (polars, which the GPU machine lacks) travel in the same pieces, after the
    MoE ops, and land unpacked in the site beside vllm; the MoE ops stay whole."""
    sha = _payload(tmp_path / "src")
    wheels = []
    for name, body in (("fakepl-1.0-py3-none-any.whl", b"X = 1\n"), ("fakert-1.0-cp311-abi3-x.whl", os.urandom(9_000))):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{name.split('-')[0]}/__init__.py", body)
        wheels.append(str(path))
    cut = _run(tmp_path, "cut", str(tmp_path / "src"), str(tmp_path / "pieces"), "4", *wheels, SITE_SHA_OVERRIDE=sha)
    assert cut.returncode == 0, cut.stderr
    assert 'wheels="fakepl-1.0-py3-none-any.whl:' in (tmp_path / "pieces" / "manifest").read_text()
    for i in range(4):
        r = _run(tmp_path, "stage", str(tmp_path / "pieces"), f"piece.{i}")
        assert r.returncode == 0, r.stderr
    assert "unpacked fakert-1.0-cp311-abi3-x.whl" in r.stdout
    site = tmp_path / "site"
    assert (site / "fakepl" / "__init__.py").read_text() == "X = 1\n"
    assert (site / "fakert" / "__init__.py").stat().st_size == 9_000
    assert (site / "vllm" / "moe_ops.py").read_text() == "OPS = 1\n"
    assert not (tmp_path / "stage" / "wheels").exists()


def test_a_payload_whose_site_does_not_match_its_checksum_is_refused(tmp_path):
    _payload(tmp_path / "src")
    assert _run(tmp_path, "cut", str(tmp_path / "src"), str(tmp_path / "pieces"), "2",
                SITE_SHA_OVERRIDE="0" * 64).returncode == 0
    _run(tmp_path, "stage", str(tmp_path / "pieces"), "piece.0")
    r = _run(tmp_path, "stage", str(tmp_path / "pieces"), "piece.1")
    assert r.returncode != 0 and "FAILED" in r.stdout + r.stderr
    assert not (tmp_path / "site" / "vllm").exists()


@pytest.mark.parametrize("args", [[], ["cut"], ["stage", "somewhere"]])
def test_a_call_without_its_arguments_says_how_to_call_it(tmp_path, args):
    r = _run(tmp_path, *args)
    assert r.returncode != 0 and ("usage" in r.stdout or "SRC" in r.stderr or "PIECE" in r.stderr)
