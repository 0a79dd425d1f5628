"""Every exception cutlass-aot raises on purpose.

Core module: imports only the standard library, so both the build side and
the run side (and a second reader of the cache) can use it.

Each error keeps its data in attributes and says what to do in its message.
All of them pickle (builds run in worker processes), which is why every
subclass passes its fields through ``__reduce__``. The CLI turns them into
exit codes; library code never prints.
"""

from __future__ import annotations

from typing import Any


class CutlassAotError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with for it."""

    exit_code = 1

    def __init__(self, message: str, **data: Any):
        super().__init__(message)
        self.message = message
        self.data = data
        for name, value in data.items():
            setattr(self, name, value)

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.data))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls, message, data):
    err = cls.__new__(cls)
    CutlassAotError.__init__(err, message, **data)
    return err


class ManifestError(CutlassAotError):
    """A manifest is malformed. Data: path, line, field, allowed."""

    exit_code = 2


class UsageError(CutlassAotError):
    """A command-line or API argument is invalid."""

    exit_code = 2


class BuildError(CutlassAotError):
    """A variant failed to compile or link. Data: variant, key, output."""


class CacheError(CutlassAotError):
    """The cache directory cannot be used as asked (missing, untrusted, foreign)."""

    exit_code = 2


class IntegrityError(CacheError):
    """An entry's bytes differ from its record, or a record is malformed."""

    exit_code = 1


class RegistryError(CutlassAotError):
    """An OCI registry failed or refused a request (push/pull; exit 1).

    Data: registry, reference, status (HTTP status, or None when the registry
    could not be reached).
    """


class KernelNotFoundError(CutlassAotError, LookupError):
    """No artifact serves a call's signature. Data: signature, nearest, hint."""


class ArgumentError(CutlassAotError, ValueError):
    """Call arguments a kernel cannot take (device, shape, dtype, layout)."""

    exit_code = 2


class LaunchError(CutlassAotError, RuntimeError):
    """A kernel launch that failed on the GPU (a CUDA error, not bad arguments).

    ``cuda_message`` holds the driver's or runtime's message.
    """

    exit_code = 1
