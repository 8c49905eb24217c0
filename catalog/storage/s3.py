"""S3 (and S3-compatible: SeaweedFS, MinIO, R2, ...) for catalog/storage/__init__.py.

Every request humanset makes to S3 is an obstore (Rust `object_store`) call under the one retry
policy of catalog/storage/retry.py (`storage.retry_*`): streamed ListObjectsV2 listing (resumed
after the last key seen), whole-object and ranged GETs that resume a cut body from the byte reached
(catalog/storage/objectfile.py), HEAD, PUT, DELETE, the conditional writes (`If-None-Match: *` for
create_once and the run lock, `If-Match` for its heartbeat) and, through URLs obstore signs, the
lock's HEAD (the store's clock) and its conditional DELETE. obstore's own retries are off for those,
so each retry is ours: counted, classified, paced (backpressure). Only the streamed multipart
uploads (`open_output`, writes over SINGLE_PUT_MAX) keep obstore's retries, configured from the
same policy: their parts go up in obstore's threads, out of our reach.

Writes survive a lost acknowledgement: a plain PUT of a deterministic name is repeated as it was;
a conditional create or compare-and-swap carries a token (user metadata `humanset-token`, a random
nonce) and, after an ambiguous answer, is read back: our token means our write took effect; a
multipart upload whose completion went unanswered is checked the same way (its size and token).

`Storage.fs` is a pyarrow file system over these same calls (catalog/storage/arrowfs.py), for
pyarrow.parquet, Ray Data's `filesystem=` and DuckDB: the AWS C++ SDK is never loaded.

Credentials: the standard AWS chain, never passed, stored or printed by humanset. obstore reads
AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, web identity (AWS_WEB_IDENTITY_TOKEN_FILE),
container credentials (AWS_CONTAINER_CREDENTIALS_*) and the instance metadata role; a ~/.aws profile
(AWS_PROFILE, shared config/credentials files: static keys, SSO, assume-role) goes through boto3's
credential chain (obstore.auth.boto3). Endpoint: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL
(path-style addressing); region: AWS_REGION/AWS_DEFAULT_REGION, the profile's, us-east-1 with a
custom endpoint, else the bucket's (one request).

Size: one backend, the one concern of "every request to S3 and how it survives a fault"; the
readers that resume and the pyarrow file system already live apart (objectfile.py, arrowfs.py).
"""
from __future__ import annotations

import io
import os
import re
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path

import pyarrow.fs as pafs

from catalog.storage import answers, retry
from catalog.storage.base import Storage
from catalog.storage.core import ConditionalWritesUnsupported, Entry, StorageError, remote_parts, scrub
from catalog.storage.objectfile import ObjectFile, ObjectStream, read_all

PART_BYTES = 8 << 20  # multipart part size of open_output; up to UPLOADS parts are in flight at once
UPLOADS = 4
SINGLE_PUT_MAX = 64 << 20  # write_bytes up to this: one PUT, retried whole by us; larger: multipart
TOKEN = "humanset-token"  # user metadata of the objects we create conditionally or in parts: read back
_CHUNK = 256 << 10  # streamed bodies arrive in chunks of at least this (a cut resumes after the last)
_WRITE_BUFFER = 1 << 20  # open_output gathers small writes (tar headers, padding) before handing them on
_ENV_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI")
_CODE = re.compile(rb"<Code>([A-Za-z]+)</Code>")


