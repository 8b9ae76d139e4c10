# Two commands on a fresh machine:  `make lab`  (set up, then open JupyterLab)  and  `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# CPU build of torch where no NVIDIA GPU is present; the default (CUDA) build otherwise.
TORCH  ?= $(if $(shell command -v nvidia-smi 2>/dev/null),torch,torch==2.13.0)
EXTRAS ?= lab,hf,test

.PHONY: setup lab test
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[$(EXTRAS)]"
	touch $@

lab: setup
	TREEWY_DEVICE=$${TREEWY_DEVICE:-cpu} $(VENV)/bin/jupyter lab --ip 127.0.0.1 --notebook-dir notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

test: setup
	$(PY) -m pytest -q
