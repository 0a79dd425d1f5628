"""All environment knobs, in one place, read when used (never at import).

Core module: standard library only, except that ``default_cache_dir`` imports
platformdirs lazily (it is a dependency of the package, and absent from some
service images; a service that sets CUTLASS_AOT_CACHE_DIR never needs it).

| variable                     | meaning                                          |
| ---------------------------- | ------------------------------------------------ |
| CUTLASS_AOT_CACHE_DIR        | cache directory (default: platformdirs user cache)|
| CUTLASS_AOT_JOBS             | default for ``build --jobs``                     |
| CUTLASS_AOT_RUNTIME_LIB      | explicit path to libcute_dsl_runtime.so          |
| CUTLASS_AOT_LOCK_TIMEOUT     | seconds a writer waits for a key lock (600)      |
| CUTLASS_AOT_TRUST_ANY_OWNER  | "1": accept a cache owned by another user        |
| CUTLASS_AOT_ALLOW_PATH_LOAD  | "1": where memfd/a private temp dir is missing,  |
|                              | dlopen the checked cache path (not the bytes)    |
| CUTLASS_AOT_MAX_VARIANTS     | ``build`` refuses a plan larger than this without|
|                              | --yes or --max-variants (default 2000)           |
| CUTLASS_AOT_TRACE_FILE       | builders append where they are (JSON lines);     |
|                              | used by the kill campaign                        |
| CUTLASS_AOT_SHAPE_LOG        | path: append one JSON line per new call shape    |
| CUTLASS_AOT_ON_MISS          | default on_miss of open_cache: raise or torch    |
| CUTLASS_AOT_UNALIGNED        | route of calls below 16-byte alignment: auto     |
|                              | (default: the model picks), staged or native     |
| CUTLASS_AOT_AUTOTUNE         | time the model's leading options on a call's     |
|                              | first use: off (default), on (6 options) or N    |
| CUTLASS_AOT_FASTPATH         | "0": dispatch in Python only, not through the    |
|                              | C++ entry (run/fastpath.py; default 1: on)       |
| CUTLASS_AOT_REGISTRY_USER    | push/pull: registry user name (with _PASSWORD)   |
| CUTLASS_AOT_REGISTRY_PASSWORD| push/pull: registry password or token            |
| CUTLASS_AOT_REGISTRY_HOST    | push/pull: the registry host[:port] the _USER/   |
|                              | _PASSWORD pair belongs to (required with them)   |
| CUTLASS_AOT_REGISTRY_CA      | push/pull: CA bundle that signs the registry     |
| CUTLASS_AOT_REGISTRY_TIMEOUT | push/pull: seconds a request may take (300), plus|
|                              | one per 256 KiB of a blob it moves               |

A knob with a value that does not parse raises UsageError (the CLI exits 2
with the variable's name), never a bare ValueError.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "CUTLASS_AOT_"


def get(name: str, default: str | None = None) -> str | None:
    """Read CUTLASS_AOT_<name> now."""
    value = os.environ.get(PREFIX + name)
    return default if value in (None, "") else value


def default_cache_dir() -> Path:
    """The cache directory when none is given on the command line."""
    explicit = get("CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    try:
        import platformdirs  # noqa: PLC0415 - only needed when no dir is configured
    except ImportError:
        from .errors import CacheError  # noqa: PLC0415 - errors imports nothing back

        raise CacheError(
            "no cache directory configured and platformdirs is not installed: set "
            "CUTLASS_AOT_CACHE_DIR (or pass the path to open_cache / --cache-dir)"
        ) from None
    return Path(platformdirs.user_cache_dir("cutlass-aot", appauthor=False))


def _number(name: str, default: str, kind: type, minimum: float, example: str):
    text = get(name, default)
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value != value or value < minimum:  # value != value: NaN
        from .errors import UsageError  # noqa: PLC0415 - errors imports nothing back

        raise UsageError(
            f"{PREFIX}{name}={text!r} is not a valid value: use a number >= {minimum:g}, "
            f"e.g. {PREFIX}{name}={example}, or unset it", knob=PREFIX + name, value=text)
    return value


def lock_timeout() -> float:
    """Seconds a build waits for another writer's lock before giving up."""
    return _number("LOCK_TIMEOUT", "600", float, 0, "600")


