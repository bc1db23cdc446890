//! The HTTP/1.1 differential check (`brook::fuzzing::Http1Check`) on generated connections, with
//! a stable toolchain: each input is one to four pipelined requests built from pieces that are
//! valid, almost valid or known smuggling vectors (`Content-Length` and `Transfer-Encoding`
//! combinations, chunk sizes, obs-fold, bare LF and CR, spaces before colons, NUL and DEL in
//! values, absolute-form targets, bodies shorter or longer than declared), then sometimes
//! mutated byte by byte. It stops at the first input on which brook's loop and hyper's differ,
//! prints both outcomes and the input, saves the input under `fuzz/artifacts/differential/`
//! and exits 1.
//!
//! `differential [--seconds N] [--inputs N] [--seed N]`: runs until N seconds passed (default
//! 60) or N inputs were checked (default unbounded); the seed (default: from the clock) is
//! printed first, so any run can be repeated.

use std::io::Write as _;
use std::time::{Duration, Instant};

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True one time in `n`.
    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<'a, T: ?Sized>(&mut self, of: &[&'a T]) -> &'a T {
        of[self.below(of.len())]
    }

    /// One of the first `valid` of `of` (the well-formed ones), or of all when `bad`.
    fn pick_some<'a, T: ?Sized>(&mut self, of: &[&'a T], valid: usize, bad: bool) -> &'a T {
        of[self.below(if bad { of.len() } else { valid })]
    }
}

/// Methods: the first 13 are tokens.
const METHODS: &[&str] = &[
    "GET", "GET", "POST", "POST", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "CONNECT", "PATCH",
    "BREW", "get", "G\u{e9}T", "", "GET\t",
];

/// Request targets: the first 11 are ones `http::Uri` takes.
const TARGETS: &[&str] = &[
    "/v1/stream/a",
    "/s",
    "/s?offset=-1&live=sse",
    "http://localhost/stream",
    "http://localhost:8080/s?x=1",
    "https://h/s",
    "//s",
    "*",
    "localhost:443",
    "/s%20t",
    "/s#frag",
    "/s t",
    "/\u{e9}",
    "/a\x01b",
    "",
    "s",
];

/// Versions: the first 5 are HTTP/1.1 and HTTP/1.0.
const VERSIONS: &[&str] = &[
    "HTTP/1.1",
    "HTTP/1.1",
    "HTTP/1.1",
    "HTTP/1.1",
    "HTTP/1.0",
    "HTTP/2.0",
    "HTTP/1.2",
    "http/1.1",
    "HTTP/1.10",
    "HTTP/1",
];

const NAMES: &[&str] = &[
    "Host",
    "Content-Type",
    "Stream-Seq",
    "Producer-Id",
    "Producer-Epoch",
    "Producer-Seq",
    "Authorization",
    "Origin",
    "X-Custom",
    "If-None-Match",
    "User-Agent",
    "Accept",
    "Cookie",
    "Keep-Alive",
    "TE",
    "Trailer",
];

const VALUES: &[&str] = &[
    "localhost",
    "application/json",
    "text/plain",
    "1",
    "abc",
    "",
    " padded ",
    "\u{e9}t\u{e9}",
    "a,b",
    "\"quoted\"",
];

/// `Content-Length` values: the first 4 are decimal numbers (zero-padded, large); then signed,
/// spaced, lists, overflowing ones.
const LENGTHS: &[&str] = &[
    "0{n}",
    "00000000000000000000{n}",
    "18446744073709551615",
    "300000",
    "+{n}",
    "-{n}",
    "{n} ",
    " {n}",
    "{n},{n}",
    "{n}, {n}",
    "{n}.0",
    "0x{n}",
    "18446744073709551616",
    "99999999999999999999999",
    "",
    "{n}\u{0}",
];

const ENCODINGS: &[&str] = &[
    "chunked",
    "chunked",
    "Chunked",
    "chunked, identity",
    "identity, chunked",
    "identity",
    "gzip, chunked",
    "chunked, chunked",
    " chunked",
    "chunked ",
    "chunked;q=1",
    "xchunked",
    "chunke",
    "",
    "chunked\u{e9}",
    "\tchunked",
];

