//! Retention policies over HTTP (brook's extension): the `Stream-Retention-Max-Age` and
//! `Stream-Retention-Max-Bytes` headers of a create and of HEAD, and the enforcer's metrics.
//!
//! A create's headers set the stream's own policy; HEAD answers with the policy in force (the
//! stream's own limits, the server's `--retention-max-age` / `--retention-max-bytes` for those it
//! leaves unset), so a client sees what the server will drop.

use axum::http::{HeaderMap, HeaderName};
use prometheus::proto::{MetricFamily, MetricType};

use crate::headers::{STREAM_RETENTION_MAX_AGE, STREAM_RETENTION_MAX_BYTES, parse_canonical_u64};
use crate::{MAX_RETENTION_LIMIT, RetentionPolicy, Stats};

use super::admin::{counter, counter_metric};
use super::error::ApiError;
use super::reply::Reply;
use super::request::raw;

const MAX_AGE: HeaderName = HeaderName::from_static(STREAM_RETENTION_MAX_AGE);
const MAX_BYTES: HeaderName = HeaderName::from_static(STREAM_RETENTION_MAX_BYTES);

/// One limit: a canonical decimal from 1 to 2^53-1, else 400 `INVALID_RETENTION`.
fn limit(headers: &HeaderMap, name: &HeaderName, what: &str) -> Result<Option<u64>, ApiError> {
    let Some(v) = raw(headers, name) else {
        return Ok(None);
    };
    match parse_canonical_u64(v) {
        Some(n) if (1..=MAX_RETENTION_LIMIT).contains(&n) => Ok(Some(n)),
        _ => Err(ApiError::bad_request(
            "INVALID_RETENTION",
            format!(
                "{what} must be a whole number from 1 to {MAX_RETENTION_LIMIT} without leading \
                 zeros (leave it out for no limit)"
            ),
        )),
    }
}

/// The policy a create asks for.
pub(super) fn requested(headers: &HeaderMap) -> Result<RetentionPolicy, ApiError> {
    let mut p = RetentionPolicy::new();
    p.max_age = limit(headers, &MAX_AGE, "Stream-Retention-Max-Age")?;
    p.max_bytes = limit(headers, &MAX_BYTES, "Stream-Retention-Max-Bytes")?;
    Ok(p)
}

/// `r` with the headers of the policy in force: the stream's own, the default's for the rest.
pub(super) fn in_force(r: Reply, own: RetentionPolicy, default: RetentionPolicy) -> Reply {
    let p = own.or(default);
    let r = match p.max_age {
        Some(s) => r.number(MAX_AGE, s),
        None => r,
    };
    match p.max_bytes {
        Some(b) => r.number(MAX_BYTES, b),
        None => r,
    }
}

/// A counter family with one sample per value of the label `label`.
fn counter_family(name: &str, help: &str, label: &str, samples: &[(&str, u64)]) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(MetricType::COUNTER);
    f.set_metric(
        samples
            .iter()
            .map(|(v, n)| counter_metric(&[(label, v)], *n))
            .collect(),
    );
    f
}

/// The enforcer's figures, for `/__brook/metrics`.
pub(super) fn families(s: &Stats) -> Vec<MetricFamily> {
    let r = &s.retention;
    vec![
        counter(
            "brook_retention_passes_total",
            "Retention enforcement passes over the streams",
            r.passes,
        ),
        counter_family(
            "brook_retention_runs_total",
            "Times a retention limit moved a stream's earliest offset, by policy",
            "policy",
            &[("age", r.age_runs), ("bytes", r.bytes_runs)],
        ),
        counter(
            "brook_retention_trimmed_segments_total",
            "Whole segments retention dropped from the start of streams",
            r.trimmed_segments,
        ),
        counter(
            "brook_retention_trimmed_bytes_total",
            "Bytes retention advanced earliest offsets over",
            r.trimmed_bytes,
        ),
        counter_family(
            "brook_retention_held_total",
            "Times retention stopped short of its limits, by what held it (the latest snapshot, a subscription's acknowledged offset)",
            "by",
            &[
                ("snapshot", r.held_by_snapshot),
                ("subscription", r.held_by_subscription),
            ],
        ),
    ]
}
