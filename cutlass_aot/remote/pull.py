"""Pull: download the entries a local cache lacks, verify, publish atomically.

Order, and why each step is safe to kill:

1. GET the manifest (its digest checked against the header or the
   reference's ``@sha256:``) and the config blob (checked against the
   manifest). Parse and validate the index inside it; check every record the
   pull will use (its key is the hash of its key_inputs) before downloading.
2. Choose the entries ``--arch``/``--signature`` ask for that the cache does
   not already hold as verified entries, and the blobs they need (artifacts,
   bundled runtimes, extra files the index lists).
3. Download each blob into ``tmp/pull-<sha>.part`` under the blob's lock,
   appending: a killed pull resumes with a Range request from the bytes
   already there. The bytes are hashed as they arrive; a blob whose size or
   sha256 differs from its digest is deleted and the pull fails. A verified
   blob is renamed to ``tmp/pull-<sha>.blob``. Still under the lock, the
   pull takes its own hard link to it, ``tmp/pull-<sha>.<pid>-<hex>.own``:
   pulls into one cache share downloads, but each publishes from, and
   deletes, only the links it owns (a shared path would vanish under a
   pull when another one finished first).
4. Publish through the store: stage each entry from its verified blob,
   place runtimes and extra files, and commit everything with ONE index
   write (CacheStore.adopt). Until that write nothing of the pull is
   visible; after it, all of it is. Then the shared blobs are deleted
   (each under its lock), and the pull's own links however it ended.

Each request runs under the client's deadline, and a blob's body under one
that grows with its size (Client.deadline): a stalled or dripping registry
ends the pull with a RegistryError, and the bytes so far are kept.
"""

from __future__ import annotations

import fnmatch
import hashlib
import http.client
import os
import shutil
import time
import uuid
from pathlib import Path

from filelock import Timeout

from ..builder.merge import (
    TABLES_SECTION,
    check_extra_file,
    check_record,
    extra_files,
    get_extra,
    merge_table,
    set_extra,
)
from ..builder.store import CacheStore
from ..errors import CacheError, IntegrityError, RegistryError, UsageError
from ..layout import LOCKS_DIR, TMP_DIR, resolve_inside, sha256_file
from ..signature import Signature
from . import bundle
from .client import CHUNK, FLOOR_RATE, Client
from .reference import parse


def _glob(pattern: str) -> str:
    """A --signature glob for fnmatch: only * and ? are wildcards. Signature
    texts hold brackets (gemm[sm_90a](...)), which fnmatch would read as a
    character class, so they are matched literally."""
    return "".join({"[": "[[]", "]": "[]]"}.get(ch, ch) for ch in pattern)


def select(index: dict, archs: tuple[str, ...], signatures: tuple[str, ...], ref: str) -> list[str]:
    """Keys of the entries that match every given filter."""
    keys = []
    for key, rec in index["entries"].items():
        if archs and rec["signature"]["arch"] not in archs:
            continue
        if signatures:
            text = Signature.from_dict(rec["signature"]).text()
            if not any(text == s or fnmatch.fnmatchcase(text, _glob(s)) for s in signatures):
                continue
        keys.append(key)
    if index["entries"] and not keys and (archs or signatures):
        have = sorted({r["signature"]["arch"] for r in index["entries"].values()})
        raise UsageError(
            f"no entry of {ref} matches --arch {list(archs) or '(any)'} --signature "
            f"{list(signatures) or '(any)'}; it holds archs {have} (see `cutlass-aot ls` on a pulled "
            "copy for signatures)", reference=ref)
    return sorted(keys)


