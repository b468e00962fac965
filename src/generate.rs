//! The man page and the shell completions, produced by the program itself:
//! `leaderrun --generate man|bash|zsh|fish` (hidden; as ripgrep has it) prints
//! one of them. The copies in `man/` and `completions/` are its output,
//! checked in for packaging, and a test fails when they differ from it.
//!
//! Everything here is rendered from the clap definitions and the tables in
//! `cli/manual.rs` and `exit.rs`. The completions are clap_complete's, untouched,
//! with leaderrun's own additions after them (the run form's COMMAND after
//! `--`), never edits of clap_complete's text.

use std::io::Write;

use clap_complete::Shell;

use crate::cli::{self, Block};
use crate::exit;

/// What `--generate` can produce.
pub const KINDS: &[&str] = &["man", "bash", "zsh", "fish"];

/// `leaderrun --generate KIND`: the exit status when the arguments ask for
/// it, `None` for every other command line. It is looked at before clap
/// parses anything, so it never mixes with the run form's flags.
pub fn from_args() -> Option<i32> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.first().map(|a| a.as_os_str()) != Some("--generate".as_ref()) {
        return None;
    }
    let kind = match args.as_slice() {
        [_, kind] => kind.to_str().unwrap_or_default(),
        _ => "",
    };
    let Some(text) = generate(kind) else {
        let _ = writeln!(
            std::io::stderr(),
            "leaderrun: --generate takes one of {} (see CONTRIBUTING.md)",
            KINDS.join(", ")
        );
        return Some(exit::USAGE);
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(&text).and_then(|()| out.flush()) {
        Ok(()) => Some(0),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "leaderrun: --generate {kind}: {e}");
            Some(exit::FAILURE)
        }
    }
}

/// The bytes of one generated file, by its `--generate` name.
pub fn generate(kind: &str) -> Option<Vec<u8>> {
    match kind {
        "man" => Some(man_page()),
        "bash" => Some(completion(Shell::Bash)),
        "zsh" => Some(completion(Shell::Zsh)),
        "fish" => Some(completion(Shell::Fish)),
        _ => None,
    }
}

// ---- the man page ----

/// Text for roff: backslashes and hyphens escaped, the few non-ASCII signs
/// the tables use spelled as groff names them, `code` in bold, no line
/// starting with a control character.
fn roff(s: &str) -> String {
    let mut out = String::new();
    let mut bold = false;
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\e"),
            '-' => out.push_str("\\-"),
            '−' => out.push_str("\\-"),
            '≥' => out.push_str("\\(>="),
            '≤' => out.push_str("\\(<="),
            '×' => out.push_str("\\(mu"),
            '…' => out.push_str("..."),
            '`' => {
                out.push_str(if bold { "\\fR" } else { "\\fB" });
                bold = !bold;
            }
            c => out.push(c),
        }
    }
    if bold {
        out.push_str("\\fR");
    }
    if out.starts_with(['.', '\'']) {
        out.insert_str(0, "\\&");
    }
    out
}

fn blocks(out: &mut String, blocks: &[Block]) {
    for b in blocks {
        match b {
            Block::Para(text) => out.push_str(&format!(".PP\n{}\n", roff(text))),
            Block::Item(term, text) => {
                out.push_str(&format!(".TP\n{}\n{}\n", roff(term), roff(text)))
            }
            Block::Example(lines) => {
                out.push_str(".PP\n.RS\n");
                let lines: Vec<String> = lines.iter().map(|l| roff(l)).collect();
                out.push_str(&lines.join("\n.br\n"));
                out.push_str("\n.RE\n");
            }
        }
    }
}

/// A flag and its value as a synopsis shows it: `--name NAME`.
fn flag(a: &clap::Arg) -> String {
    let long = a.get_long().unwrap_or_default();
    let value = if a.get_action().takes_values() {
        let name = a
            .get_value_names()
            .and_then(|v| v.first())
            .map_or_else(|| a.get_id().as_str().to_uppercase(), |v| v.to_string());
        format!(" \\fI{name}\\fR")
    } else {
        String::new()
    };
    format!("\\fB{}\\fR{value}", roff(&format!("--{long}")))
}

