//! Rows that hold out-of-range values (written by hand, or by a leaderrun
//! that did not clamp) must not break `status` for every lease, and
//! `release` must be able to clear them. Nothing a user passes may be stored
//! in a form that later reads reject.

use crate::support::{leaderrun, lr, run, Output, Pg, TempDir};

fn admin(store: &str, args: &[&str]) -> Output {
    let mut c = leaderrun();
    c.args(args).args(["--store", store]);
    run(c)
}

fn sqlite(db: &std::path::Path, q: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        use sqlx::Connection;
        let url = format!("sqlite://{}", db.display());
        let mut c = sqlx::SqliteConnection::connect(&url).await.expect("open");
        sqlx::raw_sql(q).execute(&mut c).await.expect("sql");
    });
}

fn sqlite_value(db: &std::path::Path, q: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        use sqlx::{Connection, Row};
        let url = format!("sqlite://{}", db.display());
        let mut c = sqlx::SqliteConnection::connect(&url).await.expect("open");
        let row = sqlx::query(q).fetch_one(&mut c).await.expect("sql");
        row.try_get::<String, _>(0).expect("text")
    })
}

/// `--min-hold 1000000000y` is refused on the command line (exit 2, nothing
/// run); the longest it accepts is clamped on write: the file stays readable.
#[test]
fn an_absurd_min_hold_is_refused_and_the_longest_is_clamped_on_write() {
    let dir = TempDir::new("minhold");
    let store = format!("sqlite://{}", dir.file("l.db").display());
    assert_eq!(run(lr(&store, "good", &[], "true")).code, Some(0));
    let r = run(lr(
        &store,
        "long",
        &["--min-hold", "1000000000y"],
        "touch ran",
    ));
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("--min-hold"), "{}", r.stderr);
    let r = run(lr(&store, "long", &["--min-hold", "365days"], "true"));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    // Stored as an integer, not a REAL from an overflow.
    let kind = sqlite_value(
        &dir.file("l.db-leases/long.db"),
        "SELECT typeof(expires_at) || ' ' || (expires_at > 30000000000)
           FROM leader_lease WHERE name = 'long'",
    );
    assert_eq!(kind, "integer 1");
    let r = admin(&store, &["status"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("good") && r.stdout.contains("long"),
        "{}",
        r.stdout
    );
    let r = admin(&store, &["release", "--name", "long"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(run(lr(&store, "long", &[], "true")).code, Some(0));
}

#[test]
fn sqlite_rows_with_real_huge_or_text_values_still_list_and_release() {
    let dir = TempDir::new("hostile");
    let db = dir.file("l.db");
    let store = format!("sqlite://{}", db.display());
    assert_eq!(run(lr(&store, "good", &[], "true")).code, Some(0));
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    let boot = boot.trim();
    sqlite(
        &db,
        &format!(
            "INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id) VALUES ('real', 'h1', 3, 1e300, '{boot}');
             INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id) VALUES ('huge', 'h2', 9223372036854775807, 9223372036854775807, '{boot}');
             INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id) VALUES ('text', 'h3', 'seven', 'soon', '{boot}');
             INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id) VALUES ('neg', 'h4', -5, -9223372036854775807, '{boot}');"
        ),
    );
    let r = admin(&store, &["status"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for name in ["good", "real", "huge", "text", "neg"] {
        assert!(r.stdout.contains(name), "{name} missing: {}", r.stdout);
    }
    let r = admin(&store, &["status", "--json"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let all: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(all.as_array().map(Vec::len), Some(5), "{}", r.stdout);

    // A time that is text does not make the lease live forever.
    assert_eq!(run(lr(&store, "text", &[], "true")).code, Some(0));
    // The REAL one reads as "held for ten years"; release clears it, and
    // the next acquisition works.
    let r = admin(&store, &["release", "--name", "real"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = run(lr(&store, "real", &[], "echo $LEASE_EPOCH"));
    assert_eq!((r.code, r.stdout.trim()), (Some(0), "4"), "{}", r.stderr);
    // The epoch at the very top cannot rise: that acquisition fails (125),
    // it does not wrap or reuse, and status still works.
    let r = admin(&store, &["release", "--name", "huge"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(run(lr(&store, "huge", &[], "true")).code, Some(125));
    assert_eq!(admin(&store, &["status"]).code, Some(0));
}

#[test]
fn postgres_rows_at_infinity_still_list_and_release() {
    let pg = Pg::start();
    let url = pg.url();
    assert_eq!(run(lr(&url, "good", &[], "true")).code, Some(0));
    pg.sql(
        "INSERT INTO leader_lease VALUES ('inf', 'h', 3, 'infinity'), ('ninf', 'h', 4, '-infinity'),
                                        ('far', 'h', 5, '294276-12-31')",
    );
    let r = admin(&url, &["status"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for name in ["good", "inf", "ninf", "far"] {
        assert!(r.stdout.contains(name), "{name} missing: {}", r.stdout);
    }
    let r = admin(&url, &["release", "--name", "inf"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = run(lr(
        &url,
        "inf",
        &["--min-hold", "365days"],
        "echo $LEASE_EPOCH",
    ));
    assert_eq!((r.code, r.stdout.trim()), (Some(0), "4"), "{}", r.stderr);
    assert_eq!(admin(&url, &["status"]).code, Some(0));
}
