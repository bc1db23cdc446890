//! The subscription records of the system stream, as JSON (DESIGN.md section 15.1).
//!
//! A record is `{"e":"sub", ...the whole subscription...}` or `{"e":"del","id":...}`; a
//! snapshot is `{"subs":[...the same subscription objects...]}`. Offsets are strings in the
//! `%016d_%016d` form, times integers in ms since the epoch. Every field is read back exactly:
//! a record that does not decode is `Error::Corrupt` (the system stream only holds what this
//! module wrote).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{LinkRec, Sub, WakeRec};
use crate::error::{Error, Result};
use crate::name::{Offset, StreamName};
use crate::subscription::{DeliveryKind, SubscriptionConfig};

/// A decoded record.
pub(super) enum Record {
    /// A subscription's new state.
    Sub(Box<Sub>),
    /// A subscription's deletion.
    Delete(String),
}

/// `name` relative to `root` (the name itself when it is outside the root).
pub(super) fn relative<'a>(root: &str, name: &'a StreamName) -> &'a str {
    name.as_str().strip_prefix(root).unwrap_or(name.as_str())
}

fn sub_value(sub: &Sub) -> Value {
    let c = &sub.config;
    let (kind, target) = match &c.delivery {
        DeliveryKind::Webhook { url } => ("webhook", url.clone()),
        DeliveryKind::PullWake { wake_stream } => ("pull-wake", wake_stream.as_str().to_owned()),
    };
    let links: Vec<Value> = sub
        .links
        .iter()
        .map(|(n, l)| json!([n.as_str(), l.explicit, l.glob, l.acked.to_string()]))
        .collect();
    let wake = sub.wake.as_ref().map(|w| {
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
    json!({
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
        "generation": sub.generation,
        "wake": wake,
        "failed": sub.failed,
        "attempts": sub.attempts,
        "next_attempt_at": sub.next_attempt_at,
    })
}

/// The record of `sub`'s whole state.
pub(super) fn encode_sub(sub: &Sub) -> Value {
    let mut v = sub_value(sub);
    if let Value::Object(m) = &mut v {
        m.insert("e".into(), "sub".into());
    }
    v
}

/// The record of a deletion.
pub(super) fn encode_delete(id: &str) -> Value {
    json!({"e": "del", "id": id})
}

/// A snapshot of every subscription.
pub(super) fn encode_snapshot<'a>(subs: impl Iterator<Item = &'a Sub>) -> Value {
    json!({"subs": subs.map(sub_value).collect::<Vec<_>>()})
}

fn corrupt(why: &str) -> Error {
    Error::corrupt(super::SYSTEM_STREAM, format!("subscription record: {why}"))
}

/// Decodes one record.
pub(super) fn decode_record(bytes: &[u8]) -> Result<Record> {
    let v: Value = serde_json::from_slice(bytes).map_err(|_| corrupt("not JSON"))?;
    let m = v.as_object().ok_or_else(|| corrupt("not an object"))?;
    match m.get("e").and_then(Value::as_str) {
        Some("sub") => Ok(Record::Sub(Box::new(decode_sub(m)?))),
        Some("del") => Ok(Record::Delete(string(m, "id")?)),
        _ => Err(corrupt("unknown kind")),
    }
}

/// Decodes a snapshot.
pub(super) fn decode_snapshot(bytes: &[u8]) -> Result<Vec<Sub>> {
    let v: Value = serde_json::from_slice(bytes).map_err(|_| corrupt("snapshot not JSON"))?;
    v.get("subs")
        .and_then(Value::as_array)
        .ok_or_else(|| corrupt("snapshot without subs"))?
        .iter()
        .map(|s| decode_sub(s.as_object().ok_or_else(|| corrupt("not an object"))?))
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
    for l in m
        .get("links")
        .and_then(Value::as_array)
        .ok_or_else(|| corrupt("links"))?
    {
        match l.as_array().map(Vec::as_slice) {
            Some([n, explicit, glob, acked]) => {
                links.insert(
                    name(n)?,
                    LinkRec {
                        explicit: explicit.as_bool().ok_or_else(|| corrupt("explicit"))?,
                        glob: glob.as_bool().ok_or_else(|| corrupt("glob"))?,
                        acked: offset(acked)?,
                    },
                );
            }
            _ => return Err(corrupt("link")),
        }
    }
    let wake = match m.get("wake") {
        None | Some(Value::Null) => None,
        Some(Value::Object(w)) => {
            let mut tails = Vec::new();
            for t in w
                .get("tails")
                .and_then(Value::as_array)
                .ok_or_else(|| corrupt("tails"))?
            {
                match t.as_array().map(Vec::as_slice) {
                    Some([n, o]) => tails.push((name(n)?, offset(o)?)),
                    _ => return Err(corrupt("tail")),
                }
            }
            Some(WakeRec {
                id: string(w, "id")?,
                tails,
                holder: opt_string(w, "holder"),
                lease_until: w.get("lease_until").and_then(Value::as_u64),
                delivered: w.get("delivered").and_then(Value::as_bool).unwrap_or(false),
            })
        }
        Some(_) => return Err(corrupt("wake")),
    };
    Ok(Sub {
        id: string(m, "id")?,
        config,
        created_at: u64_of(m, "created_at")?,
        links,
        generation: u64_of(m, "generation")?,
        wake,
        failed: m.get("failed").and_then(Value::as_bool).unwrap_or(false),
        attempts: u32::try_from(u64_of(m, "attempts")?).unwrap_or(u32::MAX),
        next_attempt_at: u64_of(m, "next_attempt_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_round_trips() {
        let mut links = BTreeMap::new();
        links.insert(
            StreamName::new("v1/events/a").expect("valid"),
            LinkRec {
                explicit: true,
                glob: false,
                acked: Offset::new(3, 40),
            },
        );
        let sub = Sub {
            id: "s1".into(),
            config: SubscriptionConfig::pull_wake(StreamName::new("v1/wake").expect("valid"))
                .pattern("events/*")
                .description("d")
                .root("v1/"),
            created_at: 17,
            links,
            generation: 4,
            wake: Some(WakeRec {
                id: "w_1".into(),
                tails: vec![(
                    StreamName::new("v1/events/a").expect("valid"),
                    Offset::new(5, 60),
                )],
                holder: Some("worker".into()),
                lease_until: Some(99),
                delivered: false,
            }),
            failed: true,
            attempts: 2,
            next_attempt_at: 1234,
        };
        let bytes = encode_sub(&sub).to_string();
        let Record::Sub(back) = decode_record(bytes.as_bytes()).expect("decodes") else {
            panic!("not a sub record");
        };
        assert_eq!(back.config, sub.config);
        assert_eq!(back.links, sub.links);
        assert_eq!(back.wake, sub.wake);
        assert_eq!(
            (
                back.generation,
                back.failed,
                back.attempts,
                back.next_attempt_at
            ),
            (4, true, 2, 1234)
        );
        let snap = encode_snapshot([&sub].into_iter()).to_string();
        assert_eq!(decode_snapshot(snap.as_bytes()).expect("decodes").len(), 1);
        assert!(matches!(
            decode_record(encode_delete("s1").to_string().as_bytes()),
            Ok(Record::Delete(id)) if id == "s1"
        ));
        assert!(matches!(
            decode_record(b"{\"e\":\"x\"}"),
            Err(crate::Error::Corrupt { .. })
        ));
    }
}
