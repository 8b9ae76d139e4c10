"""Claims as data: every measured figure the README's "Measured so far" and the notebooks' "What we saw" quote has one
entry in tests/claims.toml naming its source (a committed results file and the key in it), and the value read there
prints as the prose prints it. An unregistered figure fails with the sentence it came from; so do a figure its
source does not round to, a key its file lacks, and an entry whose figure the prose no longer quotes.

Which numbers are figures: decimals, powers of ten and `~1e-7` orders of magnitude, integers with a unit (us, µs,
ms, s, GiB, MiB, %, ×, x, tokens/s; a unit written once after a run such as "963 vs 40373 ms" or "2047-4506 ms"
covers the run), and integers compared with "vs" or "against". Not figures: code spans, dates, versions, tree
shapes, `B = 256`-style sizes, `gmu 0.6` and `temperature 0.75` settings, and the concurrency of "at 128". Plain counts ("40 of 40
prompts", "15 preemptions") are not checked here.

Printed precision: "469.55" holds when the source value times the entry's scale formats to "469.55" with 2 decimals,
"2.02e-07" when it formats so with 2 decimals of mantissa (3 significant digits), "~1e-7" when the value's nearest
power of ten (log10 rounded) is 1e-7. Formatting rounds the exact binary value, ties to even, as Python's format does.
"""

import functools
import importlib.util
import json
import math
import re
from pathlib import Path

import polars as pl
import pytest

tomllib = pytest.importorskip("tomllib", reason="tests/claims.toml is read with tomllib (Python 3.11+)")

ROOT = Path(__file__).parent.parent
REGISTRY = Path(__file__).parent / "claims.toml"
#: Notebooks that quote measured figures; the others' figures are printed by their own cells
#: (tests/test_notebooks.py checks those against the executed notebook).
NOTEBOOKS = ("03_kernel_parity_live", "04_acceptance_sweeps", "05_serving_curves", "06_serving_with_vllm")
SOURCES = {"treewy/data/": (".json", ".parquet"), "benchmarks/results/": (".json", ".jsonl", ".txt", ".log")}

NOT_FIGURES = re.compile(
    r"`[^`]*`"                                # code: paths, commands, names
    r"|\d{4}-\d{2}-\d{2}"                     # dates
    r"|\d+\.\d+\.\d+"                         # versions
    r"|\(\d+(?:,\s*\d+)+\)"                   # tree shapes
    r"|\b(?:B|k|T|N|HV|H)\s*=\s*\d+|N \+ 1"   # sizes
    r"|\b(?:gmu|temperatures?)\s*\d+(?:\.\d+)?"  # settings
    r"|\bat \d+\b(?!\.)")                     # the concurrency or batch a result is at
NUMBER = re.compile(r"(?<![\w.])(~?(?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:e-?\d+)?))"
                    r"(?:\s?(µs|us|ms|s|GiB|MiB|%|tokens/s|×|x)(?![\w/])(?!\s*\d))?(?![\w.]?\d|\w)")
JOIN = re.compile(r"\s*(?:vs\.?|against|and|to|-|–|,|/)\s*")   # between the numbers of one run


def _places():
    """(place, text) for the README's "Measured so far" and each notebook's "What we saw"."""
    readme = (ROOT / "README.md").read_text()
    yield "README", readme.split("## Measured so far", 1)[1].split("\n## ", 1)[0]
    for name in NOTEBOOKS:
        nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
        for cell in nb["cells"]:
            text = "".join(cell["source"])
            if cell["cell_type"] == "markdown" and "## What we saw" in text:
                yield name, text.split("## What we saw", 1)[1].split("## Try this", 1)[0]


def _sentence(text: str, at: int) -> str:
    """The sentence (or list item) of text around position at, on one line."""
    start = max((i + 2 for i in (text.rfind(". ", 0, at), text.rfind("\n-", 0, at)) if i >= 0), default=0)
    end = min((i + 1 for i in (text.find(". ", at), text.find("\n-", at)) if i >= 0), default=len(text))
    return " ".join(text[start:end].split())


def _figures(text: str):
    """(figure as printed, its unit, the sentence) for each figure in text, in reading order."""
    masked = NOT_FIGURES.sub(lambda m: "\0" * len(m.group(0)), text)
    runs = []   # lists of (number, unit, start, end) that only connectors separate
    for m in NUMBER.finditer(masked):
        token = (m.group(1), m.group(2) or "", m.start(), m.end())
        if runs and JOIN.fullmatch(masked[runs[-1][-1][3]:m.start()]):
            runs[-1].append(token)
        else:
            runs.append([token])
    for run in runs:
        compared = any(re.search(r"\b(?:vs|against)\b", masked[a[3]:b[2]]) for a, b in zip(run, run[1:]))
        for i, (number, unit, start, _) in enumerate(run):
            unit = unit or next((u for _, u, _, _ in run[i:] if u), "") or next(
                (u for _, u, _, _ in reversed(run[:i]) if u), "")
            if "." in number or "e" in number or unit or compared:
                yield number, unit, _sentence(text, start)


