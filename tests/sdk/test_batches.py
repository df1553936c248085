"""The Batch API as the openai SDK drives it: a JSONL of 200 chat lines (ten of them too long
for the backend's window) uploaded with `files.create`, a batch created, polled to
`completed`, its output and error files downloaded and read into the SDK's own types; a
batch cancelled mid-way; batches and files listed a page at a time; another client's key
refused. Simulator only (the batch's state is the proxy's own)."""

import json
import os
import time

import openai
import pytest
from openai.types.chat import ChatCompletion

from conftest import BACKEND, Fleet, ledgered_config

pytestmark = pytest.mark.skipif(BACKEND == "real", reason="the proxy's own batches: simulator only")

ADMIN, ANN, BOB = "sdk-batch-admin", "sdk-batch-ann", "sdk-batch-bob"


@pytest.fixture(scope="module")
def base():
    """A proxy with two clients and an admin key, keeping batches in a SQLite ledger."""
    fleet = Fleet()
    try:
        sim = fleet.simulate("llamacpp", "--slots", "4")
        os.environ.update(SB_SDK_BATCH_ADMIN=ADMIN, SB_SDK_BATCH_ANN=ANN, SB_SDK_BATCH_BOB=BOB)
        config = ledgered_config(fleet, sim, "SB_SDK_BATCH", "\n[batches]\nmax_concurrent = 4\n")
        yield fleet.serve("batch-proxy", config)
    finally:
        fleet.close()


def sdk(base, key):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)


def line(custom_id, content, max_tokens=8):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "small", "max_tokens": max_tokens,
                                "messages": [{"role": "user", "content": content}]}})


def upload(client, lines):
    text = "\n".join(lines) + "\n"
    return client.files.create(file=("lines.jsonl", text.encode()), purpose="batch")


def until(client, batch_id, done, timeout=120.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        b = client.batches.retrieve(batch_id)
        if done(b):
            return b
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} never reached the state awaited: {b}")


def read(client, file_id):
    if file_id is None:
        return []
    return [json.loads(l) for l in client.files.content(file_id).text.splitlines()]


def test_two_hundred_lines_run_to_completed_each_custom_id_answered_once(base):
    ann = sdk(base, ANN)
    good = [f"q-{i:03}" for i in range(190)]
    bad = [f"long-{i}" for i in range(10)]
    lines = [line(c, f"question {c}") for c in good]
    # Over the simulator's 4096-token window: the backend refuses each with a 400.
    lines += [line(c, "word " * 5000) for c in bad]
    f = upload(ann, lines)
    assert (f.object, f.purpose, f.bytes) == ("file", "batch", len("\n".join(lines)) + 1)
    assert ann.files.retrieve(f.id).filename == "lines.jsonl"
    b = ann.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                           completion_window="24h", metadata={"suite": "sdk"})
    assert b.status == "validating" and b.metadata == {"suite": "sdk"}
    b = until(ann, b.id, lambda b: b.status in ("completed", "failed", "expired"))
    assert b.status == "completed", b
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (200, 190, 10)
    out = read(ann, b.output_file_id)
    assert sorted(l["custom_id"] for l in out) == good
    for l in out:
        assert l["response"]["status_code"] == 200 and l["error"] is None
        answer = ChatCompletion.model_validate(l["response"]["body"])
        assert answer.choices[0].message.content
    errors = read(ann, b.error_file_id)
    assert sorted(l["custom_id"] for l in errors) == bad
    for l in errors:
        assert l["response"]["status_code"] == 400
        assert l["response"]["body"]["error"]["code"] == "context_length_exceeded"


def test_a_batch_cancelled_mid_way_keeps_what_was_done(base):
    bob = sdk(base, BOB)
    f = upload(bob, [line(f"c-{i}", f"count {i}", max_tokens=200) for i in range(100)])
    b = bob.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                           completion_window="24h")
    until(bob, b.id, lambda b: b.request_counts.completed >= 4)
    cancelled = bob.batches.cancel(b.id)
    assert cancelled.status in ("cancelling", "cancelled")
    b = until(bob, b.id, lambda b: b.status == "cancelled")
    counts = b.request_counts
    assert counts.completed + counts.failed == counts.total == 100
    assert 4 <= counts.completed < 100
    out, errors = read(bob, b.output_file_id), read(bob, b.error_file_id)
    assert len(out) == counts.completed and len(errors) == counts.failed
    assert all(e["error"]["code"] == "batch_cancelled" for e in errors)
    assert len({l["custom_id"] for l in out + errors}) == 100


def test_batches_and_files_list_a_page_at_a_time_and_another_clients_key_gets_404(base):
    ann, bob, admin = sdk(base, ANN), sdk(base, BOB), sdk(base, ADMIN)
    f = upload(bob, [line("only", "hi")])
    made = [bob.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                               completion_window="24h").id for _ in range(3)]
    for i in made:
        until(bob, i, lambda b: b.status == "completed")
    page = bob.batches.list(limit=2)
    assert len(page.data) == 2 and page.has_more
    every = [b.id for b in bob.batches.list(limit=2)]
    assert every[:3] == made[::-1], "newest first, every page followed"
    assert all(bob.batches.retrieve(i).input_file_id == f.id for i in every[:3])
    files = [x.id for x in bob.files.list(limit=1)]
    assert f.id in files
    # ann sees none of bob's; the admin key sees them.
    for call in (lambda: ann.batches.retrieve(made[0]), lambda: ann.batches.cancel(made[0]),
                 lambda: ann.files.retrieve(f.id), lambda: ann.files.content(f.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert made[0] not in [b.id for b in ann.batches.list()]
    assert admin.batches.retrieve(made[0]).id == made[0]
    assert bob.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        bob.files.retrieve(f.id)
