//! A request body as a backend gets it: slices of the client's body with the few bytes spliced
//! between them (the model's name, the usage option), so a body is held once while it is sent.

use std::io::IoSlice;
use std::ops::Range;

use bytes::{Buf, Bytes};
use smallvec::SmallVec;

/// The parts of a body, in order; none is empty. As a [`Buf`] it is written out (and used up)
/// part by part, each a slice of its own, so a `writev` takes them all at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Payload {
    parts: SmallVec<[Bytes; 5]>,
    /// The first part not written out whole.
    at: usize,
}

impl Payload {
    /// `body` with `edits` (ranges of it and what takes their place; not overlapping, in any
    /// order) applied, the unchanged spans shared with `body`.
    pub fn spliced(body: &Bytes, mut edits: Vec<(Range<usize>, Vec<u8>)>) -> Payload {
        edits.sort_by_key(|(r, _)| r.start);
        let mut p = Payload::default();
        let mut at = 0;
        for (range, bytes) in edits {
            p.push(body.slice(at..range.start));
            p.push(Bytes::from(bytes));
            at = range.end;
        }
        p.push(body.slice(at..));
        p
    }

    fn push(&mut self, part: Bytes) {
        if !part.is_empty() {
            self.parts.push(part);
        }
    }

    /// The bytes left to write.
    pub fn len(&self) -> usize {
        self.parts[self.at..].iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.at == self.parts.len()
    }

    /// The bytes left, in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        self.parts[self.at..].concat()
    }
}

impl From<Bytes> for Payload {
    fn from(body: Bytes) -> Payload {
        let mut p = Payload::default();
        p.push(body);
        p
    }
}

impl From<Vec<u8>> for Payload {
    fn from(body: Vec<u8>) -> Payload {
        Payload::from(Bytes::from(body))
    }
}

impl Buf for Payload {
    fn remaining(&self) -> usize {
        self.len()
    }

    fn chunk(&self) -> &[u8] {
        self.parts.get(self.at).map_or(&[], |b| b)
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, part) in dst.iter_mut().zip(&self.parts[self.at..]) {
            *slot = IoSlice::new(part);
            n += 1;
        }
        n
    }

    fn advance(&mut self, mut cnt: usize) {
        while cnt > 0 {
            let part = &mut self.parts[self.at];
            if cnt < part.len() {
                part.advance(cnt);
                return;
            }
            cnt -= part.len();
            self.at += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_splice_shares_the_unchanged_spans() {
        let body = Bytes::from_static(br#"{"model":"a","x":1}"#);
        let p = Payload::spliced(&body, vec![(9..12, b"\"up\"".to_vec())]);
        assert_eq!(p.to_vec(), br#"{"model":"up","x":1}"#);
        assert_eq!(p.len(), 20);
        assert_eq!(p.parts.len(), 3);
        assert_eq!(
            p.parts[0].as_ptr(),
            body.as_ptr(),
            "the client's bytes, not a copy"
        );
        // An edit at either end leaves no empty part.
        let p = Payload::spliced(&body, vec![(0..0, b"[".to_vec()), (19..19, b"]".to_vec())]);
        assert_eq!(p.to_vec(), br#"[{"model":"a","x":1}]"#);
        assert_eq!(p.parts.len(), 3);
        assert!(Payload::from(Bytes::new()).is_empty());
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
            let want = crate::wire::request::apply_edits(&body, edits.clone());
            let mut p = Payload::spliced(&Bytes::from(body), edits);
            prop_assert_eq!(p.len(), want.len());
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
