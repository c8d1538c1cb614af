# pile-gpt: `make quickstart` runs the whole pipeline offline on CPU; `make test` runs the test suite (tests/unit/
# and tests/e2e/), `make test-fast` tests/unit/ alone.
# Both install what they need into the current Python environment first (pip skips what is there).
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: install install-dev test test-fast lint quickstart bench

install:
	$(PIP) install -q -r requirements.txt

install-dev:
	$(PIP) install -q -r requirements-dev.txt

test: install-dev
	$(PYTHON) -m pytest tests

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
