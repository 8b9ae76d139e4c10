# Two commands on a fresh machine:  `make lab`  (set up, then open JupyterLab)  and  `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
# Where no NVIDIA GPU is present, torch's CPU build from PyTorch's own index (the plain index would bring the CUDA
# build and ~20 NVIDIA wheels on Linux); if that index cannot be reached within seconds, the plain index.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
EXTRAS ?= lab,hf,test
LAB_ARGS ?=

.PHONY: setup lab test notebook-filter
setup: $(VENV)/.installed notebook-filter

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(HAS_GPU),yes)
	$(PIP) install -q torch
else
	$(PIP) install -q --timeout 5 --retries 0 --index-url $(TORCH_CPU_INDEX) "torch==$(TORCH_VERSION)" \
	  || $(PIP) install -q "torch==$(TORCH_VERSION)"
endif
	@# setuptools' note on editable installs is a UserWarning from the build backend: not ours to act on
	PYTHONWARNINGS=ignore::UserWarning $(PIP) install -q -e ".[$(EXTRAS)]"
	touch $@

# Outputs never reach git: notebooks/*.ipynb pass through tools/nbstrip.py (.gitattributes) on their way in, from
# any editor; `make lab` also saves them stripped, so that even `git status` stays clean after Run All.
notebook-filter:
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  git config filter.nbstrip.clean "python3 tools/nbstrip.py"; fi

# The whole checkout in the file browser (READMEs and results next to the notebooks); 00 opens first, and the URL
# JupyterLab prints opens 00 too; notebooks are saved without their outputs, no news prompt, warnings only in the
# terminal (tools/jupyter_lab_config.py).
lab: setup
	@echo "JupyterLab runs in this terminal until Ctrl-C; the URL it prints opens notebooks/00_start_here.ipynb"
	@TREEWY_DEVICE=$${TREEWY_DEVICE:-cpu} $(VENV)/bin/jupyter lab --ip 127.0.0.1 --ServerApp.root_dir=. \
	  --config=tools/jupyter_lab_config.py --LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb \
	  $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

test: setup
	$(PY) -m pytest -q
