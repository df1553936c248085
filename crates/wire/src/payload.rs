//! A request body as a backend gets it: slices of the client's body with the few bytes spliced
//! between them (the model's name, the usage option), so a body is held once while it is sent.

use std::io::IoSlice;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Buf, Bytes};

/// The parts of a body, in order; none is empty. Cheap to clone (a reference count); written
/// out through a [`Cursor`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload(Repr);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    /// Nothing spliced: one piece (the common case, no allocation).
    Whole(Bytes),
    Parts(Arc<[Bytes]>),
}

impl Payload {
    /// `body` with `edits` (ranges of it and what takes their place; not overlapping, in any
    /// order) applied, the unchanged spans shared with `body`.
    pub(crate) fn spliced(body: &Bytes, mut edits: Vec<(Range<usize>, Vec<u8>)>) -> Payload {
        if edits.is_empty() {
            return Payload::from(body.clone());
        }
        edits.sort_by_key(|(r, _)| r.start);
        let mut parts = Vec::with_capacity(2 * edits.len() + 1);
        let mut at = 0;
        for (range, bytes) in edits {
            parts.push(body.slice(at..range.start));
            parts.push(Bytes::from(bytes));
            at = range.end;
        }
        parts.push(body.slice(at..));
        parts.retain(|p| !p.is_empty());
        Payload(Repr::Parts(parts.into()))
    }

    /// The body with `member` (`"key":value,`) put first in its top-level object: after the
    /// first `{`, the rest shared. A body without one is returned as it is.
    pub fn with_first_member(&self, member: Bytes) -> Payload {
        if let Repr::Whole(body) = &self.0 {
            // The common case (nothing spliced before) in one allocation.
            let Some(at) = memchr::memchr(b'{', body) else {
                return self.clone();
            };
            let (head, tail) = (body.slice(..=at), body.slice(at + 1..));
            let parts: Arc<[Bytes]> = match tail.is_empty() {
                true => Arc::from([head, member]),
                false => Arc::from([head, member, tail]),
            };
            return Payload(Repr::Parts(parts));
        }
        let parts = self.parts();
        let Some((i, at)) = parts
            .iter()
            .enumerate()
            .find_map(|(i, p)| p.iter().position(|b| *b == b'{').map(|at| (i, at)))
        else {
            return self.clone();
        };
        let mut out = Vec::with_capacity(parts.len() + 2);
        out.extend(parts[..i].iter().cloned());
        out.push(parts[i].slice(..=at));
        out.push(member);
        out.push(parts[i].slice(at + 1..));
        out.extend(parts[i + 1..].iter().cloned());
        out.retain(|p| !p.is_empty());
        Payload(Repr::Parts(out.into()))
    }

    fn parts(&self) -> &[Bytes] {
        match &self.0 {
            Repr::Whole(b) => std::slice::from_ref(b),
            Repr::Parts(p) => p,
        }
    }

    pub fn len(&self) -> usize {
        self.parts().iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The body in one buffer.
    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        self.parts().concat()
    }

    /// A reader of the body from its start, to write it out.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            left: self.len(),
            payload: self.clone(),
            at: 0,
            off: 0,
        }
    }
}

impl Default for Payload {
    fn default() -> Payload {
        Payload(Repr::Whole(Bytes::new()))
    }
}

impl From<Bytes> for Payload {
    fn from(body: Bytes) -> Payload {
        Payload(Repr::Whole(body))
    }
}

impl From<Vec<u8>> for Payload {
    fn from(body: Vec<u8>) -> Payload {
        Payload::from(Bytes::from(body))
    }
}

/// A [`Payload`] being written out: each part a slice of its own, so a `writev` takes them
/// all at once.
#[derive(Debug)]
pub struct Cursor {
    payload: Payload,
    /// The part being written, and how much of it is.
    at: usize,
    off: usize,
    left: usize,
}

impl Buf for Cursor {
    fn remaining(&self) -> usize {
        self.left
    }

    fn chunk(&self) -> &[u8] {
        self.payload
            .parts()
            .get(self.at)
            .map_or(&[], |b| &b[self.off..])
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let parts = self.payload.parts();
        let Some(first) = parts.get(self.at).filter(|_| self.left > 0) else {
            return 0;
        };
        let rest = parts[self.at + 1..].iter().map(|b| &b[..]);
        let mut n = 0;
        for (slot, part) in dst
            .iter_mut()
            .zip(std::iter::once(&first[self.off..]).chain(rest))
        {
            *slot = IoSlice::new(part);
            n += 1;
        }
        n
    }