def allow_path_load() -> bool:
    """Whether the loader may dlopen a checked path where it cannot load bytes."""
    _flag("ALLOW_PATH_LOAD")
    return get("ALLOW_PATH_LOAD", "0") == "1"


def max_variants() -> int:
    """Largest plan ``build`` compiles without --yes or --max-variants."""
    return _number("MAX_VARIANTS", "2000", int, 1, "5000")


def trust_any_owner() -> bool:
    """Whether the loader accepts a cache directory owned by another user."""
    _flag("TRUST_ANY_OWNER")
    return get("TRUST_ANY_OWNER", "0") == "1"


def shape_log() -> str | None:
    """Path of the opt-in shape log (see cutlass_aot/shapelog.py), or None;
    ``~`` expanded, as CUTLASS_AOT_CACHE_DIR's is."""
    value = get("SHAPE_LOG")
    return os.path.expanduser(value) if value else value


ON_MISS_CHOICES = ("raise", "torch")


def on_miss() -> str:
    """What a call no artifact serves does by default: "raise" (default) or "torch"."""
    value = get("ON_MISS", "raise")
    if value not in ON_MISS_CHOICES:
        from .errors import UsageError  # noqa: PLC0415 - errors imports nothing back

        raise UsageError(f"CUTLASS_AOT_ON_MISS={value!r}: use one of {', '.join(ON_MISS_CHOICES)}")
    return value


UNALIGNED_CHOICES = ("auto", "staged", "native")


def unaligned_route() -> str:
    """How dispatch serves calls below 16-byte alignment (run/dispatch.py):
    "auto" (default: select.prefer_staged decides), "staged" (16-byte variants
    through aligned copies) or "native" (low-alignment variants, where the
    cache has them)."""
    value = get("UNALIGNED", "auto")
    if value not in UNALIGNED_CHOICES:
        from .errors import UsageError  # noqa: PLC0415 - errors imports nothing back

        raise UsageError(f"CUTLASS_AOT_UNALIGNED={value!r}: use one of {', '.join(UNALIGNED_CHOICES)}")
    return value


AUTOTUNE_DEFAULT = 6


def autotune_count() -> int:
    """How many of the model's leading options dispatch times on a call's
    first use (run/autotune.py): 0 (off, the default), "on"/"1" for
    AUTOTUNE_DEFAULT, or a count of at least 2."""
    value = get("AUTOTUNE", "off").strip().lower()
    if value in ("0", "off", "false", "no"):
        return 0
    if value in ("1", "on", "true", "yes"):
        return AUTOTUNE_DEFAULT
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 2:
        from .errors import UsageError  # noqa: PLC0415 - errors imports nothing back

        raise UsageError(
            f"CUTLASS_AOT_AUTOTUNE={value!r} is not a valid value: use off, on (times "
            f"{AUTOTUNE_DEFAULT} options) or a number of options >= 2, e.g. "
            "CUTLASS_AOT_AUTOTUNE=8, or unset it", knob="CUTLASS_AOT_AUTOTUNE", value=value)
    return count


def fastpath() -> bool:
    """Whether dispatch may use the C++ entry (run/fastpath.py): "1" (the
    default) or "0"."""
    value = get("FASTPATH", "1").strip().lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    from .errors import UsageError  # noqa: PLC0415 - errors imports nothing back

    raise UsageError(f"CUTLASS_AOT_FASTPATH={value!r} is not a valid value: use 1 (on) or 0 (off), "
                     "or unset it", knob="CUTLASS_AOT_FASTPATH", value=value)


def registry_credentials() -> tuple[str, str] | None:
    """(user, password) for push/pull from the environment, if both are set."""
    user, password = get("REGISTRY_USER"), get("REGISTRY_PASSWORD")
    return (user, password) if user and password else None


