# bkspark — two commands: `make install`, then `make demo` / `make test`.
PYTHON ?= python3
PYTEST_ARGS ?=

.PHONY: install system-packages build wheel proto test demo bench chaos clean

# System packages every suite needs, each installed when what it provides is missing (as root,
# or with sudo): librocksdb-dev (the bookie index: bookie_native/README.md "The index"),
# zookeeper (the ZooKeeper suites' metadata store), iproute2 + nftables (the multi-host
# tests' hosts: network namespaces and packet filters), chromium (the dashboard's browser
# tests), mount + e2fsprogs (a failing disk: bkspark/testing/faildisk.py), faketime (skewed
# clocks: bkspark/testing/clockskew.py), clang (the fuzz tests' sanitizer build), a Java
# runtime (Spark). `.ci/run` installs through this same target.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SYSTEM_PACKAGES = \
	"test -f /usr/include/rocksdb/c.h" librocksdb-dev \
	"test -f /usr/share/java/zookeeper.jar" zookeeper \
	"command -v ip" iproute2 \
	"command -v nft" nftables \
	"test -x /usr/bin/chromium" chromium \
	"command -v losetup" mount \
	"command -v mkfs.ext4" e2fsprogs \
	"command -v faketime" faketime \
	"command -v clang" clang \
	"command -v java" default-jre-headless

system-packages:
	@set -- $(SYSTEM_PACKAGES); missing=""; \
	while [ $$# -gt 0 ]; do PATH="$$PATH:/usr/sbin:/sbin" sh -c "$$1" >/dev/null 2>&1 || \
	  missing="$$missing $$2"; shift 2; done; \
	if [ -z "$$missing" ]; then echo "make install: every system package is there"; exit 0; fi; \
	echo "make install: installing Debian packages:$$missing"; \
	if [ "$$(id -u)" != 0 ] && ! command -v sudo >/dev/null; then \
	  echo "make install: not root and no sudo: install them as root, then run make install again:"; \
	  echo "  apt-get install -y$$missing"; exit 1; fi; \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || { \
	  echo "make install: apt-get could not install:$$missing (see above); the suites that need"; \
	  echo "them would fail. Install them by hand, then run make install again."; exit 1; }

# compat mode: the editable install puts the repository on sys.path (a .pth file) instead of
# an import hook, so PySpark's scan for top-level `pyspark_*` modules (pkgutil.iter_modules)
# finds pyspark_bookkeeper and format("bookkeeper") works without register() from any directory.
install: system-packages
	$(PYTHON) -m pip install --config-settings editable_mode=compat -e '.[test]'
	$(PYTHON) setup.py -q build_ext --inplace

build:
	$(PYTHON) setup.py -q build_ext --inplace

# A wheel that installs on any Linux with this machine's glibc or newer, nothing else needed:
# the PEP 517 build, then auditwheel copies RocksDB and the libraries it links into the wheel
# (bkspark.libs/) and tags it manylinux. Both tools come with the test extras. build/lib is
# emptied first: files deleted from the checkout must not ride along from an earlier build.
WHEEL_DIR ?= dist
wheel:
	rm -rf $(WHEEL_DIR)/.linux build/lib.* build/bdist.* && mkdir -p $(WHEEL_DIR)
	$(PYTHON) -m build --wheel --no-isolation --outdir $(WHEEL_DIR)/.linux .
	$(PYTHON) -m auditwheel repair --wheel-dir $(WHEEL_DIR) $(WHEEL_DIR)/.linux/bkspark-*.whl
	rm -rf $(WHEEL_DIR)/.linux

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
	rm -rf build dist *.egg-info bkspark/_native*.so
	find . -name __pycache__ -prune -exec rm -rf {} +
