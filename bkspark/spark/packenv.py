"""A relocatable Python environment with bkspark, for Spark executors that have none.

Spark's way to give executors a Python with packages of native code (PySpark's "Python
Package Management": YARN, Kubernetes, standalone) is an archive of a virtual environment
sent with the application -- ``spark.archives`` / ``--archives env.tar.gz#environment`` --
and ``PYSPARK_PYTHON=./environment/bin/python``. :func:`pack` makes that archive from a
bkspark wheel (``make wheel``): a fresh virtual environment (no system site packages) with
the wheel and its dependencies, packed by ``venv-pack``.

* PySpark itself is left out (the archive is ~300 MB smaller): Spark puts its own
  ``pyspark.zip`` on its Python workers' path, so the workers import the PySpark of the
  cluster's Spark. ``with_pyspark=True`` includes it (a driver that runs from the archive).
* Like any ``venv-pack`` archive it holds the packages, not the interpreter: every host runs
  the archive's ``bin/python`` through the Python it was made with, which must be at the
  same path there (the same base image); ``conda-pack`` is the way when hosts differ.

Failure: :class:`~bkspark.errors.BadRequestError` naming what is missing (the wheel, pip's
error, venv-pack); nothing is left behind but ``output`` on success.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser

from bkspark.errors import BadRequestError

SPARK_PROVIDED = ("pyspark",)


def wheel_requirements(wheel: str, with_pyspark: bool = False) -> list[str]:
    """The ``Requires-Dist`` of a wheel's metadata without extras' ones (and without PySpark
    unless ``with_pyspark``)."""
    try:
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            meta = Parser().parsestr(z.read(name).decode())
    except (OSError, zipfile.BadZipFile, StopIteration) as exc:
        raise BadRequestError(f"{wheel} is not a bkspark wheel ({exc}); make one with "
                              "`make wheel`") from None
    out = []
    for req in meta.get_all("Requires-Dist") or []:
        if "extra ==" in req:
            continue
        project = req.split(";")[0].strip()
        base = project.split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("!")[0]
        if not with_pyspark and base.strip().lower() in SPARK_PROVIDED:
            continue
        out.append(project)
    return out


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise BadRequestError(f"{what} failed ({' '.join(command[:4])} ...):\n"
                              f"{(done.stderr or done.stdout)[-2000:]}")


def pack(output: str, wheel: str, *, python: str = sys.executable,
         with_pyspark: bool = False) -> dict:
    """Write ``output`` (``.tar.gz``): a virtual environment of ``python`` with ``wheel``
    and its dependencies. Returns ``{"output", "bytes", "requirements"}``."""
    try:
        import venv_pack
    except ImportError:
        raise BadRequestError("packing needs venv-pack: pip install venv-pack") from None
    if not output.endswith((".tar.gz", ".tgz", ".zip")):
        raise BadRequestError(f"{output}: name the archive .tar.gz, .tgz or .zip (Spark "
                              "unpacks those)")
    if not os.path.isfile(wheel):
        raise BadRequestError(f"no wheel at {wheel}: make one with `make wheel`")
    requirements = wheel_requirements(wheel, with_pyspark)
    with tempfile.TemporaryDirectory(prefix="bkspark-env-") as tmp:
        env = os.path.join(tmp, "environment")
        _run([python, "-m", "venv", env], "creating the environment")
        env_python = os.path.join(env, "bin", "python")
        _run([env_python, "-m", "pip", "install", "-q", "--no-deps", wheel],
             "installing the wheel")
        _run([env_python, "-m", "pip", "install", "-q", *requirements],
             "installing its dependencies")
        _run([env_python, "-c", "import bkspark._native, bkspark.client, bkspark.log"],
             "importing bkspark in the environment")
        venv_pack.pack(prefix=env, output=os.path.abspath(output), force=True)
    return {"output": output, "bytes": os.path.getsize(output), "requirements": requirements}