def _short(e: BaseException) -> str:
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
        self._store = self._uploads = None
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

    def _build(self, own_retries: bool):
        try:
            from obstore.store import S3Store
        except ImportError:
            raise StorageError("s3:// needs obstore (pip install -r deps/storage.pip.txt)") from None
        pol = retry.policy()
        if own_retries:  # obstore's retries, from the policy: for the parts it uploads in its threads
            retries = {"max_retries": pol.attempts - 1, "retry_timeout": timedelta(seconds=pol.total_s),
                       "backoff": {"init_backoff": timedelta(seconds=max(pol.first_wait_s, 0.001)),
                                   "max_backoff": timedelta(seconds=max(pol.max_wait_s, 0.001)), "base": 3}}
        else:  # every other request is retried by catalog/storage/retry.py (counted, paced)
            retries = {"max_retries": 0}
        kw = {"credential_provider": self._provider} if self._provider is not None else {}
        http = bool(self.endpoint and self.endpoint.startswith("http://"))
        return S3Store(self.bucket, region=self.region, endpoint=self.endpoint, virtual_hosted_style_request=False,
                       client_options={"allow_http": http, "timeout": timedelta(seconds=300),
                                       "connect_timeout": timedelta(seconds=10)},
                       retry_config=retries, **kw), pol

    @property
    def store(self):
        """The client of our own requests (obstore retries off: catalog/storage/retry.py retries them)."""
        with self._lock:
            if self._store is None:
                self._store = self._build(False)[0]
            return self._store

    @property
    def uploads(self):
        """The client of multipart uploads, with obstore's retries set from the policy (rebuilt when
        the policy changes)."""
        with self._lock:
            if self._uploads is None or self._uploads[1] != retry.policy():
                self._uploads = self._build(True)
            return self._uploads[0]


