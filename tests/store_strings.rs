//! Store strings through the real binary: where they come from, how they are
//! refused (one line, never echoed), and where the embedded store lives.

use std::process::Command;

use crate::support::{leaderrun, run, Output, TempDir};

/// `leaderrun <args> --name n -- touch <marker>`; the marker tells whether a
/// child was started.
fn try_run(dir: &TempDir, mut c: Command) -> (Output, bool) {
    let marker = dir.file("ran");
    let _ = std::fs::remove_file(&marker);
    c.args(["--name", "n", "--", "touch"]).arg(&marker);
    let r = run(c);
    (r, marker.exists())
}

fn one_line(r: &Output) {
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{:?}", r.stderr);
}

#[test]
fn unparsable_store_strings_name_their_origin_and_are_never_echoed() {
    let dir = TempDir::new("strings");
    let cases = [
        // an unencoded '/', '#', '?' in the password
        (
            "postgres://app:Se/cr3t@db/jobs",
            "Se/cr3t",
            "is not valid: invalid port number",
        ),
        ("postgres://app:Se#cr3t@db/jobs", "Se#cr3t", "is not valid"),
        ("mysql://app:Se?cr3t@db/jobs", "Se?cr3t", "is not valid"),
        // digits only: "port" 12 parses, the rest would land in the path
        ("postgres://app:12/34Zz@db/jobs", "34Zz", "is not valid"),
        // libpq key/value form, and an unknown scheme
        (
            "host=db user=app password=Sekr1t dbname=jobs",
            "Sekr1t",
            "is not a URL",
        ),
        // a scheme known and refused: ZooKeeper without TLS only
        (
            "zks://app:Sekr1t@zk1:2281,zk2:2281/apps",
            "Sekr1t",
            "asks for TLS (zks://), which leaderrun's ZooKeeper store does not support",
        ),
        (
            "ftp://app:Sekr1t@db/jobs",
            "Sekr1t",
            "unknown scheme ftp://",
        ),
    ];
    for (url, secret, want) in cases {
        for (how, origin) in [
            ("flag", "--store"),
            ("LEADERRUN_STORE", "LEADERRUN_STORE"),
            ("DATABASE_URL", "DATABASE_URL"),
        ] {
            let mut c = leaderrun();
            match how {
                "flag" => {
                    c.args(["--store", url]);
                }
                var => {
                    c.env(var, url);
                }
            }
            let (r, ran) = try_run(&dir, c);
            assert_eq!(r.code, Some(2), "{url} via {how}: {}", r.stderr);
            assert!(!ran, "{url}: a child was started");
            one_line(&r);
            assert!(
                r.stderr.contains(&format!("from {origin} ")) && r.stderr.contains(want),
                "{url} via {how}: {}",
                r.stderr
            );
            assert!(!r.stderr.contains(secret), "{url}: echoed: {}", r.stderr);
        }
    }
}

#[test]
fn a_one_letter_password_does_not_star_out_other_words() {
    let port = crate::support::free_port();
    let mut c = leaderrun();
    c.args([
        "-v",
        "--store",
        &format!("postgres://a:a@127.0.0.1:{port}/a?sslmode=disable"),
    ]);
    let (r, _) = try_run(&TempDir::new("oneletter"), c);
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        r.stderr.contains("postgres://a:***@127.0.0.1"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("a:a@"), "{}", r.stderr);
    // Stars appear where the password was, nowhere else.
    assert!(
        !r.stderr.replace("a:***@", "").contains('*'),
        "{}",
        r.stderr
    );
}

#[test]
fn an_empty_store_brings_back_the_embedded_default() {
    let dir = TempDir::new("emptystore");
    let state = dir.file("state");
    for how in ["flag", "env"] {
        let mut c = leaderrun();
        // A DATABASE_URL the application uses, in a scheme leaderrun does not speak.
        c.env("DATABASE_URL", "redis-ish://u:pw@h/0")
            .env("LEADERRUN_STATE_DIR", &state)
            .arg("-v");
        if how == "flag" {
            c.args(["--store", ""]);
        } else {
            c.env("LEADERRUN_STORE", "");
        }
        let (r, ran) = try_run(&dir, c);
        assert_eq!(r.code, Some(0), "{how}: {}", r.stderr);
        assert!(ran, "{how}");
        assert!(
            r.stderr
                .contains(&format!("sqlite://{}", state.join("leases.db").display())),
            "{}",
            r.stderr
        );
    }
    // Without the empty override, DATABASE_URL is used, and named.
    let mut c = leaderrun();
    c.env("DATABASE_URL", "redis-ish://u:pw@h/0");
    let (r, ran) = try_run(&dir, c);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(!ran);
    assert!(
        r.stderr
            .contains("from DATABASE_URL has an unknown scheme redis-ish://"),
        "{}",
        r.stderr
    );
}

