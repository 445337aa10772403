"""The ``ump`` command: one entry point whose subcommands map onto the project folders."""
