"""`dirichlet-fl audit-experiment`: the privacy audit at matched utility. config fixes and checks the
experiment, training trains the audited and the reference models, tuning picks their rates on a validation
split, reference_runs trains the shadow models of LiRA and RMIA, tables writes what was found, and
experiment strings them together (docs/audit.md)."""
