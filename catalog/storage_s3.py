"""S3 (and S3-compatible: SeaweedFS, MinIO, R2, ...) for catalog/storage.py.

Data moves through pyarrow's S3FileSystem (the AWS C++ SDK: multipart uploads, ranged GETs, standard
retries); the streamed listing (ListObjectsV2, 1,000 keys a page) and the conditional requests
(`If-None-Match: *`, `If-Match` on PUT and DELETE) go through boto3. Both take credentials only from
the standard AWS chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, ~/.aws profiles,
container and instance roles), the endpoint from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, the region
from AWS_REGION/AWS_DEFAULT_REGION or the profile.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from email.utils import parsedate_to_datetime

import pyarrow.fs as pafs

from .storage import ConditionalWritesUnsupported, Entry, Storage, StorageError, scrub

MAX_ATTEMPTS = 10  # per request, with the SDKs' standard exponential backoff (both clients)
_REFUSED = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_MISSING = {"NoSuchKey", "404", "NotFound"}
_NOT_IMPLEMENTED = {"NotImplemented", "501"}


def _code(e) -> str:
    err = getattr(e, "response", {}).get("Error", {})
    return str(err.get("Code", ""))


class S3Storage(Storage):
    scheme = "s3"
    page_size = 1000  # keys per ListObjectsV2 request (the S3 maximum)

    def __init__(self, bucket: str, key: str):
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise StorageError("s3:// needs boto3 (pip install -r deps/storage.pip.txt)") from None
        self.bucket = bucket
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
        session = boto3.session.Session()
        region = session.region_name
        if not region:
            try:
                region = "us-east-1" if endpoint else pafs.resolve_s3_region(bucket)
            except OSError as e:
                raise StorageError(f"s3://{bucket}: cannot find the bucket's region (set AWS_REGION): "
                                   f"{scrub(str(e))}") from None
        self._session, self._endpoint, self._region = session, endpoint, region
        self._config = Config(retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
                              s3={"addressing_style": "path"} if endpoint else None)
        self._client = None
        fs = pafs.S3FileSystem(region=region, endpoint_override=endpoint,
                               retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=MAX_ATTEMPTS))
        base = f"{bucket}/{key}".rstrip("/")
        super().__init__(f"s3://{base}", fs, base)

    @property
    def client(self):
        if self._client is None:
            self._client = self._session.client("s3", endpoint_url=self._endpoint, region_name=self._region,
                                                config=self._config)
        return self._client

    def _key(self, path: str) -> str:
        full = self.fs_path(path)
        return full[len(self.bucket) + 1:]

    def _fail(self, what: str, path: str, e: Exception) -> StorageError:
        return StorageError(f"{self.uri_of(path)}: {what} failed: {scrub(str(e))}")

    def _call(self, what: str, path: str, fn, **kw):
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            return fn(Bucket=self.bucket, **kw)
        except ClientError:
            raise
        except BotoCoreError as e:  # no credentials, endpoint unreachable, ...
            raise self._fail(what, path, e) from None

    def _under(self, raw: str) -> Iterator[Entry]:
        from botocore.exceptions import BotoCoreError, ClientError
        root = self._key("")
        prefix = (root + "/" if root else "") + raw
        cut = len(root) + 1 if root else 0
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": self.page_size})
        try:
            for page in pages:  # one page (<= page_size keys) in memory at a time
                for obj in page.get("Contents", ()):
                    if not obj["Key"].endswith("/"):  # folder markers some tools write
                        yield Entry(obj["Key"][cut:], obj["Size"])
        except (BotoCoreError, ClientError) as e:
            raise self._fail("list", raw, e) from None

    def _create(self, path: str, data: bytes) -> str | None:
        from botocore.exceptions import ClientError
        try:
            return self._call("create", path, self.client.put_object, Key=self._key(path), Body=data,
                              IfNoneMatch="*")["ETag"]
        except ClientError as e:
            if _code(e) in _REFUSED:
                return None
            if _code(e) in _NOT_IMPLEMENTED:
                raise ConditionalWritesUnsupported(f"{self.uri}: the store refuses If-None-Match") from None
            raise self._fail("create", path, e) from None

    def _stat(self, path: str):
        from botocore.exceptions import ClientError
        try:
            head = self._call("stat", path, self.client.head_object, Key=self._key(path))
        except ClientError as e:
            if _code(e) in _MISSING:
                return None
            raise self._fail("stat", path, e) from None
        date = head["ResponseMetadata"]["HTTPHeaders"].get("date")
        now = parsedate_to_datetime(date) if date else None
        age = (now - head["LastModified"]).total_seconds() if now else 0.0  # both by the store's clock
        return head["ETag"], max(age, 0.0)

    def _replace_if(self, path: str, data: bytes, tag: str) -> str | None:
        from botocore.exceptions import ClientError
        try:
            return self._call("replace", path, self.client.put_object, Key=self._key(path), Body=data,
                              IfMatch=tag)["ETag"]
        except ClientError as e:
            if _code(e) in _REFUSED | _MISSING:
                return None
            raise self._fail("replace", path, e) from None

    def _delete_if(self, path: str, tag: str) -> bool:
        from botocore.exceptions import ClientError
        try:
            self._call("delete", path, self.client.delete_object, Key=self._key(path), IfMatch=tag)
            return True
        except ClientError as e:
            if _code(e) in _REFUSED | _MISSING:
                return False
            if _code(e) not in _NOT_IMPLEMENTED:
                raise self._fail("delete", path, e) from None
        now = self._stat(path)  # a store without conditional DELETE: check, then delete (a short race)
        if now is None or now[0] != tag:
            return False
        self.delete(path)
        return True
