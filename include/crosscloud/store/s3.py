"""A cloud's S3-compatible object store (OBS, OSS, MinIO, Ceph, AWS S3) through boto3.

Large objects stream: uploads are multipart with parallel parts, downloads are
ranged reads that resume where a dropped connection left them, so no whole
checkpoint is ever held in memory. Transient failures (throttling, 5xx,
connection resets, a restarting server) are retried with backoff until a
deadline; permanent ones (access denied, no such bucket) fail at once with the
cloud, bucket and key named.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO, TypeVar

from crosscloud.store.base import CHUNK, ObjectNotFound, ObjectStore, StoreError

T = TypeVar("T")

PERMANENT = {
    "AccessDenied", "NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidBucketName",
    "AllAccessDisabled", "AccountProblem", "InvalidArgument", "MethodNotAllowed", "403", "Forbidden",
    "EntityTooLarge", "QuotaExceeded", "XMinioStorageFull",  # out of space: say so now, not after the deadline
}
NOT_FOUND = {"NoSuchKey", "404", "NotFound"}


class _KeepOpen:
    """The caller's stream as s3transfer sees it: a failed upload closes it, and a closed one cannot be sent again."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

    def close(self) -> None:
        pass


class S3Store(ObjectStore):
    def __init__(
        self,
        cloud: str,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        addressing_style: str = "auto",
        credentials: dict[str, str] | None = None,
        retry_deadline_s: float = 120.0,
        retry_backoff_s: float = 0.2,
        retry_backoff_max_s: float = 5.0,
    ):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.cloud, self.bucket, self.prefix = cloud, bucket, prefix.strip("/")
        self.retry_deadline_s, self.retry_backoff_s, self.retry_backoff_max_s = retry_deadline_s, retry_backoff_s, retry_backoff_max_s
        config = Config(
            region_name=region or "us-east-1",
            s3={"addressing_style": addressing_style},
            retries={"mode": "standard", "max_attempts": 3},
            connect_timeout=5,
            read_timeout=60,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            max_pool_connections=16,
        )
        session = boto3.session.Session(**(credentials or {}))
        self.client = session.client("s3", endpoint_url=endpoint_url, config=config)
        # parallel parts, but a bounded number of them in memory: (queue + in flight) x CHUNK
        self.transfer = TransferConfig(
            multipart_threshold=CHUNK, multipart_chunksize=CHUNK, max_concurrency=4, use_threads=True
        )
        self.transfer.max_in_memory_upload_chunks = 4  # s3transfer's knob; boto3's constructor lacks it

    def __repr__(self) -> str:
        return f"S3Store({self.cloud!r}, s3://{self.bucket}/{self.prefix})"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self, key: str) -> str:
        return f"cloud {self.cloud}: s3://{self.bucket}/{self._key(key)}"

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """Run ``fn``, retrying transient failures with exponential backoff until the deadline."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        deadline, delay = time.monotonic() + self.retry_deadline_s, self.retry_backoff_s
        while True:
            try:
                return fn()
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code in NOT_FOUND:
                    raise ObjectNotFound(f"{self._where(key)}: no such object") from None
                if code in PERMANENT:
                    raise StoreError(f"{self._where(key)}: {what} refused: {code} ({exc})") from None
                error = exc
            except NoCredentialsError:
                raise StoreError(f"{self._where(key)}: {what} impossible: no credentials for this store") from None
            except (BotoCoreError, ConnectionError, OSError) as exc:
                error = exc
            if time.monotonic() + delay > deadline:
                raise StoreError(f"{self._where(key)}: {what} still failing after {self.retry_deadline_s:.0f} s: {error}")
            time.sleep(delay)
            delay = min(delay * 2, self.retry_backoff_max_s)

    # -- the ObjectStore operations ---------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        self.put_stream(key, io.BytesIO(data))

    def put_stream(self, key: str, stream: BinaryIO) -> None:
        upload = lambda: self.client.upload_fileobj(_KeepOpen(stream), self.bucket, self._key(key), Config=self.transfer)  # noqa: E731
        if not stream.seekable():  # cannot be sent again from here: the caller retries from its source
            try:
                return upload()
            except Exception as exc:
                raise StoreError(f"{self._where(key)}: upload failed: {exc}") from exc
        start = stream.tell()

        def again():
            stream.seek(start)  # a retried upload sends the whole object again
            upload()

        self._call("upload", key, again)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """A conditional write (If-None-Match: *) where the server supports it."""
        from botocore.exceptions import ClientError

        def put():
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
                return True
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                    return False
                if code in ("NotImplemented", "501"):  # no conditional writes here: check, then write
                    if self.exists(key):
                        return False
                    self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
                    return True
                raise

        return self._call("conditional write", key, put)

    def get(self, key: str) -> bytes:
        return b"".join(self.iter_chunks(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """One ranged GET, retried whole like any call; a short read counts as a dropped connection."""

        def read_range() -> bytes:
            rng = f"bytes={start}-{start + length - 1}"
            data = self.client.get_object(Bucket=self.bucket, Key=self._key(key), Range=rng)["Body"].read()
            if len(data) != length:
                raise ConnectionError(f"short read: {len(data)} of {length} bytes")
            return data

        return self._call("download", key, read_range) if length > 0 else b""

    def iter_chunks(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """The object's bytes in ranged reads; a dropped read resumes at the offset reached."""
        size = self.size(key)
        offset = 0
        while offset < size:
            data = self.get_range(key, offset, min(chunk, size - offset))
            offset += len(data)
            yield data

    def size(self, key: str) -> int:
        head = self._call("head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(key)))
        return int(head["ContentLength"])

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
            return True
        except ObjectNotFound:
            return False

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0

        def list_all() -> list[str]:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
            return [obj["Key"][strip:] for page in pages for obj in page.get("Contents", [])]

        return sorted(self._call("list", prefix, list_all))

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key)))
