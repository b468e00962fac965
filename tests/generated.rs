//! The man page and shell completions are generated from the clap
//! definitions and checked in. This test fails when they are stale; run
//! `LEADERRUN_REGENERATE=1 cargo nextest run -E 'test(/^generated::/)'` to rewrite them.

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

const SYNOPSIS: &str = r#".SH SYNOPSIS
.B leaderrun
[\fIOPTIONS\fR] \fB\-\-name\fR \fINAME\fR \fB\-\-\fR \fICOMMAND\fR [\fIARGS\fR...]
.br
.B leaderrun
[\fB\-\-store\fR \fIURL\fR] [\fB\-v\fR|\fB\-q\fR] [\fB\-\-log\-format\fR \fIFORMAT\fR] \fBstatus\fR|\fBrelease\fR|\fBcheck\fR|\fBinit\fR [\fIOPTIONS\fR]
"#;

/// Text for roff: backslashes and hyphens escaped, no line starting with a
/// control character.
fn roff(s: &str) -> String {
    let t = s.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with(['.', '\'']) {
        format!("\\&{t}")
    } else {
        t
    }
}

/// One `.SS` per subcommand with its own options (the common ones are
/// under OPTIONS above).
fn subcommands() -> String {
    let cmd = Cli::command();
    let mut out = String::from(".SH SUBCOMMANDS\nThe common options (\\fB\\-\\-store\\fR, \\fB\\-v\\fR, \\fB\\-q\\fR, \\fB\\-\\-log\\-format\\fR) may come before or after the subcommand.\n");
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let own: Vec<&clap::Arg> = sub
            .get_arguments()
            .filter(|a| !a.is_global_set() && a.get_id() != "help" && !a.is_hide_set())
            .collect();
        let mut head = format!("leaderrun \\fB{}\\fR", sub.get_name());
        for a in &own {
            let long = a.get_long().unwrap_or_default();
            let value = match a.get_action().takes_values() {
                true => format!(
                    " \\fI{}\\fR",
                    a.get_value_names()
                        .and_then(|v| v.first())
                        .map_or("VALUE".into(), |v| v.to_string())
                ),
                false => String::new(),
            };
            let flag = format!("\\fB\\-\\-{}\\fR{value}", roff(long));
            if a.is_required_set() && a.get_env().is_none() {
                head.push_str(&format!(" {flag}"));
            } else {
                head.push_str(&format!(" [{flag}]"));
            }
        }
        out.push_str(&format!(".SS \"{head}\"\n"));
        let about = sub
            .get_long_about()
            .or(sub.get_about())
            .map(|a| a.to_string())
            .unwrap_or_default();
        out.push_str(&format!("{}\n", roff(&about)));
        for a in &own {
            let long = a.get_long().unwrap_or_default();
            let short = a
                .get_short()
                .map(|c| format!("\\fB\\-{c}\\fR, "))
                .unwrap_or_default();
            let value = match a.get_action().takes_values() {
                true => format!(
                    " \\fI{}\\fR",
                    a.get_value_names()
                        .and_then(|v| v.first())
                        .map_or("VALUE".into(), |v| v.to_string())
                ),
                false => String::new(),
            };
            out.push_str(&format!(
                ".TP\n{short}\\fB\\-\\-{}\\fR{value}\n",
                roff(long)
            ));
            let help = a
                .get_long_help()
                .or(a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            out.push_str(&roff(&help));
            if let Some(env) = a.get_env() {
                out.push_str(&format!(" [env: \\fB{}\\fR]", roff(&env.to_string_lossy())));
            }
            out.push('\n');
        }
    }
    out
}

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
    // clap_mangen's synopsis has no `--` and reads COMMAND as a subcommand,
    // and its subcommand section points at leaderrun-status(1) and others,
    // which are not shipped: both are written here, from the same clap
    // definitions, and the subcommands' options are documented in this page.
    out.extend_from_slice(SYNOPSIS.as_bytes());
    man.render_description_section(&mut out).unwrap();
    man.render_options_section(&mut out).unwrap();
    out.extend_from_slice(subcommands().as_bytes());
    out.extend_from_slice(EXTRA.as_bytes());
    man.render_version_section(&mut out).unwrap();
    out
}

