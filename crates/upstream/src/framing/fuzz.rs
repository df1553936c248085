//! Property test of the response framing: [`parse_head`] and [`Decoder`], fed a response in
//! arbitrary pieces, agree with a plain reference that reads the whole input at once (httparse
//! for the head, a straightforward chunked reader for the body), on generated, mutated and
//! random responses. `PROPTEST_CASES` sets how many inputs are tried (default
//! [`DEFAULT_CASES`]); the run prints the count and the time taken.

#![allow(clippy::unwrap_used)]

use std::time::Instant;

use bytes::BytesMut;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::{parse_head, Decoder, Framing};

mod inputs;
mod reference;

use inputs::case;
use reference::reference;

/// Inputs tried by a plain `cargo test` (a few seconds in a debug build).
const DEFAULT_CASES: u32 = 3000;

/// How one response reads, whichever reader read it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// The head breaks HTTP/1.1 (or is too large).
    BadHead,
    /// The input ended before the head did.
    NoHead,
    Message {
        status: u16,
        /// The fields handed on, in order.
        headers: Vec<(String, Vec<u8>)>,
        framing: Framing,
        keep_alive: bool,
        /// The body data that came out: all of it, or all before the error or the end.
        body: Vec<u8>,
        end: End,
        /// The bytes after a complete body.
        rest: Vec<u8>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Complete,
    /// The input ended first.
    Truncated,
    /// The body's framing is malformed.
    Malformed,
}

/// The decoder under test, given `wire` in the pieces `cuts` (sorted offsets) make.
fn decoded(wire: &[u8], cuts: &[usize]) -> Outcome {
    let mut buf = BytesMut::new();
    let mut head = None;
    let mut decoder = Decoder::new(Framing::Empty);
    let mut body = Vec::new();
    let mut from = 0;
    for to in cuts.iter().copied().chain([wire.len()]) {
        let to = to.clamp(from, wire.len());
        buf.extend_from_slice(&wire[from..to]);
        from = to;
        if head.is_none() {
            match parse_head(&mut buf) {
                Err(_) => return Outcome::BadHead,
                Ok(None) => continue,
                Ok(Some(h)) => {
                    let fields = by_name(
                        h.headers
                            .iter()
                            .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
                            .collect(),
                    );
                    decoder = Decoder::new(h.framing);
                    head = Some((h.status.as_u16(), fields, h.framing, h.keep_alive));
                }
            }
        }
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(data)) => body.extend_from_slice(&data),
                Ok(None) => break,
                Err(_) => {
                    let (status, headers, framing, keep_alive) = head.unwrap();
                    return Outcome::Message {
                        status,
                        headers,
                        framing,
                        keep_alive,
                        body,
                        end: End::Malformed,
                        rest: Vec::new(),
                    };
                }
            }
        }
    }
    let Some((status, headers, framing, keep_alive)) = head else {
        return Outcome::NoHead;
    };
    let end = match decoder.eof() {
        Ok(()) => End::Complete,
        Err(_) => End::Truncated,
    };
    Outcome::Message {
        status,
        headers,
        framing,
        keep_alive,
        body,
        end,
        rest: if end == End::Complete {
            buf.to_vec()
        } else {
            Vec::new()
        },
    }
}

/// Fields grouped by name, each name's values in their order (a `HeaderMap` keeps them so).
fn by_name(mut fields: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// The decoder, given each input whole, byte by byte and cut at random offsets, reads it as
/// the reference does.
#[test]
fn decoder_agrees_with_the_reference_whatever_the_pieces() {
    let cases = cases();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let tally = std::cell::RefCell::new([0u32; 5]);
    let started = Instant::now();
    let result = runner.run(&case(), |(wire, cuts)| {
        let want = reference(&wire);
        let every_byte: Vec<usize> = (1..wire.len()).collect();
        for (how, pieces) in [
            ("whole", &[][..]),
            ("cut", &cuts[..]),
            ("bytewise", &every_byte),
        ] {
            let got = decoded(&wire, pieces);
            if got != want {
                return Err(TestCaseError::fail(format!(
                    "{how} {pieces:?}: {:?}\n  decoder:   {got:?}\n  reference: {want:?}",
                    String::from_utf8_lossy(&wire)
                )));
            }
        }
        let kind = match want {
            Outcome::BadHead => 0,
            Outcome::NoHead => 1,
            Outcome::Message { end, .. } => 2 + end as usize,
        };
        tally.borrow_mut()[kind] += 1;
        Ok(())
    });
    let [bad_head, no_head, complete, truncated, malformed] = *tally.borrow();
    let tried = bad_head + no_head + complete + truncated + malformed;
    println!(
        "framing fuzz: {tried} of {cases} inputs agreed, each fed whole, byte by byte and in \
         random pieces, in {:.2?}: {complete} complete, {malformed} malformed bodies, \
         {truncated} truncated, {bad_head} refused heads, {no_head} incomplete heads",
        started.elapsed()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The reference itself, on the cases the unit tests spell out.
#[test]
fn the_reference_reads_the_plain_cases() {
    let wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx: 1\r\n\r\n5;a=\"b\"\r\nhello\r\n0\r\nt: 1\r\n\r\nNEXT";
    let want = Outcome::Message {
        status: 200,
        headers: vec![("x".into(), b"1".to_vec())],
        framing: Framing::Chunked,
        keep_alive: true,
        body: b"hello".to_vec(),
        end: End::Complete,
        rest: b"NEXT".to_vec(),
    };
    assert_eq!(reference(wire), want);
    assert_eq!(decoded(wire, &[3, 40, 60]), want);
    for bad in [
        &b"5\r\nhello\n0\r\n\r\n"[..],
        b"5\r\nhello\r\n0\r\n\r\r\n",
        b"5 \r\nhello\r\n0\r\n\r\n",
    ] {
        let mut wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        wire.extend_from_slice(bad);
        let Outcome::Message { end, .. } = reference(&wire) else {
            panic!("no message")
        };
        assert_eq!(end, End::Malformed, "{:?}", String::from_utf8_lossy(bad));
        assert_eq!(decoded(&wire, &[]), reference(&wire));
    }
}
