# Two commands for a fresh Debian/Ubuntu machine with Python 3.11:
#   make demo   installs everything (apt + virtualenv) and runs the demo on embedded data
#   make test   same install, then the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast bench clean

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh $(wildcard deps/*.txt)
	bash scripts/install.sh $(VENV)
	touch $@

demo: install
	$(VENV)/bin/humanset demo --output runs/demo

# lint first (rules in pyproject.toml), then every tier of the suite (docs/testing.md); a hung test must
# not hang CI: after 52 minutes pytest is interrupted and reports what it ran (CI allows 60 minutes for
# the install and the suite together)
test: install
	$(VENV)/bin/ruff check .
	timeout --signal=INT --kill-after=60 3120 $(PY) -m pytest tests

# the unit tier only: no S3 server, cluster, Blender, training run or whole curation (docs/testing.md)
test-fast: install
	$(VENV)/bin/ruff check .
	timeout --signal=INT --kill-after=60 1200 $(PY) -m pytest -m unit tests

bench: install
	$(PY) bench/curate.py

clean:
	rm -rf runs .pytest_cache
