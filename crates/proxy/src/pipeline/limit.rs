//! Limit: a client's request admitted against its limits before any byte reaches a backend —
//! its place among its requests in flight, one request, and its prompt (the guard's count:
//! exact with a local or backend counter, the estimate otherwise) and its output reserved
//! (`max_tokens`, else the client's `reserve_output_tokens`, times `n`), in tokens and in GPU
//! time.

use std::borrow::Cow;

use super::admit::Admitted;
use super::call::Call;
use crate::clients::charge::Charge;
use crate::config::{ClientSpec, Resource};
use crate::error::ProxyError;
use crate::fleet::work::Need;

/// Charge the request's client (its requests in flight and tokens are counted whether it
/// has limits or not) for the body `admitted` by its alias, when the request is not charged
/// yet. The prompt's tokens where the guard counted them already are not counted again;
/// its GPU time reserved as `need` is predicted on the alias's first replica.
pub(crate) async fn charge(
    call: &mut Call<'_>,
    admitted: &Admitted,
    need: Need,
) -> Result<(), ProxyError> {
    let Some(caller) = call.req.caller.as_ref() else {
        return Ok(());
    };
    if call.rec.charge.is_some() {
        return Ok(());
    }
    let body = &admitted.body.body;
    let (prompt, output) = if caller.spec.counts_tokens() {
        let adapter = call.req.adapter;
        let choices = adapter.spec().choices;
        let asked = crate::wire::request::output_ask(body, adapter.spec().output_limit(), choices)?;
        let prompt = match admitted.prompt {
            Some(n) => u64::from(n),
            None => prompt_tokens(call, admitted).await?,
        };
        (prompt, reservation(&caller.spec, asked, prompt))
    } else {
        (0, 0)
    };
    let gpu = if caller.spec.counts_gpu() {
        gpu_ms(call, &caller.spec, admitted, need)
    } else {
        0
    };
    // A batch's line takes no place among its client's requests in flight: `[batches]` bounds
    // its lines, and its people keep their `max_concurrent`.
    let live = !call.req.idle;
    let charge = Charge::admit(caller, prompt, output, gpu, live).await?;
    call.rec.charge = Some(Box::new(charge));
    Ok(())
}

/// The request's GPU-milliseconds reserved, as predicted on its alias's first replica (its
/// budget is reserved before a replica is chosen) for its prompt and the most output it may
/// ask: its limit for each choice; without one, the client's `reserve_output_tokens` for
/// each, as much of it as leaves the request within the client's smallest GPU budget (a
/// default never makes a request never fit). What its client's recent answers took orders
/// the queue ([`crate::fleet::work::estimate`]) but never lowers this.
fn gpu_ms(call: &Call<'_>, spec: &ClientSpec, admitted: &Admitted, need: Need) -> u64 {
    let replica = admitted.alias.first();
    let on = (&*replica.slots, &*replica.health.cost);
    let ms = |output: u64| {
        let work = crate::fleet::work::at_most(on, &call.place.ticket, need.prompt, output);
        (work.total() * 1000.0).round() as u64
    };
    let choices = u64::from(need.choices.max(1));
    match need.output {
        Some(each) => ms(u64::from(each) * choices),
        None => {
            let smallest = spec.smallest(Resource::Gpu).unwrap_or(u64::MAX);
            let wanted = ms(u64::from(spec.reserve_output_tokens) * choices);
            wanted.min(smallest.max(ms(0)))
        }
    }
}

/// The output reserved for a request asking `asked` (its output limit, its choices) of a
/// client: its limit times its choices; without a limit (its alias sets none either), the
/// client's `reserve_output_tokens` for each choice, as much of it as leaves the request
/// within each of the client's budgets that counts output (a default never makes a request
/// never fit).
fn reservation(spec: &ClientSpec, asked: (Option<u32>, u32), prompt: u64) -> u64 {
    let (limit, choices) = asked;
    let choices = u64::from(choices);
    match limit {
        Some(each) => u64::from(each) * choices,
        None => {
            let limits = spec.limits.map(|_, n| n.map(std::num::NonZeroU64::get));
            let room = crate::budget::room_for_output(&limits, prompt).unwrap_or(u64::MAX);
            let wanted = u64::from(spec.reserve_output_tokens) * choices;
            wanted.min(room)
        }
    }
}

/// The prompt's tokens as the alias's guard counts them (in the chat form its backend
/// templates); without a guard, its text bytes over four.
async fn prompt_tokens(call: &Call<'_>, admitted: &Admitted) -> Result<u64, ProxyError> {
    let (adapter, body) = (call.req.adapter, &admitted.body.body[..]);
    let converter = admitted.alias.spec.backend.counting(adapter);
    let chat = adapter
        .to_chat(body, converter)
        .unwrap_or(Cow::Borrowed(body));
    match admitted.alias.guard() {
        Some(spec) => spec
            .counter
            .count_prompt(&call.state.client, &chat, &spec.media)
            .await
            .map(u64::from)
            .map_err(crate::guard::count_error),
        None => Ok((crate::tokens::prompt_bytes(&chat) as u64).div_ceil(4)),
    }
}
