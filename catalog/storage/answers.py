"""What an object store's answer means, for the retry policy (catalog/storage/retry.py).

`classify(exc)` reads an exception of obstore, pyarrow, urllib or ours:
- throttled (429, 503, SlowDown and the other throttling codes): retried, and the process slows
  down (backpressure);
- transient (500, 502, 504, 408, InternalError, a reset or refused connection, a timeout) and cut
  (a body shorter than its length): retried, a cut read resumed from the byte reached;
- permanent (401, 403, InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied, NoSuchBucket, an
  expired token): `refusal(uri, verdict)` is a `StoreRefused`, one line naming the URI, the cause
  and the fix, never retried;
- anything else (a missing key, 412, a bug): not the store's fault, raised as it is.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from catalog.storage.core import StorageError


class StoreRefused(StorageError):
    """The store refused a request for good (credentials, permissions, a missing bucket): one line
    naming the URI, the cause and the fix. Never retried; commands exit 3 on it."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


class Verdict(NamedTuple):
    kind: str | None  # "throttled" | "transient" | "cut" | "permanent" | None (not ours to retry)
    status: int | None = None
    code: str = ""
    retry_after: float | None = None


THROTTLE_CODES = {"SlowDown", "SlowDownRead", "SlowDownWrite", "Throttling", "ThrottlingException",
                  "TooManyRequests", "TooManyRequestsException", "RequestLimitExceeded", "RequestThrottled",
                  "SLOW_DOWN", "THROTTLING"}
TRANSIENT_CODES = {"InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeTooSkewed",
                   "INTERNAL_FAILURE", "SERVICE_UNAVAILABLE", "NETWORK_CONNECTION", "REQUEST_TIMEOUT"}
# the permanent answers: (cause, fix); {bucket} and {uri} are filled in
PERMANENT = {
    "InvalidAccessKeyId": ("the store does not know this access key id (InvalidAccessKeyId)",
                           "check AWS_ACCESS_KEY_ID (or the AWS profile) and AWS_ENDPOINT_URL"),
    "SignatureDoesNotMatch": ("the store refuses the request's signature (SignatureDoesNotMatch: a wrong "
                              "secret key)", "check AWS_SECRET_ACCESS_KEY (or the AWS profile's secret)"),
    "AccessDenied": ("access denied (AccessDenied)",
                     "give these credentials read, write, list and delete rights on s3://{bucket}"),
    "AllAccessDisabled": ("all access to this bucket is disabled (AllAccessDisabled)",
                          "use another bucket or ask its owner"),
    "NoSuchBucket": ("no such bucket (NoSuchBucket)",
                     "create s3://{bucket} or correct the URI (and AWS_ENDPOINT_URL)"),
    "InvalidBucketName": ("not a valid bucket name (InvalidBucketName)", "correct the URI"),
    "ExpiredToken": ("the credentials expired (ExpiredToken)",
                     "renew them (a new session token, `aws sso login`), then rerun"),
    "InvalidToken": ("the session token is not valid (InvalidToken)", "renew the credentials"),
    "AccountProblem": ("the store's account has a problem (AccountProblem)", "ask the account's owner"),
    "UNAUTHENTICATED": ("the store refuses the credentials (401)",
                        "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the AWS profile"),
    "FORBIDDEN": ("the store refuses the request (403, no reason given: a HEAD's answer has no body)",
                  "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the AWS profile), and that they may read, "
                  "write, list and delete in s3://{bucket}"),
}
_PA_CODES = {"ACCESS_DENIED": "AccessDenied", "INVALID_ACCESS_KEY_ID": "InvalidAccessKeyId",
             "SIGNATURE_DOES_NOT_MATCH": "SignatureDoesNotMatch", "NO_SUCH_BUCKET": "NoSuchBucket",
             "EXPIRED_TOKEN": "ExpiredToken"}
_STATUS = re.compile(r"(?:status code: |HTTP status |HTTP Error |HTTP )(\d{3})\b")
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>|AWS Error ([A-Z_]+)")
_CONNECTION = ("error sending request", "connection reset", "connection refused", "connection aborted",
               "broken pipe", "timed out", "timeout", "connection closed", "incomplete", "eof occurred",
               "remote end closed", "curlcode: 56", "curlcode: 7", "curlcode: 28", "failed to flush response",
               "name or service not known", "temporary failure in name resolution", "dns error")
