"""`bkspark auth`: make the credentials of a secured cluster (docs/security.md).

    bkspark auth new-key DIR                      token.key (sign; keep it off the bookies)
                                                  and token.pub (for auth_token_public_key_file)
    bkspark auth mint-token --key DIR/token.key --subject NAME --role ROLE [--days N] --out FILE
    bkspark auth new-ca DIR                       ca.pem / ca.key
    bkspark auth issue-cert --ca DIR NAME [--host ADDR ...] [--role ROLE]
                                                  NAME.pem / NAME.key in DIR: a bookie's (with
                                                  --host) or a client's (with --role, its OU)

Every file is written 0600 in a 0700 directory; a token is written to a file, never printed
(a terminal's scrollback and ``ps`` are not secret).
"""
from __future__ import annotations

import argparse
import os
import sys

from bkspark import private
from bkspark.errors import BKError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="auth_command", required=True)
    p = sub.add_parser("new-key", help="a token signing key pair (token.key, token.pub)")
    p.add_argument("dir")
    p = sub.add_parser("mint-token", help="a token for a subject with a role, to a file")
    p.add_argument("--key", required=True, help="the signing key (token.key)")
    p.add_argument("--subject", required=True)
    p.add_argument("--role", required=True, choices=["client", "autorecovery", "admin"])
    p.add_argument("--days", type=float, default=90.0, help="lifetime (default 90)")
    p.add_argument("--out", required=True, help="file to write the token to (0600)")
    p = sub.add_parser("new-ca", help="a certificate authority (ca.pem, ca.key)")
    p.add_argument("dir")
    p = sub.add_parser("issue-cert", help="a bookie's or a client's certificate")
    p.add_argument("--ca", required=True, help="directory of ca.pem / ca.key")
    p.add_argument("name")
    p.add_argument("--host", action="append", default=[],
                   help="an address or DNS name the bookie serves on (repeatable)")
    p.add_argument("--role", choices=["client", "autorecovery", "admin"],
                   help="a client certificate's role (its OU)")
    p.add_argument("--days", type=int, default=825)


def run(args: argparse.Namespace) -> int:
    from bkspark.auth import tokens
    from bkspark.auth.certs import CertificateAuthority
    try:
        if args.auth_command == "new-key":
            private.make_dir(args.dir)
            key = tokens.new_signing_key()
            for name, data in (("token.key", key), ("token.pub", tokens.public_key_of(key))):
                with private.open_file(os.path.join(args.dir, name), "wb") as f:
                    f.write(data)
            print(f"wrote {args.dir}/token.key (keep it where tokens are minted) and "
                  f"{args.dir}/token.pub (auth_token_public_key_file of the bookies)")
        elif args.auth_command == "mint-token":
            with open(args.key, "rb") as f:
                token = tokens.mint(f.read(), args.subject, args.role, args.days * 86400)
            with private.open_file(args.out) as f:
                f.write(token + "\n")
            print(f"wrote a {args.role} token for {args.subject!r} to {args.out} "
                  f"(valid {args.days:g} days; client setting auth_token_file)")
        elif args.auth_command == "new-ca":
            ca = CertificateAuthority(args.dir).create()
            print(f"wrote {ca.cert_file} and {ca.key_file}")
        else:
            if not args.host and not args.role:
                raise BKError("give --host (a bookie's certificate) or --role (a client's)")
            key, cert = CertificateAuthority(args.ca).issue(args.name, role=args.role,
                                                            hosts=args.host, days=args.days)
            print(f"wrote {cert} and {key}")
    except (BKError, OSError, ValueError) as exc:
        print(f"bkspark auth: {exc}", file=sys.stderr)
        return 2
    return 0
