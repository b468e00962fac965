//! The orders cross the pipe whole, as one line each, and nothing else is
//! taken for them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::*;
use crate::timing::TimingArgs;

fn orders() -> Orders {
    Orders {
        store: Some(String::from("postgres://u:p w\"\\@h/db?x=1\n\u{7}é").into()),
        origin: Origin::LeaderrunStore,
        name: "x".into(),
        holder: "host:1:ab cd\nforged\u{0}".into(),
        epoch: 4_294_967_297,
        timing: Timing::resolve(TimingArgs {
            lease: Some(Duration::from_millis(3000).into()),
            retry: Some(Duration::from_millis(400).into()),
            ..Default::default()
        })
        .expect("a valid timing"),
        min_hold: Some(Duration::new(60, 1)),
        acquired_at: Stamp::from_origin(Duration::new(12345, 678)),
        sent: Stamp::from_origin(Duration::new(12347, 999_999_999)),
        verbose: 2,
        quiet: false,
        json: true,
    }
}

fn path(raw: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(raw))
}

/// Encoded and read back, as the watchdog reads it: one line, whose bytes
/// before the newline decode.
fn across<T>(line: &str, decode: impl Fn(&[u8]) -> Result<T, DecodeError>) -> T {
    assert_eq!(line.matches('\n').count(), 1, "{line:?}");
    let bytes = line.as_bytes();
    assert_eq!(bytes.last(), Some(&b'\n'));
    assert_eq!(bytes.first(), Some(&b'{'), "one JSON object: {line}");
    decode(&bytes[..bytes.len() - 1]).expect("decodes")
}

#[test]
fn the_orders_and_the_state_cross_whole_on_one_line() {
    let said = vec![
        Msg::Spawning {
            cgroup: Some(path(b"/sys/fs/cgroup/a b/leaderrun-1-ab")),
        },
        Msg::Child {
            pid: 12,
            start: 34,
            cgroup: None,
        },
        Msg::Stopping,
        Msg::Look,
    ];
    let start = Start::new(orders(), said);
    let back = across(&start.encode().expect("encodes"), Start::decode);
    assert_eq!(back, start);
    assert_eq!(back.watchdog, VERSION);
    // Without a store, a `--min-hold` or any state.
    let bare = Start::new(
        Orders {
            store: None,
            min_hold: None,
            origin: Origin::DatabaseUrl,
            ..orders()
        },
        vec![],
    );
    assert_eq!(
        across(&bare.encode().expect("encodes"), Start::decode),
        bare
    );
    let flag = Orders {
        origin: Origin::Flag,
        ..orders()
    };
    let s = Start::new(flag, vec![]);
    assert_eq!(across(&s.encode().expect("encodes"), Start::decode), s);
}

/// A cgroup path with a space, a newline or bytes that are not UTF-8 comes
/// back whole, as hex with no blank in it.
#[test]
fn cgroup_paths_cross_whole_whatever_bytes_they_hold() {
    for raw in [
        &b"/sys/fs/cgroup/my service.slice/leaderrun-1-ab"[..],
        b"/sys/fs/cgroup/a\nchild 1 2 -/x",
        b"/sys/fs/cgroup/\xff\xfe\"}",
        b"/",
    ] {
        let m = Msg::Child {
            pid: 1,
            start: 2,
            cgroup: Some(path(raw)),
        };
        let line = m.encode().expect("encodes");
        assert!(!line.trim_end().contains(' '), "{line}");
        assert_eq!(across(&line, Msg::decode), m);
    }
}

#[test]
fn every_update_crosses_whole() {
    for m in [
        Msg::Spawning { cgroup: None },
        Msg::Spawning {
            cgroup: Some(path(b"/x")),
        },
        Msg::Child {
            pid: i32::MAX,
            start: u64::MAX,
            cgroup: None,
        },
        Msg::Renewed {
            sent: Stamp::from_origin(Duration::new(1, 1)),
        },
        Msg::Stopping,
        Msg::Look,
        Msg::Done,
    ] {
        assert_eq!(across(&m.encode().expect("encodes"), Msg::decode), m);
    }
}