const CONNECTIONS: &[&str] = &[
    "close",
    "keep-alive",
    "Close",
    "upgrade",
    "keep-alive, close",
    "close, keep-alive",
    "closed",
    "te, close",
];

/// One request's pieces and framing; when `bad`, pieces that are not well-formed too.
fn request(rng: &mut Rng, out: &mut Vec<u8>, bad: bool) {
    let eol: &[u8] = match rng.below(if bad { 12 } else { 6 }) {
        0 => b"\n",
        1 => b"\r",
        2 => b"\r\r\n",
        _ => b"\r\n",
    };
    let eol = if !bad && eol != b"\n" { b"\r\n" } else { eol };
    // Mostly one line ending per request; sometimes mixed within it.
    let mixed = rng.one_in(if bad { 3 } else { 12 });
    let line_end = |rng: &mut Rng, out: &mut Vec<u8>| {
        if mixed && rng.one_in(2) {
            out.extend_from_slice(if rng.one_in(2) { b"\n" } else { b"\r\n" });
        } else {
            out.extend_from_slice(eol);
        }
    };
    if rng.one_in(10) {
        line_end(rng, out);
    }
    let method = rng.pick_some(METHODS, 13, bad);
    out.extend_from_slice(method.as_bytes());
    out.extend_from_slice(if bad && rng.one_in(8) { b"  " } else { b" " });
    out.extend_from_slice(rng.pick_some(TARGETS, 11, bad).as_bytes());
    out.extend_from_slice(if bad && rng.one_in(8) { b"\t" } else { b" " });
    out.extend_from_slice(rng.pick_some(VERSIONS, 5, bad).as_bytes());
    line_end(rng, out);

    let body = random_body(rng);
    let mut chunked = false;
    let mut declared: Option<usize> = None;
    let lines = rng.below(7);
    // Where the framing headers go among the others.
    let framing_at = rng.below(lines + 1);
    for i in 0..=lines {
        if i == framing_at {
            framing(rng, out, &body, &mut chunked, &mut declared, &line_end, bad);
        }
        if i < lines {
            header_line(rng, out, bad);
            line_end(rng, out);
        }
    }
    line_end(rng, out);
    if chunked {
        chunks(rng, out, &body);
    } else if let Some(n) = declared {
        // The body as declared, or shorter or longer than its length.
        let len = match rng.below(6) {
            0 => n.saturating_sub(1 + rng.below(4)),
            1 => n + 1 + rng.below(4),
            _ => n,
        };
        let mut b = body.clone();
        b.resize(len.min(4096), b'x');
        out.extend_from_slice(&b);
    } else if rng.one_in(8) {
        // A body with no length: the next request's bytes.
        out.extend_from_slice(&body);
    }
}

