"""Merge what a serving sweep call brought back from the GPU machine into the committed results (CPU, seconds).

    python -m benchmarks.merge_sweep CALL_FILES benchmarks/results/serve35b_h200_gmu0.75_2026-12-03 \
        --package serving_qwen3.5-35b-a3b_h200_gmu0.75_2026-12-03.parquet

The first argument holds the call's files: ``<mode>.tar.gz`` from ``sweep_pair.sh`` (each a mode's --out folder),
or the --out folders themselves. For each checkpoint ``<table>.points.jsonl`` found there:
- the checkpoint replaces the committed one: the call resumed it, so it holds every committed point (checked);
- the per-point records in ``results.tar.gz`` go gzipped into DEST/results/ (no name or time in the gzip header,
  so an unchanged record is an unchanged file); the server logs stay out;
- the sweep log is appended to DEST's, under a line naming the merge; ``capacity_*.json`` is copied;
- DEST/<table>.parquet keeps its committed rows and gains the checkpoint's new points (a committed row may carry
  columns an older checkpoint record lacks, such as median_tpot_ms).
Then the package's table (``--package``, in treewy/data/) gains the same new rows and is published
(``treewy.results.publish``); without ``--package`` only DEST changes (a sweep still missing points). Prints what it
added.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import io
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

KEY = ["workload", "mode", "concurrency", "tree"]


def key(frame) -> list[str]:
    """A point's columns: KEY, and the acceptance it asked for where the table records it (a chain at ``tiny`` is
    another point than the chain at ``paper-35b``)."""
    return KEY + (["acceptance_source"] if "acceptance_source" in frame.columns else [])


def mode_folders(src: Path, work: Path) -> list[Path]:
    """The --out folders in ``src``: its <mode>.tar.gz unpacked under ``work``, or its subfolders with a checkpoint."""
    for tar in sorted(src.glob("*.tar.gz")):
        with tarfile.open(tar) as t:
            t.extractall(work, filter="data")
    found = {p.parent for root in (src, work) for p in root.glob("*/*.points.jsonl")}
    return sorted(found)


def gzip_record(data: bytes, dest: Path) -> None:
    """``data`` gzipped into ``dest`` with no file name or time in the header."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as f:
        f.write(data)
    dest.write_bytes(buf.getvalue())


def new_rows(frame, committed):
    """The rows of ``frame`` whose point (``key``) ``committed`` lacks (None: all of them)."""
    if committed is None:
        return frame
    on = [c for c in key(frame) if c in committed.columns]
    return frame.join(committed.select(on), on=on, how="anti", nulls_equal=True)


def with_rows(committed, added):
    import polars as pl

    return added if committed is None else pl.concat([committed, added.select(committed.columns)])


def merge_folder(folder: Path, dest: Path) -> list:
    """Merge one --out folder into ``dest``; the frames of the new rows, one per checkpoint."""
    import polars as pl

    from treewy.schema import serving_frame
    from treewy.serve.sweep_io import load_checkpoint

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "results").mkdir(exist_ok=True)
    added = []
    for ckpt in sorted(folder.glob("*.points.jsonl")):
        table = ckpt.name.removesuffix(".points.jsonl")
        old, new = load_checkpoint(dest / ckpt.name), load_checkpoint(ckpt)
        if old.keys() - new.keys():
            raise SystemExit(f"{ckpt}: lacks {len(old.keys() - new.keys())} point(s) of {dest / ckpt.name} (a call "
                             "that did not resume the committed checkpoint: pass --resume-from next time)")
        frame = serving_frame([rec["row"] for rec in new.values()])
        parquet = dest / f"{table}.parquet"
        committed = pl.read_parquet(parquet) if parquet.is_file() else None
        rows = new_rows(frame, committed)
        with_rows(committed, rows).sort(KEY).write_parquet(parquet)
        shutil.copyfile(ckpt, dest / ckpt.name)
        added.append(rows)
    packed = folder / "results.tar.gz"
    if packed.is_file():
        with tarfile.open(packed) as t:
            for m in t.getmembers():
                if m.isfile() and m.name.endswith(".json"):
                    gzip_record(t.extractfile(m).read(), dest / "results" / f"{Path(m.name).name}.gz")
    for path in folder.glob("capacity_*.json"):
        shutil.copyfile(path, dest / path.name)
    for log in folder.glob("sweep_*.log"):
        with open(dest / log.name, "a") as f:
            f.write(f"# merged {dt.date.today().isoformat()} from a call's {log.name}\n" + log.read_text())
    return added


def main(argv=None) -> int:
    import polars as pl

    from treewy.results import DATA_DIR, publish

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="the call's files: <mode>.tar.gz from sweep_pair.sh, or --out folders")
    ap.add_argument("dest", help="the committed results folder of this gmu and date")
    ap.add_argument("--package", default=None, help="the package's table of this sweep (a name in treewy/data/); "
                    "leave it out while a mode's points are missing (the notebooks read the newest package)")
    ap.add_argument("--data-dir", default=None, help=argparse.SUPPRESS)    # tests: another treewy/data
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        folders = mode_folders(Path(args.src), Path(work))
        if not folders:
            raise SystemExit(f"{args.src}: no sweep output there (<mode>.tar.gz or folders with *.points.jsonl)")
        added = [rows for folder in folders for rows in merge_folder(folder, Path(args.dest))]
    new = pl.concat(added, how="diagonal_relaxed") if added else None
    if args.package is None:
        print(new.select("workload", "mode", "concurrency", "output_throughput", "mean_tpot_ms", "error"))
        print(f"{new.height} new point(s) in {args.dest}; the package's table left as it is (no --package)")
        return 0
    package = Path(args.data_dir or DATA_DIR) / args.package
    committed = pl.read_parquet(package) if package.is_file() else None
    rows = new_rows(new, committed)
    with tempfile.TemporaryDirectory() as work:
        table = Path(work) / args.package
        with_rows(committed, rows).sort(KEY).write_parquet(table)
        publish("serving", table, data_dir=args.data_dir)
    print(rows.select("workload", "mode", "concurrency", "output_throughput", "mean_tpot_ms", "error"))
    print(f"{rows.height} new point(s) in {args.dest} and {package}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
