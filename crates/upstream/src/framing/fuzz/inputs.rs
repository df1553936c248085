//! The inputs: responses generated mostly well-formed, then mutated, or random bytes, each
//! with the offsets it is cut at.

use proptest::prelude::*;

/// Bytes the mutations and the random bodies are made of: framing punctuation and the
/// characters around it.
const ALPHABET: &[u8] = b"\r\n\r\n\r\n \t;=\"\\:,0123456789aAfFgGxX-\x00\x0b\x0c\x7f\x80\xff";

fn status_line() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "HTTP/1.1 200 OK\r\n",
        "HTTP/1.1 200 OK\r\n",
        "HTTP/1.1 200 OK\r\n",
        "HTTP/1.0 200 OK\r\n",
        "HTTP/1.1 400 Bad Request\r\n",
        "HTTP/1.1 502 Bad Gateway\r\n",
        "HTTP/1.1 204 No Content\r\n",
        "HTTP/1.1 304 Not Modified\r\n",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n",
        "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n",
        "HTTP/1.1 101 Switching Protocols\r\n",
        "HTTP/1.1 200 OK\n",
        "HTTP/1.1 200 OK\r\n",
        "HTTP/1.1 200 OK\r\n",
    ])
}

/// The fields that frame the body: mostly one sound framing, sometimes a doubtful one.
fn framing_fields() -> impl Strategy<Value = Vec<String>> {
    let own = |v: Vec<&'static str>| v.into_iter().map(String::from).collect::<Vec<_>>();
    prop_oneof![
        5 => Just(own(vec!["Transfer-Encoding: chunked"])),
        1 => prop::sample::select(vec!["transfer-encoding: CHUNKED", "transfer-encoding: ,chunked,"])
            .prop_map(|f| vec![f.to_string()]),
        2 => (0u64..64).prop_map(|n| vec![format!("Content-Length: {n}")]),
        1 => (0u64..64).prop_map(|n| vec![format!("content-length: {n}, {n}")]),
        1 => Just(Vec::new()),
        2 => prop::sample::select(vec![
            own(vec!["transfer-encoding: chunked", "content-length: 5"]),
            own(vec!["transfer-encoding: gzip, chunked"]),
            own(vec!["transfer-encoding: chunked, chunked"]),
            own(vec!["transfer-encoding: chunked", "transfer-encoding: chunked"]),
            own(vec!["transfer-encoding: gzip"]),
            own(vec!["transfer-encoding: "]),
            own(vec!["content-length: 3", "content-length: 4"]),
            own(vec!["content-length: "]),
            own(vec!["content-length: +1"]),
            own(vec!["content-length: 18446744073709551616"]),
        ]),
    ]
}

/// Other fields: connection options, fields handed on, odd values.
fn other_field() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "Connection: close",
            "connection: keep-alive",
            "connection: x-trace, Keep-Alive",
            "Keep-Alive: timeout=5",
            "content-type: text/event-stream",
            "content-type: application/json",
            "x-trace: 7",
        ])
        .prop_map(String::from),
        1 => prop::collection::vec(prop::sample::select(b"abc 09\t:;,\x80\xff".to_vec()), 0..8)
            .prop_map(|v| format!("x-any: {}", String::from_utf8_lossy(&v))),
    ]
}

/// A chunk-size line's extensions, well-formed or not.
fn extension() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "",
        "",
        "",
        "",
        ";a",
        ";a=b",
        " ;a = \"b;c\"",
        ";a=\"\\\"\"",
        "\t;\tx\t=\ty",
        ";",
        " ",
        ";a=",
        ";=b",
        ";a=\"open",
        ";a b",
        "\r",
    ])
}

/// A chunked body, mostly well-formed: chunks, a last chunk, trailers.
fn chunked_body() -> impl Strategy<Value = Vec<u8>> {
    let chunk = (
        prop::collection::vec(any::<u8>(), 1..40),
        extension(),
        0usize..3,
        any::<bool>(),
        prop::sample::select(vec![
            "\r\n", "\r\n", "\r\n", "\r\n", "\n", "\r", "", "x\r\n",
        ]),
    )
        .prop_map(|(data, ext, zeros, upper, end)| {
            let size = if upper {
                format!("{:X}", data.len())
            } else {
                format!("{:x}", data.len())
            };
            let mut out = format!("{}{size}{ext}\r\n", "0".repeat(zeros)).into_bytes();
            out.extend_from_slice(&data);
            out.extend_from_slice(end.as_bytes());
            out
        });
    let trailer = prop::sample::select(vec![
        "x-sum: 1\r\n",
        "Checksum:\tab c \r\n",
        "e:\r\n",
        "\r\r\n",
        " folded\r\n",
        "no colon\r\n",
        "x: 1\n",
        "x\x00: 1\r\n",
    ]);
    (
        prop::collection::vec(chunk, 0..4),
        prop::sample::select(vec!["0", "0", "000", "0;last=1"]),
        prop::collection::vec(trailer, 0..2),
        prop::sample::select(vec!["\r\n", "\r\n", "\r\n", "\n", "\r\r\n", ""]),
    )
        .prop_map(|(chunks, last, trailers, end)| {
            let mut out = chunks.concat();
            out.extend_from_slice(last.as_bytes());
            out.extend_from_slice(b"\r\n");
            for t in trailers {
                out.extend_from_slice(t.as_bytes());
            }
            out.extend_from_slice(end.as_bytes());
            out
        })
}

