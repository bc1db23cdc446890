//! Where a source stream lands on the destination: the same name, or, with `--ursula-names`,
//! an Ursula path `bucket/stream`.

use crate::portable;

use super::MirrorError;

/// How source names become destination names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameMap {
    /// The same name.
    Same,
    /// Ursula's `bucket/stream`: the first segment is the bucket and the rest becomes one
    /// segment with each `~` written `~~` and then each `/` written `~`, so the mapping is
    /// one-to-one (a portable name without `~` keeps its path).
    Ursula,
    /// Ursula's `bucket/stream` with every stream in this bucket, the whole name as the
    /// segment (written as for [`NameMap::Ursula`]).
    UrsulaBucket(String),
}

/// A destination name: its path (without a leading `/`) and the bucket to create first, if
/// any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    /// The destination stream's path below the destination URL.
    pub path: String,
    /// The Ursula bucket the stream lives in (`PUT /{bucket}` before the stream).
    pub bucket: Option<String>,
}

/// `rest` as one path segment: `~` becomes `~~`, then `/` becomes `~`.
fn one_segment(rest: &str) -> String {
    rest.replace('~', "~~").replace('/', "~")
}

impl NameMap {
    /// The destination of the source stream `name` (without a leading `/`), or why it has none.
    pub fn map(&self, name: &str) -> Result<Mapped, MirrorError> {
        let refuse = |why: String| MirrorError::Name {
            name: name.to_owned(),
            why,
        };
        let (bucket, stream) = match self {
            NameMap::Same => {
                return Ok(Mapped {
                    path: name.to_owned(),
                    bucket: None,
                });
            }
            NameMap::Ursula => {
                let Some((bucket, rest)) = name.split_once('/') else {
                    return Err(refuse(
                        "a single-segment name has no bucket (use --bucket)".into(),
                    ));
                };
                if !portable::is_bucket(bucket) {
                    return Err(refuse(format!(
                        "'{bucket}' is not an Ursula bucket (4-64 of [a-z0-9_-]; use --bucket)"
                    )));
                }
                (bucket.to_owned(), one_segment(rest))
            }
            NameMap::UrsulaBucket(bucket) => (bucket.clone(), one_segment(name)),
        };
        if let Some(why) = portable::stream_problem(&bucket, &stream) {
            return Err(refuse(why));
        }
        Ok(Mapped {
            path: format!("{bucket}/{stream}"),
            bucket: Some(bucket),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ursula_names_are_one_to_one() -> Result<(), MirrorError> {
        let m = NameMap::Ursula;
        assert_eq!(m.map("chat/room")?.path, "chat/room");
        assert_eq!(m.map("chat/room")?.bucket.as_deref(), Some("chat"));
        assert_eq!(m.map("chat/a/b")?.path, "chat/a~b");
        assert_eq!(m.map("chat/a~/b")?.path, "chat/a~~~b");
        assert_eq!(m.map("chat/a~b")?.path, "chat/a~~b");
        for bad in ["single", "UPPER/x", "chat/streams", "chat/a..b"] {
            assert!(
                matches!(m.map(bad), Err(MirrorError::Name { ref name, .. }) if name == bad),
                "{bad}"
            );
        }
        let b = NameMap::UrsulaBucket("mirror".into());
        assert_eq!(b.map("x/y")?.path, "mirror/x~y");
        assert_eq!(NameMap::Same.map("x/y")?.path, "x/y");
        Ok(())
    }
}