fn completion(shell: Shell) -> Vec<u8> {
    // The run form's COMMAND is left out of what clap generates: as a
    // positional it would claim the first word (`leaderrun st<TAB>` offered
    // files, not `status`) and everything after it. What follows `--` is
    // completed by the wrappers below instead, as a command line of its own.
    let mut cmd = Cli::command().mut_arg("command", |a| a.hide(true));
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "leaderrun", &mut out);
    let text = String::from_utf8(out).expect("UTF-8");
    let text = match shell {
        Shell::Bash => {
            let text = edit(&text, BASH_FROM, BASH_TO);
            // Two `complete` lines, one per bash version.
            let text = edit(
                &text,
                "complete -F _leaderrun ",
                "complete -F _leaderrun_run_form ",
            );
            edit(
                &text,
                "complete -F _leaderrun ",
                "complete -F _leaderrun_run_form ",
            )
        }
        Shell::Zsh => {
            // clap_complete's zsh output keeps hidden positionals: drop the
            // COMMAND spec, so the subcommand is the first word again.
            let text = edit(
                &text,
                "':command -- The command and its arguments, run directly (no shell):_default' \\\n",
                "",
            );
            let text = edit(&text, "words=($line[2] ", "words=($line[1] ");
            let text = edit(
                &text,
                "leaderrun-command-$line[2]:",
                "leaderrun-command-$line[1]:",
            );
            let text = edit(&text, "case $line[2] in", "case $line[1] in");
            edit(&text, ZSH_FROM, ZSH_TO)
        }
        Shell::Fish => edit(&edit(&text, FISH_FROM, FISH_TO), "", FISH_ADD),
        _ => text,
    };
    text.into_bytes()
}

/// Replace `from` (which must be there: a new clap_complete that changed
/// its output must not silently lose the edit), or append when empty.
fn edit(text: &str, from: &str, to: &str) -> String {
    if from.is_empty() {
        return format!("{text}{to}");
    }
    assert!(
        text.contains(from),
        "clap_complete's output changed; update the edit of {from:?}"
    );
    text.replacen(from, to, 1)
}

const BASH_FROM: &str = "if [[ \"${BASH_VERSINFO[0]}\" -eq 4";
const BASH_TO: &str = r#"# After `--` comes the run form's COMMAND: complete it as a command line of
# its own (bash-completion's _command_offset), or at least as a command name.
_leaderrun_run_form() {
    local i
    for (( i = 1; i < COMP_CWORD; i++ )); do
        if [[ ${COMP_WORDS[i]} == -- ]]; then
            if declare -F _command_offset >/dev/null; then
                _command_offset $((i + 1))
            elif (( COMP_CWORD == i + 1 )); then
                mapfile -t COMPREPLY < <(compgen -c -- "${COMP_WORDS[COMP_CWORD]}")
            else
                mapfile -t COMPREPLY < <(compgen -f -- "${COMP_WORDS[COMP_CWORD]}")
            fi
            return 0
        fi
    done
    _leaderrun "$@"
}

