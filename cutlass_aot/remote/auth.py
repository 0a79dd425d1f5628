"""Auth: find credentials for a registry host, the way docker does.

Order (first that yields credentials wins):

1. ``CUTLASS_AOT_REGISTRY_USER`` and ``CUTLASS_AOT_REGISTRY_PASSWORD``, for
   the one host named by ``CUTLASS_AOT_REGISTRY_HOST`` only (and, for Docker
   Hub, its token service): any other registry, or a token realm elsewhere,
   never sees them. The pair without the host is a UsageError, since
   sending it to whichever registry asks would leak it;
2. the docker config (``$DOCKER_CONFIG/config.json``, else
   ``~/.docker/config.json``): ``credHelpers[host]``, else ``credsStore``,
   run as ``docker-credential-<name> get`` with the server address on stdin
   (the credential-helper protocol: docker's own address first, e.g.
   ``https://index.docker.io/v1/`` for Docker Hub or an ``auths`` key that
   names the host, then the bare host); a helper that has nothing for the
   host falls through;
3. the same file's ``auths[host].auth`` (base64 ``user:password``) or
   ``username``/``password`` fields.

No credentials is fine: the registry may allow anonymous access, and a 401
then says how to log in. Credentials are never logged or put in errors.
Each Credentials says which hosts it may be sent to (``may_send_to``): the
client asks before it answers a token realm with them.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .. import knobs

ENV_SOURCE = "CUTLASS_AOT_REGISTRY_USER/PASSWORD"
# Docker Hub's token realm; env credentials for Docker Hub may answer it.
DOCKER_HUB_AUTH = "auth.docker.io"
# The server address `docker login` stores Docker Hub's credentials under.
DOCKER_HUB_V1 = "https://index.docker.io/v1/"


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)  # never in a repr, a log line or a traceback's locals
    source: str  # where they came from, for messages ("env", "docker config", "helper x")
    # The hosts they may be sent to; None: the registry's, and the token realm
    # its challenge names (docker's rule for credentials it stores per registry).
    hosts: frozenset[str] | None = None

    def may_send_to(self, host: str) -> bool:
        return self.hosts is None or host.lower() in self.hosts

    def basic(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()


def docker_config_path() -> Path:
    base = os.environ.get("DOCKER_CONFIG")
    return Path(base) / "config.json" if base else Path.home() / ".docker" / "config.json"


def _host_of(key: str) -> str:
    """'https://host:port/v1/' -> 'host:port' (docker config keys vary)."""
    for prefix in ("https://", "http://"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key.split("/", 1)[0]


def _aliases(host: str) -> set[str]:
    # Docker Hub is stored under its v1 index name by `docker login`.
    if host in ("registry-1.docker.io", "docker.io", "index.docker.io"):
        return {"registry-1.docker.io", "docker.io", "index.docker.io"}
    return {host}


def _from_helper(helper: str, host: str) -> Credentials | None:
    try:
        res = subprocess.run([f"docker-credential-{helper}", "get"], input=host, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None  # "credentials not found in native keychain" and the like
    try:
        data = json.loads(res.stdout)
        user, secret = data["Username"], data["Secret"]
    except (ValueError, KeyError, TypeError):
        return None
    if not secret:
        return None
    return Credentials(user, secret, f"credential helper docker-credential-{helper}")


def _from_env(host: str) -> Credentials | None:
    """The env pair, if it is scoped to ``host``; UsageError if it is not scoped."""
    pair = knobs.registry_credentials()
    if not pair:
        return None
    scope = knobs.registry_host()  # UsageError: the pair without its host
    names = _aliases(_host_of(scope.strip()).lower())
    if host.lower() not in names:
        return None  # credentials of another registry: this one gets docker's, or none
    if "docker.io" in names:
        names = names | {DOCKER_HUB_AUTH}
    return Credentials(pair[0], pair[1], ENV_SOURCE, hosts=frozenset(names))


def find(host: str) -> Credentials | None:
    """Credentials for ``host`` (``name[:port]``), or None.

    Raises UsageError when the env pair is set without CUTLASS_AOT_REGISTRY_HOST.
    """
    env = _from_env(host)
    if env:
        return env
    path = docker_config_path()
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    names = _aliases(host)
    helpers = config.get("credHelpers") or {}
    for key, helper in helpers.items() if isinstance(helpers, dict) else ():
        if _host_of(key) in names and isinstance(helper, str):
            found = _from_helper(helper, key)
            if found:
                return found
    auths = config.get("auths") or {}
    store = config.get("credsStore")
    if isinstance(store, str) and store:
        # The store holds what `docker login` gave it, under docker's server
        # address: Docker Hub's is "https://index.docker.io/v1/", never a bare
        # host, and `docker login` marks each address in "auths" (an empty
        # entry). Ask under those addresses first, then under the bare names.
        keys = [DOCKER_HUB_V1] if "docker.io" in names else []
        keys += [k for k in (auths if isinstance(auths, dict) else ())
                 if isinstance(k, str) and _host_of(k) in names and k not in keys]
        for name in [*keys, *sorted(names)]:
            found = _from_helper(store, name)
            if found:
                return found
    for key, entry in auths.items() if isinstance(auths, dict) else ():
        if _host_of(key) not in names or not isinstance(entry, dict):
            continue
        if isinstance(entry.get("auth"), str) and entry["auth"]:
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                continue
            return Credentials(user, password, f"docker config {path}")
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            return Credentials(entry["username"], entry["password"], f"docker config {path}")
    return None
