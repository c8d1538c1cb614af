# pile-gpt: `make quickstart` runs the whole pipeline offline on CPU; `make test` runs the test suite (tests/unit/
# and tests/e2e/), `make test-fast` tests/unit/ alone.
# Both install what they need into the current Python environment first (pip skips what is there).
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# make test's pytest-xdist workers: auto is one more than the CPUs, capped by memory (tests/conftest.py); 0 runs in
# one process. test-fast runs in one process: workers would each import Composer and gain nothing (45 s either way).
# --dist loadfile keeps each test file in one worker, so that a module's shared runs are made once; files go out
# in the order conftest.py gives (the longest first), not xdist's (the most tests first).
WORKERS ?= auto
PYTEST = $(PYTHON) -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: install install-dev test test-fast lint quickstart bench

install:
	$(PIP) install -q -r requirements.txt

install-dev:
	$(PIP) install -q -r requirements-dev.txt

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
