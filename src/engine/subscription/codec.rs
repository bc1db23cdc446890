//! The subscription records of the system stream, as JSON (DESIGN.md section 15.1).
//!
//! A record is `{"e":"sub", ...the whole subscription...}` (a create), a delta
//! `{"e":"link"|"ack"|"wake","root":...,"id":..., ...the parts it changes...}`, or
//! `{"e":"del","root":...,"id":...}`; a snapshot is `{"subs":[...the subscription objects...]}`.
//! Offsets are strings in the `%016d_%016d` form, times integers in ms since the epoch. Every
//! field is read back exactly: a record that does not decode is `Error::Corrupt` (the system
//! stream only holds what this module wrote). Records written before deltas existed (a `sub`
//! record for every change, a `del` without `root`) decode as before.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{Delivery, Delta, LinkRec, Sub, WakeRec};
use crate::error::{Error, Result};
use crate::name::{Offset, StreamName};
use crate::subscription::{DeliveryKind, SubscriptionConfig};

/// A decoded record.
pub(super) enum Record {
    /// A subscription's whole state.
    Sub(Box<Sub>),
    /// A change to an existing subscription.
    Delta {
        root: String,
        id: String,
        delta: Box<Delta>,
    },
    /// A subscription's deletion; `root` is `None` in records written while ids were one
    /// namespace for the whole store.
    Delete { root: Option<String>, id: String },
}

/// `name` relative to `root` (the name itself when it is outside the root).
pub(super) fn relative<'a>(root: &str, name: &'a StreamName) -> &'a str {
    name.as_str().strip_prefix(root).unwrap_or(name.as_str())
}

fn link_value(n: &StreamName, l: &LinkRec) -> Value {
    json!([n.as_str(), l.explicit, l.glob, l.acked.to_string()])
}

/// The delivery state's members, as a `sub` record holds them at its top level.
fn delivery_members(d: &Delivery, m: &mut Map<String, Value>) {
    let wake = d.wake.as_ref().map(|w| {
        let tails: Vec<Value> = w
            .tails
            .iter()
            .map(|(n, t)| json!([n.as_str(), t.to_string()]))
            .collect();
        json!({
            "id": w.id,
            "tails": tails,
            "holder": w.holder,
            "lease_until": w.lease_until,
            "delivered": w.delivered,
        })
    });
    m.insert("generation".into(), d.generation.into());
    m.insert("wake".into(), wake.unwrap_or(Value::Null));
    m.insert("failed".into(), d.failed.into());
    m.insert("attempts".into(), d.attempts.into());
    m.insert("next_attempt_at".into(), d.next_attempt_at.into());
}

fn sub_value(sub: &Sub) -> Value {
    let c = &sub.config;
    let (kind, target) = match &c.delivery {
        DeliveryKind::Webhook { url } => ("webhook", url.clone()),
        DeliveryKind::PullWake { wake_stream } => ("pull-wake", wake_stream.as_str().to_owned()),
    };
    let links: Vec<Value> = sub.links.iter().map(|(n, l)| link_value(n, l)).collect();
    let mut v = json!({
        "id": sub.id,
        "kind": kind,
        "target": target,
        "pattern": c.pattern,
        "streams": c.streams.iter().map(StreamName::as_str).collect::<Vec<_>>(),
        "lease_ttl_ms": c.lease_ttl.as_millis() as u64,
        "description": c.description,
        "root": c.root,
        "base_url": c.base_url,
        "created_at": sub.created_at,
        "links": links,
    });
    if let Value::Object(m) = &mut v {
        delivery_members(&sub.d, m);
    }
    v
}

/// The record of `sub`'s whole state.
pub(super) fn encode_sub(sub: &Sub) -> Value {
    let mut v = sub_value(sub);
    if let Value::Object(m) = &mut v {
        m.insert("e".into(), "sub".into());
    }
    v
}