def registry_host() -> str | None:
    """The registry host[:port] the env credentials belong to (remote/auth.py
    sends them to no other host). UsageError when the pair is set without it:
    sending the pair to whichever registry asks would leak it."""
    host = get("REGISTRY_HOST")
    if not host and registry_credentials():
        from .errors import UsageError  # noqa: PLC0415 - errors imports nothing back

        raise UsageError(
            f"{PREFIX}REGISTRY_USER and {PREFIX}REGISTRY_PASSWORD are set but {PREFIX}REGISTRY_HOST "
            f"is not: set {PREFIX}REGISTRY_HOST to the registry host[:port] they belong to (e.g. "
            f"{PREFIX}REGISTRY_HOST=ghcr.io), so that no other registry is sent them, or unset them "
            "to use docker's credentials", knob=PREFIX + "REGISTRY_HOST", value=None)
    return host


def registry_timeout() -> float:
    """Seconds one registry request may take before it is abandoned
    (remote/client.py adds time for the bytes a blob transfer moves)."""
    value = _number("REGISTRY_TIMEOUT", "300", float, 0.1, "600")
    if value == float("inf"):
        from .errors import UsageError  # noqa: PLC0415 - errors imports nothing back

        raise UsageError(f"{PREFIX}REGISTRY_TIMEOUT={get('REGISTRY_TIMEOUT')!r} is not a valid value: use a "
                         "finite number of seconds, e.g. 600", knob=PREFIX + "REGISTRY_TIMEOUT",
                         value=get("REGISTRY_TIMEOUT"))
    return value


def registry_ca() -> str | None:
    """A CA bundle file to trust for registries (besides the system's)."""
    return get("REGISTRY_CA")


def default_jobs() -> int:
    """Worker processes for a build: CUTLASS_AOT_JOBS or all cores."""
    if get("JOBS") is None:
        return os.cpu_count() or 1
    return _number("JOBS", "1", int, 1, "4")


def _flag(name: str) -> None:
    """UsageError unless an on/off knob is unset, "0" or "1": its reader takes
    only "1" as on, so a "true" would otherwise pass silently as off."""
    value = get(name)
    if value is not None and value not in ("0", "1"):
        from .errors import UsageError  # noqa: PLC0415 - errors imports nothing back

        raise UsageError(f"{PREFIX}{name}={value!r} is not a valid value: use 1 (on) or 0 (off), "
                         "or unset it", knob=PREFIX + name, value=value)


def trace_file() -> str | None:
    """CUTLASS_AOT_TRACE_FILE: the file builders append trace lines to
    (builder/store.trace), or None. Refused (UsageError) when it names a
    directory or a file in a directory that does not exist: trace() would
    fail on its first line, in the middle of a build."""
    path = get("TRACE_FILE")
    if path is None:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    why = ("it is a directory" if os.path.isdir(path)
           else f"its directory {parent} does not exist" if not os.path.isdir(parent) else None)
    if why is not None:
        from .errors import UsageError  # noqa: PLC0415 - errors imports nothing back

        raise UsageError(f"{PREFIX}TRACE_FILE={path!r} is not a file builders can append to: {why}; "
                         "point it at a file in an existing directory, or unset it",
                         knob=PREFIX + "TRACE_FILE", value=path)
    return path


def problems() -> list[str]:
    """Every knob that is set to a value its reader would refuse, as that
    reader's message (``cutlass-aot info`` prints them and exits 2). Each
    reader runs where its knob is used; this runs them all at once, so a bad
    value shows up before the call or command that would trip on it."""
    from .errors import UsageError  # noqa: PLC0415 - errors imports nothing back

    checks = (lock_timeout, max_variants, on_miss, unaligned_route, autotune_count, fastpath,
              registry_timeout, default_jobs, registry_host, allow_path_load, trust_any_owner,
              trace_file)
    found = []
    for check in checks:
        try:
            check()
        except UsageError as exc:
            found.append(exc.message)
    return found


@contextmanager
def override(**values: str | None) -> Iterator[None]:
    """Temporarily set (or with None, unset) knobs; for tests."""
    saved = {k: os.environ.get(PREFIX + k) for k in values}
    try:
        _set_all(values)
        yield
    finally:
        _set_all(saved)


def _set_all(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(PREFIX + k, None)
        else:
            os.environ[PREFIX + k] = v
