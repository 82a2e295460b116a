"""The storage engine (``bkspark._native``) built for fuzzing: clang with AddressSanitizer,
UndefinedBehaviorSanitizer (every report fatal) and libFuzzer's coverage instrumentation
(``fuzzer-no-link``: atheris brings libFuzzer). The build is cached by the hash of its sources
and flags; it is loaded in place of the normal build by :func:`load`, in a process started
with atheris's ``asan_with_fuzzer.so`` preloaded (:func:`environment`)."""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FLAGS = ["-g", "-O1", "-fno-omit-frame-pointer", "-std=c11", "-fPIC",
         "-fsanitize=address,undefined,fuzzer-no-link", "-fno-sanitize-recover=all"]


def build(out_dir: str, cc: str = "clang", jobs: int = 2, source_dir: str | None = None) -> str:
    """Compile ``bookie_native/*.c`` (or ``source_dir``'s) into ``out_dir``; return the
    shared object's path.
    :raises RuntimeError: clang is missing or the build fails (its output in the message)."""
    source_dir = source_dir or os.path.join(REPO, "bookie_native")
    sources = sorted(glob.glob(os.path.join(source_dir, "*.c")))
    headers = sorted(glob.glob(os.path.join(source_dir, "*.h")))
    digest = hashlib.sha256(" ".join(FLAGS).encode())
    for path in sources + headers:
        with open(path, "rb") as f:
            digest.update(f.read())
    target = os.path.join(out_dir, f"_native-fuzz-{digest.hexdigest()[:16]}.so")
    if os.path.exists(target):
        return target
    os.makedirs(out_dir, exist_ok=True)
    include = ["-I" + sysconfig.get_paths()["include"], "-I" + source_dir]

    def compile_one(src: str) -> str:
        obj = os.path.join(out_dir, os.path.basename(src) + ".o")
        _run([cc, *FLAGS, *include, "-c", src, "-o", obj])
        return obj

    with ThreadPoolExecutor(jobs) as pool:
        objects = list(pool.map(compile_one, sources))
    _run([cc, "-shared", *FLAGS, *objects, "-lrocksdb", "-lpthread", "-o", target + ".tmp"])
    os.replace(target + ".tmp", target)
    return target


def _run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"{cmd[0]} not found: the fuzz build needs clang (Debian: clang)") from None
    if done.returncode:
        raise RuntimeError(f"fuzz build failed: {' '.join(cmd)}\n{done.stderr[-4000:]}")


def environment(base: dict | None = None) -> dict:
    """The environment of a fuzzing process: atheris's sanitizer runtime preloaded (the C
    extension's instrumentation needs it before Python starts), leaks not reported (the
    interpreter's own allocations would be), every sanitizer report fatal."""
    import atheris
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = os.path.join(atheris.path(), "asan_with_fuzzer.so")
    env["ASAN_OPTIONS"] = "detect_leaks=0:allocator_may_return_null=1:abort_on_error=0"
    env["PYTHONMALLOC"] = "malloc"  # Python objects too get red zones: a read past a bytes
                                    # object's end is reported, not served from its arena
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    return env


def load(path: str):
    """Import the fuzz build at ``path`` as ``bkspark._native`` (before anything imports
    the normal build)."""
    if "bkspark._native" in sys.modules:
        raise RuntimeError("bkspark._native was imported before the fuzz build was loaded")
    spec = importlib.util.spec_from_file_location("bkspark._native", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bkspark._native"] = module
    spec.loader.exec_module(module)
    import bkspark
    bkspark._native = module
    return module
