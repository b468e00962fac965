//! What the SQL stores (Postgres, MySQL/MariaDB, SQLite) share below their
//! statements: how sqlx's errors are classified (TLS refusals, unreadable
//! TLS files, a missing table), rows decoded defensively, durations clamped
//! before they are written. Their sessions are src/store/session.rs's.

use std::time::Duration;

use super::session::Connect;
use super::{ErrorKind, LeaseInfo, StoreError, MAX_STORED};

/// What differs between the SQL stores' errors, beyond the network.
pub(crate) trait Dialect: Connect<Error = sqlx::Error> {
    /// Server errors that may heal by themselves, beyond the network.
    fn may_heal(e: &sqlx::Error) -> bool;
    /// Whether `e` says the lease table does not exist (for the calls that
    /// never create it; a dialect that creates it elsewhere keeps `false`).
    fn no_table(_e: &sqlx::Error) -> bool {
        false
    }
    /// The URL parameters that name files read for TLS.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    const TLS_FILES: &'static [&'static str] = &[];
}

/// `what` ("cannot renew in") the store, with the server's own words: what
/// each SQL store's [`Connect::classify`] says.
pub(crate) fn error<D: Dialect>(d: &D, what: &str, e: sqlx::Error) -> StoreError {
    if D::no_table(&e) {
        return no_table(&d.shown());
    }
    classify::<D>(&format!("{what} the store {}", d.shown()), e)
}

/// `context: <the server's words>`, may-heal or will-not-heal.
pub(crate) fn classify<D: Dialect>(context: &str, e: sqlx::Error) -> StoreError {
    let msg = format!("{context}: {}", message(&e));
    StoreError::healing(heals::<D>(&e), msg).with_source(e)
}

/// Whether `e` may heal on a store of dialect `D`.
pub(crate) fn heals<D: Dialect>(e: &sqlx::Error) -> bool {
    may_heal(e) || D::may_heal(e)
}

/// The server's own words for a database error, the driver's otherwise.
/// Neither contains the password: servers do not echo it, and the URL the
/// driver was given is never part of its errors.
pub(crate) fn message(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => d.message().to_string(),
        // sqlx wraps some configuration errors in a second one ("error with
        // configuration: error with configuration: unknown value …"): say it
        // once.
        sqlx::Error::Configuration(inner) => match inner.downcast_ref::<sqlx::Error>() {
            Some(e @ sqlx::Error::Configuration(_)) => message(e),
            _ => e.to_string(),
        },
        other => other.to_string(),
    }
}

/// Errors that may heal whatever the server: the network, a lost or
/// unexpected connection state. Authentication, permissions, TLS and
/// configuration errors will not.
///
/// sqlx reports TLS trouble in two shapes: `Error::Tls` for what it finds
/// before the handshake (a CA file that is not PEM, a server without TLS
/// where the URL requires it), and `Error::Io` wrapping a `rustls::Error`
/// for what the handshake finds (rustls turns its errors into
/// `io::ErrorKind::InvalidData`). The second shape is also how a refused or
/// reset connection arrives, so only a rustls error that names a
/// certificate or a mismatch of configuration is taken as will-not-heal:
/// an unknown CA, a wrong host name, an expired certificate, a client
/// certificate the server refused. A garbled record (a middlebox, a
/// flaky link) stays may-heal.
fn may_heal(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(io) => !tls_refusal(io),
        sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

/// A TLS handshake that failed over certificates or configuration, which
/// no retry can change.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn tls_refusal(io: &std::io::Error) -> bool {
    use tokio_rustls::rustls::{AlertDescription as A, Error as T};
    let Some(t) = io.get_ref().and_then(|e| e.downcast_ref::<T>()) else {
        return false;
    };
    match t {
        T::InvalidCertificate(_)
        | T::NoCertificatesPresented
        | T::UnsupportedNameType
        | T::PeerIncompatible(_)
        | T::InvalidCertRevocationList(_)
        | T::NoApplicationProtocol
        | T::InconsistentKeys(_) => true,
        T::AlertReceived(a) => matches!(
            a,
            A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::AccessDenied
                | A::HandshakeFailure
                | A::ProtocolVersion
                | A::InsufficientSecurity
                | A::CertificateRequired
                | A::UnrecognisedName
        ),
        _ => false,
    }
}

/// Without a server store there is no TLS, and no handshake to refuse.
#[cfg(not(any(feature = "postgres", feature = "mysql")))]
fn tls_refusal(_: &std::io::Error) -> bool {
    false
}

/// Classify a failed connect. A file the URL names for TLS (a CA, a client
/// certificate or key) that cannot be read comes back from sqlx as a bare
/// `Io` error ("No such file or directory"), which looks like a network
/// error and would be retried for ever: when one of the named files is
/// unreadable, that is the cause, it will not heal by itself, and the
/// error says which file and which parameter. The files are looked at only
/// after a failure, so a healthy connect costs nothing.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn connect_failed<D: Dialect>(d: &D, e: sqlx::Error) -> StoreError {
    let context = format!("cannot connect to the store {}", d.shown());
    if let sqlx::Error::Io(io) = &e {
        if let Some(why) = unreadable_tls_file(&d.shown(), D::TLS_FILES) {
            return StoreError::fatal(format!("{context}: {why}")).with_source(e);
        }
        if tls_refusal(io) {
            let said = format!(
                "{context}: {} (the TLS handshake refused it: not retried)",
                message(&e)
            );
            return StoreError::fatal(said).with_source(e);
        }
    }
    classify::<D>(&context, e)
}

