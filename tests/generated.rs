//! The man page and shell completions are generated from the clap
//! definitions and checked in. This test fails when they are stale; run
//! `LEADERRUN_REGENERATE=1 cargo nextest run --test generated` to rewrite them.

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;
use leaderrun::cli::Cli;

const EXTRA: &str = r#".SH "EXIT STATUS"
Run form:
.TP
\fIthe command's own\fR
the command ran and exited
.TP
\fB128+N\fR
the command died of signal N (or leaderrun got signal N while still waiting)
.TP
\fB75\fR
the lease was lost while the command ran; the command was stopped
.TP
\fB124\fR
\-\-timeout passed without leading
.TP
\fB125\fR
leaderrun's own failure: store unreachable, wrong password, permission denied
.TP
\fB126\fR
the command, or the interpreter on its #! line, is not executable
.TP
\fB127\fR
the command, or the interpreter on its #! line, was not found (both checked before the lease is
taken)
.TP
\fB2\fR
usage error: bad flag, duration, lease name, store URL or timing relation
.TP
\fB\-\-conflict\-exit\-code\fR (default 0)
try\-once found the lease held elsewhere
.PP
Subcommands: \fB0\fR done (status read, lease released, lease live at that epoch, table ready);
\fB1\fR no such lease, nothing to release, or not live at that epoch; \fB125\fR store failure;
\fB2\fR usage error.
.SH TIMING
L lease, R renew, G give\-up, K kill\-after, P retry. Defaults: L = 15s, R = L/3, G = 2L/3,
K = (L \- G)/2, P = 2s. leaderrun refuses to start unless 0 < R < G, G + K < L and P > 0.
.PP
The holder counts from the moment it \fIsent\fR its last successful renewal, on CLOCK_BOOTTIME.
The store set expiry at least L after that moment, by its own clock. At sent + G the command's
process group gets SIGTERM, at sent + G + K SIGKILL; since G + K < L the command is dead before
any rival can acquire. With the defaults: renew every 5s, SIGTERM after 10s without a successful
renewal, SIGKILL at 12.5s, expiry at 15s at the earliest. A waiting contender takes over within
L + P of a holder's death, and within P of a clean release.
.SH ENVIRONMENT
.TP
\fBLEADERRUN_NAME\fR, \fBLEADERRUN_STORE\fR
defaults for \-\-name and \-\-store
.TP
\fBDATABASE_URL\fR
the store, when neither \-\-store nor LEADERRUN_STORE is set
.TP
\fBLEADERRUN_STATE_DIR\fR, \fBXDG_STATE_HOME\fR, \fBHOME\fR
where the embedded store lives when no store is configured (see FILES)
.TP
\fBNOTIFY_SOCKET\fR
set by systemd for Type=notify units: leaderrun sends READY=1 and keeps STATUS= current; the
command does not inherit it
.TP
\fBLEASE_EPOCH\fR, \fBLEASE_NAME\fR, \fBLEASE_HOLDER\fR
set for the command: the fencing token, the lease name and this process's holder id.
\fBleaderrun check\fR reads LEASE_NAME and LEASE_EPOCH
.SH FILES
The embedded store: \fI$LEADERRUN_STATE_DIR/leases.db\fR; for root
\fI/var/lib/leaderrun/leases.db\fR; otherwise \fI$XDG_STATE_HOME/leaderrun/leases.db\fR or
\fI~/.local/state/leaderrun/leases.db\fR. One host only; never on a network filesystem.
.SH EXAMPLES
Run a nightly job at most once at a time on this host:
.PP
.RS
leaderrun \-\-name nightly \-\- ./report.sh
.RE
.PP
The same cron line on several hosts, sharing a Postgres; a host whose clock is a few seconds late
still skips:
.PP
.RS
0 3 * * * leaderrun \-\-store postgres://app@db/jobs \-\-name invoice\-sweeper \-\-min\-hold 5m \-\- ./sweep.sh
.RE
.PP
A standby systemd service: every host runs it, one leads:
.PP
.RS
ExecStart=/usr/bin/leaderrun \-v \-\-wait \-\-name ingest \-\- /usr/bin/ingestd
.RE
.PP
Before a step that must not run twice, from inside the command:
.PP
.RS
leaderrun check || exit 75
.RE
.PP
Who holds what, and clearing a lease whose holder is gone:
.PP
.RS
leaderrun status
.br
leaderrun release \-\-name invoice\-sweeper \-\-epoch 41
.RE
"#;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn man_page() -> Vec<u8> {
    let man = clap_mangen::Man::new(Cli::command())
        .date("")
        .manual("leaderrun manual");
    let mut out = Vec::new();
    man.render_title(&mut out).unwrap();
    man.render_name_section(&mut out).unwrap();
    man.render_synopsis_section(&mut out).unwrap();
    man.render_description_section(&mut out).unwrap();
    man.render_options_section(&mut out).unwrap();
    man.render_subcommands_section(&mut out).unwrap();
    out.extend_from_slice(EXTRA.as_bytes());
    man.render_version_section(&mut out).unwrap();
    out
}

fn completion(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "leaderrun", &mut out);
    out
}

fn generated() -> Vec<(PathBuf, Vec<u8>)> {
    vec![
        (root().join("man/leaderrun.1"), man_page()),
        (
            root().join("completions/leaderrun.bash"),
            completion(Shell::Bash),
        ),
        (
            root().join("completions/_leaderrun"),
            completion(Shell::Zsh),
        ),
        (
            root().join("completions/leaderrun.fish"),
            completion(Shell::Fish),
        ),
    ]
}

#[test]
fn man_page_and_completions_are_current() {
    let regenerate = std::env::var_os("LEADERRUN_REGENERATE").is_some();
    let mut stale = Vec::new();
    for (path, want) in generated() {
        if regenerate {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &want).unwrap();
        } else if std::fs::read(&path).ok().as_ref() != Some(&want) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale: {stale:?}; run LEADERRUN_REGENERATE=1 cargo nextest run --test generated and commit the result"
    );
}

#[test]
fn the_man_page_documents_what_users_look_up() {
    let page = String::from_utf8(man_page()).unwrap();
    for want in [
        "EXIT STATUS",
        "ENVIRONMENT",
        "TIMING",
        "EXAMPLES",
        "LEASE_EPOCH",
        "\\-\\-min\\-hold",
        "status",
    ] {
        assert!(page.contains(want), "man page lacks {want}");
    }
}

fn bash(script: &str, dir: &Path) -> String {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "bash: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bash_completion_loads_and_completes() {
    let out = bash(
        "source completions/leaderrun.bash && complete -p leaderrun && \
         COMP_WORDS=(leaderrun sta) COMP_CWORD=1 && _leaderrun leaderrun sta leaderrun && echo \"${COMPREPLY[@]}\" && \
         COMP_WORDS=(leaderrun --min) COMP_CWORD=1 && _leaderrun leaderrun --min leaderrun && echo \"${COMPREPLY[@]}\"",
        &root(),
    );
    assert!(out.contains("-F _leaderrun leaderrun"), "{out}");
    assert!(out.contains("status"), "subcommand not completed: {out}");
    assert!(out.contains("--min-hold"), "flag not completed: {out}");
}
