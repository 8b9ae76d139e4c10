"""Sampled tree speculation (temperature > 0): the warp, the drafters' draws, the exact toy and its
chi-square check. The acceptance rules live in ``treewy.accept``; why each is exact is in README.md."""

from treewy.sampling.params import Sampling, draw_children, sampling_of, warp
from treewy.sampling.toy import ChiSquare, ToyChain, chi_square, sequence_index

__all__ = ["ChiSquare", "Sampling", "ToyChain", "chi_square", "draw_children", "sampling_of", "sequence_index", "warp"]
