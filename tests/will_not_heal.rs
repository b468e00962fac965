//! Configuration that will not heal ends a `--wait` at once (125) instead of
//! being retried for ever, on Postgres and MariaDB: a server certificate
//! from an unknown CA under full verification, a CA file that is not
//! there. A refused connection may heal, and is waited out.

use std::time::{Duration, Instant};

use crate::support::mysql::My;
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);

/// Under `--wait`, 125 well before `--timeout`, saying `says`; try-once 125
/// too; the password never shown.
fn ends_at_once(url: &str, says: &str, password: &str) {
    let t0 = Instant::now();
    let r = run(lr(url, "cfg", &["--wait", "--timeout", "20s"], "true"));
    assert_eq!(r.code, Some(125), "{says}: {}", r.stderr);
    assert!(r.stderr.contains(says), "{says}: {}", r.stderr);
    assert!(!r.stderr.contains("retrying"), "{says}: {}", r.stderr);
    assert!(t0.elapsed() < 10 * SEC, "{says}: took {:?}", t0.elapsed());
    assert!(!r.stderr.contains(password), "{}", r.stderr);
    let r = run(lr(url, "cfg", &[], "true"));
    assert_eq!(r.code, Some(125), "{says}: {}", r.stderr);
}

#[test]
fn postgres_tls_configuration_errors_end_the_wait() {
    let tls = Pg::start_with(true);
    let dir = TempDir::new("pg-tls");
    let url = |q: &str| {
        format!(
            "postgres://postgres:{}@localhost:{}/postgres?{q}",
            crate::support::pg::PASSWORD,
            tls.port
        )
    };
    let missing = dir.file("missing-ca.crt");
    // The right CA works (the setup is sound)...
    let good = url(&format!(
        "sslmode=verify-full&sslrootcert={}",
        tls.dir.file("ca.crt").display()
    ));
    let r = run(lr(&good, "cfg", &[], "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    // ...the system roots do not know the test CA...
    ends_at_once(
        &url("sslmode=verify-full"),
        "UnknownIssuer",
        crate::support::pg::PASSWORD,
    );
    // ...and a CA file that is not there is named.
    ends_at_once(
        &url(&format!(
            "sslmode=verify-full&sslrootcert={}",
            missing.display()
        )),
        &format!("cannot read {} (named by sslrootcert)", missing.display()),
        crate::support::pg::PASSWORD,
    );
    ends_at_once(
        &url(&format!(
            "sslmode=require&sslcert={0}&sslkey={0}",
            missing.display()
        )),
        "(named by sslcert)",
        crate::support::pg::PASSWORD,
    );
}

#[test]
fn mariadb_tls_configuration_errors_end_the_wait() {
    let my = My::start_tls();
    let dir = TempDir::new("my-tls");
    let url = |q: &str| {
        format!(
            "mysql://lr:{}@localhost:{}/lr?{q}",
            crate::support::mysql::PASSWORD,
            my.port
        )
    };
    let missing = dir.file("missing-ca.crt");
    let good = url(&format!(
        "ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        my.dir.file("ca.crt").display()
    ));
    let r = run(lr(&good, "cfg", &[], "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    ends_at_once(
        &url("ssl-mode=VERIFY_IDENTITY"),
        "UnknownIssuer",
        crate::support::mysql::PASSWORD,
    );
    ends_at_once(
        &url(&format!("ssl-mode=VERIFY_CA&ssl-ca={}", missing.display())),
        &format!("cannot read {} (named by ssl-ca)", missing.display()),
        crate::support::mysql::PASSWORD,
    );
    // A server without TLS where the URL requires it.
    let plain = My::start();
    ends_at_once(
        &format!("{}?ssl-mode=REQUIRED", plain.url()),
        "TLS",
        crate::support::mysql::PASSWORD,
    );
}

/// A refused connection may heal: `--wait` keeps trying until `--timeout`
/// (124), on both stores.
#[test]
fn a_refused_connection_is_waited_out() {
    let port = free_port();
    for url in [
        format!("postgres://u:pw@127.0.0.1:{port}/db?sslmode=disable"),
        format!("mysql://u:pw@127.0.0.1:{port}/db"),
    ] {
        let t0 = Instant::now();
        let r = run(lr(&url, "cfg", &["--wait", "--timeout", "1500ms"], "true"));
        assert_eq!(r.code, Some(124), "{url}: {}", r.stderr);
        assert!(t0.elapsed() >= Duration::from_millis(1500), "{url}");
        assert!(r.stderr.contains("retrying"), "{url}: {}", r.stderr);
    }
}
