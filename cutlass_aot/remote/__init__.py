"""Remote: push a cache to, and pull it from, any OCI distribution registry.

Uses both sides: it reads caches through the layout module and writes them
only through the build side's store (stage, lock, rename, one index commit).
The run side never imports this package.

How a cache maps onto the OCI distribution spec (docs/distribution.md):

* every artifact (``kernel.so``), bundled runtime library and extra file the
  index lists is one blob, whose digest is ``sha256:<the sha256 already in
  the index>``; identical bytes are one blob;
* the manifest's config blob is the bundle document (bundle.py): the index
  itself plus every entry's ``entry.json`` bytes, so a puller can filter by
  arch or signature before it downloads anything else;
* the manifest lists every blob as a layer, so that registries keep them.

Stages: reference (parse ``host/repo:tag``) -> auth (docker config,
credential helpers, env) -> client (HTTP API over http.client) -> push /
pull.
"""
