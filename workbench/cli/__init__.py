"""The ``workbench`` command: one module per subcommand group."""