/// The record of a change to the subscription `id` under `root`: only the parts `delta` has.
pub(super) fn encode_delta(root: &str, id: &str, delta: &Delta) -> Value {
    let mut m = Map::new();
    m.insert("e".into(), delta.kind.into());
    m.insert("root".into(), root.into());
    m.insert("id".into(), id.into());
    if !delta.unlink.is_empty() {
        let names: Vec<&str> = delta.unlink.iter().map(StreamName::as_str).collect();
        m.insert("unlink".into(), json!(names));
    }
    if !delta.links.is_empty() {
        let links: Vec<Value> = delta.links.iter().map(|(n, l)| link_value(n, l)).collect();
        m.insert("links".into(), Value::Array(links));
    }
    if !delta.acks.is_empty() {
        let acks: Vec<Value> = delta
            .acks
            .iter()
            .map(|(n, o)| json!([n.as_str(), o.to_string()]))
            .collect();
        m.insert("acks".into(), Value::Array(acks));
    }
    if let Some(d) = &delta.delivery {
        delivery_members(d, &mut m);
    }
    Value::Object(m)
}

/// The record of a deletion.
pub(super) fn encode_delete(root: &str, id: &str) -> Value {
    json!({"e": "del", "root": root, "id": id})
}

/// A snapshot of every subscription, `{"subs":[...]}`, written one subscription at a time: only
/// one subscription's JSON tree is held at once, not the whole state's (a tree costs several
/// times the text it makes).
pub(super) fn encode_snapshot<'a>(subs: impl Iterator<Item = &'a Sub>) -> String {
    let mut out = String::from(r#"{"subs":["#);
    for (i, sub) in subs.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&sub_value(sub).to_string());
    }
    out.push_str("]}");
    out
}

pub(super) fn corrupt(why: &str) -> Error {
    Error::corrupt(super::SYSTEM_STREAM, format!("subscription record: {why}"))
}

/// Decodes one record.
pub(super) fn decode_record(bytes: &[u8]) -> Result<Record> {
    let v: Value = serde_json::from_slice(bytes).map_err(|_| corrupt("not JSON"))?;
    let m = v.as_object().ok_or_else(|| corrupt("not an object"))?;
    match m.get("e").and_then(Value::as_str) {
        Some("sub") => Ok(Record::Sub(Box::new(decode_sub(m)?))),
        Some("del") => Ok(Record::Delete {
            root: opt_string(m, "root"),
            id: string(m, "id")?,
        }),
        Some(kind @ ("link" | "ack" | "wake")) => Ok(Record::Delta {
            root: string(m, "root")?,
            id: string(m, "id")?,
            delta: Box::new(decode_delta(kind, m)?),
        }),
        _ => Err(corrupt("unknown kind")),
    }
}

/// Decodes a snapshot.
///
/// Each subscription is parsed from its own slice of the text, so only one subscription's JSON
/// tree is held at once (as [`encode_snapshot`] writes them).
pub(super) fn decode_snapshot(bytes: &[u8]) -> Result<Vec<Sub>> {
    use serde_json::value::RawValue;
    let top: BTreeMap<String, Vec<&RawValue>> =
        serde_json::from_slice(bytes).map_err(|_| corrupt("snapshot not JSON"))?;
    top.get("subs")
        .ok_or_else(|| corrupt("snapshot without subs"))?
        .iter()
        .map(|raw| {
            let v: Value = serde_json::from_str(raw.get()).map_err(|_| corrupt("not JSON"))?;
            decode_sub(v.as_object().ok_or_else(|| corrupt("not an object"))?)
        })
        .collect()
}

fn string(m: &Map<String, Value>, k: &str) -> Result<String> {
    m.get(k)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| corrupt(k))
}

fn opt_string(m: &Map<String, Value>, k: &str) -> Option<String> {
    m.get(k).and_then(Value::as_str).map(str::to_owned)
}

fn u64_of(m: &Map<String, Value>, k: &str) -> Result<u64> {
    m.get(k).and_then(Value::as_u64).ok_or_else(|| corrupt(k))
}

fn offset(v: &Value) -> Result<Offset> {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| corrupt("offset"))
}

fn name(v: &Value) -> Result<StreamName> {
    v.as_str()
        .map(|s| StreamName(s.into()))
        .ok_or_else(|| corrupt("stream name"))
}

