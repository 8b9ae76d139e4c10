"""Sampled tree speculation (temperature > 0): the warp and the drafters' draws, which the engine uses. The
acceptance rules live in ``treewy.accept``; why each is exact is in README.md. The checks that sampling keeps the
target distribution (the exact toy and its chi-square test) and the temperature sweep run the engine, so they sit
above it, in ``treewy.experiments``."""

from treewy.sampling.params import Sampling, draw_children, sampling_of, warp

__all__ = ["Sampling", "draw_children", "sampling_of", "warp"]
