//! leaderrun in the foreground of a terminal, driven through a real pty and
//! an interactive bash: the command can prompt and read, Ctrl-C reaches it
//! as it would without leaderrun, and Ctrl-Z stops the job as a whole.

use std::time::Duration;

use crate::support::pty::Shell;
use crate::support::*;

const SEC: Duration = Duration::from_secs(1);

fn shell(dir: &TempDir) -> Shell {
    Shell::start(&[
        (
            "LEADERRUN_STATE_DIR",
            dir.path().to_str().expect("utf-8 path"),
        ),
        ("LR", env!("CARGO_BIN_EXE_leaderrun")),
    ])
}

#[test]
fn the_command_can_prompt_and_read_from_the_terminal() {
    let dir = TempDir::new("tty-read");
    let mut sh = shell(&dir);
    sh.line(r#"$LR --name tty -- bash -c 'read -p "cont""inue? " a; echo "got:$a"; exit 4'; echo "rc=$?""#);
    sh.expect("continue? ", 10 * SEC);
    sh.line("yes");
    sh.expect("got:yes", 5 * SEC);
    sh.expect("rc=4", 5 * SEC);
    // The terminal came back to the shell: it still runs commands.
    sh.line("echo back-$((6*7))");
    sh.expect("back-42", 5 * SEC);
}

#[test]
fn ctrl_c_reaches_the_command_and_the_lease_is_released() {
    let dir = TempDir::new("tty-int");
    let mut sh = shell(&dir);
    sh.line(r#"$LR --name tty -- bash -c 'echo re""ady; sleep 100'; echo "rc=$?""#);
    sh.expect("ready", 10 * SEC);
    sh.type_keys("\x03");
    // 130 = 128 + SIGINT: the command died of Ctrl-C, as without leaderrun.
    sh.expect("rc=130", 5 * SEC);
    sh.line(r#"$LR status --name tty; echo "st=$?""#);
    sh.expect("free since", 5 * SEC);
    sh.expect("st=0", 5 * SEC);
}

#[test]
fn ctrl_z_stops_the_job_and_fg_continues_it() {
    let dir = TempDir::new("tty-stop");
    let mut sh = shell(&dir);
    // L = 30 s: a short stop is well within the give-up deadline.
    sh.line(r#"$LR --name tty --lease 30s -- bash -c 'echo re""ady; read a; echo "got:$a"'; echo "rc=$?""#);
    sh.expect("ready", 10 * SEC);
    sh.type_keys("\x1a");
    // The shell sees the job stopped and prompts again.
    sh.expect("Stopped", 5 * SEC);
    sh.line("jobs -l");
    sh.expect("Stopped", 5 * SEC);
    sh.line("fg");
    // The command gets the terminal back and can read again.
    std::thread::sleep(Duration::from_millis(300));
    sh.line("after");
    sh.expect("got:after", 5 * SEC);
    sh.line(r#"echo "rc=$?""#);
    sh.expect("rc=0", 5 * SEC);
}

#[test]
fn started_in_the_background_a_read_stops_the_job_until_fg() {
    let dir = TempDir::new("tty-bg");
    let mut sh = shell(&dir);
    sh.line(r#"$LR --name tty --lease 30s -- bash -c 'read a; echo "got:$a"' &"#);
    // The command reads from the terminal in the background: the job stops
    // as a whole, as it would without leaderrun, instead of hanging.
    sh.line("sleep 1; jobs -l");
    sh.expect("Stopped", 10 * SEC);
    sh.line("fg");
    std::thread::sleep(Duration::from_millis(300));
    sh.line("typed");
    sh.expect("got:typed", 5 * SEC);
    sh.line(r#"echo "rc=$?""#);
    sh.expect("rc=0", 5 * SEC);
}

/// Ctrl-Z held longer than `G`: leaderrun is stopped with its job and
/// cannot renew, and its watchdog stops the command meanwhile, as it would
/// for any frozen leaderrun. After `fg` the run ends as a loss does (the
/// `lost` event, exit 75), not with the command's own status as if it had
/// exited by itself; and the lease is handed back.
#[test]
fn ctrl_z_held_past_the_give_up_deadline_ends_as_a_loss() {
    let dir = TempDir::new("tty-stop-long");
    let mut sh = shell(&dir);
    // L = 3 s: G = 2 s, K = 500 ms.
    sh.line(r#"$LR --name tty --lease 3s -- bash -c 'echo re""ady; read a; echo "got:$a"'"#);
    sh.expect("ready", 10 * SEC);
    sh.type_keys("\x1a");
    sh.expect("Stopped", 5 * SEC);
    // The watchdog's own stop, a grace after G: its warning reaches the
    // terminal it shares with leaderrun.
    sh.expect("SIGTERM to the command", 10 * SEC);
    sh.line("fg");
    sh.expect("lost lease tty", 10 * SEC);
    sh.line(r#"echo "rc=$?""#);
    sh.expect("rc=75", 10 * SEC);
    // Handed back at once, not left to expire.
    sh.line(r#"$LR status --name tty; echo "st=$?""#);
    sh.expect("free since", 5 * SEC);
    sh.expect("st=0", 5 * SEC);
}