#[test]
fn relative_paths_are_refused_and_a_relative_xdg_state_home_is_ignored() {
    let dir = TempDir::new("relative");
    for url in [
        "sqlite://app.db",
        "sqlite://./app.db",
        "sqlite://dir/app.db",
        "sqlite://",
    ] {
        let mut c = leaderrun();
        c.args(["--store", url]).current_dir(dir.path());
        let (r, ran) = try_run(&dir, c);
        assert_eq!(r.code, Some(2), "{url}: {}", r.stderr);
        assert!(!ran);
        one_line(&r);
        assert!(
            r.stderr.contains("needs an absolute file path"),
            "{url}: {}",
            r.stderr
        );
        assert_eq!(
            std::fs::read_dir(dir.path())
                .map(|d| d.count())
                .unwrap_or(0),
            0,
            "{url} created a file"
        );
    }

    let mut c = leaderrun();
    c.env("LEADERRUN_STATE_DIR", "state")
        .current_dir(dir.path());
    let (r, ran) = try_run(&dir, c);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(!ran);
    assert!(
        r.stderr
            .contains("LEADERRUN_STATE_DIR must be an absolute path"),
        "{}",
        r.stderr
    );

    // XDG: a relative XDG_STATE_HOME is ignored (HOME decides). Root always
    // uses /var/lib, so this runs as an unprivileged user.
    let home = dir.file("home");
    std::fs::create_dir(&home).expect("home");
    nix::unistd::chown(&home, Some(nix::unistd::Uid::from_raw(65534)), None).ok();
    let mut c = crate::support::leaderrun_unprivileged(&dir);
    c.env("HOME", &home)
        .env("XDG_STATE_HOME", "relative/state")
        .arg("-v")
        .current_dir("/");
    let (r, _) = try_run(&dir, c);
    assert!(
        r.stderr.contains(&format!(
            "{}/.local/state/leaderrun/leases.db",
            home.display()
        )),
        "{}",
        r.stderr
    );
}

#[test]
fn sqlite_url_parameters_are_parsed_not_part_of_the_file_name() {
    let dir = TempDir::new("sqparams");
    let db = dir.file("x.db");
    let mut c = leaderrun();
    c.args(["--store", &format!("sqlite://{}?mode=rwc", db.display())]);
    let (r, ran) = try_run(&dir, c);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(ran);
    assert!(db.exists(), "x.db was not created");
    assert!(!dir.file("x.db?mode=rwc").exists());

    // mode=rw never creates the file: a typo is an error, not a new store.
    let typo = dir.file("typo.db");
    let mut c = leaderrun();
    c.args(["--store", &format!("sqlite://{}?mode=rw", typo.display())]);
    let (r, ran) = try_run(&dir, c);
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(!ran && !typo.exists());

    for (q, want) in [
        ("?cache=shared", "parameter other than mode"),
        ("?mode=ro", "mode other than rwc or rw"),
    ] {
        let mut c = leaderrun();
        c.args(["--store", &format!("sqlite://{}{q}", db.display())]);
        let (r, ran) = try_run(&dir, c);
        assert_eq!(r.code, Some(2), "{q}: {}", r.stderr);
        assert!(!ran && r.stderr.contains(want), "{q}: {}", r.stderr);
    }
    // A '#' in a file name must be encoded; unencoded it would cut the name.
    let mut c = leaderrun();
    c.args([
        "--store",
        &format!("sqlite://{}/a#b.db", dir.path().display()),
    ]);
    let (r, _) = try_run(&dir, c);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    let mut c = leaderrun();
    c.args([
        "--store",
        &format!("sqlite://{}/a%23b.db", dir.path().display()),
    ]);
    let (r, _) = try_run(&dir, c);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(dir.file("a#b.db").exists());
}

#[test]
fn no_home_at_all_is_a_store_failure_not_a_usage_error() {
    let dir = TempDir::new("nohome");
    let mut c = crate::support::leaderrun_unprivileged(&dir);
    c.env_remove("HOME").env_remove("XDG_STATE_HOME");
    let (r, ran) = try_run(&dir, c);
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(!ran);
    one_line(&r);
    assert!(r.stderr.contains("HOME"), "{}", r.stderr);
}
