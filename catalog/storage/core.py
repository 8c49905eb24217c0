"""What every storage module shares (catalog/storage/__init__.py is the facade): the errors, a listing Entry,
`scrub` (no credential in a message), the check of a relative path and the split of a URI that
refuses credentials in it. Imports nothing of the storage layer, so every layer above can use it."""
from __future__ import annotations

import os
from typing import NamedTuple
from urllib.parse import SplitResult, urlsplit

_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


class StorageError(OSError):
    """A storage request failed; the message names the URI and never holds a credential."""


class ConditionalWritesUnsupported(StorageError):
    """This store (or backend) cannot create an object only if it is absent."""


class Entry(NamedTuple):
    path: str  # relative to the Storage root
    size: int


def scrub(text: str) -> str:
    """Remove any credential value of the environment from a message (defence in depth)."""
    for var in _SECRET_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def clean_rel(path: str) -> str:
    """`path` relative to a Storage root, normalised; refused if absolute or with '..'."""
    path = str(path).replace("\\", "/")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or ".." in parts or "\x00" in path:
        raise ValueError(f"{path!r}: a storage path is relative to its root, without '..' or a leading '/'")
    return "/".join(parts)


def split_uri(text: str) -> SplitResult:
    """urlsplit of a storage URI or path; a URI with credentials in it is refused without echoing them."""
    parts = urlsplit(text)
    if "@" in parts.netloc:  # s3://KEY:SECRET@bucket: never echo it
        raise ValueError(f"{parts.scheme.lower()}://...: credentials in a URI are refused; use the standard "
                         "provider chain (environment variables, a profile, or an instance role)")
    return parts


def is_local_scheme(scheme: str) -> bool:
    """A plain path, file://, or (on Windows) a drive letter."""
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def remote_parts(text: str) -> SplitResult:
    """split_uri of an object-store URI, which must name a bucket or host."""
    parts = split_uri(text)
    if not parts.netloc:
        scheme = parts.scheme.lower()
        raise ValueError(f"{text}: a {scheme}:// URI names a bucket or host ({scheme}://NAME/path)")
    return parts