fn decode_sub(m: &Map<String, Value>) -> Result<Sub> {
    let target = string(m, "target")?;
    let delivery = match m.get("kind").and_then(Value::as_str) {
        Some("webhook") => DeliveryKind::Webhook { url: target },
        Some("pull-wake") => DeliveryKind::PullWake {
            wake_stream: StreamName(target.into()),
        },
        _ => return Err(corrupt("kind")),
    };
    let streams = m
        .get("streams")
        .and_then(Value::as_array)
        .ok_or_else(|| corrupt("streams"))?
        .iter()
        .map(name)
        .collect::<Result<Vec<_>>>()?;
    let config = SubscriptionConfig {
        delivery,
        pattern: opt_string(m, "pattern"),
        streams,
        lease_ttl: Duration::from_millis(u64_of(m, "lease_ttl_ms")?),
        description: opt_string(m, "description"),
        root: string(m, "root")?,
        base_url: opt_string(m, "base_url"),
    };
    let mut links = BTreeMap::new();
    for (name, link) in decode_links(m.get("links").ok_or_else(|| corrupt("links"))?)? {
        links.insert(name, link);
    }
    let mut sub = Sub::new(string(m, "id")?, config, u64_of(m, "created_at")?);
    sub.links = links;
    sub.d = decode_delivery(m)?;
    Ok(sub)
}

fn decode_links(v: &Value) -> Result<Vec<(StreamName, LinkRec)>> {
    let mut links = Vec::new();
    for l in v.as_array().ok_or_else(|| corrupt("links"))? {
        match l.as_array().map(Vec::as_slice) {
            Some([n, explicit, glob, acked]) => links.push((
                name(n)?,
                LinkRec {
                    explicit: explicit.as_bool().ok_or_else(|| corrupt("explicit"))?,
                    glob: glob.as_bool().ok_or_else(|| corrupt("glob"))?,
                    acked: offset(acked)?,
                },
            )),
            _ => return Err(corrupt("link")),
        }
    }
    Ok(links)
}

/// `[[name, offset], ...]`.
fn decode_offsets(v: &Value, what: &str) -> Result<Vec<(StreamName, Offset)>> {
    let mut out = Vec::new();
    for t in v.as_array().ok_or_else(|| corrupt(what))? {
        match t.as_array().map(Vec::as_slice) {
            Some([n, o]) => out.push((name(n)?, offset(o)?)),
            _ => return Err(corrupt(what)),
        }
    }
    Ok(out)
}

fn decode_delivery(m: &Map<String, Value>) -> Result<Delivery> {
    let wake = match m.get("wake") {
        None | Some(Value::Null) => None,
        Some(Value::Object(w)) => Some(WakeRec {
            id: string(w, "id")?,
            tails: decode_offsets(w.get("tails").ok_or_else(|| corrupt("tails"))?, "tail")?,
            holder: opt_string(w, "holder"),
            lease_until: w.get("lease_until").and_then(Value::as_u64),
            delivered: w.get("delivered").and_then(Value::as_bool).unwrap_or(false),
        }),
        Some(_) => return Err(corrupt("wake")),
    };
    Ok(Delivery {
        generation: u64_of(m, "generation")?,
        wake,
        failed: m.get("failed").and_then(Value::as_bool).unwrap_or(false),
        attempts: u32::try_from(u64_of(m, "attempts")?).unwrap_or(u32::MAX),
        next_attempt_at: u64_of(m, "next_attempt_at")?,
    })
}

