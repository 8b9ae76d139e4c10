"""The package list only; pyproject.toml holds the rest. notebooks/ and tools/ sit at the checkout's top (one copy,
where `make lab` opens them) and ship as treewy_lab.notebooks and treewy_lab.tools (pyproject.toml's package-dir),
which no directory scan can find, so the scan's packages and those three are listed here."""

from setuptools import find_namespace_packages, setup

setup(packages=find_namespace_packages(include=["treewy", "treewy.*", "treewy_lab", "treewy_lab.*"],
                                       exclude=["*__pycache__*"])
      + ["treewy_lab.notebooks", "treewy_lab.tools", "treewy_lab.tools.labconfig"])
