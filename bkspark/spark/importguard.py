"""A Spark Python worker that cannot import bkspark says what to install where.

Spark sends the connector's objects (the data source class and instance, its readers and
writers) pickled to Python processes it starts with an interpreter the connector does not
choose (``bkspark/spark/README.md``, "Which Python runs the connector"): planning processes
on the driver's host, task workers on every executor. A plain pickle of those objects names
their modules, so a Python without bkspark would fail while unpickling them, inside PySpark,
with a bare ``ModuleNotFoundError: No module named 'bkspark'`` and no word on which Python
on which host lacked it.

The connector's classes therefore pickle as a call to :func:`load` -- instances through
:class:`Guarded`, the data source class through the metaclass registered by
:func:`guard_class` -- and this module is pickled *by value*
(``cloudpickle.register_pickle_by_value``): :func:`load` and :func:`missing_message` travel
as code with every pickled object and need only the standard library on the other side.
:func:`load` imports the class's module and returns the class (or a bare instance whose
state pickle then restores); when that import fails it raises :class:`ImportError` with
:func:`missing_message`: the interpreter, its version, the host, the import error, and the
settings that choose that interpreter. Cost: a task's pickled command grows by about 3 kB
and takes some tens of microseconds longer to unpickle (``bench/spark_pickle_guard.py``;
figures in ``bkspark/spark/README.md``).
"""
from __future__ import annotations

import copyreg
import sys

README = "bkspark/spark/README.md, 'Which Python runs the connector'"


def missing_message(exc: BaseException) -> str:
    """Why this Python cannot run the connector and how to fix it (runs in that Python)."""
    import socket
    import sys as _sys
    exe = _sys.executable or "?"
    launched = (getattr(_sys, "orig_argv", None) or [exe])[0]
    python = exe if launched == exe else f"{launched} (= {exe})"
    return (
        f"bkspark cannot be imported by the Python that Spark started for format(\"bookkeeper\") "
        f"on host {socket.gethostname()}: {python}, Python {_sys.version.split()[0]} "
        f"({type(exc).__name__}: {exc}). Install bkspark into that Python on this host and on "
        "every host that runs Spark executors (pip install bkspark; --py-files cannot carry it: "
        "its C extension does not import from a zip), or make Spark start a Python that has it, "
        "at the same path on every host -- or ship one with the application: bkspark "
        "spark-env pack env.tar.gz --wheel bkspark-*.whl, then spark.archives="
        "env.tar.gz#environment and PYSPARK_PYTHON=./environment/bin/python. For format(\"bookkeeper\") found without registration "
        "Spark starts $PYSPARK_DRIVER_PYTHON, else $PYSPARK_PYTHON, else python3 (looked up in "
        "each host's PATH), as set in the environment that the driver's JVM started with; "
        "spark.pyspark.python and spark.executorEnv.PYSPARK_PYTHON do not apply to it. After "
        "bkspark.spark.register(spark) Spark starts the Python that it starts for Python UDFs "
        "(spark.pyspark.python under spark-submit and pyspark, else $PYSPARK_PYTHON of the "
        f"driver's Python). See {README}.")


def load(module: str, qualname: str, instance: bool):
    """The class ``module.qualname`` (``instance``: a new, empty instance of it); raises
    :class:`ImportError` with :func:`missing_message` when the module cannot be imported."""
    import importlib
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(missing_message(exc), name=module) from exc
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj.__new__(obj) if instance else obj


class Guarded:
    """Mixin: instances pickle as ``load(module, qualname, True)`` plus their ``__dict__``
    (restored after ``load`` ran, so nothing else of bkspark is unpickled before it)."""

    def __reduce__(self):
        cls = type(self)
        return load, (cls.__module__, cls.__qualname__, True), self.__dict__


def _reduce_class(cls):
    return load, (cls.__module__, cls.__qualname__, False)


def guard_class(meta: type) -> type:
    """A subclass of the metaclass ``meta`` whose classes pickle as ``load(module, qualname,
    False)`` (pickle consults ``copyreg`` for a class's metaclass before saving it by name)."""
    guarded = type(f"Guarded{meta.__name__}", (meta,), {"__module__": __name__})
    copyreg.pickle(guarded, _reduce_class)
    return guarded


def _register_by_value() -> None:
    from pyspark import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_register_by_value()
