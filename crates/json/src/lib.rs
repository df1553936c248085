//! JSON read from its bytes, for the proxy's hot path: where a key is (`scan`), an array's
//! elements and an object's members walked in checked text (`walk`), numbers as serde_json
//! reads them (`number`), how deep a body nests (`depth`), and UTF-8 cut at a character
//! boundary (`utf8`). Each byte-level reading is held by property tests to what a full parse
//! finds, for every valid input.

pub mod depth;
pub mod number;
#[cfg(any(test, feature = "testing"))]
pub mod respell;
pub mod scan;
pub mod utf8;
pub mod walk;