_CUT = ("request or response body error", "body error", "failed to flush response stream", "incompleteread",
        "shorter than its length", "error decoding response body")


def _codes(text: str) -> list[str]:
    out = []
    for xml, aws in _CODE.findall(text):
        code = xml or aws
        out.append(_PA_CODES.get(code, code))
    return out


def classify(exc: BaseException) -> Verdict:
    """What a failed request's exception means (obstore's, pyarrow's, urllib's or ours)."""
    if isinstance(exc, StoreRefused):
        return Verdict("permanent", None, exc.code)
    given = getattr(exc, "verdict", None)
    if isinstance(given, Verdict):
        return given
    name = type(exc).__name__
    text = str(exc)
    low = text.lower()
    m = _STATUS.search(text)
    status = int(m.group(1)) if m else getattr(exc, "status", None)
    codes = _codes(text)
    code = next((c for c in codes if c in PERMANENT or c in THROTTLE_CODES or c in TRANSIENT_CODES), "")
    if isinstance(exc, FileNotFoundError) and not isinstance(exc, StorageError):
        # a missing key, unless the body says the bucket itself is missing (a GET's 404 NoSuchBucket)
        return Verdict("permanent", 404, code) if code in PERMANENT else Verdict(None, 404)
    if name in ("UnauthenticatedError",):
        return Verdict("permanent", status or 401, code if code in PERMANENT else "UNAUTHENTICATED")
    if code in PERMANENT or (code == "" and name == "PermissionDeniedError"):
        return Verdict("permanent", status or 403, code or "FORBIDDEN")
    if name in ("NotFoundError", "AlreadyExistsError", "PreconditionError", "NotModifiedError",
                "NotSupportedError", "NotImplementedError", "InvalidPathError", "UnknownConfigurationKeyError"):
        return Verdict(None, status, code)
    if code in THROTTLE_CODES or status in (429, 503):
        return Verdict("throttled", status, code or str(status))
    if any(s in low for s in _CUT):
        return Verdict("cut", status, code)
    if code in TRANSIENT_CODES or status in (500, 502, 504, 408):
        return Verdict("transient", status, code or str(status))
    if status == 403 or status == 401:
        return Verdict("permanent", status, "FORBIDDEN" if status == 403 else "UNAUTHENTICATED")
    if status is not None and status < 500:
        return Verdict(None, status, code)
    if any(s in low for s in _CONNECTION) or isinstance(exc, (ConnectionError, TimeoutError)):
        return Verdict("transient", status, code)
    return Verdict(None, status, code)


class CutBody(OSError):
    """A body that ended before its length: the read resumes from the byte reached."""
    verdict = Verdict("cut")


class AnswerStatus(OSError):
    """An HTTP answer of a request humanset sends itself (the lock's signed HEAD and DELETE)."""

    def __init__(self, message: str, status: int, code: str = "", retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        kind = classify(OSError(f"HTTP {status} <Code>{code}</Code>")).kind if status >= 400 else None
        self.verdict = Verdict(kind, status, code or str(status), retry_after)


def refusal(uri: str, verdict: Verdict) -> StoreRefused:
    """The one line of a permanent answer: the URI, the cause and the fix."""
    cause, fix = PERMANENT.get(verdict.code) or PERMANENT["FORBIDDEN" if verdict.status == 403 else
                                                          "UNAUTHENTICATED"]
    bucket = uri.split("://", 1)[-1].split("/", 1)[0]
    return StoreRefused(f"{uri}: {cause}; {fix.format(bucket=bucket, uri=uri)}", verdict.code)


class GaveUp(StorageError):
    """A transient fault outlasted the retry policy (its tries or its total time): the store is
    failing, not the data; commands exit 3 on it and a rerun resumes."""


STORE_FAULTS = (StoreRefused, GaveUp)  # a store refusing or failing, never a fault of the data: readers
# that turn a read error into a row (a damaged shard, a changed source) let these through


def store_fault(exc: BaseException) -> StorageError | None:
    """The StoreRefused or GaveUp behind an exception (a Ray task error, a wrapped OSError), if any:
    what a command reports as its one line, exit status 3."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (StoreRefused, GaveUp)):
            return e
        cause = getattr(e, "cause", None)  # a Ray task error holds the worker's exception here
        e = cause if isinstance(cause, BaseException) else (e.__cause__ or e.__context__)
    return None
