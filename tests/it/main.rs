//! Integration tests through brook's public API, in one binary.

mod checkpoint_files;
mod checkpoint_many;
#[cfg(feature = "http")]
mod cli_auth;
#[cfg(feature = "http")]
mod cli_serve;
#[cfg(all(feature = "client", feature = "http"))]
mod client_crash;
#[cfg(all(feature = "client", feature = "http"))]
mod client_recipes;
mod concurrency;
mod corruption;
mod crash;
#[cfg(feature = "http")]
mod descriptor_exhaustion;
#[cfg(feature = "http")]
mod descriptors;
mod disk_full;
mod engine;
mod faults;
#[cfg(feature = "fuzzing")]
mod fuzz_logic;
#[cfg(feature = "http")]
mod http1_loop;
#[cfg(feature = "http")]
mod http1_smuggling;
#[cfg(feature = "http")]
mod http_auth;
#[cfg(feature = "http")]
mod http_budget;
#[cfg(feature = "http")]
mod http_cache;
#[cfg(feature = "http")]
mod http_close;
#[cfg(feature = "http")]
mod http_edges;
#[cfg(feature = "http")]
mod http_ext;
#[cfg(feature = "http")]
mod http_hostile;
#[cfg(feature = "http")]
mod http_incarnation;
#[cfg(feature = "http")]
mod http_json_limits;
#[cfg(feature = "http")]
mod http_limits;
#[cfg(feature = "http")]
mod http_read_span;
#[cfg(feature = "http")]
mod http_retention;
#[cfg(feature = "http")]
mod http_seed;
#[cfg(feature = "http")]
mod http_sendfile;
#[cfg(feature = "http")]
mod http_slow;
#[cfg(feature = "http")]
mod http_sse_fanout;
#[cfg(feature = "http")]
mod http_sse_resume;
#[cfg(feature = "http")]
mod http_support;
#[cfg(feature = "http")]
mod http_tenants;
#[cfg(feature = "http")]
mod http_tls;
#[cfg(feature = "http")]
mod http_ursula_reads;
#[cfg(feature = "http")]
mod http_ursula_writes;
#[cfg(feature = "http")]
mod mirror;
mod model;
mod open_streams;
#[cfg(feature = "http")]
mod ops_admin;
mod ops_archive;
#[cfg(feature = "http")]
mod ops_cli;
// Its 100k-stream test takes minutes in a debug build: run it once, in the all-features pass.
#[cfg(feature = "http")]
mod ops_listing;
#[cfg(feature = "http")]
mod ops_logs;
#[cfg(feature = "http")]
mod ops_support;
mod power_loss;
mod regressions;
mod retention;
mod store_api;
mod subscriptions;
#[cfg(feature = "http")]
mod subscriptions_http;
#[cfg(feature = "http")]
mod subscriptions_scale;
#[cfg(feature = "tier")]
mod tier;
#[cfg(feature = "http")]
mod tier_s3;
mod util;
#[cfg(feature = "http")]
mod webhook_policy;