/// Only whole hex bytes of an absolute path name a cgroup: anything else is
/// no message at all (never a cgroup, perhaps a stranger's, made up).
#[test]
fn a_cgroup_field_that_is_not_whole_hex_of_an_absolute_path_is_refused() {
    for bad in ["", "2f7", "zz", "7379732f", "+f", "2f 2f", "-"] {
        let line = format!(r#"{{"msg":"spawning","cgroup":"{bad}"}}"#);
        assert!(Msg::decode(line.as_bytes()).is_err(), "{bad:?}");
    }
    let ok = r#"{"msg":"spawning","cgroup":"2f78"}"#;
    assert_eq!(
        Msg::decode(ok.as_bytes()).expect("decodes"),
        Msg::Spawning {
            cgroup: Some(path(b"/x"))
        }
    );
    let none = r#"{"msg":"spawning","cgroup":null}"#;
    assert_eq!(
        Msg::decode(none.as_bytes()).expect("decodes"),
        Msg::Spawning { cgroup: None }
    );
}

/// What is not orders of this version is refused: the watchdog then says
/// no `ready`, and leaderrun starts no command.
#[test]
fn anything_but_orders_of_this_version_is_refused() {
    let good = Start::new(orders(), vec![]).encode().expect("encodes");
    let v: serde_json::Value = serde_json::from_str(&good).expect("json");
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = v.clone();
        f(&mut v);
        serde_json::to_vec(&v).expect("json")
    };
    let other_version = with(&|v| v["watchdog"] = 2.into());
    assert!(matches!(
        Start::decode(&other_version),
        Err(DecodeError::Version(2))
    ));
    let unknown = with(&|v| v["orders"]["extra"] = 1.into());
    let missing = with(&|v| {
        v["orders"].as_object_mut().expect("object").remove("epoch");
    });
    // A timing leaderrun could not have run with (G + K ≥ L).
    let timing = with(&|v| v["orders"]["timing"]["kill_after"] = 2_000_000_000u64.into());
    let origin = with(&|v| v["orders"]["origin"] = "somewhere".into());
    let negative = with(&|v| v["orders"]["sent"] = (-1).into());
    for bad in [
        unknown,
        missing,
        timing,
        origin,
        negative,
        b"leaderrun-watchdog 1".to_vec(),
        b"".to_vec(),
        good.as_bytes()[..good.len() / 2].to_vec(),
        br#"{"msg":"stopping"}"#.to_vec(),
    ] {
        assert!(
            Start::decode(&bad).is_err(),
            "{}",
            String::from_utf8_lossy(&bad)
        );
    }
    for bad in [
        &br#"{"msg":"stop"}"#[..],
        br#"{"msg":"renewed"}"#,
        br#"{"msg":"renewed","sent":1,"extra":2}"#,
        br#"{"msg":"child","pid":"1","start":2,"cgroup":null}"#,
        br#"stopping"#,
        b"",
    ] {
        assert!(
            Msg::decode(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

/// Why orders were refused is said without quoting them (they hold the
/// store string).
#[test]
fn a_refusal_never_quotes_the_orders() {
    let good = Start::new(orders(), vec![]).encode().expect("encodes");
    // The store where a number belongs: serde's own message would quote it.
    let bad = good.replacen("\"epoch\":4294967297", "\"epoch\":\"postgres://u:p@h\"", 1);
    assert_ne!(good, bad);
    let e = Start::decode(bad.trim_end().as_bytes()).expect_err("refused");
    let shown = e.to_string();
    assert!(!shown.contains("u:p"), "{shown}");
    assert!(
        shown.contains("not the fields expected at column"),
        "{shown}"
    );
    let cut = Start::decode(&good.as_bytes()[..10]).expect_err("refused");
    assert!(cut.to_string().contains("cut short"), "{cut}");
    let junk = Start::decode(b"leaderrun-watchdog 1").expect_err("refused");
    assert!(junk.to_string().contains("not JSON"), "{junk}");
}

/// The store string may hold a password: `Debug` never shows it.
#[test]
fn the_orders_debug_hides_the_password() {
    let shown = format!("{:?}", orders());
    assert!(!shown.contains("u:p"), "{shown}");
    assert!(shown.contains("holder"), "{shown}");
    let plain = Orders {
        store: Some(String::from("postgres://app:s3cret@db/jobs").into()),
        ..orders()
    };
    let shown = format!("{plain:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("db/jobs"), "redacted, not hidden: {shown}");
    let none = format!(
        "{:?}",
        Orders {
            store: None,
            ..orders()
        }
    );
    assert!(none.contains("store: None"), "{none}");
    // Nor does a replacement's first line, debugged whole.
    let start = format!("{:?}", Start::new(plain, vec![]));
    assert!(!start.contains("s3cret"), "{start}");
}
