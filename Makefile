# bkspark — two commands: `make install`, then `make demo` / `make test`.
PYTHON ?= python3
PYTEST_ARGS ?=

.PHONY: install build proto test demo bench chaos clean

install:
	$(PYTHON) -m pip install -e '.[test]'
	$(PYTHON) setup.py -q build_ext --inplace

build:
	$(PYTHON) setup.py -q build_ext --inplace

proto:
	$(PYTHON) -m bkspark.proto.generate

test: build
	$(PYTHON) -m pytest tests $(PYTEST_ARGS)

demo: build
	$(PYTHON) examples/demo.py

bench: build
	$(PYTHON) bench/storage.py
	$(PYTHON) bench/bookie.py
	$(PYTHON) bench/client.py

clean:
	rm -rf build *.egg-info bkspark/_native*.so
	find . -name __pycache__ -prune -exec rm -rf {} +
