"""A minimal init for an MCP server's PID namespace: `python -I -S ns_init.py COMMAND [ARGS...]`.

The first process of a PID namespace is special: the kernel delivers it only the signals it has
handlers for (a SIGTERM to a server running as PID 1 would be ignored), its orphaned descendants
are handed to it to reap, and when it exits the kernel kills every other process in the namespace.
So the server does not run as PID 1: this init starts it, forwards termination signals to it,
reaps every zombie, and exits with the server's status (128 + N when signal N killed it) as soon
as the server is gone, which takes down whatever the server left behind (setsid() daemons too).

Standard library only, and nothing else is imported: it runs with `-I -S` before every server.
"""

import os
import signal
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("ns_init: no command given\n")
        os._exit(2)
    pid = os.fork()
    if pid == 0:
        # The server gets ordinary signal dispositions (Python ignores SIGPIPE, which exec keeps).
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            sys.stderr.write(f"cannot run {argv[0]!r}: {e}\n")
            os._exit(127)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    # The server holds the protocol pipes; the init keeps only stderr, for its own messages.
    for fd in (0, 1):
        try:
            os.close(fd)
        except OSError:
            pass
    while True:
        try:
            done, status = os.wait()  # any child: orphans the server left behind are reaped too
        except ChildProcessError:
            os._exit(1)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main(sys.argv[1:])
