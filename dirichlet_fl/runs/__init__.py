"""The run folder: what a run writes (writer: summary.json, rounds.csv, ledger.csv, model.pt, checkpoints),
reads back (reader), draws (plots), and the membership-inference audit of a finished run (audit, with its
ROC plots in audit_plot)."""
