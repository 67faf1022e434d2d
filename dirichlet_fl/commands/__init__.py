"""Subcommands of the `dirichlet-fl` command line, one module each, registered through `add_parser`."""
