"""Experiments that run the engine (``treewy.decode``) and so sit above it: the greedy acceptance sweep behind
``treewy sweep`` (``acceptance.py``), the checks that sampled speculation keeps the target distribution
(``sampling_check.py``: an exact toy chain and the tiny model's second token, each with a chi-square test) and
acceptance against temperature (``sampling_sweep.py``). Nothing below imports from here."""

from treewy.experiments.acceptance import summarize, sweep, sweep_rows
from treewy.experiments.sampling_check import (
    ChiSquare, ToyChain, chi_square, second_token_check, sequence_index, toy_check,
)
from treewy.experiments.sampling_sweep import temperature_sweep

__all__ = ["ChiSquare", "ToyChain", "chi_square", "second_token_check", "sequence_index", "summarize", "sweep",
           "sweep_rows", "temperature_sweep", "toy_check"]