    fn advance(&mut self, cnt: usize) {
        assert!(cnt <= self.left, "advanced past the end of a payload");
        self.left -= cnt;
        let parts = self.payload.parts();
        let mut cnt = cnt + self.off;
        while self.at < parts.len() && cnt >= parts[self.at].len() {
            cnt -= parts[self.at].len();
            self.at += 1;
        }
        self.off = cnt;
    }
}

/// Apply non-overlapping edits to `body`, in any order.
pub fn apply_edits(body: &[u8], mut edits: Vec<(Range<usize>, Vec<u8>)>) -> Vec<u8> {
    edits.sort_by_key(|(r, _)| r.start);
    let extra: usize = edits.iter().map(|(_, b)| b.len()).sum();
    let mut out = Vec::with_capacity(body.len() + extra);
    let mut at = 0;
    for (range, bytes) in edits {
        out.extend_from_slice(&body[at..range.start]);
        out.extend_from_slice(&bytes);
        at = range.end;
    }
    out.extend_from_slice(&body[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_member_goes_after_the_opening_brace_whatever_the_parts() {
        let body = Bytes::from_static(br#" {"model":"a","stream":true}"#);
        let whole =
            Payload::from(body.clone()).with_first_member(Bytes::from_static(br#""id_slot":1,"#));
        assert_eq!(
            whole.to_vec(),
            br#" {"id_slot":1,"model":"a","stream":true}"#
        );
        assert_eq!(whole.parts()[2].as_ptr(), body[2..].as_ptr(), "shared");
        let spliced = Payload::spliced(&body, vec![(10..13, br#""bb""#.to_vec())]);
        let v: serde_json::Value = serde_json::from_slice(
            &spliced
                .with_first_member(Bytes::from_static(br#""id_slot":0,"#))
                .to_vec(),
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"id_slot":0,"model":"bb","stream":true})
        );
    }
    use proptest::prelude::*;

    #[test]
    fn a_splice_shares_the_unchanged_spans() {
        let body = Bytes::from_static(br#"{"model":"a","x":1}"#);
        let p = Payload::spliced(&body, vec![(9..12, b"\"up\"".to_vec())]);
        assert_eq!(p.to_vec(), br#"{"model":"up","x":1}"#);
        assert_eq!(p.len(), 20);
        assert_eq!(p.parts().len(), 3);
        assert_eq!(
            p.parts()[0].as_ptr(),
            body.as_ptr(),
            "the client's bytes, not a copy"
        );
        // An edit at either end leaves no empty part.
        let p = Payload::spliced(&body, vec![(0..0, b"[".to_vec()), (19..19, b"]".to_vec())]);
        assert_eq!(p.to_vec(), br#"[{"model":"a","x":1}]"#);
        assert_eq!(p.parts().len(), 3);
        let whole = Payload::spliced(&body, Vec::new());
        assert_eq!(whole.parts()[0].as_ptr(), body.as_ptr());
        assert!(Payload::from(Bytes::new()).is_empty());
        assert!(!Payload::default().cursor().has_remaining());
    }

    proptest! {
        /// However the writer takes it (any sizes of write, slices or single chunks), the bytes
        /// written are the edited body's, as `apply_edits` gives them in one buffer.
        #[test]
        fn written_in_any_steps_it_is_the_edited_body(
            body in proptest::collection::vec(any::<u8>(), 0..64),
            cuts in proptest::collection::vec((0usize..64, 0usize..8, proptest::collection::vec(any::<u8>(), 0..6)), 0..4),
            steps in proptest::collection::vec(1usize..20, 1..40),
            vectored: bool,
        ) {
            // Ranges of the body that neither overlap nor start at the same byte.
            let mut edits: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
            for (start, len, bytes) in cuts {
                let start = start.min(body.len());
                let end = (start + len).min(body.len());
                if edits.iter().all(|(r, _)| (end <= r.start || start >= r.end) && start != r.start) {
                    edits.push((start..end, bytes));
                }
            }
            let want = apply_edits(&body, edits.clone());
            let payload = Payload::spliced(&Bytes::from(body), edits);
            prop_assert_eq!(payload.len(), want.len());
            let mut p = payload.cursor();
            let mut got = Vec::new();
            for step in steps.iter().cycle() {
                if !p.has_remaining() {
                    break;
                }
                let mut slices = [IoSlice::new(&[]); 3];
                let n = if vectored { p.chunks_vectored(&mut slices) } else { 1 };
                let mut take = Vec::new();
                if vectored {
                    for s in &slices[..n] {
                        take.extend_from_slice(s);
                    }
                } else {
                    take.extend_from_slice(p.chunk());
                }
                take.truncate(*step);
                got.extend_from_slice(&take);
                p.advance(take.len());
                prop_assert_eq!(p.remaining(), want.len() - got.len());
            }
            prop_assert_eq!(got, want);
        }
    }
}
