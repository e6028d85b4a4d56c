# Everything runs inside a local virtual environment made on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

ARGS ?= --patch 16 --res 448

.PHONY: setup export test clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[export,test]'
	touch $(STAMP)

## export: the default bundle (ViT-B/16, deploy resolution 448), written to ./vit-B16-448
export: $(STAMP)
	$(BIN)/vit-deploy export $(ARGS)

## test: the whole test suite
test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) vit-*/ .pytest_cache
