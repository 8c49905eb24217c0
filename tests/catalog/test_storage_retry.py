"""catalog/storage/retry.py and answers.py without a server: what an answer means, the waits between
tries, the bound on tries and time, backpressure, and the settings every room shares."""
import json
import os
import random
import threading
import time

import pytest

from catalog.storage import answers, retry
from catalog.storage.answers import GaveUp, StoreRefused, classify

OBSTORE_503 = ("Generic S3 error: Error performing GET http://127.0.0.1:1/b/k in 44ms - Server returned non-2xx "
               "status code: 503 Service Unavailable: <?xml version=\"1.0\"?>\n<Error><Code>SlowDown</Code>"
               "<Message>Please reduce your request rate.</Message></Error>\n\nDebug source: ...")
OBSTORE_500 = ("Generic S3 error: Error performing PUT http://127.0.0.1:1/b/k in 45.015013ms - Server returned "
               "non-2xx status code: 500 Internal Server Error: <Error><Code>InternalError</Code></Error>")
OBSTORE_CUT = "Generic S3 error: HTTP error: request or response body error\n\nDebug source: kind: Interrupted"
OBSTORE_RESET = "Generic S3 error: Error performing HEAD http://127.0.0.1:1/b/k in 0.7ms - HTTP error: error sending request"
OBSTORE_SIG = ("Generic S3 error: ... Server returned non-2xx status code: 403 Forbidden: <Error><Code>"
               "SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match</Message>")
OBSTORE_BUCKET = ("Object at location x not found: ... status code: 404 Not Found: <Error><Code>NoSuchBucket</Code>"
                  "<Message>The specified bucket does not exist</Message></Error>")
PYARROW_503 = ("When getting information for key 'exp/p.bin' in bucket 'b': AWS Error UNKNOWN (HTTP status 503) "
               "during HeadObject operation: No response body.")
PYARROW_CUT = ("AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response stream "
               "(eof: 0, bad: 1)")
PYARROW_RESET = ("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 56, Failure when receiving data "
                 "from the peer")


@pytest.mark.parametrize("text,kind,code", [
    (OBSTORE_503, "throttled", "SlowDown"), (OBSTORE_500, "transient", "InternalError"), (OBSTORE_CUT, "cut", ""),
    (OBSTORE_RESET, "transient", ""), (OBSTORE_SIG, "permanent", "SignatureDoesNotMatch"),
    (OBSTORE_BUCKET, "permanent", "NoSuchBucket"), (PYARROW_503, "throttled", "503"), (PYARROW_CUT, "cut", None),
    (PYARROW_RESET, "transient", None), ("HTTP 429 ", "throttled", "429"), ("HTTP 502 ", "transient", "502"),
    ("status code: 412 Precondition Failed", None, ""), ("status code: 404 Not Found: <Code>NoSuchKey</Code>", None, None),
    ("a bug of ours", None, ""),
])
def test_each_answer_is_classified_as_the_store_meant_it(text, kind, code):
    v = classify(OSError(text))
    assert v.kind == kind, v
    if code is not None:
        assert v.code == code


def test_an_answer_that_only_looks_like_a_fault_is_not_one():
    # the timing obstore prints ("45.015013ms") holds "501": no status is read from it
    assert classify(OSError(OBSTORE_500)).status == 500
    assert classify(FileNotFoundError("s3://b/k: no such file")).kind is None
    # obstore raises a GET's 404 as FileNotFoundError; a missing bucket says so in the body
    assert classify(FileNotFoundError(OBSTORE_BUCKET)).kind == "permanent"
    assert classify(ConnectionResetError("reset")).kind == "transient"


def test_a_permanent_answer_is_one_line_naming_the_uri_the_cause_and_the_fix():
    e = answers.refusal("s3://runs/r1/.lock", classify(OSError(OBSTORE_SIG)))
    assert isinstance(e, StoreRefused) and "\n" not in str(e)
    assert str(e).startswith("s3://runs/r1/.lock: the store refuses the request's signature")
    assert "AWS_SECRET_ACCESS_KEY" in str(e)
    e = answers.refusal("s3://missing/runs/r1", classify(OSError(OBSTORE_BUCKET)))
    assert "no such bucket (NoSuchBucket)" in str(e) and "create s3://missing" in str(e)
    e = answers.refusal("s3://b/r/x.json", classify(OSError("HEAD ... status code: 403 Forbidden")))  # no body
    assert "AWS_SECRET_ACCESS_KEY" in str(e) and "delete in s3://b" in str(e) and "\n" not in str(e)


def _policy(**kw):
    return retry.RetryPolicy(**{"attempts": 5, "first_wait_s": 0.01, "max_wait_s": 0.05, "total_s": 30, **kw})


