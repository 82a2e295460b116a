"""`bkspark auth`: the "A secured multi-host cluster" commands of docs/security.md, run as
written; what they make works (a token verifies with the public key, certificates chain to the
CA and carry the role), and every file is private."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

from bkspark.auth import tokens
from bkspark.auth.certs import identity_of
from bkspark.auth.roles import Role

README = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "security.md")


def _readme_auth_commands() -> list[str]:
    text = open(README).read()
    block = re.search(r"```bash\n(bkspark auth new-key.*?)```", text, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readmes_auth_commands_make_working_credentials(tmp_path):
    commands = _readme_auth_commands()
    assert len(commands) == 6 and all(c.startswith("bkspark auth ") for c in commands)
    for command in commands:
        argv = [sys.executable, "-m", "bkspark.cli.main", *command.split()[1:]]
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (command, done.stderr)
        assert "eyJ" not in done.stdout + done.stderr        # a token is never printed
    d = tmp_path / "bk-secrets"
    verifier = tokens.TokenVerifier.from_file(str(d / "token.pub"))
    etl = verifier.verify((d / "etl.token").read_text().strip())
    ops = verifier.verify((d / "ops.token").read_text().strip())
    assert (etl.subject, etl.role, ops.role) == ("spark-etl", Role.CLIENT, Role.ADMIN)
    assert identity_of((d / "recovery.pem").read_bytes())[:2] == ("recovery", Role.AUTORECOVERY)
    done = subprocess.run(["openssl", "verify", "-CAfile", str(d / "ca.pem"),
                           str(d / "bookie1.pem")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    for f in d.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_a_token_written_over_an_existing_file_makes_it_private(tmp_path):
    key = tmp_path / "token.key"
    key.write_bytes(tokens.new_signing_key())
    out = tmp_path / "t.token"
    out.write_text("old")
    out.chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "bkspark.cli.main", "auth", "mint-token",
                           "--key", str(key), "--subject", "s", "--role", "admin",
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