fn decode_delta(kind: &str, m: &Map<String, Value>) -> Result<Delta> {
    let kind = match kind {
        "link" => "link",
        "ack" => "ack",
        _ => "wake",
    };
    let unlink = match m.get("unlink") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .ok_or_else(|| corrupt("unlink"))?
            .iter()
            .map(name)
            .collect::<Result<Vec<_>>>()?,
    };
    let links = match m.get("links") {
        None => Vec::new(),
        Some(v) => decode_links(v)?,
    };
    let acks = match m.get("acks") {
        None => Vec::new(),
        Some(v) => decode_offsets(v, "ack")?,
    };
    // The delivery state is written whole or not at all: its generation says which.
    let delivery = if m.contains_key("generation") {
        Some(decode_delivery(m)?)
    } else {
        None
    };
    Ok(Delta {
        kind,
        links,
        unlink,
        acks,
        delivery,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> StreamName {
        StreamName::new(s).expect("valid")
    }

    fn sample() -> Sub {
        let config = SubscriptionConfig::pull_wake(n("v1/wake"))
            .pattern("events/*")
            .description("d")
            .root("v1/");
        let mut sub = Sub::new("s1".into(), config, 17);
        sub.links.insert(
            n("v1/events/a"),
            LinkRec {
                explicit: true,
                glob: false,
                acked: Offset::new(3, 40),
            },
        );
        sub.d = Delivery {
            generation: 4,
            wake: Some(WakeRec {
                id: "w_1".into(),
                tails: vec![(n("v1/events/a"), Offset::new(5, 60))],
                holder: Some("worker".into()),
                lease_until: Some(99),
                delivered: false,
            }),
            failed: true,
            attempts: 2,
            next_attempt_at: 1234,
        };
        sub
    }

    #[test]
    fn a_subscription_round_trips() {
        let sub = sample();
        let bytes = encode_sub(&sub).to_string();
        let Record::Sub(back) = decode_record(bytes.as_bytes()).expect("decodes") else {
            panic!("not a sub record");
        };
        assert_eq!(back.config, sub.config);
        assert_eq!(back.links, sub.links);
        assert_eq!(back.d, sub.d);
        assert_eq!(back.path(), "v1/s1");
        let snap = encode_snapshot([&sub, &sub].into_iter());
        assert_eq!(decode_snapshot(snap.as_bytes()).expect("decodes").len(), 2);
        assert_eq!(encode_snapshot(std::iter::empty()), r#"{"subs":[]}"#);
        assert!(matches!(
            decode_record(encode_delete("v1/", "s1").to_string().as_bytes()),
            Ok(Record::Delete { root: Some(r), id }) if r == "v1/" && id == "s1"
        ));
        assert!(matches!(
            decode_record(b"{\"e\":\"x\"}"),
            Err(crate::Error::Corrupt { .. })
        ));
    }

    #[test]
    fn deltas_round_trip_and_hold_only_their_parts() {
        let sub = sample();
        let delta = Delta {
            kind: "ack",
            links: vec![(
                n("v1/events/b"),
                LinkRec {
                    explicit: false,
                    glob: true,
                    acked: Offset::ZERO,
                },
            )],
            unlink: vec![n("v1/events/c")],
            acks: vec![(n("v1/events/a"), Offset::new(5, 60))],
            delivery: Some(sub.d.clone()),
        };
        let v = encode_delta("v1/", "s1", &delta);
        let Record::Delta {
            root,
            id,
            delta: back,
        } = decode_record(v.to_string().as_bytes()).expect("decodes")
        else {
            panic!("not a delta");
        };
        assert_eq!((root.as_str(), id.as_str()), ("v1/", "s1"));
        assert_eq!(*back, delta);
        // A heartbeat's record: the delivery state only, a few hundred bytes.
        let wake = encode_delta("v1/", "s1", &Delta::wake(sub.d.clone()));
        assert!(wake.get("links").is_none() && wake.get("acks").is_none());
        assert!(wake.to_string().len() < 300, "{wake}");
        let Record::Delta { delta: back, .. } =
            decode_record(wake.to_string().as_bytes()).expect("decodes")
        else {
            panic!("not a delta");
        };
        assert_eq!(back.delivery.as_ref(), Some(&sub.d));
        let links_only = Delta {
            kind: "link",
            unlink: vec![n("v1/x")],
            ..Delta::default()
        };
        let v = encode_delta("", "s", &links_only).to_string();
        let Record::Delta { delta: back, .. } = decode_record(v.as_bytes()).expect("decodes")
        else {
            panic!("not a delta");
        };
        assert_eq!(*back, links_only);
    }

    /// A `del` written while ids were one namespace has no root.
    #[test]
    fn an_old_deletion_has_no_root() {
        assert!(matches!(
            decode_record(br#"{"e":"del","id":"s1"}"#),
            Ok(Record::Delete { root: None, id }) if id == "s1"
        ));
    }
}