/// The framing headers: none, `Content-Length` (once, twice, odd), `Transfer-Encoding`, both,
/// and `Connection`, `Expect`, `Upgrade`.
fn framing(
    rng: &mut Rng,
    out: &mut Vec<u8>,
    body: &[u8],
    chunked: &mut bool,
    declared: &mut Option<usize>,
    line_end: &impl Fn(&mut Rng, &mut Vec<u8>),
    bad: bool,
) {
    let n = body.len();
    let line = |rng: &mut Rng, out: &mut Vec<u8>, name: &str, value: &str| {
        let name = match rng.below(if bad { 20 } else { 40 }) {
            0 => name.to_ascii_lowercase(),
            1 => name.to_ascii_uppercase(),
            2 if bad => format!("{name} "),
            3 if bad => format!(" {name}"),
            _ => name.to_owned(),
        };
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(if rng.one_in(6) { b":" } else { b": " });
        out.extend_from_slice(value.as_bytes());
        line_end(rng, out);
    };
    let cl = |rng: &mut Rng| -> String {
        if rng.one_in(3) {
            rng.pick_some(LENGTHS, 4, bad)
                .replace("{n}", &n.to_string())
        } else {
            n.to_string()
        }
    };
    match rng.below(10) {
        0 | 1 => {}
        2..=4 => {
            *declared = Some(n);
            let v = cl(rng);
            line(rng, out, "Content-Length", &v);
        }
        5 => {
            // Two lengths, equal or not.
            *declared = Some(n);
            let v = cl(rng);
            line(rng, out, "Content-Length", &v);
            let v = if rng.one_in(2) {
                n.to_string()
            } else {
                (n + 1).to_string()
            };
            line(rng, out, "Content-Length", &v);
        }
        6 | 7 => {
            *chunked = true;
            let v = rng.pick(ENCODINGS);
            line(rng, out, "Transfer-Encoding", v);
            if rng.one_in(4) {
                let v = rng.pick(ENCODINGS);
                line(rng, out, "Transfer-Encoding", v);
            }
        }
        _ => {
            // Both, in either order.
            *chunked = true;
            let te = rng.pick(ENCODINGS);
            let v = cl(rng);
            if rng.one_in(2) {
                line(rng, out, "Content-Length", &v);
                line(rng, out, "Transfer-Encoding", te);
            } else {
                line(rng, out, "Transfer-Encoding", te);
                line(rng, out, "Content-Length", &v);
            }
        }
    }
    if rng.one_in(4) {
        let v = rng.pick(CONNECTIONS);
        line(rng, out, "Connection", v);
    }
    if rng.one_in(6) {
        let v = rng.pick(&["100-continue", "100-Continue", "200-ok", ""]);
        line(rng, out, "Expect", v);
    }
    if rng.one_in(12) {
        line(rng, out, "Upgrade", "websocket");
    }
}

/// One other header line, sometimes malformed: space before the colon, obs-fold, NUL, CR or DEL
/// in the value, an empty or non-token name.
fn header_line(rng: &mut Rng, out: &mut Vec<u8>, bad: bool) {
    let name = rng.pick(NAMES);
    let value = rng.pick(VALUES);
    // Only 7 (tabs around the value) is well-formed among the odd lines.
    let line = rng.below(24);
    let line = if bad || line == 7 { line } else { 10 };
    match line {
        0 => out.extend_from_slice(format!("{name} : {value}").as_bytes()),
        1 => out.extend_from_slice(format!("{name}: {value}\r\n folded").as_bytes()),
        2 => out.extend_from_slice(format!("{name}: a\u{0}b").as_bytes()),
        3 => out.extend_from_slice(format!("{name}: a\rb").as_bytes()),
        4 => out.extend_from_slice(format!("{name}: a\x7fb").as_bytes()),
        5 => out.extend_from_slice(format!(": {value}").as_bytes()),
        6 => out.extend_from_slice(format!("Na(me: {value}").as_bytes()),
        7 => out.extend_from_slice(format!("{name}:\t{value}\t").as_bytes()),
        8 => out.extend_from_slice(name.as_bytes()),
        9 => out.extend_from_slice(format!("{name}: {value}\n\tfolded").as_bytes()),
        _ => out.extend_from_slice(format!("{name}: {value}").as_bytes()),
    }
}

/// A body of a few bytes.
fn random_body(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(8) {
        0 => 0,
        1 => 20 + rng.below(200),
        _ => rng.below(12),
    };
    (0..len)
        .map(|_| match rng.below(10) {
            0 => b'\r',
            1 => b'\n',
            _ => b'a' + rng.below(26) as u8,
        })
        .collect()
}

