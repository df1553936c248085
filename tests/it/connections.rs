//! The backends' connections as the proxy keeps them: a backend that closes its connection
//! after every streamed answer while announcing keep-alive (llama.cpp's `llama-server`, as
//! the simulator's `close_after_stream` plays it) loses no request, is learned of, and its
//! streams' connections are no longer kept.
use crate::common;

use common::*;
use switchboard_sim::SimConfig;

/// Chat requests the backend read.
fn chats(s: &switchboard_sim::Sim) -> usize {
    s.recorder()
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .count()
}

/// One answer through the proxy: its status and whether it came whole.
async fn answered(p: &Proxy, c: &reqwest::Client, stream: bool) -> (u16, bool) {
    let r = p.post_chat(c, &chat("a", stream)).await;
    let status = r.status().as_u16();
    let text = within("the answer's body", r.text()).await.unwrap();
    let whole = if stream {
        text.contains("data: [DONE]")
    } else {
        text.contains("\"choices\"")
    };
    (status, whole)
}

/// Regression: the request that took the connection a stream had ended on got a 502
/// ("connection closed before the response head"). It goes again on a new connection to the
/// same backend, which had read none of it; the backend is then known to close after
/// streams, and its streams' connections are closed rather than kept, so no later request
/// needs sending again.
#[tokio::test]
async fn a_request_on_a_connection_closed_after_a_stream_is_sent_again_and_answered() {
    let s = sim(SimConfig {
        close_after_stream: true,
        ..SimConfig::default()
    })
    .await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", s.url())]).await;
    let c = client();
    let retries = |m: &str| {
        sample(
            m,
            r#"switchboard_upstream_retries_total{backend="b",reason="closed"}"#,
        )
    };
    let not_pooled = |m: &str| {
        sample(
            m,
            r#"switchboard_upstream_connections_not_pooled_total{backend="b",reason="closes_after_stream"}"#,
        )
    };

    assert_eq!(answered(&p, &c, true).await, (200, true));
    // The connection the stream ended on is taken, and the backend closes it unread.
    assert_eq!(answered(&p, &c, false).await, (200, true));
    let m = p.metrics().await;
    assert_eq!(retries(&m), 1.0, "sent again once");
    assert_eq!(chats(&s), 2, "the backend read each request once");

    // Learned: a stream's connection is closed at its end, the next request needs no resend.
    assert_eq!(answered(&p, &c, true).await, (200, true));
    assert_eq!(answered(&p, &c, false).await, (200, true));
    assert_eq!(answered(&p, &c, true).await, (200, true));
    assert_eq!(answered(&p, &c, false).await, (200, true));
    let m = p.metrics().await;
    assert_eq!(retries(&m), 1.0, "no request sent again once learned");
    assert_eq!(not_pooled(&m), 2.0);
    assert_eq!(chats(&s), 6);
}
