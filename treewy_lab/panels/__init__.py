"""Widget panels, one class each; every panel has ``set(**values)`` for headless tests."""

from treewy_lab.panels.environment import EnvironmentPanel
from treewy_lab.panels.kernels import ParityPanel, TimingPanel
from treewy_lab.panels.pseudo_value import PseudoValuePanel
from treewy_lab.panels.serving import ServingPanel
from treewy_lab.panels.sweep import SweepPanel
from treewy_lab.panels.tree import TreePanel

__all__ = ["EnvironmentPanel", "ParityPanel", "PseudoValuePanel", "ServingPanel", "SweepPanel", "TimingPanel", "TreePanel"]
