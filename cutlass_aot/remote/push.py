"""Push: upload a local cache to a registry, sending only the blobs it lacks.

The reference names a tag (``host/repo:tag``); one with ``@sha256:`` is
refused, since the manifest's digest is what the push produces (and
reports), not something it can be told.

Order: verify the whole local cache (bundle.local_bundle) -> HEAD each blob
-> upload the missing ones -> the config blob -> the manifest under the tag,
last. A push killed or failed midway leaves the tag as it was (blobs without
a manifest are the registry's garbage to collect); running it again sends
only what is still missing.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from ..errors import IntegrityError, UsageError
from . import bundle
from .client import Client
from .reference import parse


def push(cache_dir: Path, ref_text: str, *, plain_http: bool = False, ca_file: str | None = None) -> dict:
    """Push ``cache_dir`` as ``ref_text``; returns the report the CLI prints."""
    t0 = time.perf_counter()
    ref = parse(ref_text)
    if ref.digest:
        raise UsageError(
            f"push takes a tag, not a digest: {ref_text!r} names {ref.digest[:19]}...; push to "
            f"{ref.registry}/{ref.repository}:{ref.tag or 'TAG'} (the digest of what was pushed is "
            "printed after the push)", reference=ref_text)
    config, blobs = bundle.local_bundle(Path(cache_dir))
    body = bundle.dumps(config)
    if len(body) > bundle.MAX_CONFIG:
        # a pull would refuse it: fail before anything is uploaded
        raise UsageError(
            f"{cache_dir} holds {len(config['records'])} entries, whose bundle document is {len(body)} "
            f"bytes, more than the {bundle.MAX_CONFIG} a pull reads; push it as several references "
            "(e.g. one cache per --arch)", reference=ref_text, size=len(body), limit=bundle.MAX_CONFIG)
    client = Client(ref, plain_http=plain_http, ca_file=ca_file, actions="pull,push")
    sent = sent_bytes = 0
    try:
        for blob in blobs:
            if client.blob_exists(blob.digest):
                continue
            path = Path(cache_dir) / blob.path
            client.upload_blob(blob.digest, blob.size, lambda p=path: open(p, "rb"))  # noqa: SIM115
            sent += 1
            sent_bytes += blob.size
        config_digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if not client.blob_exists(config_digest):
            client.upload_blob(config_digest, len(body), lambda: body)
            sent += 1
            sent_bytes += len(body)
        man = bundle.manifest(body, config_digest, blobs)
        digest = "sha256:" + hashlib.sha256(man).hexdigest()
        claimed = client.put_manifest(man)
        if claimed is not None and claimed.strip() != digest:
            # the registry stored something else, or says it did: pulling
            # by the digest it names would not give these bytes
            raise IntegrityError(
                f"{ref.registry} answered the manifest upload with digest {claimed.strip()[:100]!r}, "
                f"but the manifest sent hashes to {digest}; the registry (or a proxy in front of "
                "it) altered it: do not pull by its digest, check the registry, and push again",
                path=str(ref))
    finally:
        client.close()
    return {
        "verb": "uploaded",
        "reference": str(ref),
        "digest": digest,
        "entries": len(config["records"]),
        "blobs": len(blobs) + 1,
        "blobs_transferred": sent,
        "bytes": sent_bytes,
        "seconds": round(time.perf_counter() - t0, 3),
    }