class _Writer:
    """open_output's file: gathers small writes and hands them to obstore's streamed upload."""

    closed = False

    def __init__(self, out, fail):
        self._out, self._fail, self._buf, self._pos = out, fail, bytearray(), 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def write(self, data) -> int:
        self._buf += data
        self._pos += len(data)
        if len(self._buf) >= _WRITE_BUFFER:
            self._drain()
        return len(data)

    def flush(self) -> None:
        pass  # a flush would not make anything visible: the object appears at close

    def _drain(self) -> None:
        if self._buf:
            try:
                self._out.write(bytes(self._buf))
            except Exception as e:  # a part that failed after obstore's retries, in its thread
                raise self._fail(e) from None
            self._buf.clear()


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

    # a pyarrow file system over this store's requests (catalog/storage/arrowfs.py), built on demand
    @property
    def fs(self):
        if self.__dict__.get("_arrow") is None:
            from catalog.storage.arrowfs import arrow_filesystem
            self._arrow = arrow_filesystem(type(self), f"s3://{self.bucket}")
        return self._arrow

    @fs.setter
    def fs(self, value):
        if value is not None:
            raise AttributeError("an S3Storage builds its own pyarrow file system")

    @property
    def region(self) -> str:
        return self._clients.region

    def _key(self, path: str) -> str:
        return self.fs_path(path)[len(self.bucket) + 1:]

    def _fail(self, what: str, path: str, e: BaseException) -> StorageError:
        """The error of a failed request: StoreRefused for a permanent answer (one line, the fix)."""
        if isinstance(e, StorageError):
            return e
        verdict = answers.classify(e)
        if verdict.kind == "permanent":
            return answers.refusal(self.uri_of(path), verdict)
        return StorageError(f"{self.uri_of(path)}: {what} failed: {_short(e)}")

    def _missing(self, path: str) -> FileNotFoundError:
        return FileNotFoundError(f"{self.uri_of(path)}: no such file")

    def _call(self, what: str, path: str, fn, on_fault=None):
        """fn() under the retry policy; a missing key is FileNotFoundError, any other failure a
        StorageError naming the URI (StoreRefused for a permanent answer, GaveUp when the policy ran out)."""
        try:
            return retry.attempt(what, self.uri_of(path), fn, on_fault=on_fault)
        except StorageError:
            raise
        except FileNotFoundError:
            raise self._missing(path) from None
        except Exception as e:
            raise self._fail(what, path, e) from None

    def _open_at(self, path: str):
        """The GET of catalog/storage/objectfile.py: bytes [start, end) (If-Match `tag` once resumed)."""
        import obstore
        store, key = self._clients.store, self._key(path)

        def open_at(start: int, end: int | None, tag: str | None):
            opts: dict = {}
            if end is not None:
                opts["range"] = (start, end)
            elif start:
                opts["range"] = {"offset": start}
            if tag:
                opts["if_match"] = tag
            res = obstore.get(store, key, options=opts or None)
            return res.meta.get("e_tag"), res.meta["size"], res.stream(min_chunk_size=_CHUNK)
        return open_at

    def _read(self, path: str, start: int = 0, end: int | None = None, tag: str | None = None) -> bytes:
        try:
            return read_all(self._open_at(path), self.uri_of(path), start, end, tag)[0]
        except StorageError:
            raise
        except FileNotFoundError:
            raise self._missing(path) from None
        except Exception as e:
            raise self._fail("read", path, e) from None

    # reads: a cut body resumes from the byte reached (catalog/storage/objectfile.py)
    def open_input(self, path: str):
        meta = self._head(path)
        if meta is None:
            raise self._missing(path)
        tag = meta.get("e_tag")  # every read of this file is of the object seen now (If-Match)
        return ObjectFile(lambda start, end: self._read(path, start, end, tag), self.uri_of(path), meta["size"])

    def open_stream(self, path: str, buffer_size: int = 1 << 20):
        """One streamed GET of the object, read `buffer_size` at a time; resumed where it is cut."""
        try:
            raw = ObjectStream(self._open_at(path), self.uri_of(path))
        except StorageError:
            raise
        except FileNotFoundError:
            raise self._missing(path) from None
        except Exception as e:
            raise self._fail("open", path, e) from None
        return io.BufferedReader(raw, buffer_size)

    def read_bytes(self, path: str) -> bytes:
        return self._read(path)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return self._read(path, offset, offset + length)

    def _head(self, path: str):
        import obstore
        try:
            return self._call("stat", path, lambda: obstore.head(self._clients.store, self._key(path)))
        except FileNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        return self._head(path) is not None

    def size(self, path: str) -> int:
        meta = self._head(path)
        if meta is None:
            raise self._missing(path)
        return meta["size"]

    def _landed(self, path: str, token: str, size: int | None = None) -> str | None:
        """The tag of `path` if the object there is the one we wrote (our token; our size), else None:
        what a write whose answer was lost looks for."""
        import obstore
        try:
            got = self._call("stat", path, lambda: obstore.get(self._clients.store, self._key(path),
                                                                 options={"head": True}))
        except FileNotFoundError:
            return None
        if got.attributes.get(TOKEN) != token or (size is not None and got.meta["size"] != size):
            return None
        return got.meta.get("e_tag")

    # writes
    @contextmanager
    def open_output(self, path: str):
        """A streamed multipart upload: parts of PART_BYTES go up in the background (UPLOADS at a
        time, retried by obstore under the policy) while the caller writes on; the object appears
        only when the block succeeds (an exception aborts the upload and leaves nothing under the
        name). A completion whose answer is lost is checked by reading back the object's token."""
        import obstore
        token = uuid.uuid4().hex
        try:
            out = obstore.open_writer(self._clients.uploads, self._key(path), buffer_size=PART_BYTES,
                                      max_concurrency=UPLOADS, attributes={TOKEN: token})
        except Exception as e:
            raise self._fail("write", path, e) from None
        f = _Writer(out, lambda e: self._fail("write", path, e))
        try:
            yield f
            f._drain()
        except BaseException as e:
            out.__exit__(type(e), e, e.__traceback__)  # aborted: nothing visible
            raise
        try:
            out.close()  # CompleteMultipartUpload, or the single PUT of a small object
        except Exception as e:
            if self._landed(path, token, f.tell()) is None:
                raise self._fail("write", path, e) from None

    def write_bytes(self, path: str, data: bytes) -> None:
        import obstore
        data = bytes(data)
        if len(data) <= SINGLE_PUT_MAX:  # repeated as it was after a lost answer: the same bytes again
            self._call("write", path, lambda: obstore.put(self._clients.store, self._key(path), data,
                                                          use_multipart=False))
            return
        token = uuid.uuid4().hex
        try:
            obstore.put(self._clients.uploads, self._key(path), data, chunk_size=PART_BYTES,
                        max_concurrency=UPLOADS, attributes={TOKEN: token})
        except Exception as e:
            if self._landed(path, token, len(data)) is None:
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
        try:  # DeleteObjects: a key already gone counts as deleted, so a repeat after a lost answer is fine
            self._call("delete", path, lambda: obstore.delete(self._clients.store, self._key(path)))
        except FileNotFoundError:
            if not missing_ok:
                raise

    def _under(self, raw: str) -> Iterator[Entry]:
        """Keys starting with `raw`, from obstore's ListObjectsV2 stream: one page (1,000 keys, the
        S3 maximum) is requested when the previous one is used up, so one page is in memory at once;
        a page that fails is asked for again, after the last key seen (start-after)."""
        import obstore
        root = self._key("")
        folder = raw.rsplit("/", 1)[0] if "/" in raw else ""  # obstore lists whole path segments
        prefix = "/".join(p for p in (root, folder) if p)
        cut = len(root) + 1 if root else 0
        state: dict = {"it": None, "last": None}

        def page():
            if state["it"] is None:
                state["it"] = iter(obstore.list(self._clients.store, prefix=prefix or None, offset=state["last"],
                                                chunk_size=1000))
            return next(state["it"], None)

        def again(exc, verdict):
            state["it"] = None

        while (chunk := self._call("list", raw, page, on_fault=again)) is not None:
            for obj in chunk:
                state["last"] = obj["path"]
                rel = obj["path"][cut:]
                if rel.startswith(raw) and not rel.endswith("/"):  # folder markers some tools write
                    yield Entry(rel, obj["size"])

    # the run lock's primitives (catalog/storage/lock.py): each survives a lost answer
    def _conditional_put(self, what: str, path: str, data: bytes, mode) -> str | None:
        """PUT with a condition, a token in its metadata. Refused (412/409): None, unless an earlier try
        had an ambiguous answer and the object there carries our token: then it was ours, its tag."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError
        token = uuid.uuid4().hex
        state = {"ambiguous": False}

        def once():
            try:
                return obstore.put(self._clients.store, self._key(path), data, mode=mode,
                                   attributes={TOKEN: token})["e_tag"]
            except (AlreadyExistsError, PreconditionError, FileNotFoundError):
                return self._landed(path, token) if state["ambiguous"] else None
            except NotSupportedError:
                raise ConditionalWritesUnsupported(f"{self.uri}: the store refuses {what}") from None
            except Exception as e:
                verdict = answers.classify(e)
                if verdict.status == 501 or verdict.code == "NotImplemented":
                    raise ConditionalWritesUnsupported(f"{self.uri}: the store refuses {what}") from None
                raise

        def ambiguous(exc, verdict):  # the write may have been applied: look before believing a refusal
            state["ambiguous"] = True

        return self._call(what, path, once, on_fault=ambiguous)

    def _create(self, path: str, data: bytes) -> str | None:
        return self._conditional_put("create", path, data, "create")

    def _replace_if(self, path: str, data: bytes, tag: str) -> str | None:
        return self._conditional_put("replace", path, data, {"e_tag": tag})

    def _signed(self, method: str, path: str, headers: dict | None = None, what: str = "stat", on_fault=None):
        """One request obstore signs (a presigned URL, valid 60 s) sent with urllib: for what obstore
        has no call for (the Date header of a HEAD, a DELETE with If-Match), under the retry policy
        (Retry-After honoured). Returns (status, headers) of an answer that is not a fault of the
        store; the URL is never shown (it names the key id)."""
        import obstore

        def once():
            url = obstore.sign(self._clients.store, method, self._key(path), timedelta(seconds=60))
            req = urllib.request.Request(url, method=method, headers=headers or {})
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    resp.read()
                    return resp.status, resp.headers
            except urllib.error.HTTPError as e:
                body = e.read() if method != "HEAD" else b""
                m = _CODE.search(body or b"")
                code = m.group(1).decode() if m else ""
                if e.code in (401, 403, 408, 429) or (e.code >= 500 and e.code != 501):
                    after = e.headers.get("Retry-After")
                    raise answers.AnswerStatus(f"HTTP {e.code} {code}".strip(), e.code, code,
                                             float(after) if after and after.isdigit() else None) from None
                return e.code, e.headers
            except urllib.error.URLError as e:  # no answer: a reset, a refused connection, a timeout
                raise ConnectionError(scrub(str(e.reason))) from None

        return self._call(what, path, once, on_fault=on_fault)

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
        state = {"ambiguous": False}

        def ambiguous(exc, verdict):
            state["ambiguous"] = True

        status, _ = self._signed("DELETE", path, {"If-Match": tag}, what="delete", on_fault=ambiguous)
        if status == 404:  # gone: by our own earlier try whose answer was lost, else by someone else
            return state["ambiguous"]
        if status == 412:
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
