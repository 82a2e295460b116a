# bkspark — two commands: `make install`, then `make demo` / `make test`.
PYTHON ?= python3
PYTEST_ARGS ?=

.PHONY: install build proto test demo bench chaos clean

# compat mode: the editable install puts the repository on sys.path (a .pth file) instead of
# an import hook, so PySpark's scan for top-level `pyspark_*` modules (pkgutil.iter_modules)
# finds pyspark_bookkeeper and format("bookkeeper") works without register() from any directory.
# The storage engine's index is RocksDB (bookie_native/README.md "The index"): its C headers and
# library come from Debian's librocksdb-dev, installed here when missing (as root, or with sudo).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
install:
	@[ -f /usr/include/rocksdb/c.h ] || { echo "make install: installing librocksdb-dev (RocksDB, the bookie index)"; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq librocksdb-dev >/dev/null; }
	@command -v faketime >/dev/null || { echo "make install: installing faketime (the tests' skewed clocks)"; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq faketime >/dev/null; }
	@command -v clang >/dev/null || { echo "make install: installing clang (the fuzz tests' sanitizer build)"; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq clang >/dev/null; }
	$(PYTHON) -m pip install --config-settings editable_mode=compat -e '.[test]'
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
	$(PYTHON) bench/rereplication.py
	$(PYTHON) bench/spark.py

# Long randomized fault run + bookie crash campaign (issue 9); the report is JSON with a
# "text" summary. Replay a failing run with the seed it prints.
CHAOS_DURATION ?= 600
CHAOS_SEED ?= $(shell date +%s)
CHAOS_STORE ?= both
CHAOS_RUN_SECONDS ?= 60
CHAOS_KILLS ?= 300
CHAOS_REPORT ?= chaos-report.json
# the multi-host campaign (network namespaces: needs root, iproute2 and nftables)
CHAOS_MULTIHOST_SECONDS ?= 600
CHAOS_MULTIHOST_REPORT ?= chaos-multihost.json
# the user-level campaign (logs, readers, Spark batch and streaming jobs; needs Java)
CHAOS_USER_SECONDS ?= 600
CHAOS_USER_REPORT ?= chaos-user.json
# the disk-fault campaign (the storage engine under injected I/O errors, power losses, kills)
CHAOS_DISK_RUNS ?= 600
CHAOS_DISK_REPORT ?= chaos-disk.json

chaos: build
	$(PYTHON) -m bkspark.testing.faults --seed $(CHAOS_SEED) --duration $(CHAOS_DURATION) \
		--store $(CHAOS_STORE) --run-seconds $(CHAOS_RUN_SECONDS) \
		--crash-kills $(CHAOS_KILLS) --quiet --report $(CHAOS_REPORT)
	$(PYTHON) -m bkspark.testing.faults multihost --seed $(CHAOS_SEED) \
		--duration $(CHAOS_MULTIHOST_SECONDS) --report $(CHAOS_MULTIHOST_REPORT)
	$(PYTHON) -m bkspark.testing.userfaults --seed $(CHAOS_SEED) --duration $(CHAOS_USER_SECONDS) \
		--store $(CHAOS_STORE) --quiet --report $(CHAOS_USER_REPORT)
	$(PYTHON) -m bkspark.testing.diskfaults --seed $(CHAOS_SEED) --runs $(CHAOS_DISK_RUNS) \
		--quiet --report $(CHAOS_DISK_REPORT)

clean:
	rm -rf build *.egg-info bkspark/_native*.so
	find . -name __pycache__ -prune -exec rm -rf {} +
