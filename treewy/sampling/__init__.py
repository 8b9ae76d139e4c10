"""Sampled tree speculation (temperature > 0): the warp, the drafters' draws, the exact toy and its
chi-square check. The acceptance rules live in ``treewy.accept``; why each is exact is in README.md."""

from treewy.sampling.params import Sampling, draw_children, sampling_of, warp
from treewy.sampling.check import ChiSquare, ToyChain, chi_square, second_token_check, sequence_index, toy_check

__all__ = ["ChiSquare", "Sampling", "ToyChain", "chi_square", "draw_children", "sampling_of", "second_token_check",
           "sequence_index", "toy_check", "warp"]
