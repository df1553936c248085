//! The families labelled by client, and one client's handles.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::labels::{ttft_hist, Name};
use crate::kinds::{Key, PerKind};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ClientLabel {
    pub(super) client: Name,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ClientRequestLabels {
    pub(super) client: Name,
    pub(super) status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ClientTokenLabels {
    pub(super) client: Name,
    pub(super) kind: TokenKind,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(super) enum TokenKind {
    prompt,
    completion,
}

/// Why a client's request was refused before it reached a backend.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum RefusalReason {
    rate_limit,
    quota,
    concurrency,
    not_allowed,
}

impl Key for RefusalReason {
    const ALL: &'static [RefusalReason] = &[
        RefusalReason::rate_limit,
        RefusalReason::quota,
        RefusalReason::concurrency,
        RefusalReason::not_allowed,
    ];
    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ClientRefusalLabels {
    pub(super) client: Name,
    pub(super) reason: RefusalReason,
}

/// The families labelled by client.
pub(super) struct ClientFamilies {
    pub(super) requests: Family<ClientRequestLabels, Counter>,
    pub(super) tokens: Family<ClientTokenLabels, Counter>,
    pub(super) queue_wait: Family<ClientLabel, Histogram, fn() -> Histogram>,
    pub(super) refusals: Family<ClientRefusalLabels, Counter>,
    pub(super) inflight: Family<ClientLabel, Gauge>,
    pub(super) queued: Family<ClientLabel, Gauge>,
}

impl Default for ClientFamilies {
    fn default() -> Self {
        ClientFamilies {
            requests: Family::default(),
            tokens: Family::default(),
            queue_wait: Family::new_with_constructor(ttft_hist),
            refusals: Family::default(),
            inflight: Family::default(),
            queued: Family::default(),
        }
    }
}

impl ClientFamilies {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "client_requests",
            "Requests answered, by client and HTTP status",
            self.requests.clone(),
        );
        r.register(
            "client_tokens",
            "Tokens charged to clients from the usage backends report, by kind",
            self.tokens.clone(),
        );
        r.register_with_unit(
            "client_queue_wait",
            "Time a client's requests spent waiting for a backend slot",
            Unit::Seconds,
            self.queue_wait.clone(),
        );
        r.register(
            "client_refusals",
            "Requests refused before reaching a backend, by client and reason",
            self.refusals.clone(),
        );
        r.register(
            "client_inflight_requests",
            "A client's requests being served now",
            self.inflight.clone(),
        );
        r.register(
            "client_queued_requests",
            "A client's requests waiting for a backend slot",
            self.queued.clone(),
        );
    }

    pub(super) fn handles(&self, name: &str) -> ClientMetrics {
        let client = Arc::new(name.to_string());
        let l = ClientLabel {
            client: Arc::clone(&client),
        };
        let tokens = |kind| {
            self.tokens.get_or_create_owned(&ClientTokenLabels {
                client: Arc::clone(&client),
                kind,
            })
        };
        let refusal = |reason| {
            self.refusals.get_or_create_owned(&ClientRefusalLabels {
                client: Arc::clone(&client),
                reason,
            })
        };
        ClientMetrics {
            requests: self.requests.clone(),
            prompt_tokens: tokens(TokenKind::prompt),
            completion_tokens: tokens(TokenKind::completion),
            queue_wait: self.queue_wait.get_or_create_owned(&l),
            refusals: PerKind::from_fn(refusal),
            inflight: self.inflight.get_or_create_owned(&l),
            queued: self.queued.get_or_create_owned(&l),
            name: client,
        }
    }
}

/// One client's metric handles.
#[derive(Clone, Debug)]
pub struct ClientMetrics {
    pub(super) name: Name,
    pub(super) requests: Family<ClientRequestLabels, Counter>,
    pub prompt_tokens: Counter,
    pub(crate) completion_tokens: Counter,
    pub(crate) queue_wait: Histogram,
    pub(super) refusals: PerKind<RefusalReason, Counter, 4>,
    pub(crate) inflight: Gauge,
    pub(crate) queued: Gauge,
}

impl ClientMetrics {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its name, shared (a clone is no copy).
    pub(crate) fn shared_name(&self) -> &std::sync::Arc<String> {
        &self.name
    }

    pub fn request(&self, status: u16) {
        self.requests
            .get_or_create(&ClientRequestLabels {
                client: Arc::clone(&self.name),
                status,
            })
            .inc();
    }

    pub(crate) fn refused(&self, reason: RefusalReason) {
        self.refusals[reason].inc();
    }
}
