"""Git clean filter for the notebooks: what Run All adds (outputs, execution counts, widget state, the kernel's
language version) never reaches the repository, so the checkout stays clean after running a notebook.

    python3 tools/nbstrip.py < notebook.ipynb > stripped.ipynb     # the filter (stdin -> stdout)
    python3 tools/nbstrip.py --check notebooks/*.ipynb             # exit 1 if a file is not stripped

``make setup`` installs it for notebooks/*.ipynb (.gitattributes). Standard library only: git runs it with any
python3, inside or outside the virtual environment.
"""

from __future__ import annotations

import json
import sys


def strip(nb: dict) -> dict:
    """The notebook without run-time state: no outputs or execution counts, cell metadata reduced to tags,
    notebook metadata reduced to the kernel spec (the python3 kernel under one display name, whatever the
    front end calls it) and the language name."""
    meta = nb.get("metadata", {})
    kept = {k: meta[k] for k in ("kernelspec",) if k in meta}
    if kept.get("kernelspec", {}).get("name") == "python3":
        kept["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    if "language_info" in meta:
        kept["language_info"] = {"name": meta["language_info"].get("name", "python")}
    nb["metadata"] = kept
    for cell in nb.get("cells", []):
        tags = cell.get("metadata", {}).get("tags")
        cell["metadata"] = {"tags": tags} if tags else {}
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def dumps(nb: dict) -> str:
    """The notebook as JupyterLab writes it (sorted keys, one-space indent, a final newline)."""
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        bad = [p for p in argv[1:] if dumps(strip(json.loads(open(p, encoding="utf-8").read()))) !=
               open(p, encoding="utf-8").read()]
        for p in bad:
            print(f"{p}: not stripped; run: python3 tools/nbstrip.py < {p} > tmp && mv tmp {p}", file=sys.stderr)
        return 1 if bad else 0
    text = sys.stdin.buffer.read().decode("utf-8")
    sys.stdout.buffer.write(dumps(strip(json.loads(text))).encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