class _Fails:
    """A request that fails with `errors` in turn, then answers `result`."""

    def __init__(self, errors, result="ok"):
        self.errors, self.result, self.calls = list(errors), result, 0

    def __call__(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


def test_transient_answers_are_retried_and_counted_with_what_they_were_for():
    before = retry.snapshot()
    waits = []
    fn = _Fails([OSError(OBSTORE_503), OSError(OBSTORE_500), OSError(OBSTORE_RESET)])
    assert retry.attempt("read", "s3://b/k", fn, pol=_policy(), sleep=waits.append) == "ok"
    got = retry.since(before)
    assert fn.calls == 4 and len(waits) == 3
    assert got["retries"] == 3 and got["throttled"] == 1 and got["requests"] == 4
    assert got["retries_for"] == {"read": 3}


def test_a_permanent_answer_is_never_retried():
    fn = _Fails([OSError(OBSTORE_SIG)] * 5)
    with pytest.raises(StoreRefused, match="SignatureDoesNotMatch"):
        retry.attempt("write", "s3://b/k", fn, pol=_policy(), sleep=lambda s: None)
    assert fn.calls == 1


def test_what_is_not_the_stores_fault_passes_through_untouched():
    err = FileNotFoundError("s3://b/k: no such file")
    fn = _Fails([err])
    with pytest.raises(FileNotFoundError) as got:
        retry.attempt("read", "s3://b/k", fn, pol=_policy(), sleep=lambda s: None)
    assert got.value is err and fn.calls == 1


def test_transient_faults_stop_after_the_tries_throttling_only_after_the_total_time():
    fn = _Fails([OSError(OBSTORE_500)] * 10)
    with pytest.raises(GaveUp, match="read failed after 5 tries") as e:
        retry.attempt("read", "s3://b/k", fn, pol=_policy(), sleep=lambda s: None)
    assert "storage.retry_attempts=5" in str(e.value) and "\n" not in str(e.value)
    fn = _Fails([OSError(OBSTORE_503)] * 12)  # more throttles than tries: the store asks for patience
    assert retry.attempt("read", "s3://b/k", fn, pol=_policy(), sleep=lambda s: None) == "ok" and fn.calls == 13
    clock = [0.0]
    fn = _Fails([OSError(OBSTORE_503)] * 100)
    with pytest.raises(GaveUp):
        retry.attempt("read", "s3://b/k", fn, pol=_policy(total_s=0.2, max_wait_s=0.05),
                      sleep=lambda s: (clock.__setitem__(0, clock[0] + s), time.sleep(s)))
    assert clock[0] <= 0.2


def test_waits_grow_with_decorrelated_jitter_and_honour_retry_after():
    pol = retry.RetryPolicy(first_wait_s=0.1, max_wait_s=5.0)
    rng = random.Random(0)
    wait, seen = None, []
    for _ in range(30):
        wait = pol.next_wait(wait, rng)
        seen.append(wait)
    assert seen[0] == 0.1 and all(0.1 <= w <= 5.0 for w in seen) and max(seen) > 2
    waits = []
    err = answers.AnswerStatus("HTTP 503 SlowDown", 503, "SlowDown", retry_after=0.3)
    retry.attempt("stat", "s3://b/k", _Fails([err]), pol=retry.RetryPolicy(first_wait_s=0.01), sleep=waits.append)
    assert waits == [0.3]  # more than the policy's own wait: the store's word


def test_throttling_halves_what_is_in_flight_pauses_the_process_and_recovers():
    gate = retry.Limiter(16)
    gate.throttled(0.05)
    assert gate.limit == 8 and gate.pause_until > time.monotonic()
    gate.throttled(0.05)  # the same burst: one cut
    assert gate.limit == 8
    t0 = time.monotonic()
    with gate.slot():
        pass
    assert time.monotonic() - t0 >= 0.03  # held for the throttled request's wait
    time.sleep(0.06)
    gate.throttled(0.0)
    assert gate.limit == 4
    for _ in range(200):
        gate.succeeded()
    assert gate.limit == 16  # additive increase back to the ceiling


def test_no_more_requests_are_in_flight_than_the_limit_and_a_nested_one_never_waits_on_itself():
    gate = retry.Limiter(2)
    peak, now, lock = [0], [0], threading.Lock()

    def work():
        with gate.slot():
            with lock:
                now[0] += 1
                peak[0] = max(peak[0], now[0])
            with gate.slot():  # a read-back inside a conditional write: same thread, same slot
                time.sleep(0.02)
            with lock:
                now[0] -= 1
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert peak[0] == 2 and not any(t.is_alive() for t in threads)


def test_settings_are_one_section_that_every_room_has_and_children_inherit(monkeypatch):
    from catalog.config import defaults_of
    from pipeline.config import default_config
    from render.config import RenderConfig
    from training.config import default_config as training_defaults
    section = defaults_of(retry.StorageSettings)
    assert default_config()["storage"] == section == RenderConfig().to_dict()["storage"]
    assert training_defaults("pretrain")["storage"] == section
    monkeypatch.delenv(retry.ENV, raising=False)
    try:
        pol = retry.configure({"stages": ["decode"], "storage": {**section, "retry_attempts": 3}})
        assert pol.attempts == 3 and json.loads(os.environ[retry.ENV])["retry_attempts"] == 3
        assert retry.policy().attempts == 3
        with pytest.raises(ValueError, match="unknown"):
            retry.RetryPolicy.of({"retry_attempts": 3, "retry_typo": 1})
    finally:
        retry.configure(None)
