"""Widget panels, one class each; every panel has ``set(**values)`` for headless tests."""

from lab.panels.environment import EnvironmentPanel
from lab.panels.kernels import ParityPanel, TimingPanel
from lab.panels.pseudo_value import PseudoValuePanel
from lab.panels.serving import ServingPanel
from lab.panels.sweep import SweepPanel
from lab.panels.tree import TreePanel

__all__ = ["EnvironmentPanel", "ParityPanel", "PseudoValuePanel", "ServingPanel", "SweepPanel", "TimingPanel", "TreePanel"]