/// `body` chunked, with sizes that are sometimes wrong or odd: overflowing, negative, non-hex,
/// uppercase, padded, with extensions; then the last chunk and maybe a trailer.
fn chunks(rng: &mut Rng, out: &mut Vec<u8>, body: &[u8]) {
    let mut rest = body;
    while !rest.is_empty() {
        let n = (1 + rng.below(8)).min(rest.len());
        let size = match rng.below(16) {
            0 => "ffffffffffffffffff".to_owned(),
            1 => format!("-{n:x}"),
            2 => "g".to_owned(),
            3 => format!("{n:X}"),
            4 => format!("{n:x};ext=1"),
            5 => format!("{n:x} "),
            6 => format!(" {n:x}"),
            7 => format!("0{n:x}"),
            8 => format!("{:x}", n + 1),
            9 => format!("{n:x};"),
            10 => format!("0x{n:x}"),
            _ => format!("{n:x}"),
        };
        out.extend_from_slice(size.as_bytes());
        out.extend_from_slice(if rng.one_in(10) { b"\n" } else { b"\r\n" });
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(if rng.one_in(10) { b"\n" } else { b"\r\n" });
        rest = &rest[n..];
    }
    if rng.one_in(10) {
        return;
    }
    out.extend_from_slice(rng.pick(&[&b"0"[..], b"0;x=y", b"00", b"0 "]));
    out.extend_from_slice(b"\r\n");
    if rng.one_in(5) {
        out.extend_from_slice(b"Trailer-Field: x\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Byte-level damage, sometimes: a flipped, inserted or deleted byte, a truncation.
fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
    for _ in 0..rng.below(3) {
        if input.is_empty() {
            return;
        }
        let at = rng.below(input.len());
        match rng.below(5) {
            0 => input[at] ^= 1 << rng.below(8),
            1 => input.insert(at, *rng.pick(&[&b'\r', &b'\n', &0, &b' ', &b':', &b'\t'])),
            2 => {
                input.remove(at);
            }
            3 => input.truncate(at),
            _ => input[at] = rng.below(256) as u8,
        }
    }
}

/// One connection's bytes.
fn input(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    // One input in four has ill-formed pieces (and one in eight is damaged byte by byte too):
    // the rest reach the handlers of both loops, where the framing of each request counts.
    let bad = rng.one_in(4);
    for _ in 0..1 + rng.below(4) {
        let this_bad = bad && rng.one_in(2);
        request(rng, &mut out, this_bad);
    }
    if bad && rng.one_in(2) {
        mutate(rng, &mut out);
    }
    out
}

fn main() {
    let mut seconds = 60u64;
    let mut inputs = u64::MAX;
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.parse().ok());
        match (arg.as_str(), value) {
            ("--seconds", Some(v)) => seconds = v,
            ("--inputs", Some(v)) => inputs = v,
            ("--seed", Some(v)) => seed = v,
            _ => {
                eprintln!("usage: differential [--seconds N] [--inputs N] [--seed N]");
                std::process::exit(2);
            }
        }
    }
    println!("differential: seed {seed}, at most {seconds} s");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = brook::Store::open(dir.path(), brook::Options::default()).expect("a store");
    let check = brook::fuzzing::Http1Check::new(store);
    let mut rng = Rng(seed);
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut done = 0u64;
    // Requests both loops served, and answers both sent (a check that the inputs reach them).
    let (mut served, mut answered) = (0usize, 0usize);
    while done < inputs && Instant::now() < until {
        let input = input(&mut rng);
        let (brook, hyper) = check.run(&input);
        if brook != hyper {
            println!("brook: {brook:#?}\nhyper: {hyper:#?}");
            println!("input: {:?}", String::from_utf8_lossy(&input));
            let dir =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts/differential");
            let path = dir.join(format!("seed-{seed}-input-{done}"));
            if std::fs::create_dir_all(&dir).is_ok()
                && std::fs::File::create(&path)
                    .and_then(|mut f| f.write_all(&input))
                    .is_ok()
            {
                println!("saved to {}", path.display());
            }
            println!(
                "differential: brook's HTTP/1.1 loop and hyper's differ (input {done}, seed {seed})"
            );
            std::process::exit(1);
        }
        served += brook.seen.len();
        answered += brook.statuses.len();
        done += 1;
    }
    println!(
        "differential: {done} inputs ({served} requests served, {answered} answers), brook's \
         HTTP/1.1 loop and hyper's agree on every one"
    );
}
