"""Regenerate bookie_pb2.py / bookie_pb2_grpc.py from bookie.proto (`make proto`).

The generated modules are checked in; tests/test_proto.py fails when they are stale.
"""
from __future__ import annotations

import pathlib
import re
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE / "bookie.proto"
OUTPUTS = ("bookie_pb2.py", "bookie_pb2_grpc.py", "bookie_pb2.pyi")


def generate(out_dir: pathlib.Path) -> None:
    """Run protoc on bookie.proto into out_dir, with package-relative imports."""
    from grpc_tools import protoc

    args = ["grpc_tools.protoc", f"-I{HERE}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", str(PROTO)]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed on " + str(PROTO))
    grpc_mod = out_dir / "bookie_pb2_grpc.py"
    text = re.sub(r"^import bookie_pb2 as", "from . import bookie_pb2 as",
                  grpc_mod.read_text(), flags=re.M)
    grpc_mod.write_text(text)


def _normalized(path: pathlib.Path) -> list[str]:
    """The module's lines without those naming tool/runtime versions (they vary by install)."""
    return [line for line in path.read_text().splitlines()
            if not re.search(r"version", line, re.I)]


def stale_outputs() -> list[str]:
    """Names of checked-in generated modules that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = pathlib.Path(tmp)
        generate(tmp_path)
        return [name for name in OUTPUTS
                if not (HERE / name).exists()
                or _normalized(HERE / name) != _normalized(tmp_path / name)]


if __name__ == "__main__":
    generate(HERE)
    print("generated", ", ".join(OUTPUTS), "in", HERE, file=sys.stderr)
