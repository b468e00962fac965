# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_leaderrun_global_optspecs
    string join \n s/store= v/verbose q/quiet log-format= n/name= lease= renew= give-up= kill-after= wait timeout= retry= min-hold= max-term= once-per= retry-failed no-push holder= advertise= slots= conflict-exit-code= metrics-file= h/help V/version
end

function __fish_leaderrun_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_leaderrun_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_leaderrun_using_subcommand
    set -l cmd (__fish_leaderrun_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c leaderrun -n "__fish_leaderrun_needs_command" -s s -l store -d 'Store URL: postgres://user:pass@host/db, mysql://user:pass@host/db, redis://:pass@host:6379/0, etcd://host:2379[,host:2379...] (rediss://, etcds:// for TLS) or sqlite:///ABS/PATH [default: DATABASE_URL, then the embedded single-host store; empty: the embedded store]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l log-format -d 'Log line format on stderr' -r -f -a "text\t'One line of text per event'
json\t'One JSON object per event'"
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s n -l name -d 'Lease name: 1-128 of A-Z a-z 0-9 . _ - (not starting with - or .)' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l lease -d 'Lease length L [default: 15s]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l renew -d 'Renew interval R [default: L/3]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l give-up -d 'Stop the command when no renewal succeeded for this long, G [default: 2L/3]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l kill-after -d 'Grace between SIGTERM and SIGKILL, K [default: (L-G)/2]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l timeout -d 'With --wait: stop waiting after this long (exit 124)' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l retry -d 'How often a waiting contender tries, P [default: 2s]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l min-hold -d 'Keep the lease at least this long after acquiring it' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l max-term -d 'Step down after leading this long: stop the command (as on a lost lease), release, wait until another contender leads (at most one lease length), exit 75' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l once-per -d 'Run at most once per firing of a schedule (cron): skip, like a held lease, when a run of this name started less than DUR/2 ago by the store\'s clock (2s to 365d; on etcd a whole even number of seconds, at least 4s)' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l holder -d 'Holder id [default: <hostname>:<pid>:<random>]; must be unique per process' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l advertise -d 'Store this text with the lease while it is held (an address, a URL): `status` and `watch` show it to anyone who may read the store; at most 256 bytes, no control characters' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l slots -d 'Let up to N holders run at once, each in a slot of its own with its own epoch (LEASE_SLOT, 0 to N-1); every contender for the name must give the same N [default: 1]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l conflict-exit-code -d 'Exit status when the lease is held elsewhere' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l metrics-file -d 'Write Prometheus metrics to this file (atomically replaced)' -r -F
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s v -l verbose -d 'More output: -v lifecycle (acquired, released), -vv every renewal'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s q -l quiet -d 'Only errors'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l wait -d 'Contend until leading (default: try once, skip if held)'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l retry-failed -d 'With --once-per: a later firing of the same period runs again when that period\'s run failed (did not exit 0, or never ended); a run that exited 0 is never repeated'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l no-push -d 'Wait by polling only, without the store\'s push wake-ups (for a Postgres behind PgBouncer in transaction mode, where LISTEN does not work)'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s V -l version -d 'Print version'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -f -a "status" -d 'Show holder, epoch and time to expiry (by the store\'s clock) of one lease or all'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -f -a "release" -d 'Clear a lease whose holder is gone; the next holder still gets a higher epoch'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -f -a "check" -d 'Exit 0 only while the lease is live at this epoch (for a child, before a step that must not run twice)'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -f -a "watch" -d 'Print who holds the lease(s) now, then one line per change (acquired, released, expired) until interrupted'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -f -a "init" -d 'Create the lease table, or print its SQL with --print'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s n -l name -d 'Only this lease' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s s -l store -d 'Store URL: postgres://user:pass@host/db, mysql://user:pass@host/db, redis://:pass@host:6379/0, etcd://host:2379[,host:2379...] (rediss://, etcds:// for TLS) or sqlite:///ABS/PATH [default: DATABASE_URL, then the embedded single-host store; empty: the embedded store]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l log-format -d 'Log line format on stderr' -r -f -a "text\t'One line of text per event'
json\t'One JSON object per event'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l json -d 'One JSON object per lease (an array without --name)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s v -l verbose -d 'More output: -v lifecycle (acquired, released), -vv every renewal'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s q -l quiet -d 'Only errors'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -s n -l name -d 'The lease to clear (never taken from LEADERRUN_NAME: clearing is deliberate)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -l slot -d 'Only this slot of the name (`--slots`; what `status` showed as NAME#SLOT) [default: 0]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -s e -l epoch -d 'Only if the lease is still at this epoch (what `status` showed)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -l holder -d 'Only if this holder holds it (a unit\'s ExecStopPost naming its own run\'s --holder)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -s s -l store -d 'Store URL: postgres://user:pass@host/db, mysql://user:pass@host/db, redis://:pass@host:6379/0, etcd://host:2379[,host:2379...] (rediss://, etcds:// for TLS) or sqlite:///ABS/PATH [default: DATABASE_URL, then the embedded single-host store; empty: the embedded store]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -l log-format -d 'Log line format on stderr' -r -f -a "text\t'One line of text per event'
json\t'One JSON object per event'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -s v -l verbose -d 'More output: -v lifecycle (acquired, released), -vv every renewal'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -s q -l quiet -d 'Only errors'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -s n -l name -d 'The lease (leaderrun sets LEASE_NAME for the command it runs)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -s e -l epoch -d 'The epoch it must be live at (leaderrun sets LEASE_EPOCH likewise)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -l slot -d 'The slot, under --slots (leaderrun sets LEASE_SLOT likewise) [default: 0]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -s s -l store -d 'Store URL: postgres://user:pass@host/db, mysql://user:pass@host/db, redis://:pass@host:6379/0, etcd://host:2379[,host:2379...] (rediss://, etcds:// for TLS) or sqlite:///ABS/PATH [default: DATABASE_URL, then the embedded single-host store; empty: the embedded store]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -l log-format -d 'Log line format on stderr' -r -f -a "text\t'One line of text per event'
json\t'One JSON object per event'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -s v -l verbose -d 'More output: -v lifecycle (acquired, released), -vv every renewal'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -s q -l quiet -d 'Only errors'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -s n -l name -d 'Only this lease (woken by the store\'s push where it has one)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -l retry -d 'How often to read the store [default: 2s]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -s s -l store -d 'Store URL: postgres://user:pass@host/db, mysql://user:pass@host/db, redis://:pass@host:6379/0, etcd://host:2379[,host:2379...] (rediss://, etcds:// for TLS) or sqlite:///ABS/PATH [default: DATABASE_URL, then the embedded single-host store; empty: the embedded store]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -l log-format -d 'Log line format on stderr' -r -f -a "text\t'One line of text per event'
json\t'One JSON object per event'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -l json -d 'One JSON object per line'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -s v -l verbose -d 'More output: -v lifecycle (acquired, released), -vv every renewal'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -s q -l quiet -d 'Only errors'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -s s -l store -d 'Store URL: postgres://user:pass@host/db, mysql://user:pass@host/db, redis://:pass@host:6379/0, etcd://host:2379[,host:2379...] (rediss://, etcds:// for TLS) or sqlite:///ABS/PATH [default: DATABASE_URL, then the embedded single-host store; empty: the embedded store]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -l log-format -d 'Log line format on stderr' -r -f -a "text\t'One line of text per event'
json\t'One JSON object per event'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -l print -d 'Print the SQL instead of running it'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -s v -l verbose -d 'More output: -v lifecycle (acquired, released), -vv every renewal'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -s q -l quiet -d 'Only errors'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status release check watch init help" -f -a "status" -d 'Show holder, epoch and time to expiry (by the store\'s clock) of one lease or all'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status release check watch init help" -f -a "release" -d 'Clear a lease whose holder is gone; the next holder still gets a higher epoch'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status release check watch init help" -f -a "check" -d 'Exit 0 only while the lease is live at this epoch (for a child, before a step that must not run twice)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status release check watch init help" -f -a "watch" -d 'Print who holds the lease(s) now, then one line per change (acquired, released, expired) until interrupted'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status release check watch init help" -f -a "init" -d 'Create the lease table, or print its SQL with --print'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status release check watch init help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'

# leaderrun's additions to clap_complete's script above.
# The values of an option still waiting for one.
function __fish_leaderrun_value_of
    set -l cmd (commandline -opc)
    contains -- -- $cmd; and return 1
    contains -- $cmd[-1] $argv
end
complete -c leaderrun -n '__fish_leaderrun_value_of --log-format' -f -a "text\t'One line of text per event'
json\t'One JSON object per event'"

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
