"""Small JSON documents (run manifests, stage outcomes) stored whole and verified on every read.

A document is wrapped in an envelope holding the sha256 of the body's canonical serialization
(sorted keys, no whitespace), so a torn or edited document is refused rather than half-trusted.
The body itself stays readable JSON for people and tools.
"""

from __future__ import annotations

import json
from typing import Any

from ringzero.errors import IntegrityError, StoreError
from ringzero.store.manifest import dump_json, sha256_hex

DOCUMENT_FORMAT = "ringzero.document"
DOCUMENT_VERSION = 1


def _canonical(body: Any) -> bytes:
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def encode_document(body: Any, what: str) -> bytes:
    try:
        digest = sha256_hex(_canonical(body))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-serializable: {exc}") from None
    return dump_json(
        {"format": DOCUMENT_FORMAT, "version": DOCUMENT_VERSION, "sha256": digest, "body": body}, what
    )


def decode_document(data: bytes, where: str) -> Any:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != DOCUMENT_FORMAT or "body" not in doc:
        raise IntegrityError(f"{where}: not a {DOCUMENT_FORMAT} envelope")
    if doc.get("version") != DOCUMENT_VERSION:
        raise StoreError(
            f"{where}: document version {doc.get('version')!r} is not supported (reads {DOCUMENT_VERSION})"
        )
    actual = sha256_hex(_canonical(doc["body"]))
    if actual != doc.get("sha256"):
        raise IntegrityError(f"{where}: sha256 mismatch: expected {doc.get('sha256')}, found {actual}")
    return doc["body"]
