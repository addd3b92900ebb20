"""Real local servers for the alert tests: an HTTP server that keeps the JSON posted to it,
an SMTP server (aiosmtpd) that requires STARTTLS with a self-signed certificate, and an
endpoint that accepts connections and never answers. All on 127.0.0.1."""

from __future__ import annotations

import datetime
import http.server
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator


class Hook(http.server.ThreadingHTTPServer):
    """Keeps (path, JSON body) of every POST."""

    daemon_threads = True

    def __init__(self, port: int = 0) -> None:
        self.received: list[tuple[str, Any]] = []
        super().__init__(("127.0.0.1", port), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        n = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(n).decode())
        self.server.received.append((self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Blackhole:
    """A listening socket that never accepts: a client connects and then waits for an answer."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1/localhost and its key, made with ``cryptography``."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@dataclass
class Mail:
    sender: str
    to: list[str]
    data: str
    tls: bool


@dataclass
class MailBox:
    messages: list[Mail] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's name
        self.messages.append(Mail(envelope.mail_from, list(envelope.rcpt_tos),
                                  envelope.content.decode("utf-8", "replace"), session.ssl is not None))
        return "250 OK"


def smtp_server(folder: Path) -> Iterator[tuple[MailBox, dict[str, str]]]:
    """An SMTP server requiring STARTTLS; yields its mailbox and the TRACKER_SMTP_* environment."""
    from aiosmtpd.controller import Controller

    cert, key = self_signed(folder)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    box = MailBox()
    port = free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port, server_hostname="localhost",
                            tls_context=context, require_starttls=True)
    controller.start()
    try:
        yield box, {"TRACKER_SMTP_HOST": "127.0.0.1", "TRACKER_SMTP_PORT": str(port),
                    "TRACKER_SMTP_CAFILE": str(cert), "TRACKER_SMTP_FROM": "tracker@test.invalid"}
    finally:
        controller.stop()


def wait_for(check: Callable[[], Any], timeout: float) -> Any:
    """Poll ``check`` until it returns something truthy or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value and time.monotonic() < deadline:
        time.sleep(0.05)
        value = check()
    return value