def pull(ref_text: str, cache_dir: Path, *, archs: tuple[str, ...] = (), signatures: tuple[str, ...] = (),
         plain_http: bool = False, ca_file: str | None = None) -> dict:
    """Pull ``ref_text`` into ``cache_dir``; returns the report the CLI prints."""
    t0 = time.perf_counter()
    ref = parse(ref_text)
    client = Client(ref, plain_http=plain_http, ca_file=ca_file, actions="pull")
    stats = {"blobs": 0, "transferred": 0, "bytes": 0}
    try:
        body, header_digest = client.get_manifest()
        actual = "sha256:" + hashlib.sha256(body).hexdigest()
        for expected in (ref.digest, header_digest):
            if expected and expected != actual:
                raise IntegrityError(f"the manifest of {ref} hashes to {actual}, not {expected}; "
                                     "refusing it", path=str(ref))
        desc = bundle.parse_manifest(body, str(ref))
        config = _fetch_small(client, desc["digest"], desc["size"], str(ref))
        index, records = bundle.parse_config(config, str(ref))
        keys = select(index, archs, signatures, str(ref))

        store = CacheStore(Path(cache_dir))
        store.ensure()
        current, _ = store.load_index()
        need = [k for k in keys if not store.entry_ok(current, k)]
        for key in need:
            if key not in records:
                raise IntegrityError(f"the config of {ref} has no record for entry {key[:16]}", key=key)
            check_record(key, index["entries"][key], records[key].encode())
        wanted: dict[str, int] = {index["entries"][k]["sha256"]: index["entries"][k]["size"] for k in need}
        runtimes_needed = sorted({index["entries"][k]["runtime"] for k in need})
        for sha in runtimes_needed:
            rec = index["runtimes"].get(sha)
            if rec is None:
                raise IntegrityError(f"entry records of {ref} name runtime {sha[:16]}, which its index "
                                     "does not list", path=str(ref))
            if rec.get("path") and not _bundled_ok(store, current, sha):
                wanted[sha] = int(rec.get("size") or 0) or -1
        extras, tables = [], []
        for section, name, rec in extra_files(index):
            have = get_extra(current, section, name)
            if have is None:
                extras.append((section, name, rec))
            elif section == TABLES_SECTION and have.get("sha256") != rec["sha256"]:
                tables.append((name, rec))  # both have a table for this GPU: rows merge
            else:
                continue  # the same file, or a local file this pull leaves alone
            wanted.setdefault(rec["sha256"], int(rec.get("size") or 0) or -1)
        stats["blobs"] = len(wanted)

        own: list[Path] = []  # the hard links this pull made, and alone deletes
        try:
            paths = {sha: _fetch_blob(client, store, sha, size, stats, own)
                     for sha, size in sorted(wanted.items())}
            # Files the index lists are checked for what they are, not only for
            # their hash, before anything is committed (a table that does not
            # parse would otherwise fail after the entries landed).
            for section, name, rec in extras + [(TABLES_SECTION, n, r) for n, r in tables]:
                check_extra_file(section, name, rec, paths[rec["sha256"]],
                                 f"{ref} {section}/{name or ''}".rstrip("/"))

            staged = {}
            try:
                for key in need:
                    rec = index["entries"][key]
                    staged[key] = (store.stage_entry(key, paths[rec["sha256"]], records[key].encode(),
                                                     rec["sha256"], rec["size"]), rec)
                runtime_records = {}
                for sha in runtimes_needed:
                    rec = dict(index["runtimes"][sha])
                    if sha in paths:
                        placed = store.ensure_runtime(str(paths[sha]), bundle=True)
                        placed["source"] = rec.get("source", placed["source"])
                        rec = placed
                    elif rec.get("path"):
                        rec = current["runtimes"][sha]
                    runtime_records[sha] = rec
                for _section, _name, rec in extras:
                    store.publish_file(rec["path"], paths[rec["sha256"]], rec["sha256"])

                def add_extras(idx: dict) -> None:
                    for section, name, rec in extras:
                        if get_extra(idx, section, name) is None:
                            set_extra(idx, section, name, dict(rec))

                result = store.adopt(staged, runtime_records, add_extras if extras else None)
                for _name, rec in tables:
                    merge_table(store, paths[rec["sha256"]])
            finally:
                for work, _ in staged.values():
                    if work.exists():
                        shutil.rmtree(work, ignore_errors=True)
            for sha in paths:  # committed: no later pull needs the shared copies
                _drop_shared(store, sha)
        except FileNotFoundError as exc:
            # a file of this pull under tmp/ was deleted by another process;
            # what the index does not list stays unpublished
            raise CacheError(
                f"a file this pull was working on vanished ({exc.filename}): another process removed "
                f"it while the pull ran (`cutlass-aot gc`, or a cleanup of {store.root / TMP_DIR}); "
                "run the pull again: it fetches and publishes what the cache still lacks",
                cache_dir=str(store.root), path=str(exc.filename)) from None
        finally:
            for path in own:
                path.unlink(missing_ok=True)
        if result["conflicts"]:
            raise IntegrityError(
                f"{cache_dir} got different artifacts for {len(result['conflicts'])} keys from another "
                f"writer during the pull (e.g. {result['conflicts'][0][:16]}); they were kept, the rest "
                "was published", key=result["conflicts"][0])
        store.init_index()  # an empty remote still leaves a readable (empty) cache
    finally:
        client.close()
    return {
        "verb": "downloaded",
        "reference": str(ref),
        "digest": actual,
        "entries": len(result["added"]),
        "selected": len(keys),
        "present": len(keys) - len(need) + len(result["present"]),
        "files": len(extras) + len(tables),
        "blobs": stats["blobs"],
        "blobs_transferred": stats["transferred"],
        "bytes": stats["bytes"],
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _bundled_ok(store: CacheStore, index: dict, sha: str) -> bool:
    rec = index["runtimes"].get(sha)
    if not rec or not rec.get("path"):
        return False
    try:
        return sha256_file(resolve_inside(store.root, rec["path"])) == sha
    except (OSError, IntegrityError):
        return False


def _fetch_small(client: Client, digest: str, size: int, ref: str) -> bytes:
    """The config blob, read whole but never past its descriptor's ``size``
    (bundle.parse_manifest bounds that): a longer body is refused unread.
    Headers and body are under one deadline."""
    with client.deadline(client.budget(size), f"GET the config blob of {ref}"):
        resp = client.open_blob(digest)
        data = client._read_body(resp, "GET", f"the config blob of {ref}", limit=size)
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if actual != digest or len(data) != size:
        raise IntegrityError(f"the config blob of {ref} hashes to {actual} ({len(data)} bytes), not "
                             f"{digest} ({size} bytes); refusing it", path=ref)
    return data


def _blob_lock(store: CacheStore, sha: str):
    """The lock of blob ``sha``'s shared files under tmp/, acquired."""
    lock = store.key_lock(f"pull-{sha}")  # same lock dir and timeout as keys
    try:
        lock.acquire()
    except Timeout:
        raise CacheError(f"timed out waiting for {store.root / LOCKS_DIR}/pull-{sha}.lock: another pull "
                         "is downloading this blob; retry", cache_dir=str(store.root)) from None
    return lock


def _fetch_blob(client: Client, store: CacheStore, sha: str, size: int, stats: dict, own: list[Path]) -> Path:
    """A verified copy of blob ``sha`` that this pull owns: a hard link under
    tmp/ to the shared download (which resumes a partial one), appended to
    ``own``; no other pull deletes it.

    ``size`` is -1 when the index does not record it.
    """
    final = store.root / TMP_DIR / f"pull-{sha}.blob"
    lock = _blob_lock(store, sha)
    try:
        if final.exists() and sha256_file(final) != sha:
            final.unlink()
        if not final.exists():
            _download(client, store, sha, size, stats)
        mine = final.with_name(f"pull-{sha}.{os.getpid()}-{uuid.uuid4().hex[:12]}.own")
        try:
            os.link(final, mine)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            shutil.copyfile(final, mine)  # a filesystem without hard links; checked again when staged
        own.append(mine)
        os.utime(mine)  # fresh: sweep_tmp takes only names an hour old
        return mine
    finally:
        lock.release()


def _drop_shared(store: CacheStore, sha: str) -> None:
    """Delete blob ``sha``'s shared download once this pull has committed; under
    its lock, so that no pull is between checking it and linking it."""
    try:
        lock = _blob_lock(store, sha)
    except CacheError:
        return  # held long: another pull uses it; sweep_tmp removes it later
    try:
        (store.root / TMP_DIR / f"pull-{sha}.blob").unlink(missing_ok=True)
    finally:
        lock.release()


def _download(client: Client, store: CacheStore, sha: str, size: int, stats: dict) -> None:
    """Download blob ``sha`` to tmp/pull-<sha>.blob, verified; resumes from
    tmp/pull-<sha>.part. The caller holds the blob's lock."""
    tmp = store.root / TMP_DIR
    final, part = tmp / f"pull-{sha}.blob", tmp / f"pull-{sha}.part"
    h = hashlib.sha256()
    have = 0
    if part.exists():
        with open(part, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                have += len(chunk)
        # A kill between the last byte and the rename leaves a whole
        # part: there is nothing left to ask for (the registry would
        # answer the empty range with 416). Keep it if it is the blob.
        if have and (size < 0 or have == size) and h.hexdigest() == sha:
            os.replace(part, final)
            return
        if size >= 0 and have >= size:
            part.unlink()
            h, have = hashlib.sha256(), 0
    digest = f"sha256:{sha}"
    # the whole transfer (headers and body) under one deadline, by the bytes it moves
    budget = client.budget(size - have if size >= 0 else 0)
    with client.deadline(budget, f"GET blob {digest[:19]}..."):
        try:
            resp = client.open_blob(digest, offset=have)
        except RegistryError as exc:
            if exc.data.get("status") != 416:
                raise
            part.unlink(missing_ok=True)  # the registry holds fewer bytes than were kept
            raise _mismatch(client, digest, f"shorter than the {have} bytes already received") from None
        if have and resp.status == 200:  # the registry ignored the range: start over
            h, have = hashlib.sha256(), 0
            part.unlink(missing_ok=True)
        length = resp.getheader("Content-Length")
        if size >= 0 and length and length.isdigit() and have + int(length) != size:
            resp.close()
            client.close()
            part.unlink(missing_ok=True)
            raise _mismatch(client, digest, f"{have + int(length)} bytes, not {size}")
        stats["transferred"] += 1
        broke = None
        try:
            with open(part, "ab") as out:
                while True:
                    # never past the recorded size: one byte more proves the
                    # body too long (checked below) without writing the rest
                    try:
                        chunk = resp.read(CHUNK if size < 0 else min(CHUNK, size - have + 1))
                    except (OSError, http.client.HTTPException) as exc:  # the network's
                        broke = f"{type(exc).__name__}: {exc}"
                        break
                    if not chunk:
                        broke = None if size < 0 or have >= size else "the stream ended early"
                        break
                    out.write(chunk)
                    h.update(chunk)
                    have += len(chunk)
                    stats["bytes"] += len(chunk)
                    if 0 <= size < have:
                        resp.close()
                        client.close()
                        break
        except OSError as exc:
            # The disk's (full, read-only, failing), not the registry's: it
            # propagates, and the CLI reports it as the other writers' disk
            # errors (exit 2). The bytes written so far stay for a resume.
            client.close()
            if exc.filename is None:
                exc.filename = str(part)
            raise
        if broke is not None:
            # The bytes so far are kept: they are checked with the rest once
            # the blob is complete, so a resumed prefix is never trusted alone.
            client.close()
            if client.expired:
                raise RegistryError(
                    f"downloading {digest[:19]}... from registry {client.ref.registry} took longer than "
                    f"the {budget:.0f} s allowed (CUTLASS_AOT_REGISTRY_TIMEOUT={client.time_limit:g}, plus "
                    f"a second per {FLOOR_RATE >> 10} KiB): the registry or the network stalled or is "
                    f"very slow; nothing was published, and the {have} bytes received are kept: the "
                    "next pull resumes from there (raise CUTLASS_AOT_REGISTRY_TIMEOUT for a slow link)",
                    registry=client.ref.registry, reference=str(client.ref), status=None, timeout=budget)
            raise RegistryError(
                f"the connection to registry {client.ref.registry} broke while downloading "
                f"{digest[:19]}... ({broke}); nothing was published, and the {have} bytes received "
                "are kept: the next pull resumes from there",
                registry=client.ref.registry, reference=str(client.ref), status=None)
    if (size >= 0 and have != size) or h.hexdigest() != sha:
        part.unlink(missing_ok=True)
        raise _mismatch(client, digest, f"{have} bytes with sha256 {h.hexdigest()}")
    os.replace(part, final)


def _mismatch(client: Client, digest: str, what: str) -> IntegrityError:
    return IntegrityError(
        f"blob {digest} from {client.ref.registry} is {what}: its bytes do not match its digest, so "
        "the registry's copy is corrupt or tampered with; nothing was published. Push the cache "
        "again from a verified build.", path=digest)
