"""Reference: parse ``[host[:port]/]repository[:tag][@sha256:digest]``.

The grammar is Docker's: the first path component is a registry host when it
contains a ``.`` or a ``:``, or is ``localhost``; otherwise the registry is
Docker Hub, whose one-component names live under ``library/``. No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError

DOCKER_HUB = "registry-1.docker.io"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPO_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Reference:
    """A parsed image reference. ``tag`` or ``digest`` names the manifest."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def target(self) -> str:
        """What goes after /manifests/: the digest if given, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        out = f"{self.registry}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


_HOST_RE = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)$")


def _host_problem(registry: str) -> str | None:
    """What is wrong with a registry's host[:port], or None."""
    host, port = registry, None
    if registry.startswith("["):  # IPv6: [addr] or [addr]:port
        end = registry.find("]")
        host, tail = registry[:end + 1], registry[end + 1:]
        if tail:
            if not tail.startswith(":"):
                return f"registry {registry!r} has junk after its IPv6 address"
            port = tail[1:]
    elif ":" in registry:
        host, port = registry.rsplit(":", 1)
    if not _HOST_RE.match(host):
        return f"registry host {host!r} is not a host name or address"
    if port is not None and not (port.isdigit() and port.isascii() and 0 < int(port) < 65536):
        return f"registry port {port!r} is not a number from 1 to 65535"
    return None


def parse(text: str) -> Reference:
    """Parse a reference; UsageError (exit 2) says what is wrong with it."""
    def bad(why: str) -> UsageError:
        return UsageError(
            f"{text!r} is not a registry reference ({why}); use HOST[:PORT]/REPOSITORY[:TAG], "
            "e.g. ghcr.io/acme/kernels:sm90 or 127.0.0.1:5000/kernels:ci", reference=text)

    rest = (text or "").strip()
    for scheme in ("oci://", "docker://"):
        if rest.startswith(scheme):
            rest = rest[len(scheme):]
    if not rest:
        raise bad("empty")
    digest = None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST_RE.match(digest):
            raise bad(f"digest {digest!r} is not sha256:<64 hex digits>")
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, remainder
        problem = _host_problem(registry)
        if problem:
            raise bad(problem)
    else:
        registry, path = DOCKER_HUB, rest
        if "/" not in path:
            path = f"library/{path}"
    tag = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = path.rsplit(":", 1)
        if not _TAG_RE.match(tag):
            raise bad(f"tag {tag!r} has characters a tag cannot have")
    if not _REPO_RE.match(path):
        raise bad(f"repository {path!r} must be lowercase letters, digits and separators")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry=registry, repository=path, tag=tag, digest=digest)
