"""S3 (and S3-compatible: SeaweedFS, MinIO, R2, ...) for catalog/storage/__init__.py.

One client does the requests humanset makes itself: obstore (Rust `object_store`): streamed
ListObjectsV2 listing, whole-object GET/PUT, ranged GETs, streamed multipart uploads (`open_output`:
parts go up in the background while the writer goes on; the object appears only when it is
complete), and the conditional writes (`If-None-Match: *` for create_once and the run lock, `If-Match`
for its heartbeat; a conditional DELETE and the lock's age by the store's clock through a request
obstore signs). pyarrow's S3FileSystem (the AWS C++ SDK) is built only when something asks for
`Storage.fs`: random-access files (`open_input`: tarfile, the shard readers), `pyarrow.parquet`,
Ray Data's `filesystem=` and DuckDB. So a driver that lists, locks and writes small objects never
loads the C++ SDK, and nothing loads boto3 unless credentials come from a ~/.aws profile.

Credentials: the standard AWS chain, never passed, stored or printed by humanset. obstore reads
AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, web identity (AWS_WEB_IDENTITY_TOKEN_FILE),
container credentials (AWS_CONTAINER_CREDENTIALS_*) and the instance metadata role; a ~/.aws profile
(AWS_PROFILE, shared config/credentials files: static keys, SSO, assume-role) goes through boto3's
credential chain (obstore.auth.boto3), as pyarrow's SDK reads it too. Endpoint: AWS_ENDPOINT_URL_S3
or AWS_ENDPOINT_URL (path-style addressing); region: AWS_REGION/AWS_DEFAULT_REGION, the profile's,
us-east-1 with a custom endpoint, else the bucket's (one request).
"""
from __future__ import annotations

import io
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path

import pyarrow.fs as pafs

from catalog.storage.base import Storage
from catalog.storage.core import ConditionalWritesUnsupported, Entry, StorageError, remote_parts, scrub

MAX_ATTEMPTS = 10  # per request, with exponential backoff and jitter (both clients)
PART_BYTES = 8 << 20  # multipart part size of open_output; up to UPLOADS parts are in flight at once
UPLOADS = 4
_WRITE_BUFFER = 1 << 20  # open_output gathers small writes (tar headers, padding) before handing them on
_ENV_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI")


def _short(e: Exception) -> str:
    """obstore's message without its debug dump (which repeats it), credentials scrubbed."""
    return scrub(str(e).split("\n\nDebug source:", 1)[0].strip())


def _profile_configured() -> bool:
    if any(os.environ.get(v) for v in _ENV_CREDENTIALS):
        return False  # the environment (or a role the environment names) comes first in the chain
    if os.environ.get("AWS_PROFILE"):
        return True
    home = Path.home() / ".aws"
    files = (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / "credentials",
             os.environ.get("AWS_CONFIG_FILE") or home / "config")
    return any(Path(f).is_file() for f in files)


class _Clients:
    """The clients of one bucket, built on first use and shared by a Storage and its children."""

    def __init__(self, bucket: str):
        self.bucket = bucket
        self.endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
        self.region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
        self._lock = threading.Lock()
        self._store = self._fs = None
        self._provider = None
        if _profile_configured():
            try:
                import boto3
                from obstore.auth.boto3 import Boto3CredentialProvider
            except ImportError:
                raise StorageError("s3:// with credentials from a ~/.aws profile needs boto3 "
                                   "(pip install -r deps/storage.pip.txt)") from None
            try:
                session = boto3.session.Session()
                self.region = self.region or session.region_name
                self._provider = Boto3CredentialProvider(session)
            except Exception as e:  # no such profile, no credentials in it, an expired SSO session
                raise StorageError(f"s3://{bucket}: cannot get credentials from the AWS profile "
                                   f"({os.environ.get('AWS_PROFILE', 'default')}): {scrub(str(e))}") from None
        if not self.region:
            try:
                self.region = "us-east-1" if self.endpoint else pafs.resolve_s3_region(bucket)
            except OSError as e:
                raise StorageError(f"s3://{bucket}: cannot find the bucket's region (set AWS_REGION): "
                                   f"{scrub(str(e))}") from None

    @property
    def store(self):
        with self._lock:
            if self._store is None:
                try:
                    from obstore.store import S3Store
                except ImportError:
                    raise StorageError("s3:// needs obstore (pip install -r deps/storage.pip.txt)") from None
                kw = {"credential_provider": self._provider} if self._provider is not None else {}
                http = bool(self.endpoint and self.endpoint.startswith("http://"))
                self._store = S3Store(self.bucket, region=self.region, endpoint=self.endpoint,
                                      virtual_hosted_style_request=False,
                                      client_options={"allow_http": http, "timeout": timedelta(seconds=300)},
                                      retry_config={"max_retries": MAX_ATTEMPTS,
                                                    "retry_timeout": timedelta(seconds=300)}, **kw)
            return self._store

    @property
    def fs(self) -> pafs.S3FileSystem:
        with self._lock:
            if self._fs is None:
                self._fs = pafs.S3FileSystem(
                    region=self.region, endpoint_override=self.endpoint,
                    retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=MAX_ATTEMPTS))
            return self._fs


