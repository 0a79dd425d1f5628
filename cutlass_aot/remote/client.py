"""Client: the OCI distribution HTTP API, over the standard library.

Only what push and pull need: HEAD/GET/upload of blobs by digest, GET/PUT of
one manifest. It negotiates auth on the first 401 (HTTP basic, or a bearer
token from the registry's token endpoint, which is how Docker Hub, GHCR,
Harbor and ECR-via-token work), follows blob redirects to storage backends
(dropping credentials when the host changes), keeps one connection per host
alive, and turns every failure into a RegistryError that says what to do.

TLS is on unless ``plain_http``: certificates are checked against the system
store, or against ``ca_file`` / ``CUTLASS_AOT_REGISTRY_CA`` when given. A
client that speaks HTTPS never takes a step to plain HTTP (a redirect, an
upload Location, a token realm): that is a RegistryError, since the next
request would carry a credential or a token in the clear. Authorization is
kept per (scheme, host) for the same reason.

Time: every request (with its redirects, auth round trip and body) must end
within CUTLASS_AOT_REGISTRY_TIMEOUT seconds, plus one second per FLOOR_RATE
bytes a blob transfer moves; a watchdog shuts the connection down when time
is up, so a registry that drips bytes cannot hold a pull forever. Idempotent
requests (GET, HEAD, PUT by digest or tag) answered 429/502/503/504 are sent
again, at most RETRIES times, after the registry's Retry-After or an
exponential back-off, each capped at MAX_BACKOFF seconds.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

from .. import knobs
from ..errors import RegistryError
from . import auth
from .reference import Reference

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
_REDIRECTS = {301, 302, 303, 307, 308}
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
CHUNK = 1 << 20
# The most a whole (non-streamed) body may hold: the OCI distribution spec
# has registries accept manifests up to 4 MiB; a token or an error message is
# far smaller. A registry that announces or sends more is refused, never
# buffered.
MAX_BODY = 4 << 20
# A transfer may take one more second per this many bytes (2 Mbit/s): a slow
# link still finishes a large blob, a server dripping bytes still ends.
FLOOR_RATE = 256 << 10
# Statuses that say "later" rather than "no", and how often to try again.
_RETRY_STATUSES = {429, 502, 503, 504}
_IDEMPOTENT = {"GET", "HEAD", "PUT"}
RETRIES = 4
MAX_BACKOFF = 10.0
# What a bearer token may hold: visible ASCII (RFC 6750's b64token and
# JWTs); a control character would split the header it goes into.
_TOKEN_RE = re.compile(r"^[\x21-\x7e]{1,65536}$")


def _shown(path: str) -> str:
    """A request path for messages: without its query, which for a storage
    redirect carries a presigned credential."""
    return path.split("?", 1)[0]

BodyFactory = Callable[[], IO[bytes] | bytes]


class Client:
    """One registry and repository; ``actions`` is the token scope asked for."""

    def __init__(self, ref: Reference, *, plain_http: bool = False, ca_file: str | None = None,
                 actions: str = "pull", timeout: float = 60.0):
        self.ref = ref
        self.scheme = "http" if plain_http else "https"
        self.timeout = timeout
        self.actions = actions
        self.ctx = None
        if not plain_http:
            cafile = ca_file or knobs.registry_ca()
            try:
                self.ctx = ssl.create_default_context(cafile=cafile)
            except (OSError, ssl.SSLError) as exc:
                raise RegistryError(f"cannot load the CA bundle {cafile} ({exc})", registry=ref.registry,
                                    reference=str(ref), status=None) from None
        self.creds = auth.find(ref.registry)
        self.time_limit = knobs.registry_timeout()
        # (scheme, host) -> Authorization header value: what was negotiated
        # over HTTPS is never sent over HTTP to the same host
        self._authz: dict[tuple[str, str], str] = {}
        self._conns: dict[tuple[str, str], http.client.HTTPConnection] = {}
        self._expired = threading.Event()  # set by the watchdog of the deadline in force
        self._deadline_depth = 0

    # ------------------------------------------------------------ plumbing
    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def _conn(self, scheme: str, host: str, fresh: bool = False) -> http.client.HTTPConnection:
        key = (scheme, host)
        if fresh and key in self._conns:
            self._conns.pop(key).close()
        if key not in self._conns:
            # 1 MiB writes for blob bodies (http.client's default is 8 KiB).
            if scheme == "https":
                ctx = self.ctx or ssl.create_default_context()
                self._conns[key] = http.client.HTTPSConnection(host, timeout=self.timeout, context=ctx,
                                                               blocksize=CHUNK)
            else:
                self._conns[key] = http.client.HTTPConnection(host, timeout=self.timeout, blocksize=CHUNK)
        conn = self._conns[key]
        if conn.sock is None:
            conn.connect()
            # Headers and body go out in separate writes: without TCP_NODELAY,
            # Nagle holds the body until the server's delayed ACK of the headers.
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _error(self, message: str, status: int | None, **data: object) -> RegistryError:
        return RegistryError(message, registry=self.ref.registry, reference=str(self.ref), status=status,
                             **data)

    def budget(self, nbytes: int = 0) -> float:
        """Seconds a request moving ``nbytes`` of body may take."""
        return self.time_limit + max(nbytes, 0) / FLOOR_RATE

    @property
    def expired(self) -> bool:
        """Whether the deadline in force has passed (its connections are shut)."""
        return self._expired.is_set()

    @contextmanager
    def deadline(self, seconds: float, what: str) -> Iterator[None]:
        """Bound everything inside to ``seconds``; a deadline inside another is
        the outer one. When time is up a watchdog thread shuts down every
        connection of this client (again as new ones open), so a blocked read
        returns; the failure that follows becomes a RegistryError that says so.
        """
        if self._deadline_depth:
            yield
            return
        done, expired = threading.Event(), threading.Event()

        def watch() -> None:
            if done.wait(seconds):
                return
            expired.set()
            while not done.is_set():
                for conn in list(self._conns.values()):
                    sock = conn.sock
                    if sock is not None:
                        try:  # socket.socket's: an SSLSocket's own would drop its state under the reader
                            socket.socket.shutdown(sock, socket.SHUT_RDWR)
                        except OSError:
                            pass
                done.wait(0.1)

        self._expired = expired
        self._deadline_depth += 1
        watcher = threading.Thread(target=watch, name="cutlass-aot-registry-deadline", daemon=True)
        watcher.start()
        try:
            yield
        except (RegistryError, OSError, http.client.HTTPException) as exc:
            if not expired.is_set() or (isinstance(exc, RegistryError) and exc.data.get("timeout")):
                raise
            raise self._error(
                f"{what}: {self.ref.registry} did not finish within {seconds:.0f} s "
                f"(CUTLASS_AOT_REGISTRY_TIMEOUT={self.time_limit:g}"
                + (f", plus a second per {FLOOR_RATE >> 10} KiB of body" if seconds > self.time_limit else "")
                + "); the registry or the network stalled or is very "
                "slow: retry (a pull resumes where it stopped), or raise CUTLASS_AOT_REGISTRY_TIMEOUT "
                "for a slow link", None, timeout=seconds) from None
        finally:
            done.set()
            self._deadline_depth -= 1
            watcher.join()
            if expired.is_set():
                self.close()  # their sockets were shut down
                self._expired = threading.Event()

    def _target(self, url: str, what: str) -> tuple[str, str, str]:
        """(scheme, host, path with query) of an absolute URL the registry sent.

        A URL that does not parse, or has no host, or a port out of range, is
        a RegistryError that does not repeat it (it may hold a presigned
        credential).
        """
        try:
            parts = urllib.parse.urlsplit(url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018 - raises ValueError for a port out of range
        except ValueError:
            ok = False
        if not ok:
            raise self._error(
                f"{self.ref.registry} sent a malformed {what} URL (not an absolute http(s) URL with a "
                "valid host and port; not shown, since it may carry a credential): the registry or "
                "a proxy in front of it is misconfigured", None)
        return parts.scheme, parts.netloc, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def _unreachable(self, host: str, exc: BaseException) -> RegistryError:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return self._error(
                f"the TLS certificate of {host} is not trusted ({exc.verify_message}); pass --ca-file "
                "(or set CUTLASS_AOT_REGISTRY_CA) with the CA that signed it, or --plain-http for a "
                "local registry without TLS", None)
        if isinstance(exc, ssl.SSLError):
            return self._error(
                f"TLS with {host} failed ({exc.reason or exc}); if the registry speaks plain HTTP, "
                "pass --plain-http", None)
        return self._error(
            f"cannot reach registry {host} ({type(exc).__name__}: {exc}); check that it is running "
            "and the reference's host and port, then retry (a pull resumes where it stopped)", None)

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                body: BodyFactory | None = None, expect: tuple[int, ...] = (200,),
                stream: bool = False) -> http.client.HTTPResponse:
        """Send a request; returns the response with a status in ``expect``.

        Non-streamed responses are read fully (``resp.data``). A streamed one
        must be read to the end (or the client closed) before the next call;
        its body is not under this call's deadline (the caller sets its own).
        """
        if url.startswith("/"):
            scheme, host, path = self.scheme, self.ref.registry, url
        else:
            scheme, host, path = self._target(url, "upload Location")
        length = (headers or {}).get("Content-Length", "0") if body is not None else "0"
        nbytes = int(length) if length.isdigit() else 0
        with self.deadline(self.budget(nbytes), f"{method} {_shown(path)}"):
            return self._request(method, scheme, host, path, headers, body, expect, stream)

    def _request(self, method: str, scheme: str, host: str, path: str, headers: dict[str, str] | None,
                 body: BodyFactory | None, expect: tuple[int, ...], stream: bool) -> http.client.HTTPResponse:
        authed_once = False
        hops = retries = 0
        while hops < 8:
            h = dict(headers or {})
            if (scheme, host) in self._authz:
                h["Authorization"] = self._authz[(scheme, host)]
            resp = self._send(scheme, host, method, path, h, body)
            # Credentials answer the registry's own challenge only: a
            # redirect's storage host that asks for them gets none.
            if resp.status == 401 and not authed_once and host == self.ref.registry \
                    and self._negotiate(scheme, host, resp):
                authed_once = True
                hops += 1
                continue
            if resp.status in _REDIRECTS and method in ("GET", "HEAD"):
                location = resp.getheader("Location")
                self._drain(resp)
                if not location:
                    raise self._error(f"{method} {_shown(path)} on {host}: HTTP {resp.status} redirect "
                                      "without a Location header; the registry is misconfigured",
                                      resp.status)
                try:
                    target = urllib.parse.urljoin(f"{scheme}://{host}{path}", location)
                except ValueError:
                    target = ""  # refused just below, without repeating it
                scheme, host, path = self._target(target, "redirect")
                hops += 1
                continue
            if resp.status in expect:
                if not stream:
                    resp.data = self._read_body(resp, method, _shown(path))  # type: ignore[attr-defined]
                return resp
            if resp.status in _RETRY_STATUSES and method in _IDEMPOTENT and retries < RETRIES:
                delay = self._backoff(resp, retries)
                self._drain(resp)
                retries += 1
                time.sleep(delay)
                continue
            self._raise_for(resp, method, _shown(path), host=host,
                            retried=retries or None)
        raise self._error(f"{method} {_shown(path)}: too many redirects", None)

    @staticmethod
    def _backoff(resp: http.client.HTTPResponse, attempt: int) -> float:
        """Seconds to wait before sending again: the registry's Retry-After
        (in seconds; an HTTP date is not trusted to a clock), else 0.5, 1, 2, 4."""
        after = (resp.getheader("Retry-After") or "").strip()
        delay = float(after) if after.isdigit() else 0.5 * 2 ** attempt
        return min(delay, MAX_BACKOFF)

    def _send(self, scheme: str, host: str, method: str, path: str, headers: dict[str, str],
              body: BodyFactory | None) -> http.client.HTTPResponse:
        if scheme == "http" and self.scheme == "https":
            raise self._error(
                f"{self.ref.registry} speaks HTTPS but sent this client to plain HTTP for {method} "
                f"{_shown(path)} on {host} (a redirect, an upload Location or a token realm that "
                "downgrades https:// to http://); refusing, since the request would carry credentials "
                "or data in the clear: fix the registry's (or its proxy's) URLs, or pass --plain-http "
                "if this registry is meant to run without TLS", None, downgrade=True)
        for attempt in (0, 1):
            payload = None
            if self._expired.is_set():  # the watchdog shut the last connection: open no new one
                raise self._error(f"{method} {_shown(path)} on {host}: out of time", None)
            try:
                conn = self._conn(scheme, host, fresh=attempt > 0)
                payload = body() if body is not None else None
                if payload is None and method in ("POST", "PUT", "PATCH"):
                    headers.setdefault("Content-Length", "0")
                conn.request(method, path, body=payload, headers=headers)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                # A kept-alive connection the server closed meanwhile: retry once fresh.
                if attempt:
                    raise self._unreachable(host, exc) from None
            except (OSError, http.client.HTTPException) as exc:
                if isinstance(exc, socket.timeout | TimeoutError | ConnectionRefusedError | ssl.SSLError) \
                        or attempt:
                    raise self._unreachable(host, exc) from None
            except ValueError:
                # http.client refuses a header value or URL with control
                # characters (a redirect's Location, say); neither is
                # repeated here, since either may hold a credential
                raise self._error(f"a {method} request to {host} holds a header or URL that HTTP "
                                  "cannot carry (a control character); the registry or one of its "
                                  "redirects sent it", None) from None
            finally:
                if payload is not None and hasattr(payload, "close"):
                    payload.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def _negotiate(self, scheme: str, host: str, resp: http.client.HTTPResponse) -> bool:
        """Answer a 401 challenge; False if there is nothing to try."""
        challenge = resp.getheader("WWW-Authenticate", "")
        self._drain(resp)
        kind = challenge.split(" ", 1)[0].lower()
        params = dict(_CHALLENGE.findall(challenge))
        if kind == "basic":
            if self.creds is None:
                return False
            self._authz[(scheme, host)] = self.creds.basic()
            return True
        if kind == "bearer" and params.get("realm"):
            query = {"service": params.get("service", "")}
            query["scope"] = f"repository:{self.ref.repository}:{self.actions}"
            url = params["realm"] + ("&" if "?" in params["realm"] else "?") + urllib.parse.urlencode(query)
            realm_scheme, realm_host, realm_path = self._target(url, "token realm")
            # credentials scoped to named hosts (the env pair) go to no other realm
            send = self.creds is not None and self.creds.may_send_to(realm_host)
            h = {"Authorization": self.creds.basic()} if send else {}
            tresp = self._send(realm_scheme, realm_host, "GET", realm_path, h, None)
            data = self._read_body(tresp, "GET", "token endpoint")
            if tresp.status != 200:
                self._raise_for(tresp, "GET", "token endpoint", data)
            try:
                doc = json.loads(data)
                token = doc.get("token") or doc.get("access_token")
            except (ValueError, AttributeError, RecursionError):
                token = None
            if not token:
                raise self._error(f"the token endpoint of {host} returned no token", tresp.status)
            if not isinstance(token, str) or not _TOKEN_RE.match(token):
                # not repeated: it is a secret, even when malformed
                raise self._error(f"the token endpoint of {host} returned a token that is not "
                                  "visible ASCII (a bearer token cannot hold spaces or control "
                                  "characters); the registry's auth is misconfigured", tresp.status)
            self._authz[(scheme, host)] = f"Bearer {token}"
            return True
        return False

    def _drain(self, resp: http.client.HTTPResponse, limit: int = 1 << 16) -> None:
        """Discard a small body (a redirect's or a challenge's) so the connection
        can be reused; a large or broken one closes the connection instead."""
        try:
            length = resp.getheader("Content-Length")
            if length is not None and (not length.strip().isdigit() or int(length) > limit):
                raise ValueError
            if len(resp.read(limit + 1)) > limit:
                raise ValueError
        except (OSError, ValueError, http.client.HTTPException):
            self.close()

    def _read_body(self, resp: http.client.HTTPResponse, method: str, what: str,
                   limit: int = MAX_BODY) -> bytes:
        """A whole response body of at most ``limit`` bytes; a connection that
        breaks mid-body, or a body that announces or holds more, is a RegistryError."""
        if method == "HEAD":  # Content-Length is the resource's; there is no body
            resp.read()
            return b""
        length = resp.getheader("Content-Length")
        too_big = self._error(
            f"{method} {what}: {self.ref.registry} sent a response of "
            f"{length if length is not None else 'more than ' + str(limit)} bytes, more than the "
            f"{limit} this request can hold; the registry is misbehaving or this is not the "
            "registry you meant", resp.status)
        if length is not None and length.strip().isdigit() and int(length) > limit:
            self.close()
            raise too_big
        try:
            data = resp.read(limit + 1)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise self._error(f"{method} {what}: the connection to {self.ref.registry} broke mid-response "
                              f"({type(exc).__name__}: {exc}); retry (a pull resumes where it stopped)",
                              resp.status) from None
        if len(data) > limit:
            self.close()
            raise too_big
        if length is not None and length.strip().isdigit() and len(data) < int(length):
            # http.client returns what came before the peer (or the deadline's
            # watchdog) closed the connection, without an error
            self.close()
            raise self._error(f"{method} {what}: the connection to {self.ref.registry} broke mid-response "
                              f"({len(data)} of {int(length)} bytes); retry (a pull resumes where it "
                              "stopped)", resp.status)
        return data

    def _raise_for(self, resp: http.client.HTTPResponse, method: str, what: str,
                   data: bytes | None = None, host: str | None = None, retried: int | None = None) -> None:
        if data is None:
            # An error body is only read for its message. Registries can send a
            # Content-Length that is not the body's (distribution answers an
            # unsatisfiable Range with the blob's length over a 33-byte text), so
            # keep what arrived and drop the connection instead of failing here.
            try:
                data = resp.read(1 << 16)  # enough for any message; the rest is dropped
                if not resp.isclosed():
                    self.close()
            except http.client.IncompleteRead as exc:
                data = exc.partial
                self.close()
            except (OSError, http.client.HTTPException):
                data = b""
                self.close()
        detail = ""
        try:
            errs = json.loads(data).get("errors") or []
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errs)
        except (ValueError, AttributeError, TypeError, RecursionError):
            detail = data[:200].decode("utf-8", "replace").strip()
        status = resp.status
        who = self.ref.registry
        if host is not None and host != who:
            # a redirect's target (blob storage) answered; credentials never go there
            raise self._error(
                f"{method} {what} on {host}, where {who} redirected the download, failed: HTTP "
                f"{status} {resp.reason} {detail}".strip() + (
                    f"; the storage asked for credentials, which cutlass-aot sends only to {who}: "
                    "the registry's redirect should carry its own authorization (a presigned URL)"
                    if status in (401, 403) else ""), status)
        if status == 401:
            if self.creds is None:
                hint = (f"it requires credentials: run `docker login {who}`, or set "
                        "CUTLASS_AOT_REGISTRY_USER and CUTLASS_AOT_REGISTRY_PASSWORD with "
                        f"CUTLASS_AOT_REGISTRY_HOST={who}")
            else:
                hint = f"it refused the credentials from {self.creds.source}; log in again"
            raise self._error(f"401 Unauthorized from {who} for {self.ref}: {hint}", 401)
        if status == 403:
            raise self._error(f"403 Forbidden from {who}: the account may not {method} {self.ref} "
                              f"({detail or 'denied'}); ask for {self.actions} access", 403)
        if status == 400 and "HTTPS" in detail:
            raise self._error(f"{who} speaks HTTPS; drop --plain-http", 400)
        if retried is not None:
            raise self._error(f"{method} {what} on {who} failed: HTTP {status} {resp.reason} {detail}".strip()
                              + f", still after {retried} retries; the registry is overloaded or down: "
                              "retry later (a pull resumes where it stopped)", status)
        raise self._error(f"{method} {what} on {who} failed: HTTP {status} {resp.reason} {detail}".strip(),
                          status)

    # ----------------------------------------------------------------- API
    def _repo(self, tail: str) -> str:
        return f"/v2/{self.ref.repository}/{tail}"

    def blob_exists(self, digest: str) -> bool:
        resp = self.request("HEAD", self._repo(f"blobs/{digest}"), expect=(200, 404))
        return resp.status == 200

    def upload_blob(self, digest: str, size: int, opener: BodyFactory) -> None:
        """POST an upload session, then PUT the whole blob with its digest."""
        resp = self.request("POST", self._repo("blobs/uploads/"), expect=(202,))
        location = resp.getheader("Location")
        if not location:
            raise self._error("the registry started an upload without a Location", resp.status)
        sep = "&" if "?" in location else "?"
        url = f"{location}{sep}digest={urllib.parse.quote(digest)}"
        if url.startswith("/"):
            url = f"{self.scheme}://{self.ref.registry}{url}"
        self.request("PUT", url, body=opener, expect=(201,),
                     headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})

    def open_blob(self, digest: str, offset: int = 0) -> http.client.HTTPResponse:
        """Stream a blob from ``offset`` (206 when the registry honours the range)."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            return self.request("GET", self._repo(f"blobs/{digest}"), headers=headers,
                                expect=(200, 206), stream=True)
        except RegistryError as exc:
            if exc.data.get("status") == 404:
                raise self._error(f"blob {digest} is listed by {self.ref} but missing from "
                                  f"{self.ref.registry}; push the cache again", 404) from None
            raise

    def get_manifest(self) -> tuple[bytes, str | None]:
        """(body, Docker-Content-Digest header) of the reference's manifest."""
        try:
            resp = self.request("GET", self._repo(f"manifests/{self.ref.target}"),
                                headers={"Accept": MANIFEST_TYPE})
        except RegistryError as exc:
            if exc.data.get("status") == 404:
                raise self._error(f"{self.ref} not found: {self.ref.registry} has no "
                                  f"{'manifest' if self.ref.digest else 'tag'} {self.ref.target!r} in "
                                  f"{self.ref.repository}; push it first or check the name", 404) from None
            raise
        return resp.data, resp.getheader("Docker-Content-Digest")  # type: ignore[attr-defined]

    def put_manifest(self, body: bytes) -> str | None:
        resp = self.request("PUT", self._repo(f"manifests/{self.ref.target}"), body=lambda: body,
                            headers={"Content-Type": MANIFEST_TYPE, "Content-Length": str(len(body))},
                            expect=(201,))
        return resp.getheader("Docker-Content-Digest")
