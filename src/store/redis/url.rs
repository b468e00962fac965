//! The URL: `redis://[user][:password]@host[:port][/db][?replicas=N]`.

use crate::store::target::check_params;
use crate::store::UrlError;

/// The most acknowledgements `?replicas=` may ask for: far more replicas
/// than any primary has, small enough that a typo is caught.
pub(super) const MAX_REPLICAS: u32 = 100;

/// `replicas=N`, the one parameter: a whole number from 0 to
/// [`MAX_REPLICAS`], given at most once.
pub(super) fn replicas_param(url: &::url::Url) -> Result<u32, UrlError> {
    // `protocol=3` would change the shape of every reply parsed below, and
    // the driver ignores parameters it does not know (a mistyped one would
    // silently do nothing): take none but ours.
    check_params(url, &["replicas"])?;
    let mut given = url.query_pairs().filter(|(k, _)| k == "replicas");
    let Some((_, v)) = given.next() else {
        return Ok(0);
    };
    if given.next().is_some() {
        return Err("has replicas= more than once".into());
    }
    // Digits only: no sign, no spaces, no hex; never shown back.
    v.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| v.parse::<u32>().ok())
        .flatten()
        .filter(|n| *n <= MAX_REPLICAS)
        .ok_or_else(|| {
            format!("has a replicas= that is not a whole number from 0 to {MAX_REPLICAS}").into()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(q: &str) -> ::url::Url {
        ::url::Url::parse(&format!("redis://h:1/0{q}")).expect("url")
    }

    #[test]
    fn the_replicas_parameter() {
        assert_eq!(replicas_param(&url("")).map_err(|e| e.to_string()), Ok(0));
        assert_eq!(
            replicas_param(&url("?replicas=0")).map_err(|e| e.to_string()),
            Ok(0)
        );
        assert_eq!(
            replicas_param(&url("?replicas=100")).map_err(|e| e.to_string()),
            Ok(100)
        );
        for bad in [
            "?replicas=",
            "?replicas=101",
            "?replicas=-1",
            "?replicas=%201",
            "?replicas=1e1",
        ] {
            let e = replicas_param(&url(bad))
                .map_err(|e| e.to_string())
                .expect_err(bad);
            assert!(e.contains("0 to 100"), "{bad}: {e}");
        }
        let e = replicas_param(&url("?replicas=1&replicas=1"))
            .map_err(|e| e.to_string())
            .expect_err("twice");
        assert!(e.contains("more than once"), "{e}");
        let e = replicas_param(&url("?protocol=3"))
            .map_err(|e| e.to_string())
            .expect_err("protocol");
        assert!(e.contains("unknown parameter protocol"), "{e}");
    }
}
