# pile-gpt: `make quickstart` runs the whole pipeline offline on CPU; `make test` runs the test suite (tests/unit/
# and tests/e2e/), `make test-fast` tests/unit/ alone.
# Both install what they need into the current Python environment first (pip skips what is there).
# `make install-keep-torch` installs around the torch the environment already has (a GPU image's, a newer one) and
# never replaces it (scripts/install_keep_torch.py). It leaves a marker in the environment (`install_keep_torch.py
# --marked` prints its path); where it is, install and install-dev (so quickstart, test, test-fast) take that path
# too instead of `pip install -r requirements.txt`, which would put the pinned torch 2.7.0 back. Deleting the marker
# returns the environment to the pinned stack.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# make test's pytest-xdist workers: auto is one more than the CPUs, capped by memory (tests/conftest.py); 0 runs in
# one process. test-fast runs in one process: workers would each import Composer and gain nothing (45 s either way).
# --dist loadfile keeps each test file in one worker, so that a module's shared runs are made once; files go out
# in the order conftest.py gives (the longest first), not xdist's (the most tests first).
WORKERS ?= auto
PYTEST = $(PYTHON) -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder
KEEP_TORCH = $(shell $(PYTHON) scripts/install_keep_torch.py --marked)

.PHONY: install install-dev install-keep-torch install-loggers test test-fast lint quickstart bench gpu-wheels

install:
	$(if $(KEEP_TORCH),$(PYTHON) scripts/install_keep_torch.py,$(PIP) install -q -r requirements.txt)

install-dev:
	$(if $(KEEP_TORCH),$(PYTHON) scripts/install_keep_torch.py --dev,$(PIP) install -q -r requirements-dev.txt)

install-keep-torch:
	$(PYTHON) scripts/install_keep_torch.py

# the optional trackers (wandb_log, mlflow_log, tensorboard_log); tests/e2e/test_wandb.py skips without wandb
install-loggers:
	$(PIP) install -q -r requirements-loggers.txt

test: install-dev
	$(PYTEST) tests

test-fast: install-dev
	$(PYTHON) -m pytest tests/unit

lint: install-dev
	$(PYTHON) -m ruff check .

quickstart: install
	bash scripts/quickstart.sh

bench: install-dev
	$(PYTHON) bench/bench_prepare_data.py
	$(PYTHON) bench/bench_to_mds.py
	$(PYTHON) bench/bench_upload_s3.py
	$(PYTHON) bench/bench_checkpoint_uploads.py
	$(PYTHON) bench/bench_train.py
	$(PYTHON) bench/bench_fsdp_memory.py

# the wheels the GPU machine's image lacks (bench/gpu_wheels.txt), for its Python 3.12, into .gpu-wheels/: the device
# tool carries them with `carry: [".gpu-wheels"]`, and bench/gpu_run.sh installs them there offline
gpu-wheels:
	$(PYTHON) bench/gpu_wheels.py
