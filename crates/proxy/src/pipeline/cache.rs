//! The members that tell a backend which slot a request runs on and whose prompt cache it
//! may meet, put first in the body an attempt sends: llama.cpp's `id_slot` (the slot the
//! scheduler granted) and `"cache_prompt": false` (where the slot's cache is not the request's
//! own cache group's), vLLM's and SGLang's `cache_salt` (one per cache group). The client's
//! own spellings of these were removed in shaping (`wire::shape::owned`).

use bytes::Bytes;

use super::choose::Chosen;
use crate::runtime::Privacy;

/// The members to put first for an attempt on `chosen` of a request of the API named `api`
/// (`"chat"` for a translated one) and of cache group `group`; `None`: none. A request the
/// backend runs on slots of its own choice (one it cannot be told a slot for, or one asking
/// for several answers, each past the first on another idle slot) is told so to the
/// scheduler ([`crate::fleet::slots::SlotPermit::unplaced`]).
pub(crate) fn members(chosen: &mut Chosen, api: Option<&str>, group: u64) -> Option<Bytes> {
    let backend = &chosen.replica.backend;
    let pinned = chosen.replica.pins(api);
    let privacy = backend.flavor.runtime().privacy;
    if !backend.isolated {
        return pinned.then(|| id_slot(chosen.slot.index(), false));
    }
    match privacy {
        Privacy::Slots(_) => {
            if !pinned || chosen.choices > 1 {
                chosen.slot.unplaced();
            }
            if !pinned {
                return Some(Bytes::from_static(COLD));
            }
            // Its other answers' slots may hold anyone's prefixes: none is used.
            let cold = !chosen.slot.warm() || chosen.choices > 1;
            Some(id_slot(chosen.slot.index(), cold))
        }
        Privacy::Salt(apis) if api.is_some_and(|a| apis.contains(&a)) => Some(salt(group)),
        Privacy::Salt(_) | Privacy::Shared => None,
    }
}

/// `"cache_prompt": false`, as a first member.
const COLD: &[u8] = br#""cache_prompt":false,"#;

/// llama-server's `id_slot` member for slot `index`, with `"cache_prompt": false` after it
/// when `cold`.
fn id_slot(index: u32, cold: bool) -> Bytes {
    /// The member of each of the first slots, in the binary: no allocation for most requests.
    static FIRST: [&str; 8] = [
        r#""id_slot":0,"#,
        r#""id_slot":1,"#,
        r#""id_slot":2,"#,
        r#""id_slot":3,"#,
        r#""id_slot":4,"#,
        r#""id_slot":5,"#,
        r#""id_slot":6,"#,
        r#""id_slot":7,"#,
    ];
    if let Some(member) = FIRST.get(index as usize).filter(|_| !cold) {
        return Bytes::from_static(member.as_bytes());
    }
    const KEY: &[u8] = br#""id_slot":"#;
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(index).as_bytes();
    let mut member = Vec::with_capacity(KEY.len() + digits.len() + 1 + COLD.len());
    member.extend_from_slice(KEY);
    member.extend_from_slice(digits);
    member.push(b',');
    if cold {
        member.extend_from_slice(COLD);
    }
    Bytes::from(member)
}

/// The `cache_salt` of cache group `group`: its id in hex. The same in every process; a
/// client cannot send its own (shaping removes it), so it needs no secret.
fn salt(group: u64) -> Bytes {
    Bytes::from(format!(r#""cache_salt":"switchboard-{group:016x}","#))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_slot_is_llama_servers_member_for_every_slot() {
        for index in [0u32, 1, 7, 8, 9, 10, 4095, u32::MAX] {
            let want = format!(r#""id_slot":{index},"#);
            assert_eq!(id_slot(index, false), Bytes::from(want), "{index}");
            let cold = format!(r#""id_slot":{index},"cache_prompt":false,"#);
            assert_eq!(id_slot(index, true), Bytes::from(cold), "{index}");
        }
    }

    #[test]
    fn a_groups_salt_is_its_own() {
        assert_ne!(salt(1), salt(2));
        let member = salt(0xabc);
        let v: serde_json::Value =
            serde_json::from_slice(&[b"{", &member[..member.len() - 1], b"}"].concat()).unwrap();
        assert_eq!(v["cache_salt"], "switchboard-0000000000000abc");
    }
}
