"""Bundle: the cache as an OCI manifest, its config document and its blobs.

The config blob (media type CONFIG_TYPE) is UTF-8 JSON::

    {"format": "cutlass-aot-bundle", "version": 1,
     "index": <the cache's index.json object, as read>,
     "records": {<key>: <the exact text of entries/<key>/entry.json>}}

Its digest is in the manifest, and the manifest's digest is what the tag
resolves to, so the records (which carry ``key_inputs``) are covered by the
same chain of digests as the blobs. Blobs are listed as layers with one media
type per kind and an ``org.opencontainers.image.title`` annotation naming a
path it is found at in the cache. No I/O beyond reading the local cache.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..builder.merge import check_record, extra_files
from ..errors import IntegrityError, UsageError
from ..layout import ENTRY_RECORD, read_index, resolve_inside, sha256_file, validate_index

ARTIFACT_TYPE = "application/vnd.cutlass-aot.cache.v1"
CONFIG_TYPE = "application/vnd.cutlass-aot.bundle.v1+json"
LAYER_TYPES = {
    "artifact": "application/vnd.cutlass-aot.artifact.v1",
    "runtime": "application/vnd.cutlass-aot.runtime.v1",
    "file": "application/vnd.cutlass-aot.file.v1",
}
BUNDLE_FORMAT = "cutlass-aot-bundle"
BUNDLE_VERSION = 1
TITLE = "org.opencontainers.image.title"


@dataclass(frozen=True)
class Blob:
    kind: str  # artifact | runtime | file
    sha256: str
    size: int
    path: str  # relative to the cache root

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha256}"


def local_bundle(root: Path) -> tuple[dict, list[Blob]]:
    """The config document and the blobs of a local cache, all verified.

    Raises IntegrityError when an entry, runtime or extra file does not match
    its record: a corrupt cache is never pushed (`cutlass-aot verify --repair`).
    """
    index = read_index(root)
    records: dict[str, str] = {}
    blobs: dict[str, Blob] = {}

    def add(kind: str, sha: str, rel: str, size: int | None) -> None:
        path = resolve_inside(root, rel)
        actual_size = path.stat().st_size
        if (size is not None and actual_size != size) or sha256_file(path) != sha:
            raise IntegrityError(f"{root}/{rel} does not match its sha256/size in the index; run "
                                 "`cutlass-aot verify --repair`, rebuild, then push", path=rel)
        blobs.setdefault(sha, Blob(kind, sha, actual_size, rel))

    for key, rec in sorted(index["entries"].items()):
        add("artifact", rec["sha256"], rec["path"], rec["size"])
        raw = (resolve_inside(root, rec["path"]).parent / ENTRY_RECORD).read_bytes()
        check_record(key, rec, raw)
        records[key] = raw.decode()
    for sha, rec in sorted(index["runtimes"].items()):
        if rec.get("path"):
            add("runtime", sha, rec["path"], rec.get("size"))
    for _section, _name, rec in extra_files(index):
        add("file", rec["sha256"], rec["path"], rec.get("size"))
    config = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "index": index, "records": records}
    return config, sorted(blobs.values(), key=lambda b: (b.kind, b.path))


def dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def manifest(config: bytes, config_digest: str, blobs: list[Blob]) -> bytes:
    doc = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": LAYER_TYPES[b.kind], "digest": b.digest, "size": b.size,
                    "annotations": {TITLE: b.path}} for b in blobs],
        "annotations": {"org.opencontainers.image.description": "cutlass-aot kernel cache"},
    }
    return dumps(doc)


# The largest config blob push writes and pull reads into memory: an index
# and one record per entry, about 4.4 KB an entry (the 888-entry dev cache's
# config is 3,894,810 bytes, built by local_bundle). json.loads takes about
# 27 times a document's size in memory, so the cap is what bounds a pull's
# memory: 32 MiB (about 7,600 entries, 8x the largest cache we build) costs
# under 1 GB; 256 MiB cost 6.9 GB.
MAX_CONFIG = 32 << 20
_BLOB_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def parse_manifest(body: bytes, ref: str) -> dict:
    """The config descriptor of a cutlass-aot manifest; refuses anything else."""
    try:
        doc = json.loads(body)
        config = doc["config"]
        ok = config["mediaType"] == CONFIG_TYPE and isinstance(config["digest"], str) \
            and isinstance(config["size"], int)
    except (ValueError, KeyError, TypeError, RecursionError):
        ok = False
    if not ok:
        raise UsageError(f"{ref} is not a cutlass-aot cache (its manifest has no {CONFIG_TYPE} config); "
                         "push one with `cutlass-aot push`", reference=ref)
    size = config["size"]
    if not _BLOB_DIGEST_RE.match(config["digest"]) or isinstance(size, bool) \
            or not 0 < size <= MAX_CONFIG:
        raise IntegrityError(
            f"the manifest of {ref} describes its config as {config['digest'][:80]!r} of {size} bytes; "
            f"a cutlass-aot config is a sha256 digest and 1..{MAX_CONFIG} bytes ({MAX_CONFIG >> 20} "
            "MiB, about 7,600 entries): the registry's copy is corrupt or not ours; push the cache "
            "again (a larger cache: push it as several references, e.g. one per --arch)",
            path=ref, size=size, limit=MAX_CONFIG)
    return config


def parse_config(body: bytes, ref: str) -> tuple[dict, dict[str, str]]:
    """(index, records) of a config document, validated like a local index."""
    try:
        doc = json.loads(body)
        if doc.get("format") != BUNDLE_FORMAT:
            raise ValueError("format")
        if doc.get("version") != BUNDLE_VERSION:
            raise UsageError(f"{ref} was pushed as bundle version {doc.get('version')!r}; this "
                             f"cutlass-aot reads version {BUNDLE_VERSION}", reference=ref)
        index, records = doc["index"], doc["records"]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise IntegrityError(f"the config of {ref} is not a cutlass-aot bundle document", path=ref) from None
    validate_index(index, Path(f"{ref} (config)"))
    if not isinstance(records, dict) or not all(isinstance(v, str) for v in records.values()):
        raise IntegrityError(f"the config of {ref} has malformed entry records", path=ref)
    return index, records
