"""treewy_lab.bytecode: the lab's bytecode cache for a Python that keeps none beside its packages."""

import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

from treewy_lab.bytecode import beside_source, missing_bytecode

BYTECODE_PY = Path(__file__).resolve().parents[1] / "treewy_lab" / "bytecode.py"


def make_package(root: Path, name: str = "fakepkg_bytecode") -> Path:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 41 + 1\n")
    return pkg / "__init__.py"


def test_missing_bytecode_names_packages_without_it_beside_their_source(tmp_path, monkeypatch):
    init = make_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert missing_bytecode(("fakepkg_bytecode", "no_such_package_here")) == ["fakepkg_bytecode"]
    py_compile.compile(str(init), cfile=str(beside_source(str(init))), doraise=True)
    assert missing_bytecode(("fakepkg_bytecode",)) == []


def run_keep(tmp_path: Path, **env) -> list[str]:
    """A new interpreter under PYTHONDONTWRITEBYTECODE=1 runs keep_bytecode (loaded from its file, so importing
    treewy_lab's own probe of torch does not run first), then imports the package: prints what it returned, the
    package's bytecode, the prefix, and the package's bytecode in a child interpreter it starts."""
    script = (f"import importlib.util, sys\n"
              f"spec = importlib.util.spec_from_file_location('bytecode', {str(BYTECODE_PY)!r})\n"
              f"mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
              f"print(mod.keep_bytecode(('fakepkg_bytecode',)))\n"
              f"import fakepkg_bytecode\n"
              f"print(fakepkg_bytecode.__cached__); print(sys.pycache_prefix)\n"
              f"import subprocess\n"
              f"print(subprocess.run([sys.executable, '-c', 'import fakepkg_bytecode; print(fakepkg_bytecode.__cached__)'],"
              f" capture_output=True, text=True, check=True).stdout.strip())\n")
    full = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "TREEWY_LAB_BYTECODE")},
            "PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PYTHONPATH": str(tmp_path / "pkgs"), **env}
    out = subprocess.run([sys.executable, "-c", script], env=full, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_a_package_without_bytecode_gets_it_in_the_labs_cache_and_reads_it_back(tmp_path):
    init = make_package(tmp_path / "pkgs")
    cache = tmp_path / "cache" / "treewy_lab" / "bytecode"
    root, cached, prefix, in_child = run_keep(tmp_path)
    assert root == prefix == str(cache)
    assert Path(cached).is_file() and Path(cached).is_relative_to(cache)
    assert in_child == cached                                # a process the kernel starts reads the same cache
    assert not (init.parent / "__pycache__").exists()       # the package's folder stays as it was
    written = Path(cached).stat().st_mtime_ns
    assert run_keep(tmp_path)[1] == cached
    assert Path(cached).stat().st_mtime_ns == written        # the second kernel read it, wrote nothing


def test_an_opt_out_or_a_prefix_of_your_own_is_left_alone(tmp_path):
    make_package(tmp_path / "pkgs")
    root, _, prefix, in_child = run_keep(tmp_path, TREEWY_LAB_BYTECODE="0")
    assert root == prefix == "None"
    assert "treewy_lab" not in in_child
    mine = str(tmp_path / "mine")
    root, _, prefix, in_child = run_keep(tmp_path, PYTHONPYCACHEPREFIX=mine)
    assert (root, prefix) == ("None", mine)
    assert in_child.startswith(mine)
    assert not (tmp_path / "cache").exists()


def test_packages_with_their_bytecode_are_left_alone(tmp_path):
    init = make_package(tmp_path / "pkgs")
    py_compile.compile(str(init), cfile=str(beside_source(str(init))), doraise=True)
    root, cached, prefix, in_child = run_keep(tmp_path)
    assert (root, prefix) == ("None", "None")
    assert Path(cached) == beside_source(str(init)) == Path(in_child)


def test_importing_the_lab_loads_no_torch_so_its_bytecode_is_kept_too():
    """keep_bytecode runs when treewy_lab is imported; torch imported before it would compile from source still."""
    probe = "import sys, treewy_lab; assert 'torch' not in sys.modules, 'torch came with treewy_lab'"
    subprocess.run([sys.executable, "-c", probe], cwd=BYTECODE_PY.parents[1], check=True, capture_output=True)


def test_setup_and_its_banner_say_where_the_bytecode_is_kept(tmp_path, monkeypatch):
    import treewy_lab
    from treewy_lab.setup import environment_banner, setup

    monkeypatch.setattr(treewy_lab, "BYTECODE_CACHE", tmp_path / "bytecode")
    info = setup(banner=False)
    said = info["features"]["bytecode cache"]
    assert said.startswith(str(tmp_path / "bytecode")) and "TREEWY_LAB_BYTECODE=0" in said
    assert f"bytecode cache: {said}" in environment_banner(info).value
    monkeypatch.setattr(treewy_lab, "BYTECODE_CACHE", None)
    assert "bytecode cache" not in setup(banner=False)["features"]