def _quoted(places):
    """{(place, figure, occurrence): (unit, sentence)}; occurrence counts the same figure within a place from 1."""
    quoted = {}
    for place, text in places:
        seen: dict[str, int] = {}
        for figure, unit, sentence in _figures(text):
            seen[figure] = seen.get(figure, 0) + 1
            quoted[place, figure, seen[figure]] = unit, sentence
    return quoted


def _registry():
    return [dict(entry, place=place) for place, entries in tomllib.loads(REGISTRY.read_text()).items()
            for entry in entries]


QUOTED = _quoted(_places())
ENTRIES = _registry()


def _place(entry) -> tuple:
    return entry["place"], entry["figure"], entry.get("occurrence", 1)


def _entries_at(place) -> list:
    return [e for e in ENTRIES if _place(e) == place]


def _select(value, step, path: str):
    """One step of a key: a dict key, a list index, a list (a tuple key, as paper.py's), or {field = value, ...}:
    the one element of a list (or value of a dict) whose fields all equal those given."""
    if isinstance(step, dict):
        items = value.values() if isinstance(value, dict) else value
        hits = [item for item in items if isinstance(item, dict) and all(item.get(k) == v for k, v in step.items())]
        if len(hits) != 1:
            raise LookupError(f"{path}: {step} selects {len(hits)} elements, expected exactly 1")
        return hits[0]
    step = tuple(step) if isinstance(step, list) else step
    try:
        return value[step]
    except (KeyError, IndexError, TypeError):
        raise LookupError(f"{path}: no {step!r} in {type(value).__name__}") from None


