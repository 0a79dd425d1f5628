"""A real OCI registry for tests: Debian's `docker-registry` (CNCF distribution).

``RegistryServer`` writes a config, starts the registry on 127.0.0.1 on a free
port with its storage in a temp dir, waits until ``/v2/`` answers, and stops
it. Options: basic auth (an htpasswd file made with apache2-utils' bcrypt
``htpasswd``) and TLS (a self-signed certificate for 127.0.0.1 made with
openssl, which clients trust through ``--ca-file``).

Where the package is missing the tests skip with a message naming it; with
CI=true they fail instead, because CI must run them (`make test` installs the
package where it can).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

PACKAGE_HINT = "Debian's docker-registry package (apt-get install docker-registry apache2-utils)"


def require(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path:
        return path
    msg = f"needs `{tool}` from {package}; `make test` installs it as root where apt-get exists"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true: {msg}")
    pytest.skip(msg)


def registry_binary() -> str:
    for name in ("docker-registry", "registry"):
        if shutil.which(name):
            return shutil.which(name)
    return require("docker-registry", PACKAGE_HINT)


def self_signed(root: Path) -> tuple[str, str]:
    """(certificate, key) files of a self-signed certificate for 127.0.0.1 under ``root``."""
    openssl = require("openssl", "the openssl package")
    cert, key = Path(root) / "cert.pem", Path(root) / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return str(cert), str(key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RegistryServer:
    """One registry process; ``host`` is what goes into references."""

    def __init__(self, root: Path, *, tls: bool = False, user: tuple[str, str] | None = None):
        self.binary = registry_binary()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.storage = self.root / "storage"
        self.tls, self.user = tls, user
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.ca_file: str | None = None
        self.proc: subprocess.Popen | None = None
        self._write_config()

    def _write_config(self) -> None:
        lines = [
            "version: 0.1",
            "log: {level: error, accesslog: {disabled: true}}",
            "storage:",
            f"  filesystem: {{rootdirectory: {self.storage}}}",
            "  delete: {enabled: true}",
            "http:",
            f"  addr: {self.host}",
            "  secret: cutlass-aot-test-secret",
        ]
        if self.tls:
            cert, key = self_signed(self.root)
            lines.append(f"  tls: {{certificate: {cert}, key: {key}}}")
            self.ca_file = cert
        if self.user:
            htpasswd = require("htpasswd", "apache2-utils (apt-get install apache2-utils)")
            out = subprocess.run([htpasswd, "-Bbn", *self.user], check=True, capture_output=True, text=True)
            (self.root / "htpasswd").write_text(out.stdout)
            lines += ["auth:", f"  htpasswd: {{realm: cutlass-aot-test, path: {self.root / 'htpasswd'}}}"]
        (self.root / "config.yml").write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 30) -> RegistryServer:
        log = open(self.root / "registry.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen([self.binary, "serve", str(self.root / "config.yml")],
                                     stdout=log, stderr=log, start_new_session=True)
        import ssl  # noqa: PLC0415

        ctx = ssl.create_default_context(cafile=self.ca_file) if self.tls else None
        url = f"{'https' if self.tls else 'http'}://{self.host}/v2/"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"registry exited: {(self.root / 'registry.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(url, timeout=2, context=ctx).read()
                return self
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"registry did not answer on {url} within {timeout}s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def blob_file(self, sha: str) -> Path:
        """Where the filesystem driver keeps a blob's bytes."""
        return self.storage / "docker/registry/v2/blobs/sha256" / sha[:2] / sha / "data"

    def flags(self) -> list[str]:
        return ["--ca-file", self.ca_file] if self.tls else ["--plain-http"]


class CuttingProxy:
    """A TCP relay to the registry that, after ``limit`` response bytes, kills
    the registry (SIGKILL: the registry is gone) and drops every connection."""

    def __init__(self, server: RegistryServer, limit: int):
        self.server, self.limit, self.sent = server, limit, 0
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.server.port))
            self.socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if downstream:
                    self.sent += len(data)
                    if self.sent > self.limit and not self.cut.is_set():
                        self.cut.set()
                        self.server.stop(signal.SIGKILL)
                        self.listener.close()
                        for s in self.socks:
                            try:
                                s.shutdown(socket.SHUT_RDWR)  # wakes the peer now, not at its timeout
                            except OSError:
                                pass
                            s.close()
                        return
                dst.sendall(data)
        except OSError:
            pass


class HookProxy:
    """An HTTP relay in front of a real registry (or standing alone) that a
    test can make lie: ``hook(method, path, headers)`` returns None to
    forward the request upstream, or ``(status, headers, body)`` to answer
    itself; ``post(method, path, (status, headers, body))`` may rewrite an
    upstream answer. Every request is logged as (method, path, headers) in
    ``log``. ``headers`` is a list of pairs; a ``Content-Length`` in it is
    sent as given (so a test can announce more than it sends). ``body`` may
    be an iterable of chunks instead of bytes, each sent and flushed as the
    iterable yields it (a registry that drips); give its Content-Length then.

    With ``tls=(certificate, key)`` the proxy speaks HTTPS and, on the same
    port, plain HTTP (told apart by the first byte a client sends), as a
    registry behind a careless load balancer does; requests that came over
    plain HTTP are also logged in ``plain_log``. The upstream is plain HTTP."""

    def __init__(self, upstream: str | None = None, hook=None, post=None,
                 tls: tuple[str, str] | None = None):
        import http.client  # noqa: PLC0415
        import http.server  # noqa: PLC0415
        import socketserver  # noqa: PLC0415
        import ssl  # noqa: PLC0415

        self.upstream, self.hook, self.post = upstream, hook, post
        self.log: list[tuple[str, str, dict]] = []
        self.plain_log: list[tuple[str, str, dict]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _relay(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                outer.log.append((self.command, self.path, dict(self.headers)))
                if tls and not isinstance(self.connection, ssl.SSLSocket):
                    outer.plain_log.append((self.command, self.path, dict(self.headers)))
                answer = outer.hook(self.command, self.path, self.headers) if outer.hook else None
                if answer is None:
                    conn = http.client.HTTPConnection(outer.upstream, timeout=30)
                    fwd = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    conn.request(self.command, self.path, body=body or None, headers=fwd)
                    resp = conn.getresponse()
                    data = resp.read()
                    skip = ("transfer-encoding", "connection", "content-length")
                    answer = (resp.status, [(k, v) for k, v in resp.getheaders() if k.lower() not in skip],
                              data)
                    conn.close()
                    if outer.post:
                        answer = outer.post(self.command, self.path, answer) or answer
                status, headers, data = answer
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                if not any(k.lower() == "content-length" for k, _ in headers):
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    try:
                        for piece in [data] if isinstance(data, bytes) else data:
                            self.wfile.write(piece)
                            self.wfile.flush()
                    except OSError:
                        pass
                self.close_connection = any(k.lower() == "content-length" for k, _ in headers)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _relay

        context = None
        if tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*tls)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

            def get_request(self):
                sock, addr = self.socket.accept()
                if context is not None and sock.recv(1, socket.MSG_PEEK) == b"\x16":  # a TLS hello
                    sock = context.wrap_socket(sock, server_side=True)
                return sock, addr

        self.server = Server(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
