"""The benchmark and GPU scripts, run from the repository root as ``python -m benchmarks.NAME`` (README.md maps each
script to what it measures and its current result). Not part of the installed package: what they share with the
package lives in treewy/bench/."""
