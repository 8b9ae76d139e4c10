"""`treewy lab [DIR]`: the notebooks shipped in the package are copied into DIR as the checkout lays them out (their
links resolve there), an edited copy is never overwritten without asking, and JupyterLab opens on 00 at 127.0.0.1
with the lab's settings (no news prompt, no warning from the save hook). The wheel carries all of it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest
from traitlets.config import Config

from treewy import cli, lab_command
from treewy.lab_command import MANIFEST, START, copy_lab, jupyter_command, sources

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
import support  # noqa: E402

ROOT = Path(__file__).parent.parent
N_NOTEBOOKS = len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))


def _edit(path: Path, text: str = "my note") -> None:
    nb = json.loads(path.read_text())
    nb["cells"][0]["source"] = [text]
    path.write_text(json.dumps(nb))


def _links(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    markdown = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return [link for link in re.findall(r"\]\(([^)#]+)\)", markdown) if "://" not in link]


def test_copies_the_notebooks_and_the_files_they_link(tmp_path):
    done = copy_lab(tmp_path / "lab")
    assert sum(rel.startswith("notebooks/") for rel in done["copied"]) == N_NOTEBOOKS and not done["kept"]
    for nb in (tmp_path / "lab" / "notebooks").glob("*.ipynb"):
        missing = [link for link in _links(nb) if not (nb.parent / link).resolve().is_file()]
        assert not missing, (nb.name, missing)
    assert copy_lab(tmp_path / "lab")["copied"] == []   # a second run has nothing to do


def test_an_edited_copy_is_never_overwritten_without_asking(tmp_path):
    dest = tmp_path / "lab"
    copy_lab(dest)
    mine = dest / "notebooks" / "02_tree_construction.ipynb"
    _edit(mine)
    done = copy_lab(dest, ask=lambda q: pytest.fail("asked although the shipped version did not change"))
    assert done["kept"] == ["notebooks/02_tree_construction.ipynb"] and "my note" in mine.read_text()
    (dest / MANIFEST).unlink()   # now nothing says the copy was ours: it differs from the shipped version
    with pytest.raises(ValueError, match=r"02_tree_construction\.ipynb differs .* --force"):
        copy_lab(dest)
    asked = []
    assert copy_lab(dest, ask=lambda q: asked.append(q) or False)["kept"] == ["notebooks/02_tree_construction.ipynb"]
    assert "my note" in mine.read_text() and len(asked) == 1 and "02_tree_construction" in asked[0]
    assert copy_lab(dest, ask=lambda q: True)["copied"] == ["notebooks/02_tree_construction.ipynb"]
    assert "my note" not in mine.read_text()
    _edit(mine)
    (dest / MANIFEST).unlink()
    assert copy_lab(dest, force=True)["copied"] == ["notebooks/02_tree_construction.ipynb"]


def test_outputs_are_not_edits(tmp_path):
    dest = tmp_path / "lab"
    copy_lab(dest)
    nb_path = dest / "notebooks" / "01_pseudo_value_rewrite.ipynb"
    nb = json.loads(nb_path.read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"], code["execution_count"] = [{"output_type": "stream", "name": "stdout", "text": "ran"}], 1
    nb_path.write_text(json.dumps(nb))
    (dest / MANIFEST).unlink()
    done = copy_lab(dest)
    assert "notebooks/01_pseudo_value_rewrite.ipynb" in done["current"]
    assert '"ran"' in nb_path.read_text()   # the run's outputs stay


def test_a_newer_release_updates_unedited_copies_and_asks_about_edited_ones(tmp_path, monkeypatch):
    dest = tmp_path / "lab"
    copy_lab(dest)
    _edit(dest / "notebooks" / "02_tree_construction.ipynb")
    files, tools = sources()
    newer = {}
    for rel in ("notebooks/00_start_here.ipynb", "notebooks/02_tree_construction.ipynb"):
        newer[rel] = tmp_path / "release" / rel
        newer[rel].parent.mkdir(parents=True, exist_ok=True)
        newer[rel].write_bytes(files[rel].read_bytes())
        _edit(newer[rel], "new release")
    monkeypatch.setattr(lab_command, "sources", lambda: ({**files, **newer}, tools))
    with pytest.raises(ValueError, match="02_tree_construction"):
        copy_lab(dest)
    assert "new release" not in (dest / "notebooks" / "00_start_here.ipynb").read_text()   # nothing written first
    done = copy_lab(dest, ask=lambda q: False)
    assert done["copied"] == ["notebooks/00_start_here.ipynb"] and done["kept"] == ["notebooks/02_tree_construction.ipynb"]
    assert "new release" in (dest / "notebooks" / "00_start_here.ipynb").read_text()


def test_the_command_opens_00_on_127_0_0_1_with_the_lab_settings(tmp_path):
    cmd = jupyter_command(tmp_path, port=9123, no_browser=True, extra=["--ServerApp.token=t"])
    assert cmd[:3] == [sys.executable, "-m", "jupyterlab"] and "--ip=127.0.0.1" in cmd
    assert f"--ServerApp.root_dir={tmp_path.resolve()}" in cmd and f"--LabApp.default_url=/lab/tree/{START}" in cmd
    config = next(a for a in cmd if a.startswith("--config=")).split("=", 1)[1]
    assert Path(config).is_file() and (Path(config).parent / "labconfig" / "default_setting_overrides.json").is_file()
    assert cmd[-3:] == ["--port=9123", "--no-browser", "--ServerApp.token=t"]
    assert ("--allow-root" in cmd) == (os.geteuid() == 0)


def test_cli_copies_prints_the_command_and_passes_options_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    assert cli.main(["lab", str(tmp_path / "lab"), "--print-command", "--no-browser", "--ServerApp.token=t"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert (tmp_path / "lab" / START).is_file() and "copied" in out[0]
    assert out[-1].endswith("--no-browser --ServerApp.token=t") and "jupyterlab" in out[-1]


@pytest.mark.parametrize("args, needle", [(["a", "b"], "'b': one DIR only"), (["--port", "0"], "--port 0")],
                         ids=["two-dirs", "port-0"])
def test_cli_bad_arguments_are_one_line(args, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["lab", *args, "--print-command"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("treewy lab: error: ") and needle in err[0]
    assert not any(tmp_path.iterdir())   # refused before copying


def test_cli_refuses_to_overwrite_an_edit_off_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    dest = tmp_path / "lab"
    copy_lab(dest)
    _edit(dest / START)
    (dest / MANIFEST).unlink()
    assert cli.main(["lab", str(dest), "--print-command"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("treewy lab: error: ") and "--force" in err[0]
    assert "my note" in (dest / START).read_text()


def test_without_jupyterlab_it_names_the_extra(monkeypatch, capsys, tmp_path):
    real = lab_command.importlib.util.find_spec
    monkeypatch.setattr(lab_command.importlib.util, "find_spec", lambda n: None if n == "jupyterlab" else real(n))
    assert cli.main(["lab", str(tmp_path / "lab")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "treewy lab: error: JupyterLab is not installed: pip install -e '.[lab]' in the checkout"


def _load_config(tools: Path):
    namespace = {"get_config": Config, "__file__": str(tools / "jupyter_lab_config.py")}
    exec(compile((tools / "jupyter_lab_config.py").read_text(), namespace["__file__"], "exec"), namespace)
    return namespace


def test_the_save_hook_strips_in_a_checkout_only(tmp_path):
    manager = _load_config(ROOT / "tools")["LabContentsManager"]
    assert manager(root_dir=str(ROOT))._pre_save_hooks   # the checkout: saved without outputs
    assert not manager(root_dir=str(tmp_path))._pre_save_hooks   # a `treewy lab` copy keeps its outputs


def test_jupyterlab_serves_the_copy_quietly_on_00(tmp_path):
    """A real JupyterLab for a few seconds on 127.0.0.1: `/` leads to 00, the news prompt's setting defaults to no,
    and the terminal holds no warning."""
    dest = tmp_path / "lab"
    copy_lab(dest)
    port = support.free_port()
    cmd = jupyter_command(dest, port=port, no_browser=True, extra=["--ServerApp.token=t"])
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "s"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    log = tmp_path / "jupyterlab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token=t", timeout=2)
                break
            except OSError:
                assert time.time() < deadline and proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.3)
        landing = urllib.request.urlopen(f"{base}/?token=t", timeout=10)
        assert landing.url.split("?")[0] == f"{base}/lab/tree/{START}"
        settings = json.load(urllib.request.urlopen(
            f"{base}/lab/api/settings/@jupyterlab/apputils-extension:notification?token=t", timeout=10))
        assert settings["schema"]["properties"]["fetchNews"]["default"] == "false"
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)
    text = log.read_text()
    assert "Warning" not in text and "Traceback" not in text and "Skipped non-installed" not in text, text


def test_a_wheel_carries_the_lab(tmp_path):
    """Built from this checkout's pyproject.toml and setup.py: every module, the notebooks, tools/ and the linked notes
    are in the wheel, and the installed package copies them with no checkout in sight."""
    src = tmp_path / "src"   # a copy: the build writes build/ beside the sources
    for name in ("pyproject.toml", "setup.py", "README.md", "benchmarks/NOTES.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for name in ("treewy", "treewy_lab", "notebooks", "tools"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("treewy-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(src).as_posix() for d in ("treewy", "treewy_lab") for p in (src / d).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules <= names, f"not in the wheel: {sorted(modules - names)}"   # setup.py's scan missed a package
    for nb in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        assert f"treewy_lab/notebooks/{nb.name}" in names
    assert {"treewy_lab/tools/jupyter_lab_config.py", "treewy_lab/tools/nbstrip.py",
            "treewy_lab/tools/labconfig/default_setting_overrides.json", "treewy_lab/benchmarks/NOTES.md"} <= names
    assert not any(n.startswith("lab/") for n in names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("from treewy.lab_command import copy_lab, sources; import sys; "
            "print(sources()[1]); print(len(copy_lab(sys.argv[1])['copied']))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "lab")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    tools, copied = out.stdout.split()
    assert Path(tools) == site / "treewy_lab" / "tools" and int(copied) == len(sources()[0])
    for nb in (tmp_path / "lab" / "notebooks").glob("*.ipynb"):
        assert all((nb.parent / link).resolve().is_file() for link in _links(nb)), nb.name


def test_messages_asking_for_the_tiny_model_name_its_extras(monkeypatch):
    import treewy.env
    import treewy.models
    from treewy.env import TINY_MODEL_EXTRAS, MissingExtra, install_command

    assert install_command(TINY_MODEL_EXTRAS) == "pip install -e '.[hf]' in the checkout"   # tests run in one
    monkeypatch.setattr("treewy.results.checkout_dirs", lambda: ())   # as installed from a wheel
    assert install_command(TINY_MODEL_EXTRAS) == 'pip install "treewy[hf]"'
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingExtra, match=r'pip install "treewy\[hf\]"'):
        treewy.models.load("tiny")
    monkeypatch.setattr(treewy.env.importlib.util, "find_spec", lambda name: None)
    assert treewy.env.describe()["features"]["tiny model engine"] == 'needs pip install "treewy[hf]"'
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"treewy[{','.join(TINY_MODEL_EXTRAS)}]" in extras["lab"]   # `pip install "treewy[lab]"` runs 04 too
