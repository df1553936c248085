"""The usage API as the openai SDK reads it: its typed admin call
(`client.admin.organization.usage.completions`) parses the proxy's ledger into its own
models, each page validated here against the SDK's schema; a client's key is refused there
(PermissionDeniedError) and reads its own usage at /v1/usage through the raw client.
Simulator only (the ledger is the proxy's own)."""

import os
import time

import openai
import pytest
from openai.types.admin.organization.usage_completions_response import UsageCompletionsResponse

from conftest import BACKEND, Fleet, ledgered_config

pytestmark = pytest.mark.skipif(BACKEND == "real", reason="the proxy's own ledger: simulator only")

ADMIN, ANN, BOB = "sdk-usage-admin", "sdk-usage-ann", "sdk-usage-bob"


@pytest.fixture(scope="module")
def ledgered():
    """A proxy with two clients and an admin key, recording usage in a SQLite ledger."""
    fleet = Fleet()
    try:
        sim = fleet.simulate("llamacpp")
        os.environ.update(SB_SDK_USAGE_ADMIN=ADMIN, SB_SDK_USAGE_ANN=ANN, SB_SDK_USAGE_BOB=BOB)
        config = ledgered_config(fleet, sim, "SB_SDK_USAGE")
        base = fleet.serve("ledgered-proxy", config)
        for key, n in ((ANN, 3), (BOB, 1)):
            c = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
            for _ in range(n):
                c.chat.completions.create(
                    model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        yield base
    finally:
        fleet.close()


def admin_usage(base, **params):
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused", admin_api_key=ADMIN, max_retries=0)
    return c.admin.organization.usage.completions(**params)


def until_recorded(base, start, total):
    """The ledger writes its rows within its batch interval: asked again until they are in."""
    deadline = time.monotonic() + 10
    while True:
        page = admin_usage(base, start_time=start, bucket_width="1h", limit=2,
                           group_by=["api_key_id", "model"])
        got = sum(r.num_model_requests for b in page.data for r in b.results)
        if got >= total or time.monotonic() > deadline:
            return page
        time.sleep(0.05)


def test_the_sdks_admin_call_reads_usage_per_client_and_model(ledgered):
    start = int(time.time()) - 3600
    page = until_recorded(ledgered, start, 4)
    # What the SDK's schema says a page is (its typed call builds models without checking).
    UsageCompletionsResponse.model_validate(page.to_dict())
    assert page.object == "page"
    per = {}
    for bucket in page.data:
        assert bucket.object == "bucket" and bucket.end_time > bucket.start_time
        for r in bucket.results:
            assert r.object == "organization.usage.completions.result"
            assert r.model == "small" and r.input_tokens > 0 and r.output_tokens > 0
            per[r.api_key_id] = per.get(r.api_key_id, 0) + r.num_model_requests
    assert per == {"ann": 3, "bob": 1}


def test_a_client_key_is_refused_there_and_reads_its_own_usage(ledgered):
    start = int(time.time()) - 3600
    until_recorded(ledgered, start, 4)
    c = openai.OpenAI(base_url=ledgered + "/v1", api_key="unused", admin_api_key=ANN, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as e:
        c.admin.organization.usage.completions(start_time=start)
    assert e.value.code == "admin_key_required"
    own = openai.OpenAI(base_url=ledgered + "/v1", api_key=ANN, max_retries=0).get(
        "/usage", cast_to=object,
        options={"params": {"start_time": start, "bucket_width": "1d", "group_by": "api_key_id"}})
    page = UsageCompletionsResponse.model_validate(own)
    clients = {r.api_key_id for b in page.data for r in b.results}
    assert clients == {"ann"}
    assert sum(r.num_model_requests for b in page.data for r in b.results) == 3