def _paper():
    spec = importlib.util.spec_from_file_location("_paper_figures", ROOT / "treewy" / "paper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


@functools.cache
def _document(path: Path):
    """path's contents, parsed: a DataFrame, text, paper.py's names, a .jsonl's list of lines, or JSON."""
    if path.suffix == ".parquet":
        return pl.read_parquet(path)
    if path.suffix in (".txt", ".log"):
        return path.read_text()
    if path.suffix == ".py":
        return _paper()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def _source_value(entry) -> float:
    """The value entry's key names in entry's file (before its scale)."""
    file = entry["file"]
    path = ROOT / file
    committed = file == "treewy/paper.py" or any(
        file.startswith(folder) and path.suffix in suffixes for folder, suffixes in SOURCES.items())
    if not committed or ".." in Path(file).parts or not path.is_file():
        raise LookupError(f"{file}: not a committed results file (treewy/paper.py, or under {', '.join(SOURCES)})")
    document = _document(path)
    if path.suffix == ".parquet":
        df = document
        missing = [c for c in (entry["column"], *entry["row"]) if c not in df.columns]
        if missing:
            raise LookupError(f"{file}: no column {missing}")
        rows = df.filter(**entry["row"])
        if rows.height != 1:
            raise LookupError(f"{file}: {entry['row']} selects {rows.height} rows, expected exactly 1")
        return float(rows[entry["column"]][0])
    if path.suffix in (".txt", ".log"):
        if re.compile(entry["regex"]).groups != 1:
            raise LookupError(f"{file}: /{entry['regex']}/ needs exactly one capture group")
        hits = re.findall(entry["regex"], document, flags=re.M)
        if len(hits) != 1:
            raise LookupError(f"{file}: /{entry['regex']}/ matches {len(hits)} times, expected exactly 1")
        return float(hits[0].replace(",", ""))
    value = document
    for step in entry["key"]:
        value = _select(value, step, file)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LookupError(f"{file}: {entry['key']} is {value!r}, not a number")
    return float(value)


def _printed(value: float, figure: str) -> str:
    """value written the way figure is written: its decimals, mantissa digits, or order of magnitude."""
    if figure.startswith("~"):
        return f"~1e{round(math.log10(value))}"
    if "e" in figure:
        mantissa, exponent = figure.split("e")
        digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
        m, e = f"{value:.{digits}e}".split("e")
        return f"{m}e{int(e):+03d}" if len(exponent.lstrip("+-")) > 1 else f"{m}e{int(e)}"
    digits = len(figure.split(".")[1]) if "." in figure else 0
    return f"{value:{',' if ',' in figure else ''}.{digits}f}"


FIELDS = {"figure", "unit", "scale", "occurrence", "file", "key", "regex", "column", "row", "place"}


def _check(entry):
    """entry's source value, scaled, prints as entry's figure; else AssertionError naming file, key and both values."""
    assert set(entry) <= FIELDS, f"{_place(entry)}: unknown fields {sorted(set(entry) - FIELDS)}"
    assert isinstance(entry["figure"], str), f"{_place(entry)}: the figure is written as a string, as printed"
    kinds = [k for k in ("key", "regex", "column") if k in entry]
    assert len(kinds) == 1, f"{_place(entry)}: exactly one of key, regex, column (with row) expected, got {kinds}"
    value = _source_value(entry) * entry.get("scale", 1)
    where = entry.get("key", entry.get("regex", (entry.get("column"), entry.get("row"))))
    assert _printed(value, entry["figure"]) == entry["figure"], (
        f"{_place(entry)}: {entry['file']} {where} gives {value!r}, printed {_printed(value, entry['figure'])!r}, "
        f"not {entry['figure']!r}")


def test_each_place_has_its_text():
    assert [place for place, _ in _places()] == ["README", *NOTEBOOKS]
    assert {place for place, _, _ in QUOTED} >= {"README", "03_kernel_parity_live", "05_serving_curves",
                                                 "06_serving_with_vllm"}


def test_which_numbers_are_figures():
    text = ("On 2026-11-30 with vLLM 0.26.0 at gmu 0.6, (3, 3, 3) at B = 256 took 469.55 us, 963 vs 40373 ms and "
            "2379 tokens/s against 1221 at 128 to 117.3 ms; 15 preemptions, 147 x 4 tokens, `run_14.log`, 2.30× "
            "and 20.0-28.1 ms, within ~1e-7 and 5.1e-04 of fp64, 0.70 % of 6400 positions, 49 vs 26 preemptions.")
    assert [(f, u) for f, u, _ in _figures(text)] == [
        ("469.55", "us"), ("963", "ms"), ("40373", "ms"), ("2379", "tokens/s"), ("1221", "tokens/s"),
        ("117.3", "ms"), ("2.30", "×"), ("20.0", "ms"), ("28.1", "ms"), ("~1e-7", ""), ("5.1e-04", ""),
        ("0.70", "%"), ("49", ""), ("26", "")]


@pytest.mark.parametrize("place", sorted(QUOTED), ids=[f"{p}: {f} #{n}" for p, f, n in sorted(QUOTED)])
def test_quoted_figure_is_registered(place):
    unit, sentence = QUOTED[place]
    entries = _entries_at(place)
    assert len(entries) == 1, (f"{place[0]}: {place[1]} (occurrence {place[2]}, in: {sentence!r}) has "
                               f"{len(entries)} entries in {REGISTRY.name}, expected exactly 1")
    assert entries[0]["unit"] == unit, f"{place}: printed in {unit!r}, registered in {entries[0]['unit']!r}"


@pytest.mark.parametrize("entry", ENTRIES, ids=[f"{e['place']}: {e['figure']} #{e.get('occurrence', 1)}"
                                               for e in ENTRIES])
def test_registered_figure_matches_its_source(entry):
    assert _place(entry) in QUOTED, f"{_place(entry)}: the prose no longer quotes this figure; drop the entry"
    _check(entry)


def _entry(place, figure, occurrence=1):
    (entry,) = _entries_at((place, figure, occurrence))
    return entry


def test_an_edited_figure_is_unregistered_and_its_entry_stale():
    places = [(p, t.replace("469.55 us", "469.56 us") if p == "README" else t) for p, t in _places()]
    quoted = _quoted(places)
    assert ("README", "469.56", 1) in quoted and not _entries_at(("README", "469.56", 1))
    assert ("README", "469.55", 1) not in quoted and _entries_at(("README", "469.55", 1))


def test_a_figure_off_in_its_last_digit_fails():
    for entry in (_entry("README", "469.55"), _entry("README", "2.02e-07"), _entry("05_serving_curves", "2379"),
                  _entry("04_acceptance_sweeps", "2.58"), _entry("03_kernel_parity_live", "~1e-7", 2)):
        _check(entry)
        figure = entry["figure"]
        off = re.sub(r"\d(?=(?:e[-+]?\d+)?$)", lambda m: str((int(m.group(0)) + 1) % 10), figure, count=1)
        with pytest.raises(AssertionError, match=re.escape(repr(off))):
            _check(dict(entry, figure=off))


def test_a_figure_at_another_scale_fails():
    with pytest.raises(AssertionError, match="not '0.70'"):
        _check(dict(_entry("README", "0.70"), scale=100))


def test_a_missing_key_fails():
    with pytest.raises(LookupError, match="no 'chain3 B512"):
        _check(dict(_entry("README", "469.55"), key=["rows", "chain3 B512 [chain]", "us"]))
    with pytest.raises(LookupError, match="selects 0 elements"):
        _check(dict(_entry("README", "3488.91"), key=["rows", {"tree": "(3,3,3)", "B": 512}, "us", "path_split"]))
    with pytest.raises(LookupError, match="selects 2 rows"):
        _check(dict(_entry("README", "2.74"), row={"drafter": "mtp", "kind": "chain", "shape": "(1, 1, 1)"}))
    with pytest.raises(LookupError, match="one capture group"):
        _check(dict(_entry("05_serving_curves", "8.61e-02"), regex=r"(eager)_step_s (\S+)"))
    with pytest.raises(LookupError, match="matches 0 times"):
        _check(dict(_entry("05_serving_curves", "8.61e-02"), regex=r"eager_step_ms (\S+)"))
    with pytest.raises(LookupError, match="not a committed results file"):
        _check(dict(_entry("README", "469.55"), file="README.md"))
