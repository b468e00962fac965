//! The man page and shell completions are produced by the program itself
//! (`leaderrun --generate man|bash|zsh|fish`, src/generate.rs) and checked
//! in for packaging. These tests fail when the checked-in copies are stale;
//! `LEADERRUN_REGENERATE=1 cargo nextest run -E 'test(/^generated::/)'`
//! rewrites them. They also check that the exit statuses and timing rules
//! in the code (src/exit.rs, src/cli/manual.rs) are what --help, the man page and
//! the README say.

use std::path::{Path, PathBuf};

use crate::support::{leaderrun, run, TempDir};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What the binary itself prints for `--generate KIND`.
fn generate(kind: &str) -> Vec<u8> {
    let out = leaderrun()
        .args(["--generate", kind])
        .output()
        .expect("run leaderrun");
    assert!(
        out.status.success(),
        "--generate {kind}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn man_page() -> Vec<u8> {
    generate("man")
}

fn generated() -> Vec<(PathBuf, Vec<u8>)> {
    vec![
        (root().join("man/leaderrun.1"), generate("man")),
        (root().join("completions/leaderrun.bash"), generate("bash")),
        (root().join("completions/_leaderrun"), generate("zsh")),
        (root().join("completions/leaderrun.fish"), generate("fish")),
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
fn generate_refuses_what_it_cannot_make() {
    for args in [
        &["--generate"][..],
        &["--generate", "tcsh"],
        &["--generate", "man", "x"],
    ] {
        let r = run({
            let mut c = leaderrun();
            c.args(args);
            c
        });
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains("man, bash, zsh, fish"), "{}", r.stderr);
        assert!(r.stdout.is_empty());
    }
    // Hidden: --help does not offer it.
    let r = run({
        let mut c = leaderrun();
        c.arg("--help");
        c
    });
    assert!(!r.stdout.contains("--generate"), "{}", r.stdout);
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
    assert!(!page.contains("leaderrun\\-"), "refers to unshipped pages");
    // Plain ASCII: every other sign is spelled as groff names it.
    assert!(page.is_ascii(), "non-ASCII in the man page");
    // A crontab line runs from cron's `$HOME`: its command is an absolute
    // path, or a user copying it gets "not found" in a cron mail.
    for line in page.lines().filter(|l| l.contains("* *")) {
        let after = line.rsplit("\\-\\- ").next().unwrap_or_default();
        assert!(
            after.starts_with('/'),
            "a cron example runs a relative path: {line}"
        );
    }
}

/// The page renders, through man(1) and groff, without a single warning.
#[test]
fn man_renders_without_warnings() {
    let text = rendered_man();
    for want in [
        "--name NAME -- COMMAND",
        "leaderrun status [--name NAME] [--json]",
        "leaderrun init [--print]",
        // `check` without LEASE_NAME and LEASE_EPOCH is a usage error: both
        // are shown as required, with where else they may come from.
        "leaderrun check --name NAME --epoch EPOCH",
        "required, from the command line or LEASE_EPOCH",
    ] {
        assert!(text.contains(want), "rendered page lacks {want:?}:\n{text}");
    }
}

/// The man page as man(1) shows it, words only.
fn rendered_man() -> String {
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
    ascii(&String::from_utf8_lossy(&out.stdout))
}

/// Words only, with the signs man may render in Unicode (or not, by the
/// locale) spelled in ASCII, for comparing rendered text with the source.
fn ascii(s: &str) -> String {
    words(
        &s.replace(['\u{2010}', '\u{2212}'], "-")
            .replace('\u{2265}', ">=")
            .replace(['\u{2018}', '\u{2019}'], "'"),
    )
}

fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The README's table that follows `heading`: (status, meaning) per row.
fn readme_table(readme: &str, heading: &str) -> Vec<(String, String)> {
    let rest = readme
        .split_once(heading)
        .unwrap_or_else(|| panic!("README has no {heading:?}"))
        .1;
    rest.lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').splitn(2, '|').collect();
            (
                cells[0].trim().to_string(),
                cells.get(1).map_or("", |c| c.trim()).to_string(),
            )
        })
        .collect()
}

/// `leaderrun --help`, in words (see [`words`]).
fn help_words() -> String {
    let mut c = leaderrun();
    c.arg("--help");
    words(&run(c).stdout)
}

/// Every exit status in the code's tables is in the README's exit tables
/// with the same meaning, in the same order, and in --help and the man page.
#[test]
fn exit_statuses_are_one_table_everywhere() {
    use leaderrun::exit::{plain, RUN_FORM, SUBCOMMANDS};
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let help = help_words();
    let man = rendered_man();
    for (heading, table) in [
        ("Exit status of the run form", RUN_FORM),
        ("Exit status of the subcommands", SUBCOMMANDS),
    ] {
        let rows = readme_table(&readme, heading);
        let want: Vec<(String, String)> = table
            .iter()
            .map(|s| (s.status.to_string(), s.meaning.to_string()))
            .collect();
        assert_eq!(rows, want, "README's {heading:?} differs from src/exit.rs");
        for s in table {
            let line = words(&format!("{} {}", plain(s.status), plain(s.meaning)));
            assert!(help.contains(&line), "--help lacks {line:?}:\n{help}");
            assert!(
                man.contains(&ascii(&line)),
                "the man page lacks {line:?}:\n{man}"
            );
        }
    }
}

/// Every timing rule in the code's table is stated by --help, the man page
/// and the README, and is one that leaderrun enforces: flags that break it
/// are a usage error naming the flags.
#[test]
fn timing_rules_are_one_table_everywhere() {
    use leaderrun::cli::{TIMING_DEFAULTS, TIMING_RULES};
    let readme = words(&std::fs::read_to_string(root().join("README.md")).unwrap());
    let help = help_words();
    let man = rendered_man();
    let dir = TempDir::new("timing-rules");
    let store = format!("sqlite://{}", dir.file("leases.db").display());
    for r in TIMING_RULES {
        assert!(readme.contains(r.rule), "README lacks the rule {}", r.rule);
        assert!(help.contains(r.rule), "--help lacks the rule {}", r.rule);
        assert!(
            man.contains(&ascii(r.rule)),
            "the man page lacks the rule {}",
            r.rule
        );
        let out = run({
            let mut c = leaderrun();
            c.args(["--store", &store, "--name", "rules"])
                .args(r.broken_by)
                .args(["--", "true"]);
            c
        });
        assert_eq!(
            out.code,
            Some(2),
            "{}: {:?} {}",
            r.rule,
            r.broken_by,
            out.stderr
        );
        let named = r
            .broken_by
            .iter()
            .filter(|a| a.starts_with("--") && **a != "--wait");
        for flag in named {
            assert!(out.stderr.contains(flag), "{}: {}", r.rule, out.stderr);
        }
    }
    for (sym, flag, default) in TIMING_DEFAULTS {
        let line = format!("{sym} = {default}");
        assert!(readme.contains(&line), "README lacks {line:?}");
        assert!(
            man.contains(&ascii(&format!("{sym} {flag} (default {default})"))),
            "man: {flag}"
        );
        assert!(
            help.contains(&format!("{sym} {flag} default {default}")),
            "--help: {flag}"
        );
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