/// A response: a status line, fields, a body (chunked, or bytes), and what follows it.
fn response() -> impl Strategy<Value = Vec<u8>> {
    let body = prop_oneof![
        3 => chunked_body(),
        1 => prop::collection::vec(any::<u8>(), 0..80),
        1 => prop::collection::vec(prop::sample::select(ALPHABET.to_vec()), 0..120),
    ];
    (
        status_line(),
        framing_fields(),
        prop::collection::vec(other_field(), 0..3),
        any::<prop::sample::Index>(),
        body,
        prop::sample::select(vec!["", "", "NEXT", "HTTP/1.1 200 OK\r\n\r\n"]),
    )
        .prop_map(|(status, mut headers, others, at, body, after)| {
            for f in others {
                let i = at.index(headers.len() + 1);
                headers.insert(i, f);
            }
            let mut out = status.as_bytes().to_vec();
            for h in headers {
                out.extend_from_slice(h.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&body);
            out.extend_from_slice(after.as_bytes());
            out
        })
}

/// One change to an input: a byte replaced, a byte or a framing string inserted, a byte cut.
#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, &'static [u8]),
    Remove(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), prop::sample::select(ALPHABET.to_vec()))
            .prop_map(|(i, b)| Mutation::Set(i, b)),
        (
            any::<usize>(),
            prop::sample::select(vec![
                &b"\r\n"[..],
                b"\n",
                b"\r",
                b"0\r\n\r\n",
                b";",
                b" ",
                b"\r\n\r\n",
                b"f",
                b"\"",
            ])
        )
            .prop_map(|(i, s)| Mutation::Insert(i, s)),
        any::<usize>().prop_map(Mutation::Remove),
    ]
}

/// `wire` with `mutations` applied, each at its offset modulo the input's length, or (for
/// `in_body`) modulo the length of what follows the head.
fn mutate(mut wire: Vec<u8>, mutations: &[(Mutation, bool)]) -> Vec<u8> {
    for (m, in_body) in mutations {
        let start = match wire.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(end) if *in_body => end + 4,
            _ => 0,
        };
        let at = |i: usize, len: usize| start + if len <= start { 0 } else { i % (len - start) };
        match *m {
            Mutation::Set(i, b) => {
                let i = at(i, wire.len());
                if let Some(byte) = wire.get_mut(i) {
                    *byte = b;
                }
            }
            Mutation::Insert(i, s) => {
                let i = at(i, wire.len() + 1);
                wire.splice(i..i, s.iter().copied());
            }
            Mutation::Remove(i) => {
                let i = at(i, wire.len());
                if i < wire.len() {
                    wire.remove(i);
                }
            }
        }
    }
    wire
}

/// An input and the offsets it is cut at.
pub(super) fn case() -> impl Strategy<Value = (Vec<u8>, Vec<usize>)> {
    let input = prop_oneof![
        // As generated: mostly well-formed.
        2 => response(),
        // With a few bytes changed.
        3 => (response(), prop::collection::vec((mutation(), any::<bool>()), 1..4))
            .prop_map(|(w, m)| mutate(w, &m)),
        // A chunked head, then bytes of the framing alphabet.
        1 => prop::collection::vec(prop::sample::select(ALPHABET.to_vec()), 0..160).prop_map(|v| {
            let mut w = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            w.extend_from_slice(&v);
            w
        }),
        // Anything at all.
        1 => prop::collection::vec(any::<u8>(), 0..200),
    ];
    (input, prop::collection::vec(any::<usize>(), 0..8)).prop_map(|(w, cuts)| {
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (w.len() + 1)).collect();
        cuts.sort_unstable();
        (w, cuts)
    })
}
