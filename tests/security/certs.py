"""Certificates made with the openssl command line, for TLS tests on a real server."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate, and an
    unrelated CA that signed none of them."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}: {done.stderr}")


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN=EchoMQ test {name}", "-keyout", key.name, "-out", cert.name,
             cwd=directory)
    return cert, key


def _signed(directory: Path, name: str, ca: tuple[Path, Path],
            extensions: str) -> tuple[Path, Path]:
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
             "-keyout", key.name, "-out", csr.name, cwd=directory)
    _openssl("x509", "-req", "-in", csr.name, "-CA", ca[0].name, "-CAkey", ca[1].name,
             "-CAcreateserial", "-days", "2", "-extfile", ext.name, "-out", cert.name,
             cwd=directory)
    return cert, key


def make_certs(directory: Path) -> Certs:
    if shutil.which("openssl") is None:
        raise RuntimeError("the TLS tests make their certificates with the openssl command")
    ca = _ca(directory, "ca")
    other = _ca(directory, "other-ca")
    server = _signed(directory, "server", ca,
                     "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
                     "extendedKeyUsage = serverAuth\n")
    client = _signed(directory, "client", ca, "extendedKeyUsage = clientAuth\n")
    for path in directory.glob("*.key"):
        path.chmod(0o600)
    return Certs(ca=ca[0], server_cert=server[0], server_key=server[1],
                 client_cert=client[0], client_key=client[1], other_ca=other[0])