/// The first file named by one of `params` in the (shown) URL that cannot
/// be read, as "cannot read PATH (named by PARAM): REASON". The shown URL
/// has its passwords starred but its file parameters as given.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn unreadable_tls_file(shown: &str, params: &[&str]) -> Option<String> {
    let url = url::Url::parse(shown).ok()?;
    url.query_pairs()
        .filter(|(k, _)| params.contains(&k.as_ref()))
        // sqlx takes a value that is PEM text itself as inline data.
        .filter(|(_, v)| !v.trim_start().starts_with("-----BEGIN"))
        .find_map(|(k, v)| {
            std::fs::File::open(v.as_ref()).err().map(|e| {
                format!(
                    "cannot read {} (named by {k}): {e}",
                    crate::names::printable(&v)
                )
            })
        })
}

/// A duration as whole milliseconds for the store, clamped to
/// [`MAX_STORED`] so that "now + d" fits every column type (a
/// `--min-hold 1000000000y` must not write a value later reads reject).
/// The stores' SELECTs clamp remaining times to the same ±10 years
/// (315360000000 ms), for rows written before clamping or by hand.
pub(crate) fn millis(d: Duration) -> i64 {
    // MAX_STORED is ten years: its milliseconds fit an i64 with room to spare.
    i64::try_from(d.min(MAX_STORED).as_millis()).unwrap_or(i64::MAX / 4)
}

/// A `LeaseInfo` from a row whose first four columns are name, holder,
/// epoch and milliseconds to expiry (each store's `COLUMNS`), followed by
/// the table's own columns (`*`): of those, the lease's values (`advertised`
/// and `slots` with `advertised_epoch`, and `kept_epoch`: each tied to the epoch it was
/// written at) are read by name where the table has them. A table made before them (which keeps
/// working for every run without `--advertise`) has none, and a value
/// written by hand that does not decode is no value: `status` must list
/// such a lease, not fail.
pub(crate) fn lease_info<R: sqlx::Row>(r: &R) -> Result<LeaseInfo, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let epoch: i64 = r.try_get(2)?;
    let holder: Option<String> = r.try_get(1)?;
    let at = |c: &str| r.try_get::<Option<i64>, _>(c).ok().flatten();
    // Values of an earlier tenure stay in the row until overwritten, and
    // are not this one's: each is shown only at the epoch it was written at.
    let advertised = match at("advertised_epoch") {
        Some(e) if e == epoch && holder.is_some() => {
            r.try_get::<Option<String>, _>("advertised").ok().flatten()
        }
        _ => None,
    };
    let slots = match at("advertised_epoch") {
        Some(e) if e == epoch && holder.is_some() => at("slots")
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 1),
        _ => None,
    };
    let kept = holder.is_some() && at("kept_epoch") == Some(epoch);
    Ok(LeaseInfo {
        name: r.try_get(0)?,
        holder,
        epoch,
        expires_in_ms: Some(r.try_get(3)?),
        advertised,
        kept,
        slots,
    })
}

/// The hint that goes with a lease table that could not be created.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn cannot_create(err: StoreError) -> StoreError {
    if err.may_heal() {
        // A read-only server (a standby, a primary demoted during a
        // failover) may accept writes again soon: say so, and keep trying.
        err.reworded(|m| format!("{m} (the table cannot be created now; retrying)"))
    } else {
        err.reworded(|m| {
            format!("{m} (create it with the SQL from `leaderrun init --print`, or grant CREATE)")
        })
    }
}

/// What status, check and release (and a run that finds its table gone)
/// say when there is no lease table. Looking never creates it: pointed at
/// the wrong database, a read-only command must not write there and then
/// answer "nothing held".
pub(crate) fn no_table(shown: &str) -> StoreError {
    StoreError::new(
        ErrorKind::NoTable,
        format!(
            "there is no lease table leader_lease in the store {shown} (the wrong database?); \
         status, check and release never create it: `leaderrun init` does, and so does a \
         first run"
        ),
    )
}

/// What `init` says when the login lacks some of what a run needs.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn lacking(shown: &str, missing: &[String], grant: &str) -> StoreError {
    StoreError::fatal(format!(
        "the login may not do what a run needs in the store {shown}: it lacks {}; \
         grant it ({grant})",
        missing.join(", ")
    ))
}

#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
mod tests {
    use super::*;

    /// A TLS file that cannot be read is named with the parameter that
    /// named it; inline PEM and files that exist are not.
    #[test]
    fn unreadable_tls_files_are_named() {
        let dir = std::env::temp_dir().join(format!("lr-tlsfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let there = dir.join("ca.crt");
        std::fs::write(&there, "x").expect("write");
        let gone = dir.join("gone.crt");
        let params = &["sslrootcert", "sslcert"];
        let url = |q: &str| format!("postgres://u:***@h/db?{q}");
        let ok = url(&format!("sslrootcert={}", there.display()));
        assert_eq!(unreadable_tls_file(&ok, params), None);
        let pem = url("sslrootcert=-----BEGIN%20CERTIFICATE-----x");
        assert_eq!(unreadable_tls_file(&pem, params), None);
        let bad = url(&format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}",
            there.display(),
            gone.display()
        ));
        let said = unreadable_tls_file(&bad, params).expect("named");
        assert!(
            said.starts_with(&format!(
                "cannot read {} (named by sslcert): ",
                gone.display()
            )),
            "{said}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