if [[ "${BASH_VERSINFO[0]}" -eq 4"#;

const ZSH_FROM: &str = r#"if [ "$funcstack[1]" = "_leaderrun" ]; then
    _leaderrun "$@"
else
    compdef _leaderrun leaderrun
fi"#;
const ZSH_TO: &str = r#"# After `--` comes the run form's COMMAND: complete it as a command line of
# its own, as for `nice` or `sudo`.
(( $+functions[_leaderrun_run_form] )) ||
_leaderrun_run_form() {
    local i=${words[(i)--]}
    if (( i < CURRENT )); then
        shift $i words
        (( CURRENT -= i ))
        _normal
        return
    fi
    _leaderrun "$@"
}

if [ "$funcstack[1]" = "_leaderrun" ]; then
    _leaderrun_run_form "$@"
else
    compdef _leaderrun_run_form leaderrun
fi"#;

const FISH_FROM: &str = "    argparse -s (__fish_leaderrun_global_optspecs) -- $cmd 2>/dev/null
    or return
";
const FISH_TO: &str = "    # An option still waiting for its value (`--log-format <TAB>`) fails to
    # parse: that is the top level too, where the option's values are offered.
    argparse -s (__fish_leaderrun_global_optspecs) -- $cmd 2>/dev/null
    or return 0
";
const FISH_ADD: &str = r#"
# After `--` comes the run form's COMMAND: complete it as a command line of
# its own.
function __fish_leaderrun_after_dashdash
    contains -- -- (commandline -opc)
end

function __fish_leaderrun_complete_command
    set -l cmd (commandline -opc)
    set -l i (contains -i -- -- $cmd)
    set -l rest $cmd[(math $i + 1)..-1]
    complete -C (string join ' ' -- (string escape -- $rest) (commandline -ct))
end

complete -c leaderrun -n __fish_leaderrun_after_dashdash -f -a '(__fish_leaderrun_complete_command)'
"#;

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
        "stale: {stale:?}; run LEADERRUN_REGENERATE=1 cargo nextest run -E 'test(/^generated::/)' and commit the result"
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
        // the subcommands' own options, and the run form's `--`
        ".SS \"leaderrun \\fBstatus\\fR",
        "\\fB\\-\\-json\\fR",
        "\\fB\\-\\-epoch\\fR",
        "\\fB\\-\\-print\\fR",
        "\\fINAME\\fR \\fB\\-\\-\\fR \\fICOMMAND\\fR",
    ] {
        assert!(page.contains(want), "man page lacks {want}");
    }
    // Only this page is shipped: no pointer to leaderrun-status(1) or any
    // other page of ours.
    assert!(
        !page.contains("leaderrun\\-status(1)"),
        "refers to unshipped pages"
    );
    assert!(!page.contains("leaderrun\\-"), "refers to unshipped pages");
}

