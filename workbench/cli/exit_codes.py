"""The exit statuses of the ``workbench`` command, written once for every subcommand.

Example:
    >>> from workbench.cli.exit_codes import EXIT_BAD_INPUT
    >>> EXIT_BAD_INPUT
    2
"""

EXIT_OK = 0
EXIT_FAILED = 1  # it ran, and the answer is bad: a training run failed, or a check found a problem
EXIT_BAD_INPUT = 2  # one line on stderr, nothing ran (argparse uses 2 for its errors too)
EXIT_INTERRUPTED = 130  # stopped with Ctrl-C: 128 + SIGINT, what shells report for it