class _Writer:
    """open_output's file: gathers small writes and hands them to obstore's streamed upload."""

    closed = False

    def __init__(self, out):
        self._out, self._buf, self._pos = out, bytearray(), 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def write(self, data) -> int:
        self._buf += data
        self._pos += len(data)
        if len(self._buf) >= _WRITE_BUFFER:
            self._out.write(bytes(self._buf))
            self._buf.clear()
        return len(data)

    def flush(self) -> None:
        pass  # a flush would not make anything visible: the object appears at close

    def _drain(self) -> None:
        if self._buf:
            self._out.write(bytes(self._buf))
            self._buf.clear()


class _RawStream(io.RawIOBase):
    """obstore's buffered reader as a raw stream, for io.BufferedReader (readinto)."""

    def __init__(self, reader):
        self._r = reader

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._r.read(len(b))
        n = len(data)
        memoryview(b)[:n] = memoryview(data)
        return n

    def close(self) -> None:
        if not self.closed:
            self._r.close()
        super().close()


class S3Storage(Storage):
    scheme = "s3"

    def __init__(self, bucket: str, key: str):
        self.bucket = bucket
        self._clients = _Clients(bucket)
        base = f"{bucket}/{key}".rstrip("/")
        super().__init__(f"s3://{base}", None, base)

    @classmethod
    def from_uri(cls, uri: str) -> "S3Storage":
        """s3://BUCKET/prefix (or s3a://)."""
        parts = remote_parts(uri)
        if parts.scheme.lower() not in ("s3", "s3a"):
            raise ValueError(f"{uri}: not an s3:// URI")
        return cls(parts.netloc, parts.path.strip("/"))

    # pyarrow's file system only for whoever needs one (see the module docstring)
    @property
    def fs(self):
        return self._clients.fs

    @fs.setter
    def fs(self, value):
        if value is not None:
            raise AttributeError("an S3Storage builds its own pyarrow file system")

    @property
    def region(self) -> str:
        return self._clients.region

    def _key(self, path: str) -> str:
        return self.fs_path(path)[len(self.bucket) + 1:]

    def _fail(self, what: str, path: str, e: Exception) -> StorageError:
        return StorageError(f"{self.uri_of(path)}: {what} failed: {_short(e)}")

    def _missing(self, path: str) -> FileNotFoundError:
        return FileNotFoundError(f"{self.uri_of(path)}: no such file")

    def open_stream(self, path: str, buffer_size: int = 1 << 20):
        import obstore
        try:
            reader = obstore.open_reader(self._clients.store, self._key(path), buffer_size=buffer_size)
        except FileNotFoundError:
            raise self._missing(path) from None
        except Exception as e:
            raise self._fail("open", path, e) from None
        return io.BufferedReader(_RawStream(reader), buffer_size)

    # whole objects and ranges: one request each
    def read_bytes(self, path: str) -> bytes:
        import obstore
        try:
            return bytes(obstore.get(self._clients.store, self._key(path)).bytes())
        except FileNotFoundError:
            raise self._missing(path) from None
        except Exception as e:
            raise self._fail("read", path, e) from None

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        import obstore
        try:
            return bytes(obstore.get_range(self._clients.store, self._key(path), start=offset, length=length))
        except FileNotFoundError:
            raise self._missing(path) from None
        except Exception as e:
            raise self._fail("read", path, e) from None

    def _head(self, path: str):
        import obstore
        try:
            return obstore.head(self._clients.store, self._key(path))
        except FileNotFoundError:
            return None
        except Exception as e:
            raise self._fail("stat", path, e) from None

    def exists(self, path: str) -> bool:
        return self._head(path) is not None

    def size(self, path: str) -> int:
        meta = self._head(path)
        if meta is None:
            raise self._missing(path)
        return meta["size"]

    @contextmanager
    def open_output(self, path: str):
        """A streamed multipart upload: parts of PART_BYTES go up in the background (UPLOADS at a
        time) while the caller writes on; the object appears only when the block succeeds (an
        exception aborts the upload and leaves nothing under the name)."""
        import obstore
        try:
            out = obstore.open_writer(self._clients.store, self._key(path), buffer_size=PART_BYTES,
                                      max_concurrency=UPLOADS)
        except Exception as e:
            raise self._fail("write", path, e) from None
        with out:  # on an exception: aborted, nothing visible
            f = _Writer(out)
            yield f
            try:
                f._drain()
            except Exception as e:
                raise self._fail("write", path, e) from None
        # (the writer's close, the CompleteMultipartUpload or the single PUT, ran in __exit__)

    def write_bytes(self, path: str, data: bytes) -> None:
        import obstore
        try:
            obstore.put(self._clients.store, self._key(path), bytes(data), chunk_size=PART_BYTES,
                        max_concurrency=UPLOADS)
        except Exception as e:
            raise self._fail("write", path, e) from None

    def write_parquet(self, path: str, table) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        self.write_bytes(path, sink.getvalue())

    def delete(self, path: str, missing_ok: bool = True) -> None:
        import obstore
        if not missing_ok and not self.exists(path):
            raise self._missing(path)
        try:
            obstore.delete(self._clients.store, self._key(path))
        except FileNotFoundError:
            if not missing_ok:
                raise self._missing(path) from None
        except Exception as e:
            raise self._fail("delete", path, e) from None

    def _under(self, raw: str) -> Iterator[Entry]:
        """Keys starting with `raw`, from obstore's ListObjectsV2 stream: one page (1,000 keys, the
        S3 maximum) is requested when the previous one is used up, so one page is in memory at once."""
        import obstore
        root = self._key("")
        folder = raw.rsplit("/", 1)[0] if "/" in raw else ""  # obstore lists whole path segments
        prefix = "/".join(p for p in (root, folder) if p)
        cut = len(root) + 1 if root else 0
        try:
            for chunk in obstore.list(self._clients.store, prefix=prefix or None, chunk_size=1000):
                for obj in chunk:
                    rel = obj["path"][cut:]
                    if rel.startswith(raw) and not rel.endswith("/"):  # folder markers some tools write
                        yield Entry(rel, obj["size"])
        except Exception as e:
            raise self._fail("list", raw, e) from None

    # the run lock's primitives (catalog/storage/lock.py)
    def _create(self, path: str, data: bytes) -> str | None:
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError
        try:
            return obstore.put(self._clients.store, self._key(path), data, mode="create")["e_tag"]
        except (AlreadyExistsError, PreconditionError):
            return None
        except NotSupportedError:
            raise ConditionalWritesUnsupported(f"{self.uri}: the store refuses If-None-Match") from None
        except Exception as e:
            if "501" in str(e) or "NotImplemented" in str(e):
                raise ConditionalWritesUnsupported(f"{self.uri}: the store refuses If-None-Match") from None
            raise self._fail("create", path, e) from None

    def _replace_if(self, path: str, data: bytes, tag: str) -> str | None:
        import obstore
        from obstore.exceptions import PreconditionError
        try:
            return obstore.put(self._clients.store, self._key(path), data, mode={"e_tag": tag})["e_tag"]
        except (PreconditionError, FileNotFoundError):
            return None
        except Exception as e:
            raise self._fail("replace", path, e) from None

    def _signed(self, method: str, path: str, headers: dict | None = None):
        """One request obstore signs (a presigned URL, valid 60 s) sent with urllib: for what obstore
        has no call for (the Date header of a HEAD, a DELETE with If-Match). Returns the response or
        the HTTPError (both have .status/.code and .headers); the URL is never shown (it names the key id)."""
        import obstore
        try:
            url = obstore.sign(self._clients.store, method, self._key(path), timedelta(seconds=60))
        except Exception as e:
            raise self._fail(method.lower(), path, e) from None
        req = urllib.request.Request(url, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                resp.read()
                return resp.status, resp.headers
        except urllib.error.HTTPError as e:
            return e.code, e.headers
        except OSError as e:
            raise StorageError(f"{self.uri_of(path)}: {method.lower()} failed: {scrub(str(getattr(e, 'reason', e)))}") from None

    def _stat(self, path: str):
        status, headers = self._signed("HEAD", path)
        if status == 404:
            return None
        if status >= 300:
            raise StorageError(f"{self.uri_of(path)}: stat failed: HTTP {status}")
        date, modified = headers.get("Date"), headers.get("Last-Modified")
        age = ((parsedate_to_datetime(date) - parsedate_to_datetime(modified)).total_seconds()
               if date and modified else 0.0)  # both by the store's clock
        return headers.get("ETag"), max(age, 0.0)

    def _delete_if(self, path: str, tag: str) -> bool:
        status, _ = self._signed("DELETE", path, {"If-Match": tag})
        if status in (412, 404):
            return False
        if status < 300:
            return True
        if status != 501:
            raise StorageError(f"{self.uri_of(path)}: delete failed: HTTP {status}")
        now = self._stat(path)  # a store without conditional DELETE: check, then delete (a short race)
        if now is None or now[0] != tag:
            return False
        self.delete(path)
        return True