/// The page renders, through man(1) and groff, without a single warning.
#[test]
fn man_renders_without_warnings() {
    let out = std::process::Command::new("man")
        .args(["--warnings", "-l"])
        .arg(root().join("man/leaderrun.1"))
        .env("MANWIDTH", "80")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .output()
        .expect("man (apt-get install man-db)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.trim().is_empty(), "warnings: {err}");
    // man may hyphenate or embolden; compare the words only.
    let text: String = String::from_utf8_lossy(&out.stdout)
        .replace(['\u{2010}', '\u{2212}'], "-")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for want in [
        "--name NAME -- COMMAND",
        "leaderrun status [--name NAME] [--json]",
        "leaderrun init [--print]",
    ] {
        assert!(text.contains(want), "rendered page lacks {want:?}:\n{text}");
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
    assert!(out.contains("-F _leaderrun_run_form leaderrun"), "{out}");
    assert!(out.contains("status"), "subcommand not completed: {out}");
    assert!(out.contains("--min-hold"), "flag not completed: {out}");
}

/// After `--`, bash completes the run form's COMMAND as a command (here
/// without bash-completion's _command_offset: command names, then files).
#[test]
fn bash_completes_the_command_after_the_double_dash() {
    let out = bash(
        "source completions/leaderrun.bash && \
         COMP_WORDS=(leaderrun --name x -- ech) COMP_CWORD=4 && _leaderrun_run_form leaderrun ech -- && echo \"${COMPREPLY[@]}\" && \
         COMP_WORDS=(leaderrun --name x -- echo --min) COMP_CWORD=5 && _leaderrun_run_form leaderrun --min echo && echo \"[${COMPREPLY[@]}]\"",
        &root(),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].split(' ').any(|w| w == "echo"),
        "no command offered: {out}"
    );
    assert!(!lines[0].contains("--"), "flags offered after --: {out}");
    assert_eq!(
        lines[1], "[]",
        "leaderrun's flags offered for the command: {out}"
    );
}

/// A scratch directory for one shell test.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("leaderrun-compl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Drives zsh's real completion: an interactive zsh on a pseudo-terminal
/// (zpty) gets LINE and a Tab; `compadd` is wrapped to write each match to
/// OUT, and a post-completion hook marks the end.
const ZSH_DRIVER: &str = r#"
zmodload zsh/zpty || exit 3
dir=$1 out=$2 line=$3
: >| $out
zpty lr zsh -f -i
zpty -w lr "PS1=''; fpath=(${(q)dir} \$fpath); autoload -Uz compinit; compinit -u -D"
zpty -w lr "bindkey '^I' complete-word"
zpty -w lr "compadd() { if (( \${@[(I)-[OAD]]} )); then builtin compadd \"\$@\"; return; fi; local -a m; builtin compadd -O m \"\$@\"; print -rl -- \$m >> ${(q)out}; builtin compadd \"\$@\"; }"
zpty -w lr "_lr_done() { print -r -- '<done>' >> ${(q)out}; }"
zpty -w lr "comppostfuncs=(_lr_done)"
zpty -w -n lr "$line"$'\t'
for i in {1..200}; do
  grep -q '^<done>$' $out 2>/dev/null && break
  sleep 0.05
done
zpty -d lr
grep -q '^<done>$' $out || { print -u2 "no completion happened"; exit 4 }
grep -v '^<done>$' $out
exit 0
"#;

fn zsh_complete(line: &str) -> Vec<String> {
    let d = scratch("zsh");
    std::fs::write(d.join("drive.zsh"), ZSH_DRIVER).unwrap();
    let out = std::process::Command::new("zsh")
        .arg("-f")
        .arg(d.join("drive.zsh"))
        .arg(root().join("completions"))
        .arg(d.join("out"))
        .arg(line)
        .current_dir(&d)
        .env("HOME", &d)
        .output()
        .expect("zsh (apt-get install zsh)");
    let _ = std::fs::remove_dir_all(&d);
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut words: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    words.sort();
    words.dedup();
    words
}

#[test]
fn zsh_completion_through_zsh() {
    let has = |w: &[String], x: &str| w.iter().any(|m| m == x);
    let w = zsh_complete("leaderrun st");
    assert_eq!(w, ["status"], "subcommands first");
    let w = zsh_complete("leaderrun -v --store sqlite:///x.db st");
    assert_eq!(w, ["status"], "after the common flags too");
    let w = zsh_complete("leaderrun status --");
    assert!(has(&w, "--json") && has(&w, "--name"), "{w:?}");
    assert!(
        !has(&w, "--lease") && !has(&w, "--min-hold"),
        "run-form flags: {w:?}"
    );
    let w = zsh_complete("leaderrun --log-format ");
    assert_eq!(w, ["json", "text"]);
    let w = zsh_complete("leaderrun --name x -- ech");
    assert!(has(&w, "echo"), "commands after --: {w:?}");
    assert!(!has(&w, "status"), "{w:?}");
    let w = zsh_complete("leaderrun --name x -- ls --al");
    assert!(
        has(&w, "--all"),
        "the command's own completion after --: {w:?}"
    );
    let w = zsh_complete("leaderrun --min");
    assert_eq!(w, ["--min-hold"]);
}

fn fish_complete(line: &str) -> Vec<String> {
    let out = std::process::Command::new("fish")
        .arg("--no-config")
        .arg("-c")
        .arg("source completions/leaderrun.fish; complete -C $argv[1]")
        .arg(line)
        .current_dir(root())
        .output()
        .expect("fish (apt-get install fish)");
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('\t').next().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn fish_completion_through_fish() {
    let w = fish_complete("leaderrun --log-format ");
    assert_eq!(w, ["json", "text"], "values, not files");
    let w = fish_complete("leaderrun status --log-format ");
    assert_eq!(w, ["json", "text"]);
    let w = fish_complete("leaderrun st");
    assert_eq!(w, ["status"]);
    let w = fish_complete("leaderrun status --");
    assert!(w.iter().any(|m| m == "--json"), "{w:?}");
    let w = fish_complete("leaderrun --name x -- ech");
    assert!(w.iter().any(|m| m == "echo"), "commands after --: {w:?}");
}
