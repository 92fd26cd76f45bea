"""Throw-away certificates for TLS tests, made with the openssl command line (no extra Python deps).

A CA, a server certificate for 127.0.0.1/localhost and a client certificate,
all signed by the CA; PEM files in one folder. Kafka (KIP-651) reads PEM key
stores directly, so the same files serve brokers, the proxy and clients.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    server_pem: Path     # key + certificate in one file, for Kafka's PEM key store
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is not installed (apt-get install openssl)")
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "2", "-subj", "/CN=txnguard-test-ca", cwd=folder)
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name if name == 'client' else 'localhost'}", cwd=folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", "san.cnf", cwd=folder)
    # Kafka's PEM key store wants an unencrypted PKCS#8 key followed by the certificate chain.
    _openssl("pkcs8", "-topk8", "-nocrypt", "-in", "server.key", "-out", "server.pk8", cwd=folder)
    (folder / "server-store.pem").write_text((folder / "server.pk8").read_text() + (folder / "server.pem").read_text())
    return Certs(folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "server-store.pem",
                 folder / "client.pem", folder / "client.key")