/// clap_mangen's synopsis has no `--` and reads COMMAND as a subcommand:
/// both forms are written here, from the same definitions.
fn synopsis(cmd: &clap::Command) -> String {
    let common: Vec<String> = ["store", "log_format"]
        .iter()
        .filter_map(|id| cmd.get_arguments().find(|a| a.get_id() == *id))
        .map(|a| format!("[{}]", flag(a)))
        .collect();
    let subs: Vec<String> = cmd
        .get_subcommands()
        .filter(|s| s.get_name() != "help")
        .map(|s| format!("\\fB{}\\fR", s.get_name()))
        .collect();
    format!(
        ".SH SYNOPSIS\n.B leaderrun\n[\\fIOPTIONS\\fR] \\fB\\-\\-name\\fR \\fINAME\\fR \\fB\\-\\-\\fR \
         \\fICOMMAND\\fR [\\fIARGS\\fR...]\n.br\n.B leaderrun\n{} [\\fB\\-v\\fR|\\fB\\-q\\fR] {} {} \
         [\\fIOPTIONS\\fR]\n",
        common[0],
        common[1..].join(" "),
        subs.join("|")
    )
}

/// One `.SS` per subcommand with its own options (the common ones are
/// under OPTIONS). clap_mangen would point at leaderrun-status(1) and
/// others, which are not shipped.
fn subcommands(cmd: &clap::Command) -> String {
    let mut out = String::from(
        ".SH SUBCOMMANDS\nThe common options (\\fB\\-\\-store\\fR, \\fB\\-v\\fR, \\fB\\-q\\fR, \
         \\fB\\-\\-log\\-format\\fR) may come before or after the subcommand.\n",
    );
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let own: Vec<&clap::Arg> = sub
            .get_arguments()
            .filter(|a| !a.is_global_set() && a.get_id() != "help" && !a.is_hide_set())
            .collect();
        let mut head = format!("leaderrun \\fB{}\\fR", sub.get_name());
        for a in &own {
            // A required option stays required when an environment variable
            // may supply it (`check` inside the command): the page says
            // where else it may come from under the option.
            if a.is_required_set() {
                head.push_str(&format!(" {}", flag(a)));
            } else {
                head.push_str(&format!(" [{}]", flag(a)));
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
            let short = a
                .get_short()
                .map(|c| format!("\\fB\\-{c}\\fR, "))
                .unwrap_or_default();
            out.push_str(&format!(".TP\n{short}{}\n", flag(a)));
            let help = a
                .get_long_help()
                .or(a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            out.push_str(&roff(&help));
            if let Some(env) = a.get_env() {
                let env = env.to_string_lossy();
                if a.is_required_set() {
                    out.push_str(&format!(
                        "; required, from the command line or \\fB{}\\fR",
                        roff(&env)
                    ));
                } else {
                    out.push_str(&format!(" [env: \\fB{}\\fR]", roff(&env)));
                }
            }
            out.push('\n');
        }
    }
    out
}

fn exit_status() -> String {
    let mut out = String::from(".SH \"EXIT STATUS\"\nRun form:\n");
    for s in exit::RUN_FORM {
        // Numbers in bold, as man pages show them; words in italic.
        let status = if s.status.starts_with(|c: char| c.is_ascii_digit()) {
            format!("\\fB{}\\fR", roff(s.status))
        } else if s.status.contains('`') {
            roff(s.status)
        } else {
            format!("\\fI{}\\fR", roff(s.status))
        };
        out.push_str(&format!(".TP\n{status}\n{}\n", roff(s.meaning)));
    }
    out.push_str(".PP\nSubcommands:\n");
    for s in exit::SUBCOMMANDS {
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            roff(s.status),
            roff(s.meaning)
        ));
    }
    out
}

fn timing() -> String {
    let mut out = String::from(".SH TIMING\n");
    let defaults: Vec<String> = cli::TIMING_DEFAULTS
        .iter()
        .map(|(sym, flag, default)| format!("{sym} {} (default {})", roff(flag), roff(default)))
        .collect();
    out.push_str(&format!("{}.\n", defaults.join(", ")));
    out.push_str(".PP\nleaderrun refuses to start (exit 2) unless:\n");
    for r in cli::TIMING_RULES {
        out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(r.rule), roff(r.why)));
    }
    blocks(&mut out, cli::TIMING_TEXT);
    out
}

/// The whole page.
pub fn man_page() -> Vec<u8> {
    let cmd = cli::command();
    let man = clap_mangen::Man::new(cmd.clone())
        .date("")
        .manual("leaderrun manual");
    let mut out = Vec::new();
    let mut rest = String::new();
    rest.push_str(&subcommands(&cmd));
    rest.push_str(&exit_status());
    rest.push_str(&timing());
    for (title, body) in cli::MAN_SECTIONS {
        rest.push_str(&format!(".SH {title}\n"));
        let mut text = String::new();
        blocks(&mut text, body);
        // A section's first paragraph needs no .PP of its own.
        rest.push_str(text.strip_prefix(".PP\n").unwrap_or(&text));
    }
    // Writing to a Vec cannot fail; the results are kept only to satisfy
    // the io::Write signatures.
    let _ = man.render_title(&mut out);
    // No hyphenation: a flag or a URL broken at a hyphen reads as another.
    out.extend_from_slice(b".nh\n");
    let _ = man.render_name_section(&mut out);
    out.extend_from_slice(synopsis(&cmd).as_bytes());
    let _ = man.render_description_section(&mut out);
    let _ = man.render_options_section(&mut out);
    out.extend_from_slice(rest.as_bytes());
    let _ = man.render_version_section(&mut out);
    out
}

