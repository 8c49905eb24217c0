"""A pyarrow file system over a Storage's own requests, for what takes one (`pyarrow.parquet`,
Ray Data's `filesystem=`, DuckDB through fsspec): `S3Storage.fs`.

Its files are the Storage's: `open_input_file` is the random-access file whose reads resume a cut
body (catalog/storage/objectfile.py), `open_input_stream` one streamed GET resumed where it is cut,
`get_file_info` a HEAD (else one listing page for a "directory"), selectors the streamed listing,
writes the Storage's uploads. So every request pyarrow makes on humanset's behalf is under the one
retry policy (catalog/storage/retry.py); pyarrow's own S3 client (the AWS C++ SDK, whose retry
strategies are its two built-ins and which gives up on a cut body) is not used.

The handler pickles as its store's class and root URI, as a Storage does: a Ray task gets no client
and no secret. Paths are pyarrow's: `bucket/key` (an `s3://` in front is dropped).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs

from catalog.storage.core import clean_rel


def arrow_filesystem(kind, root_uri: str) -> pafs.PyFileSystem:
    """The pyarrow FileSystem of the stores of class `kind` (e.g. S3Storage), rooted at a bucket URI."""
    return pafs.PyFileSystem(StoreHandler(kind, root_uri))


class _Output:
    """open_output_stream's file: the Storage's upload, committed at close."""

    def __init__(self, store, rel: str):
        self._cm = store.open_output(rel)
        self._f = self._cm.__enter__()
        self.closed = False

    def write(self, data) -> int:
        return self._f.write(bytes(data))

    def tell(self) -> int:
        return self._f.tell()

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._cm.__exit__(None, None, None)


class StoreHandler(pafs.FileSystemHandler):
    def __init__(self, kind, root_uri: str):
        self.kind, self.root_uri = kind, root_uri.rstrip("/")
        self.scheme = self.root_uri.split("://", 1)[0]
        self._stores: dict = {}

    def __reduce__(self):
        return StoreHandler, (self.kind, self.root_uri)

    def __eq__(self, other):
        return isinstance(other, StoreHandler) and (other.kind, other.root_uri) == (self.kind, self.root_uri)

    def _split(self, path: str):
        """(the Storage of the path's bucket, the key): `bucket/key`, with or without `s3://`."""
        path = path.split("://", 1)[1] if "://" in path else path
        bucket, _, key = path.strip("/").partition("/")
        store = self._stores.get(bucket)
        if store is None:
            store = self._stores[bucket] = self.kind.from_uri(f"{self.scheme}://{bucket}")
        return store, clean_rel(key)

    def get_type_name(self) -> str:
        return f"humanset-{self.scheme}"

    def equals(self, other) -> bool:
        return self == getattr(other, "handler", None)

    def normalize_path(self, path: str) -> str:
        return path.split("://", 1)[1] if "://" in path else path

    def _info(self, path: str) -> pafs.FileInfo:
        store, key = self._split(path)
        path = self.normalize_path(path).rstrip("/")
        if not key:
            return pafs.FileInfo(path, pafs.FileType.Directory)
        meta = store._head(key)
        if meta is not None:
            return pafs.FileInfo(path, pafs.FileType.File, size=meta["size"], mtime=meta.get("last_modified"))
        if next(iter(store._under(key + "/")), None) is not None:
            return pafs.FileInfo(path, pafs.FileType.Directory)
        return pafs.FileInfo(path, pafs.FileType.NotFound)

    def get_file_info(self, paths):
        return [self._info(p) for p in paths]

    def get_file_info_selector(self, selector):
        store, key = self._split(selector.base_dir)
        base = self.normalize_path(selector.base_dir).rstrip("/")
        out, dirs = [], set()
        for entry in store._under(key + "/" if key else ""):
            rel = entry.path[len(key) + 1:] if key else entry.path
            parts = rel.split("/")
            for i in range(1, len(parts) if selector.recursive else min(2, len(parts))):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    out.append(pafs.FileInfo(f"{base}/{d}", pafs.FileType.Directory))
            if selector.recursive or len(parts) == 1:
                out.append(pafs.FileInfo(f"{base}/{rel}", pafs.FileType.File, size=entry.size))
        if not out and key and not selector.allow_not_found and store._head(key) is None:
            raise FileNotFoundError(f"{store.uri_of(key)}: no such directory")
        return out

    def create_dir(self, path, recursive):
        pass  # an object store has no folders: a key's prefix is one

    def delete_dir(self, path):
        self.delete_dir_contents(path, True)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        store, key = self._split(path)
        if not key:
            raise PermissionError(f"{path}: refusing to empty a whole bucket")
        for entry in list(store._under(key + "/")):
            store.delete(f"{key}/{entry.path[len(key) + 1:]}")

    def delete_root_dir_contents(self):
        raise PermissionError(f"{self.root_uri}: refusing to empty a whole bucket")

    def delete_file(self, path):
        store, key = self._split(path)
        store.delete(key, missing_ok=False)

    def copy_file(self, src, dest):
        s, sk = self._split(src)
        d, dk = self._split(dest)
        d.write_bytes(dk, s.read_bytes(sk))

    def move(self, src, dest):
        self.copy_file(src, dest)
        self.delete_file(src)

    def open_input_stream(self, path):
        store, key = self._split(path)
        return pa.PythonFile(store.open_stream(key, 8 << 20), mode="r")

    def open_input_file(self, path):
        store, key = self._split(path)
        return pa.PythonFile(store.open_input(key), mode="r")

    def open_output_stream(self, path, metadata):
        store, key = self._split(path)
        return pa.PythonFile(_Output(store, key), mode="w")

    def open_append_stream(self, path, metadata):
        raise NotImplementedError(f"{path}: an object cannot be appended to; write a new one")