// ---- the completions ----

/// The command line as the completions see it: everything but the run
/// form's COMMAND. As a positional it would claim the first word
/// (`leaderrun st<TAB>` would offer files, not `status`); what follows `--`
/// is completed by leaderrun's additions instead.
fn for_completion() -> clap::Command {
    let full = cli::command();
    let mut cmd = clap::Command::new("leaderrun")
        .about(full.get_about().cloned().unwrap_or_default())
        .version(env!("CARGO_PKG_VERSION"));
    for a in full.get_arguments().filter(|a| a.get_id() != "command") {
        cmd = cmd.arg(a.clone());
    }
    for s in full.get_subcommands() {
        cmd = cmd.subcommand(s.clone());
    }
    cmd
}

fn clap_completion(shell: Shell) -> String {
    let mut cmd = for_completion();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "leaderrun", &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn completion(shell: Shell) -> Vec<u8> {
    let clap = clap_completion(shell);
    let text = match shell {
        Shell::Bash => format!("{clap}{BASH_RUN_FORM}"),
        Shell::Zsh => zsh(&clap),
        Shell::Fish => format!("{clap}{}{FISH_RUN_FORM}", fish_pending_values()),
        _ => clap,
    };
    text.into_bytes()
}

const BASH_RUN_FORM: &str = r#"
# leaderrun's addition to clap_complete's script above: after `--` comes the
# run form's COMMAND, completed as a command line of its own
# (bash-completion's _command_offset), or at least as a command name.
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

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _leaderrun_run_form -o nosort -o bashdefault -o default leaderrun
else
    complete -F _leaderrun_run_form -o bashdefault -o default leaderrun
fi
"#;

/// clap_complete's zsh script defines `_leaderrun` and, when autoloaded,
/// calls it at once. Run as the body of a function of its own, it only
/// defines: the completion registered and called afterwards is leaderrun's
/// wrapper, which hands everything before `--` to `_leaderrun`.
fn zsh(clap: &str) -> String {
    format!(
        "#compdef leaderrun\n\n\
         # clap_complete's script, as generated, run once for its definitions.\n\
         _leaderrun_clap_definitions() {{\n{clap}}}\n\
         _leaderrun_clap_definitions\n\
         unfunction _leaderrun_clap_definitions\n{ZSH_RUN_FORM}"
    )
}

const ZSH_RUN_FORM: &str = r#"
# After `--` comes the run form's COMMAND: complete it as a command line of
# its own, as for `nice` or `sudo`.
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

compdef _leaderrun_run_form leaderrun
if [ "$funcstack[1]" = "_leaderrun" ]; then
    _leaderrun_run_form "$@"
fi
"#;

/// clap_complete's fish script offers an option's values only where its
/// option parser succeeds, and an option still waiting for its value
/// (`--log-format <TAB>`) makes it fail: those values are offered here.
fn fish_pending_values() -> String {
    let mut out = String::from(
        "\n# leaderrun's additions to clap_complete's script above.\n\
         # The values of an option still waiting for one.\n\
         function __fish_leaderrun_value_of\n    \
         set -l cmd (commandline -opc)\n    \
         contains -- -- $cmd; and return 1\n    \
         contains -- $cmd[-1] $argv\n\
         end\n",
    );
    let cmd = for_completion();
    for a in cmd.get_arguments() {
        let values = a.get_possible_values();
        if values.is_empty() || !a.get_action().takes_values() {
            continue;
        }
        let mut spellings: Vec<String> = Vec::new();
        if let Some(l) = a.get_long() {
            spellings.push(format!("--{l}"));
        }
        if let Some(s) = a.get_short() {
            spellings.push(format!("-{s}"));
        }
        let words: Vec<String> = values
            .iter()
            .map(|v| match v.get_help() {
                Some(h) => format!("{}\\t'{}'", v.get_name(), h.to_string().replace('\'', "")),
                None => v.get_name().to_string(),
            })
            .collect();
        out.push_str(&format!(
            "complete -c leaderrun -n '__fish_leaderrun_value_of {}' -f -a \"{}\"\n",
            spellings.join(" "),
            words.join("\n")
        ));
    }
    out
}

const FISH_RUN_FORM: &str = r#"
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
